"""Nova integration: the libvirt image backend for vmar flavors.

It owns everything a compute host's Nova needs to boot an instance whose
flavor has ``vmar:enabled=true`` from a qcow2 overlay on the image's VMAR
view:

* :mod:`.image`: the ``nova.virt.libvirt.imagebackend.Image`` subclass
  (provisioning of the export and the overlay, the libvirt disk config);
* :mod:`.hooks`: how it is plugged into stock Nova (per-flavor backend
  choice, export release on delete, live snapshots, refused operations);
* :mod:`.reconcile`: at start, the export references of instances that
  left the host while the service was down are dropped;
* :mod:`.extra_specs`: the ``nova.api.extra_spec_validators`` plugin for the
  ``vmar:`` flavor extra specs.

``vmar-nova-compute`` (:mod:`vmar_openstack.cmd.nova_compute`) registers the
hooks and runs Nova's own ``nova-compute``.
"""
