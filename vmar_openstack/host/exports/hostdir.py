"""The maps and base files of a host, under ``[vmar_host] host_dir``.

``maps/<image id>.<version>.vmap`` and ``bases/<image id>``, copied from the
map source (:mod:`vmar_openstack.mapsource`) when an export first needs
them and deleted when the last export reading them goes. ``host_dir`` is
vmar's own directory: Nova's image cache manager never touches it.

With ``[vmar_host] base_fetch = lazy`` a base is a mirror instead, in
``mirrors/``: ``<image id>`` (sparse, filled by the export daemon's
``vmar-mirror`` node), ``<image id>.digests`` (the library's digest list),
``<image id>.reader`` (where the map source reads its missing blocks, a
:mod:`~vmar_openstack.mapsource.readers` description as JSON) and
``<image id>.present`` (which blocks it holds); see
``doc/source/reference/mirror-format.rst``. A whole base in ``bases/`` wins
over a mirror of the same image. ``<base id>.alt.<image id>.<version>``
is an alternate map (:mod:`vmar_openstack.mapformat.alternate`): where
that map version's image holds blocks of the base, for when the base's own
data is gone from the source; the image then has a ``.reader`` too.
``peers/<base id>.json`` names the other hosts that hold blocks of a
mirrored base (:mod:`.discovery`), ``peers/reads.json`` counts what the
range server read from peers.
"""

import collections
import contextlib
import glob
import json
import os
import time

from oslo_log import log as logging

from vmar_openstack import exception
from vmar_openstack import fileutils
from vmar_openstack.host.exports import locks
from vmar_openstack import mapformat
from vmar_openstack.mapformat import alternate as alt_format
from vmar_openstack.mapformat import bootset as bootset_format
from vmar_openstack.mapformat import layout as layout_format
from vmar_openstack.mapformat import mirror as mirror_format
from vmar_openstack.mapsource import readers
from vmar_openstack import names

LOG = logging.getLogger(__name__)

_MAPS, _BASES, _MIRRORS = 'maps', 'bases', 'mirrors'
_BOOTSETS, _SENT = 'bootsets', '.sent'
_LAYOUTS = 'layouts'
_PEERS = 'peers'
_PEER_COUNTS = 'reads.json'
# the lock files of releases before the host API (nothing takes them now)
_OLD_LOCKS = 'locks'
# the files of a mirror, in the order they are created; deleted in reverse
_PRESENT, _READER, _DIGESTS = '.present', '.reader', '.digests'
_ALT = '.alt.'

# one base file fetched from the map source
Fetch = collections.namedtuple('Fetch', 'image_id size seconds')
# the files of one base mirror
Mirror = collections.namedtuple('Mirror', 'data digests reader present')
# an alternate map of a mirrored base: map version ``version`` of
# ``image_id`` (``size`` bytes) holds some of its blocks
Alternate = collections.namedtuple('Alternate', 'image_id version size path')


class Layout:
    """The files of ``host_dir``, read only: no map source needed.

    What a host holds (:meth:`holdings`, its reports) and where each file
    is. :class:`HostDir` adds what changes them.
    """

    def __init__(self, root):
        self.root = root

    def map_file(self, image_id, version):
        return os.path.join(self.root, _MAPS,
                            names.map_file(image_id, version))

    def bootset_file(self, image_id):
        return os.path.join(self.root, _BOOTSETS,
                            names.bootset_file(image_id))

    def layout_file(self, image_id):
        return os.path.join(self.root, _LAYOUTS, names.layout_file(image_id))

    def layout(self, image_id):
        """The host's block layout of an image, or None without one."""
        try:
            return layout_format.read(self.layout_file(image_id), image_id)
        except (OSError, exception.LayoutFormatError):
            return None

    def bootset_source(self, image_id):
        """Where the host's boot working set of an image came from.

        ``'recorded'``, ``'introspected'``, or None without one.
        """
        try:
            return bootset_format.read(self.bootset_file(image_id),
                                       image_id).source
        except (OSError, exception.BootsetFormatError):
            return None

    def bootset_sent(self, image_id):
        """Whether this host reported a set it recorded for the image."""
        return os.path.exists(self.bootset_file(image_id) + _SENT)

    def holders_file(self, base_id):
        """Who holds blocks of ``base_id`` (:mod:`.discovery`)."""
        return os.path.join(self.root, _PEERS, names.holders_file(base_id))

    def peer_counts_file(self):
        """What the range server read from peers (its reader's counts)."""
        return os.path.join(self.root, _PEERS, _PEER_COUNTS)

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

    def mirror_size(self, image_id):
        """The bytes of a base's mirror (its data file's size)."""
        return os.path.getsize(self.mirror(image_id).data)

    def reader(self, image_id):
        """Where a mirror fetches its missing blocks (:mod:`.readers`)."""
        path = self.mirror(image_id).reader
        try:
            with open(path) as f:
                return readers.from_record(json.load(f))
        except (OSError, ValueError) as e:
            raise exception.ExportError('mirror of %s: cannot read %s: %s'
                                        % (image_id, path, e))

    def has_reader(self, image_id):
        return os.path.exists(self.mirror(image_id).reader)

    def alternates(self, base_id):
        """The :class:`Alternate` maps of a mirrored base, oldest first.

        Only those whose image has a reader.
        """
        d = os.path.join(self.root, _MIRRORS)
        prefix = base_id + _ALT
        out = []
        for name in os.listdir(d) if os.path.isdir(d) else ():
            if not name.startswith(prefix) or name.endswith('.tmp'):
                continue
            image_id, _dot, version = name[len(prefix):].partition('.')
            path = os.path.join(d, name)
            if not (version.isdigit() and self.has_reader(image_id)):
                continue
            try:
                target = mapformat.read(path).targets[0]
            except exception.MapFormatError as e:
                LOG.warning('ignoring the alternate map %s: %s', path, e)
                continue
            out.append((os.stat(path).st_mtime, Alternate(
                image_id, int(version), target.size, path)))
        return [a for _t, a in sorted(out)]

    def is_whole(self, image_id):
        """Whether the host holds the base whole (no peer is needed)."""
        return os.path.exists(self._whole(image_id))

    def is_mirror(self, image_id):
        """Whether the base is served from a mirror (no whole base)."""
        return not os.path.exists(self._whole(image_id)) and os.path.exists(
            self.mirror(image_id).data)

    def bases(self):
        """Image ids of the base files and mirrors on the host."""
        found = set()
        for sub in (_BASES, _MIRRORS):
            d = os.path.join(self.root, sub)
            found.update(n for n in (os.listdir(d) if os.path.isdir(d)
                                     else ())
                         if not n.startswith('.') and '.' not in n)
        return sorted(found)

    def holdings(self):
        """What the host holds of each base: ``{base id: blocks}``.

        ``blocks`` is None for a whole base, else the blocks its mirror
        holds (its present bits, as last written). A mirror being made
        (no present file yet) or whose present file is unreadable is left
        out.
        """
        out = {}
        for image_id in self.bases():
            if not names.is_uuid(image_id):
                continue    # not vmar's (lost+found)
            if not self.is_mirror(image_id):
                out[image_id] = None
                continue
            try:
                _hdr, bits = mirror_format.read_present(
                    self.mirror(image_id).present)
            except FileNotFoundError:
                continue
            except (OSError, exception.MirrorFormatError) as e:
                LOG.warning('holdings: mirror of %s left out: %s',
                            image_id, e)
                continue
            out[image_id] = int(bits.sum())
        return out

    def complete_mirrors(self, exports):
        """Mirrors holding every block only their own image has.

        ``exports``: ``(image id, map version)`` pairs, the host's. An
        image's mirror is complete when its present bits cover every block
        each of those map versions reads from the image itself (its
        ``is_self`` target): the blocks no other image holds, which a host
        must still serve once the image is deleted from the store, for its
        servers to move (the fill of an export makes them so). Whole bases
        are complete by themselves (:meth:`holdings` says None) and are
        not listed. A set of image ids.
        """
        versions = collections.defaultdict(set)
        for image_id, version in exports:
            versions[image_id].add(version)
        out = set()
        for image_id, vs in sorted(versions.items()):
            if not self.is_mirror(image_id):
                continue
            try:
                _hdr, bits = mirror_format.read_present(
                    self.mirror(image_id).present)
                maps = [mapformat.read(self.map_file(image_id, v))
                        for v in sorted(vs)]
            except (OSError, exception.MirrorFormatError,
                    exception.MapFormatError):
                continue
            if all(bits[alt_format.block_pairs(bmap, i)[0]].all()
                   for bmap in maps
                   for i, t in enumerate(bmap.targets) if t.is_self):
                out.add(image_id)
        return out

    def _mirror_ids(self):
        d = os.path.join(self.root, _MIRRORS)
        return {n.split('.')[0] for n in (os.listdir(d) if os.path.isdir(d)
                                          else ()) if not n.startswith('.')}


class HostDir(Layout):
    """The files of ``host_dir``, fetched from a map source and pruned.

    Only the export daemon makes one (:mod:`vmar_openstack.hostapi`).
    """

    def __init__(self, root, source, mirror_cache_bytes=0, peers=None):
        super().__init__(root)
        self.source = source
        self.mirror_cache_bytes = mirror_cache_bytes
        # mirrors also read from peers (the first child of their quorum):
        # a base the source cannot read is still mirrored; digest lists
        # come from them first (a PeerDigests, or None: no peers)
        self.peers = peers
        # per image: held while its base is fetched or its mirror made
        self._fetch_locks = locks.Keyed()
        # per image: held by each export being prepared, claimed by prune
        self._uses = locks.Holds()

    # locks: no host-wide lock is held across the map source's I/O
    def _fetching(self, image_id):
        """While this thread fetches a base or makes its mirror files.

        Concurrent misses of one base wait here for the first one's fetch,
        then find the files made.
        """
        return self._fetch_locks(image_id)

    def hold(self, image_id, stack):
        """Keep an image's map and base files until ``stack`` is closed.

        :meth:`prune` leaves them alone meanwhile: an export being
        prepared outside the state lock holds the files it will read.
        """
        self._uses.hold(image_id, stack)

    def _claimed(self, image_id):
        """Whether the caller may delete an image's files now.

        True (held exclusively until the block ends) unless an export being
        prepared :meth:`hold` s them.
        """
        return self._uses.claimed(image_id)

    def drop_old_locks(self):
        """Remove the lock files of releases before the host API."""
        d = os.path.join(self.root, _OLD_LOCKS)
        for name in os.listdir(d) if os.path.isdir(d) else ():
            fileutils.unlink(os.path.join(d, name))
        with contextlib.suppress(OSError):
            os.rmdir(d)

    def mark_bootset_sent(self, image_id):
        fileutils.write_atomic(self.bootset_file(image_id) + _SENT, b'')

    def ensure_bootset(self, image_id):
        """The image's boot working set from the source, if it has one.

        Returns the file's path, or None. Call it holding the image's files
        (:meth:`hold`).
        """
        if not self.source.has_bootsets:
            return None
        return self._ensure_file(
            image_id, self.bootset_file(image_id), self.source.fetch_bootset,
            bootset_format.read, exception.BootsetFormatError,
            'boot working set to prefetch')

    def ensure_layout(self, image_id):
        """The image's block layout from the source, if it has one.

        Returns the file's path, or None. Call it holding the image's files
        (:meth:`hold`).
        """
        if not self.source.has_layouts:
            return None
        return self._ensure_file(
            image_id, self.layout_file(image_id), self.source.fetch_layout,
            layout_format.read, exception.LayoutFormatError,
            'block layout (its metadata is not kept warm)')

    @staticmethod
    def _ensure_file(image_id, path, fetch, read, invalid, what):
        """``path`` fetched and checked, unless the host has it already."""
        if os.path.exists(path):
            return path
        # several exports of the image may be prepared at once (the hold
        # is shared): each fetches into a file of its own
        tmp = fileutils.new_temp(path)
        try:
            fetch(image_id, tmp)
            read(tmp, image_id)
        except (exception.SourceError, invalid, OSError) as e:
            fileutils.unlink(tmp)
            LOG.info('image %s: no %s (%s)', image_id, what, e)
            return None
        fileutils.install(tmp, path)
        return path

    def _write_alternates(self, bmap):
        """Keep where ``bmap``'s image holds blocks of its mirrored bases.

        Needs a reader of the image itself (it may have no mirror); without
        one (the source cannot read it range by range) nothing is kept.
        """
        d = os.path.join(self.root, _MIRRORS)
        for t in bmap.targets:
            path = os.path.join(d, '%s%s%s.%d' % (
                t.image_id, _ALT, bmap.image_id, bmap.map_version))
            if (t.is_self or not self.is_mirror(t.image_id)
                    or os.path.exists(path)):
                continue
            data = alt_format.alternate(bmap, t.image_id)
            if data is None:
                continue
            if not self._ensure_reader(
                    mapformat.Target(bmap.image_id, bmap.virtual_size),
                    self.mirror(bmap.image_id)):
                return
            fileutils.write_atomic(path, data)

    def can_mirror(self):
        return self.source.can_mirror

    def fetch(self, func, *args):
        """``func(*args)`` of the map source; its failures are ExportErrors."""
        try:
            return func(*args)
        except exception.SourceError as e:
            raise exception.ExportError(str(e))

    def ensure(self, image_id, version, lazy=False, hold=None, whole=(),
               on_map=None):
        """Fetch a map version and its bases if missing; check them.

        ``lazy``: a missing base becomes an empty mirror, not a copy, if
        the source can fill mirrors (else, or without a digest list, the
        whole base is copied); bases in ``whole`` are copied even then.
        ``hold``: a :class:`contextlib.ExitStack`
        that keeps the files (:meth:`hold`) until it is closed. Returns
        the map (:class:`vmar_openstack.mapformat` reader's) and the
        :class:`Fetch` of each base copied now. ``on_map(map)`` is called
        once the map is read, before any base or mirror is made.
        """
        if hold is not None:
            self.hold(image_id, hold)
        path = self.map_file(image_id, version)
        if not os.path.exists(path):
            LOG.debug('fetching map v%d of %s from the map source', version,
                      image_id)
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
        if on_map is not None:
            on_map(bmap)
        fetched = []
        itself = mapformat.Target(image_id, bmap.virtual_size)
        for t in bmap.targets:
            if hold is not None and not t.is_self:
                self.hold(t.image_id, hold)
            base = self._whole(t.image_id)
            with self._fetching(t.image_id):
                if (not os.path.exists(base) and lazy and self.can_mirror()
                        and t.image_id not in whole
                        and self._ensure_mirror(
                            t, None if t.is_self else itself)):
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
        if lazy and self.can_mirror():
            self._write_alternates(bmap)
        return bmap, fetched

    def _ensure_mirror(self, target, via=None):
        """Make the mirror files of ``target`` if missing; False: cannot.

        The digest list comes first and is checked against the map's
        target, then the reader, then the present file, then the empty
        data file: the data file exists only with the other three.
        ``via``: the :class:`~vmar_openstack.mapformat.Target` of the
        map's own image, which holds the blocks the map reads from
        ``target``; with a reader of it the mirror does without one of its
        own (the base's data is gone from the source, say).
        """
        m = self.mirror(target.image_id)
        if os.path.exists(m.data):
            if not self._has_source(target, m, via):
                return False
            # used again: last in line for eviction
            with contextlib.suppress(FileNotFoundError):
                os.utime(m.present)
            return True
        os.makedirs(os.path.dirname(m.data), exist_ok=True)
        if os.path.exists(m.digests):
            hdr, _rows = mirror_format.read_digests(m.digests)
        else:
            hdr = self._fetch_digests(target, m.digests)
            if hdr is None:
                return False
        if not self._has_source(target, m, via):
            return False
        mirror_format.create_present(m.present, hdr)
        tmp = fileutils.write_temp(m.data, b'')
        os.truncate(tmp, hdr.size)
        fileutils.install(tmp, m.data)
        LOG.info('base %s: empty mirror of %d bytes created', hdr.image_id,
                 hdr.size)
        return True

    def ensure_digests(self, target):
        """The path of ``target``'s digest list, fetched if missing.

        Kept with the base's mirror files (a mirror made later uses it)
        and evicted with them. Call it holding the image (:meth:`hold`).

        :raises ExportError: the source has none.
        """
        m = self.mirror(target.image_id)
        if not os.path.exists(m.digests):
            os.makedirs(os.path.dirname(m.digests), exist_ok=True)
            if self._fetch_digests(target, m.digests) is None:
                raise exception.ExportError(
                    'no digest list of %s from the map source'
                    % target.image_id)
        return m.digests

    def _has_source(self, target, m, via):
        if self._ensure_reader(target, m):
            return True
        if via is not None and self._ensure_reader(
                via, self.mirror(via.image_id)):
            LOG.warning('base %s: mirrored from images that hold its '
                        'blocks only', target.image_id)
            return True
        if self.peers:
            # deleted in Glance, say: the hosts that hold it serve it
            LOG.warning('base %s: the store cannot serve it; mirrored from '
                        'the peers that hold it only', target.image_id)
            return True
        return False

    def _ensure_reader(self, target, m):
        """Keep where the source reads ``target``; False: it cannot.

        The description (:mod:`.readers`, never QEMU options) is kept with
        the mirror, so that a restarted daemon re-adds its nodes without
        asking the source (which may be unreachable then).
        """
        if os.path.exists(m.reader):
            return True
        try:
            reader = self.source.base_reader(target.image_id, target.size)
        except exception.SourceError as e:
            LOG.warning('base %s: cannot be read range by range (%s)',
                        target.image_id, e)
            return False
        fileutils.install(fileutils.write_temp(
            m.reader, json.dumps(readers.to_record(reader)).encode()),
            m.reader)
        return True

    def _fetch_digests(self, target, dest):
        """The source's digest list of ``target`` at ``dest``: its header.

        None if the source has none usable (the base is copied whole).
        """
        tmp = fileutils.new_temp(dest)
        try:
            if not self._digests_from_peers(target.image_id, tmp):
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

    def _digests_from_peers(self, image_id, dest):
        """Whether a peer's copy of the list, checked, is at ``dest``."""
        if self.peers is None or not self.source.has_digest_sums:
            return False
        try:
            sha = self.source.digests_sha256(image_id)
        except exception.SourceError:
            return False        # the store says why, next
        return self.peers.fetch(image_id, dest, sha)

    def prune(self, exports):
        """Delete maps and bases that no export in ``exports`` reads.

        A base file stays while any export's map reads from it, whatever
        happened to its image elsewhere (deleted in Glance, say).
        """
        maps = {names.map_file(e.image_id, e.map_version) for e in exports}
        bases = {tid for e in exports for tid, _s in e.targets}
        boots = {names.bootset_file(e.image_id) + suffix for e in exports
                 for suffix in ('', _SENT)}
        layouts = {names.layout_file(e.image_id) for e in exports}
        for sub, keep in ((_MAPS, maps), (_BASES, bases), (_BOOTSETS, boots),
                          (_LAYOUTS, layouts)):
            d = os.path.join(self.root, sub)
            for name in os.listdir(d) if os.path.isdir(d) else ():
                if name in keep or name.startswith('.'):
                    continue
                with self._claimed(name.split('.')[0]) as mine:
                    if not mine:
                        continue    # an export being prepared reads it
                    LOG.info('deleting unreferenced %s/%s', sub, name)
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(d, name))
        self._evict_mirrors(bases)

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
            with self._claimed(image_id) as mine:
                if mine:
                    self._evict(image_id, size, used)
                    used -= size
        if 0 < self.mirror_cache_bytes < used:
            LOG.warning('the mirrors exports read hold %d bytes, above the '
                        'mirror_cache_gb budget of %d', used,
                        self.mirror_cache_bytes)

    def _evict(self, image_id, size, used):
        LOG.info('evicting the unreferenced mirror of %s (%d bytes; '
                 'mirrors hold %d, mirror_cache_gb allows %d)',
                 image_id, size, used, self.mirror_cache_bytes)
        m = self.mirror(image_id)
        # the present bits go first: never bits without their data
        for path in (m.present, m.data, m.reader, m.digests):
            fileutils.unlink(path)
        for alt in glob.glob(glob.escape(m.data + _ALT) + '*'):
            fileutils.unlink(alt)


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
