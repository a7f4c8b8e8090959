"""The maps and base files of a host, under ``[vmar] host_dir``.

``maps/<image id>.<version>.vmap`` and ``bases/<image id>``, copied from the
map source (:mod:`vmar_openstack.mapsource`) when an export first needs
them and deleted when the last export reading them goes. ``host_dir`` is
vmar's own directory: Nova's image cache manager never touches it.

With ``[vmar] base_fetch = lazy`` a base is a mirror instead, in
``mirrors/``: ``<image id>`` (sparse, filled by the export daemon's
``vmar-mirror`` node), ``<image id>.digests`` (the library's digest list),
``<image id>.reader`` (the QEMU node, as JSON, that fetches its missing
blocks from the map source) and ``<image id>.present`` (which blocks it
holds); see ``doc/source/mirror-format.rst``. A whole base in ``bases/``
wins over a mirror of the same image.
"""

import collections
import contextlib
import json
import os
import time

from oslo_log import log as logging

from vmar_openstack import exception
from vmar_openstack import fileutils
from vmar_openstack import mapformat
from vmar_openstack.mapformat import mirror as mirror_format
from vmar_openstack import names

LOG = logging.getLogger(__name__)

_MAPS, _BASES, _MIRRORS = 'maps', 'bases', 'mirrors'
# the files of a mirror, in the order they are created; deleted in reverse
_PRESENT, _READER, _DIGESTS = '.present', '.reader', '.digests'

# one base file fetched from the map source
Fetch = collections.namedtuple('Fetch', 'image_id size seconds')
# the files of one base mirror
Mirror = collections.namedtuple('Mirror', 'data digests reader present')


class HostDir:

    def __init__(self, root, source, mirror_cache_bytes=0):
        self.root = root
        self.source = source
        self.mirror_cache_bytes = mirror_cache_bytes

    def map_file(self, image_id, version):
        return os.path.join(self.root, _MAPS,
                            names.map_file(image_id, version))

    def base_file(self, image_id):
        """The file that holds the base's data: whole base, else mirror."""
        whole = self._whole(image_id)
        mirror = self.mirror(image_id).data
        return mirror if (not os.path.exists(whole)
                          and os.path.exists(mirror)) else whole

    def _whole(self, image_id):
        return os.path.join(self.root, _BASES, image_id)

    def mirror(self, image_id):
        """The :class:`Mirror` files of a base."""
        data = os.path.join(self.root, _MIRRORS, image_id)
        return Mirror(data, data + _DIGESTS, data + _READER, data + _PRESENT)

    def reader(self, image_id):
        """The ``blockdev-add`` options of a mirror's fetch node."""
        path = self.mirror(image_id).reader
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError) as e:
            raise exception.ExportError('mirror of %s: cannot read %s: %s'
                                        % (image_id, path, e))

    def is_mirror(self, image_id):
        """Whether the base is served from a mirror (no whole base)."""
        return not os.path.exists(self._whole(image_id)) and os.path.exists(
            self.mirror(image_id).data)

    def can_mirror(self):
        return hasattr(self.source, 'base_reader')

    def fetch(self, func, *args):
        """``func(*args)`` of the map source; its failures are ExportErrors."""
        try:
            return func(*args)
        except exception.SourceError as e:
            raise exception.ExportError(str(e))

    def ensure(self, image_id, version, lazy=False):
        """Fetch a map version and its bases if missing; check them.

        ``lazy``: a missing base becomes an empty mirror, not a copy, if
        the source can fill mirrors (else, or without a digest list, the
        whole base is copied). Returns the map
        (:class:`vmar_openstack.mapformat` reader's) and the
        :class:`Fetch` of each base copied now.
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
            base = self._whole(t.image_id)
            if (not os.path.exists(base) and lazy and self.can_mirror()
                    and self._ensure_mirror(t)):
                continue
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

    def _ensure_mirror(self, target):
        """Make the mirror files of ``target`` if missing; False: cannot.

        The digest list comes first and is checked against the map's
        target, then the reader, then the present file, then the empty
        data file: the data file exists only with the other three.
        """
        m = self.mirror(target.image_id)
        if os.path.exists(m.data) and self._ensure_reader(target, m):
            # used again: last in line for eviction
            with contextlib.suppress(FileNotFoundError):
                os.utime(m.present)
            return True
        if os.path.exists(m.data):
            return False
        os.makedirs(os.path.dirname(m.data), exist_ok=True)
        if os.path.exists(m.digests):
            hdr, _rows = mirror_format.read_digests(m.digests)
        else:
            hdr = self._fetch_digests(target, m.digests)
            if hdr is None:
                return False
        if not self._ensure_reader(target, m):
            return False
        mirror_format.create_present(m.present, hdr)
        tmp = fileutils.write_temp(m.data, b'')
        os.truncate(tmp, hdr.size)
        fileutils.install(tmp, m.data)
        LOG.info('base %s: empty mirror of %d bytes created', hdr.image_id,
                 hdr.size)
        return True

    def _ensure_reader(self, target, m):
        """Keep the source's fetch node of ``target``; False: it has none.

        Kept with the mirror so that a restarted daemon re-adds its nodes
        without asking the source (which may be unreachable then).
        """
        if os.path.exists(m.reader):
            return True
        try:
            spec = self.source.base_reader(target.image_id, target.size)
        except exception.SourceError as e:
            LOG.warning('base %s: cannot be read range by range (%s); '
                        'copying the whole base instead of mirroring it',
                        target.image_id, e)
            return False
        fileutils.install(fileutils.write_temp(
            m.reader, json.dumps(spec).encode()), m.reader)
        return True

    def _fetch_digests(self, target, dest):
        """The source's digest list of ``target`` at ``dest``: its header.

        None if the source has none usable (the base is copied whole).
        """
        tmp = dest + '.%d.tmp' % os.getpid()
        try:
            self.source.fetch_digests(target.image_id, tmp)
            hdr, _rows = mirror_format.read_digests(tmp)
        except (exception.SourceError, exception.MirrorFormatError) as e:
            fileutils.unlink(tmp)
            LOG.warning('base %s: no usable digest list (%s); copying the '
                        'whole base instead of mirroring it',
                        target.image_id, e)
            return None
        if (hdr.image_id, hdr.size) != (target.image_id, target.size):
            fileutils.unlink(tmp)
            raise exception.ExportError(
                'the digest list of base %s describes %s (%d bytes), the '
                'map says %d bytes' % (target.image_id, hdr.image_id,
                                       hdr.size, target.size))
        fileutils.install(tmp, dest)
        return hdr

    def bases(self):
        """Image ids of the base files and mirrors on the host."""
        found = set()
        for sub in (_BASES, _MIRRORS):
            d = os.path.join(self.root, sub)
            found.update(n for n in (os.listdir(d) if os.path.isdir(d)
                                     else ())
                         if not n.startswith('.') and '.' not in n)
        return sorted(found)

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
        self._evict_mirrors(bases)

    def _mirror_ids(self):
        d = os.path.join(self.root, _MIRRORS)
        return {n.split('.')[0] for n in (os.listdir(d) if os.path.isdir(d)
                                          else ()) if not n.startswith('.')}

    def _evict_mirrors(self, keep):
        """Evict unreferenced mirrors while mirrors exceed the budget.

        Least recently used first: by the time of the present file, which
        the driver rewrites as it fetches and :meth:`ensure` touches when
        an export is added. Mirrors in ``keep`` stay whatever their size.
        """
        used, idle = 0, []
        for image_id in self._mirror_ids():
            m = self.mirror(image_id)
            size = sum(_allocated(p) for p in m)
            used += size
            if image_id not in keep:
                idle.append((_mtime(m.present), image_id, size))
        for _t, image_id, size in sorted(idle):
            if used <= self.mirror_cache_bytes:
                break
            LOG.info('evicting the unreferenced mirror of %s (%d bytes; '
                     'mirrors hold %d, mirror_cache_gb allows %d)',
                     image_id, size, used, self.mirror_cache_bytes)
            m = self.mirror(image_id)
            # the present bits go first: never bits without their data
            for path in (m.present, m.data, m.reader, m.digests):
                fileutils.unlink(path)
            used -= size
        if 0 < self.mirror_cache_bytes < used:
            LOG.warning('the mirrors exports read hold %d bytes, above the '
                        'mirror_cache_gb budget of %d', used,
                        self.mirror_cache_bytes)


def _allocated(path):
    try:
        return os.stat(path).st_blocks * 512
    except FileNotFoundError:
        return 0


def _mtime(path):
    try:
        return os.stat(path).st_mtime
    except FileNotFoundError:
        return 0
