"""The host's side of its guests' ``vmar-guest``.

* :mod:`.channels`: one virtio-serial channel per guest, the guest's view
  of its mode, and the ``auto`` policy that switches guest-private caching
  on and off under host memory pressure.

The guest component itself (``vmar-guest.c``, which runs inside the guest)
is :mod:`vmar_openstack.guest`.
"""
