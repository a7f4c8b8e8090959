"""The maps and base files of a host, under ``[vmar] host_dir``.

``maps/<image id>.<version>.vmap`` and ``bases/<image id>``, copied from the
map source (:mod:`vmar_openstack.mapsource`) when an export first needs
them and deleted when the last export reading them goes. ``host_dir`` is
vmar's own directory: Nova's image cache manager never touches it.
"""

import collections
import contextlib
import os
import time

from oslo_log import log as logging

from vmar_openstack import exception
from vmar_openstack import mapformat
from vmar_openstack import names

LOG = logging.getLogger(__name__)

_MAPS, _BASES = 'maps', 'bases'

# one base file fetched from the map source
Fetch = collections.namedtuple('Fetch', 'image_id size seconds')


class HostDir:

    def __init__(self, root, source):
        self.root = root
        self.source = source

    def map_file(self, image_id, version):
        return os.path.join(self.root, _MAPS,
                            names.map_file(image_id, version))

    def base_file(self, image_id):
        return os.path.join(self.root, _BASES, image_id)

    def fetch(self, func, *args):
        """``func(*args)`` of the map source; its failures are ExportErrors."""
        try:
            return func(*args)
        except exception.SourceError as e:
            raise exception.ExportError(str(e))

    def ensure(self, image_id, version):
        """Fetch a map version and its bases if missing; check them.

        Returns the map (:class:`vmar_openstack.mapformat` reader's) and
        the :class:`Fetch` of each base fetched now.
        """
        path = self.map_file(image_id, version)
        if not os.path.exists(path):
            self.fetch(self.source.fetch_map, image_id, version, path)
        try:
            bmap = mapformat.read(path)
        except exception.MapFormatError as e:
            os.unlink(path)
            raise exception.ExportError('map v%d of %s rejected: %s'
                                        % (version, image_id, e))
        if bmap.image_id != image_id or bmap.map_version != version:
            raise exception.ExportError(
                'map file %s describes %s v%d'
                % (path, bmap.image_id, bmap.map_version))
        fetched = []
        for t in bmap.targets:
            base = self.base_file(t.image_id)
            if not os.path.exists(base):
                start = time.monotonic()
                self.fetch(self.source.fetch_base, t.image_id, base)
                fetched.append(Fetch(t.image_id, os.path.getsize(base),
                                     time.monotonic() - start))
            size = os.path.getsize(base)
            if size != t.size:
                raise exception.ExportError(
                    'base %s is %d bytes, map v%d of %s says %d'
                    % (t.image_id, size, version, image_id, t.size))
        return bmap, fetched

    def bases(self):
        """Image ids of the base files on the host."""
        d = os.path.join(self.root, _BASES)
        return sorted(n for n in (os.listdir(d) if os.path.isdir(d) else ())
                      if not n.startswith('.'))

    def prune(self, exports):
        """Delete maps and bases that no export in ``exports`` reads.

        A base file stays while any export's map reads from it, whatever
        happened to its image elsewhere (deleted in Glance, say).
        """
        maps = {names.map_file(e.image_id, e.map_version) for e in exports}
        bases = {tid for e in exports for tid, _s in e.targets}
        for sub, keep in ((_MAPS, maps), (_BASES, bases)):
            d = os.path.join(self.root, sub)
            for name in os.listdir(d) if os.path.isdir(d) else ():
                if name not in keep and not name.startswith('.'):
                    LOG.info('deleting unreferenced %s/%s', sub, name)
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(d, name))
