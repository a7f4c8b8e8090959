"""A compute host's side: ``vmar-export``, one daemon per host.

The daemon owns one patched ``qemu-storage-daemon`` and keeps in it, for
every export, the image's map and base files as read-only block nodes and
one NBD export on the unix socket ``[vmar_host] export_socket``. Maps and
base files come from the configured map source
(:mod:`vmar_openstack.mapsource`) and are copied into ``[vmar_host]
host_dir``, a vmar-owned directory that Nova's image cache manager never
touches. Everyone else asks the daemon, over its host API
(:mod:`vmar_openstack.hostapi`).

One concern per package, from the bottom up:

* :mod:`.exports`: the record of the host's exports, their files under
  ``host_dir``, the daemon's block graph and its QMP client;
* :mod:`.peers`: the cloud's other hosts: the peer server that offers what
  this host holds, the fetcher that reads from them, their digest lists
  and the discovery of who holds what;
* :mod:`.cache`: the host page cache: boot working sets prefetched,
  metadata kept warm and locked, residency;
* :mod:`.guests`: the channels to the guests' ``vmar-guest`` and the
  guest-private policy;
* :mod:`.observe`: what the daemon says of itself: status, Prometheus
  metrics, the host's reports to the library.

Above them :mod:`.service` (:class:`~.service.ExportService`, the
operations), :mod:`.supervisor` (the daemon's processes) and :mod:`.api`
(the host API server); :mod:`.daemon` alone wires them into ``vmar-export
serve``. Export names and NBD URIs are built by :mod:`vmar_openstack.names`,
errors are :class:`vmar_openstack.exception.ExportError`.
"""
