"""The export service of a compute host: ``vmar-export``.

It owns one patched ``qemu-storage-daemon`` per host and keeps in it, for
every export, the image's map and base files as read-only block nodes and
one NBD export on the unix socket ``[vmar_host] export_socket``. Maps and
base files come from the configured map source
(:mod:`vmar_openstack.mapsource`) and are copied into ``[vmar_host]
host_dir``, a vmar-owned directory that Nova's image cache manager never
touches.

* :mod:`.state`: the exports of the host (``exports.json``) and the
  :class:`Export` record;
* :mod:`.hostdir`: the maps and base files under ``host_dir``;
* :mod:`.qmp`: the QMP client of the daemon;
* :mod:`.graph`: the daemon's nodes and exports, and their names;
* :mod:`.service`: :class:`ExportService`, the operations
  (``add``, ``remove``, ``release``, ``list``, ``restore``);
* :mod:`.supervisor`: ``vmar-export serve``, which runs the daemon and
  restores every export when it restarts;
* :mod:`.prefetch`: the prefetch of boot working sets ``serve`` runs;
* :mod:`.peers` and :mod:`.nbdkit_peer`: the peer server ``serve`` runs
  with ``[vmar_peers] listen_address``: what the host holds, for the
  cloud's other hosts over NBD with TLS.

Export names and NBD URIs are built by :mod:`vmar_openstack.names`, errors
are :class:`vmar_openstack.exception.ExportError`.
"""

from vmar_openstack.export.service import ExportService
from vmar_openstack.export.state import Export
from vmar_openstack.export.state import HOST_CACHE

__all__ = ['Export', 'ExportService', 'HOST_CACHE']
