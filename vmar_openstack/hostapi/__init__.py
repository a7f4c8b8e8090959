"""The local API of a compute host's export daemon (``vmar-export serve``).

The daemon is the one process that changes a host's vmar state: its
export record, maps, digest lists, mirrors and bases, and the
qemu-storage-daemon with its nodes. Everyone else (``vmar-export add``
and its siblings, ``vmar-nova-compute``) asks it, over a unix socket, as
Nova asks libvirtd. This package is what both ends share and what a
client needs, and nothing more: it imports no QEMU, QMP or map-source
code, so ``vmar-nova-compute`` loads none of it.

* :mod:`.protocol`: the versioned wire format, the operations and the
  errors that cross the socket;
* :mod:`.client`: :class:`~.client.Client`, one call per operation.

The server is :mod:`vmar_openstack.host.api`, inside the daemon.
"""

from vmar_openstack.hostapi.client import Client

__all__ = ['Client']
