"""Nova integration: the libvirt image backend for vmar flavors.

It owns everything a compute host's Nova needs to boot an instance whose
flavor has ``vmar:enabled=true`` from a qcow2 overlay on the image's VMAR
view:

* :mod:`.image`: the ``nova.virt.libvirt.imagebackend.Image`` subclass
  (provisioning of the export and the overlay, the libvirt disk config);
* :mod:`.snapshot`: live snapshots of a vmar root disk;
* :mod:`.driver`: the one door to the libvirt driver's private parts;
* :mod:`.resume`: guests paused on an I/O error resume once their exports
  are back;
* :mod:`.guest_cache`: the guest-private cache policy;
* :mod:`.reconcile`: at start, the export references of instances that
  left the host while the service was down are dropped;
* :mod:`.extra_specs`: the ``nova.api.extra_spec_validators`` plugin for the
  ``vmar:`` flavor extra specs.

How it is plugged into stock Nova (per-flavor backend choice, export
release on delete, live snapshots, refused operations) is
:mod:`vmar_openstack.nova_wrappers`'s table; ``vmar-nova-compute``
(:mod:`vmar_openstack.cmd.nova_compute`) installs it and runs Nova's own
``nova-compute``.
"""
