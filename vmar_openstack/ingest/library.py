"""The image library: add, update and delete images (paper Fig. 7).

:class:`Library` fingerprints an image (outside any lock), then in one
locked transaction updates the cluster tables, works out which other
images' maps change, writes the new map versions atomically and records
them. Map files written by a transaction that does not commit are removed;
a killed process leaves at most unreferenced files, which ``vmar-manage
check`` reports.
"""

from concurrent import futures
import contextlib
import dataclasses
import hashlib
import os
import time
import types
import uuid

import numpy as np
from oslo_log import log as logging

from vmar_openstack import conf as vmar_conf
from vmar_openstack.db import api as db_api
from vmar_openstack.db import content_log as db_content_log
from vmar_openstack.db import digest_lists as db_digest_lists
from vmar_openstack.db import session as db_session
from vmar_openstack.db import store as db_store
from vmar_openstack import exception
from vmar_openstack import fileutils
from vmar_openstack import fingerprint
from vmar_openstack.fingerprint import classify
from vmar_openstack.fingerprint import introspect
from vmar_openstack.fingerprint import keys as fp_keys
from vmar_openstack.ingest import ahead as ingest_ahead
from vmar_openstack.ingest import paths
from vmar_openstack import mapformat
from vmar_openstack.mapformat import bootset as bootset_format
from vmar_openstack.mapformat import delta as delta_format
from vmar_openstack.mapformat import layout as layout_format
from vmar_openstack.mapformat import mirror as mirror_format
from vmar_openstack import mapgen
from vmar_openstack import names

LOG = logging.getLogger(__name__)

# what a locked transaction changes (Library._mutation)
ADD, OTHER = db_content_log.ADD, db_content_log.OTHER


@dataclasses.dataclass
class Outcome:
    image_id: str
    seq: int
    map_version: int
    regenerated: dict          # image id -> new map version, other images
    shared_fraction: float = 0.0
    pending: int = 0           # other maps left for vmar-agent to rewrite


@dataclasses.dataclass
class _Left:
    """The maps of other images a change left pending, to rewrite after.

    ``seqs``: their images; ``deadline``: ``time.monotonic()`` at which
    the change stops rewriting them (``[vmar] rewrite_seconds`` after it
    began to write maps); ``own``: the change wrote its image's own map
    first, so that none is rewritten once ``deadline`` is past.
    """

    cause: str
    seqs: list
    deadline: float
    own: bool


def _check_uuid(image_id):
    try:
        return str(uuid.UUID(image_id))
    except (ValueError, TypeError, AttributeError):
        raise ValueError('%r is not an image id (UUID)' % (image_id,))


def _content_id(fps):
    h = hashlib.sha256(b'%s/%d/%d/' % (fps.algorithm.encode(),
                                       fps.block_size, fps.virtual_size))
    h.update(np.ascontiguousarray(fps.digests).data)
    return h.hexdigest()


class Library:
    """The image library described by one configuration."""

    def __init__(self, conf=None):
        self.conf = conf or vmar_conf.CONF
        self.lists = db_digest_lists.DigestLists(self.conf)

    # -- public operations -------------------------------------------------

    def add(self, image_id, path, disk_format='raw', owner=None,
            visibility='private', expected_size=None, progress=None,
            keep_base=True, on_map_written=None):
        """Ingest a new image; an id already in the library is refused.

        ``on_map_written(image_id, version, path, sha256)``, if given, is
        called once the image's new map file is written, before the
        transaction commits (so that a publisher can start work that
        overlaps the commit). The version may still fail to commit.
        """
        image_id = _check_uuid(image_id)
        if visibility not in db_api.VISIBILITIES:
            raise ValueError('visibility must be one of %s'
                             % ', '.join(db_api.VISIBILITIES))
        with db_session.reader(self.conf) as s:
            existing = db_api.get_image(s, image_id)
            if existing is not None:
                raise exception.ImageExists(
                    'image %s is already in the library (seq %d, map v%d); '
                    'use update to change it' % (
                        existing.image_id, existing.seq,
                        existing.map_version))
        ahead = ingest_ahead.Ahead(self.conf, self.conf.vmar.hash_algorithm,
                                   self.conf.vmar.block_size)
        try:
            fps, raw_placed = self._fingerprint(
                image_id, path, disk_format, expected_size, progress,
                keep_base, ahead=ahead)
            try:
                return self._commit_add(image_id, fps, disk_format, owner,
                                        visibility, on_map_written, ahead)
            except BaseException:
                if raw_placed:
                    self._unplace(image_id)
                raise
        finally:
            ahead.close()

    def add_delta(self, image_id, delta, owner=None, visibility='private',
                  parent_rows=None):
        """Ingest a snapshot from its parent's entry and its delta.

        ``delta``: the :class:`~vmar_openstack.mapformat.delta.Delta`
        whose data blocks the caller has checked against their digests,
        and the parent's other blocks against ``parent_rows`` (the
        parent's digests, :meth:`delta_parent`, read again if not given):
        :mod:`vmar_openstack.glance_hooks.assemble` does both as it
        builds the image. Only the delta's blocks were hashed: every other
        block's digest is the parent's. The parent's block layout and boot
        working set are the snapshot's too (the delta's blocks are not
        classified again). Returns the :class:`Outcome`.

        :raises ImageNotFound: the parent is not in the library.
        :raises ImageRejected: the parent's entry cannot describe it.
        """
        image_id = _check_uuid(image_id)
        hdr = delta.header
        if visibility not in db_api.VISIBILITIES:
            raise ValueError('visibility must be one of %s'
                             % ', '.join(db_api.VISIBILITIES))
        if self.has_image(image_id):
            raise exception.ImageExists(image_id=image_id)
        rows = (self.delta_parent(delta) if parent_rows is None
                else parent_rows)
        digests = np.zeros((hdr.n_blocks, rows.shape[1]), np.uint8)
        digests[:len(rows)] = rows
        digests[delta.zero_blocks.astype(np.intp)] = 0
        digests[delta.data_blocks.astype(np.intp)] = delta.digests
        fps = fingerprint.Fingerprints(delta_format.ALGORITHM, hdr.block_size,
                                       hdr.virtual_size, digests)
        self._derive_files(hdr.parent_id, image_id, hdr.virtual_size)
        try:
            return self.add_fingerprints(image_id, fps, owner=owner,
                                         visibility=visibility)
        except BaseException:
            self._unplace(image_id)
            raise

    def add_fingerprints(self, image_id, fps, disk_format='raw', owner=None,
                         visibility='private', on_map_written=None):
        """Ingest an image from its :class:`Fingerprints`, hashed already.

        No file is read or kept: no base copy, block layout or boot set
        (a snapshot's delta, :meth:`add_delta`; a bench's synthetic
        stream). Otherwise as :meth:`add`.
        """
        image_id = _check_uuid(image_id)
        if visibility not in db_api.VISIBILITIES:
            raise ValueError('visibility must be one of %s'
                             % ', '.join(db_api.VISIBILITIES))
        if self.has_image(image_id):
            raise exception.ImageExists(image_id=image_id)
        ahead = ingest_ahead.Ahead(self.conf, fps.algorithm, fps.block_size)
        try:
            ahead.expect(fps.n_blocks)
            return self._commit_add(image_id, fps, disk_format, owner,
                                    visibility, on_map_written, ahead)
        finally:
            ahead.close()

    def delta_parent(self, delta):
        """The digests of a delta's parent, ``(n, 32)`` uint8.

        :raises ImageNotFound: the parent is not in the library.
        :raises ImageRejected: its entry is of another block size,
            algorithm or size than the delta says.
        """
        hdr = delta.header
        with db_session.reader(self.conf) as s:
            store = db_store.ClusterStore(s)
            parent = self._get(store, hdr.parent_id)
            if (parent.algorithm, parent.block_size, parent.virtual_size) != (
                    delta_format.ALGORITHM, hdr.block_size, hdr.parent_size):
                raise exception.ImageRejected(
                    reason='the delta describes %s %d-byte blocks of %d '
                    'bytes of %s; the library holds %s %d-byte blocks of %d'
                    % (delta_format.ALGORITHM, hdr.block_size,
                       hdr.parent_size, hdr.parent_id, parent.algorithm,
                       parent.block_size, parent.virtual_size))
            return store.load_digests(parent)

    def _derive_files(self, parent_id, image_id, size):
        """The parent's layout and boot set, as the snapshot's."""
        for read, fmt, path in (
                (self.layout, layout_format, paths.layout_path),
                (self.bootset, bootset_format, paths.bootset_path)):
            data = read(parent_id)
            if data is not None:
                fileutils.write_atomic(
                    path(self.conf, image_id),
                    fmt.for_image(data, parent_id, image_id, size),
                    mode=0o444)

    def update_content(self, image_id, path, disk_format='raw',
                       expected_size=None, progress=None, keep_base=True):
        """Replace an image's content, keeping its sequence id (Fig. 7)."""
        image_id = _check_uuid(image_id)
        fps, _placed = self._fingerprint(image_id, path, disk_format,
                                         expected_size, progress, keep_base)
        ref = self.lists.put(fps.digests)
        return self._rewrite_after(*self._replace_content(
            image_id, fps, disk_format, ref, self._holders_of(image_id)))

    @db_session.retry_conflicts()
    def _replace_content(self, image_id, fps, disk_format, ref, holders):
        with self._mutation(OTHER) as (store, written):
            img = self._get(store, image_id)
            old = store.load_digests(img)
            old_keys = fp_keys.image_key_set(img, old)
            affected = self._affected(store, img, old)
            store.use_holders(holders)
            store.remove_keys(img.seq, old_keys)
            self._fill_image(img, fps, disk_format)
            self.lists.ensure(ref, fps.digests)
            store.record_digests(img, ref)
            store.add_keys(img.seq, fp_keys.image_key_set(img, fps.digests),
                           img.visibility == 'public')
            store.flush()
            affected |= self._affected(store, img, fps.digests)
            return self._regenerate(store, written, img, affected)

    def update_metadata(self, image_id, owner=None, visibility=None):
        """Change owner and/or visibility: an update for dedup scope."""
        image_id = _check_uuid(image_id)
        if visibility is not None and visibility not in db_api.VISIBILITIES:
            raise ValueError('visibility must be one of %s'
                             % ', '.join(db_api.VISIBILITIES))
        return self._rewrite_after(*self._update_metadata(
            image_id, owner, visibility))

    @db_session.retry_conflicts()
    def _update_metadata(self, image_id, owner, visibility):
        with self._mutation(OTHER) as (store, written):
            img = self._get(store, image_id)
            digests = store.load_digests(img)
            affected = self._affected(store, img, digests)
            was_public = img.visibility == 'public'
            if owner is not None:
                img.owner = owner
            if visibility is not None:
                img.visibility = visibility
            store.flush()
            store.refresh_smallest(store.clusters_of_image(img, digests))
            if was_public and img.visibility != 'public':
                store.recover_uncovered(img, digests)
            affected |= self._affected(store, img, digests)
            return self._regenerate(store, written, img, affected)

    def delete(self, image_id):
        """Remove an image; regenerate the maps that pointed into it."""
        image_id = _check_uuid(image_id)
        return self._rewrite_after(*self._delete(
            image_id, self._holders_of(image_id)))

    @db_session.retry_conflicts()
    def _delete(self, image_id, holders):
        with self._mutation(OTHER) as (store, written):
            img = self._get(store, image_id)
            digests = store.load_digests(img)
            affected = self._affected(store, img, digests)
            store.use_holders(holders)
            store.remove_keys(img.seq, fp_keys.image_key_set(img, digests))
            old_versions = store.delete_image(img)
            _versions, left = self._pend_others(store, written, img,
                                                affected)
        for v in old_versions:
            fileutils.unlink(paths.map_path(self.conf, image_id, v))
        self._unplace(image_id)
        return Outcome(image_id, 0, 0, {}), left

    @db_session.retry_conflicts()
    def drop_map_version(self, image_id, version):
        """Remove a map version that is no longer current.

        Its record and its file go. Returns whether there was one.
        """
        image_id = _check_uuid(image_id)
        with self._mutation() as (store, _written):
            dropped = store.delete_map_version(image_id, version)
        if dropped:
            fileutils.unlink(paths.map_path(self.conf, image_id, version))
        return dropped

    def bases_of(self, image_id, version):
        """Image ids of the bases a map version reads (its map file's)."""
        path = paths.map_path(self.conf, image_id, version)
        try:
            return {t.image_id for t in mapformat.read(path).targets}
        except FileNotFoundError:
            return set()

    def has_image(self, image_id):
        return self.virtual_size(image_id) is not None

    def virtual_size(self, image_id):
        """An image's virtual size, None if it is not in the library."""
        with db_session.reader(self.conf) as s:
            img = db_store.ClusterStore(s).get_image(image_id)
            return None if img is None else img.virtual_size

    def superseded(self):
        """The map versions that are not current (``Superseded`` rows)."""
        with db_session.reader(self.conf) as s:
            return db_store.ClusterStore(s).superseded_map_versions()

    @db_session.retry_conflicts()
    def remap(self, image_id):
        """Write a new map version of an image from the tables.

        For a host that lost a map file (the versions are immutable, so a
        lost one is replaced by a new one, never rewritten). Returns it.
        """
        image_id = _check_uuid(image_id)
        with self._mutation() as (store, written):
            img = self._get(store, image_id)
            return self._write_maps(store, {img.seq}, written)[image_id]

    @db_session.retry_conflicts()
    def collect_digest_lists(self, min_age):
        """Remove the digest list objects no image has named ``min_age`` s.

        Those of deleted images, of replaced content, of adds that did not
        commit. Under the library lock (:meth:`DigestLists.ensure`).
        Returns how many went.
        """
        with self._mutation() as (store, _written):
            gone = self.lists.collect(store.digest_locations(), min_age)
        if gone:
            LOG.info('removed %d digest lists no image names', len(gone))
        return len(gone)

    def move_digest_lists(self, progress=None):
        """Move the lists of before revision 0023 out of the tables.

        One image per transaction, none of them locked: a move killed
        half way goes on where it stopped when run again. ``progress(n,
        image id)`` after each. Returns how many were moved.
        """
        moved = 0
        while True:
            with db_session.reader(self.conf) as s:
                batch = [(i.seq, i.image_id, i.n_blocks, i.algorithm)
                         for i in db_store.ClusterStore(s).images_to_move(64)]
            if not batch:
                return moved
            for seq, image_id, n_blocks, algorithm in batch:
                moved += self._move_one(seq, image_id, n_blocks, algorithm)
                if progress:
                    progress(moved, image_id)

    @db_session.retry_conflicts()
    def _move_one(self, seq, image_id, n_blocks, algorithm):
        dsize = fingerprint.DIGEST_SIZES[algorithm]
        with db_session.reader(self.conf) as s:
            raw = db_store.ClusterStore(s).unmoved_digests(seq)
        if len(raw) != n_blocks * dsize:
            raise exception.LibraryInconsistent(
                what='digest list of image %s has %d bytes, expected %d'
                % (image_id, len(raw), n_blocks * dsize))
        ref = self.lists.put(np.frombuffer(raw, np.uint8).reshape(
            n_blocks, dsize))
        with db_session.writer(self.conf) as s:
            return int(db_store.ClusterStore(s).moved_digests(seq, ref))

    @db_session.retry_conflicts()
    def backfill_map_targets(self):
        """Record the per-target counts of current maps written without.

        Maps written before the counts existed (revision 0010) are read
        from their files. Returns ``(recorded, missing)``: how many maps
        got their counts, and the ``(image id, version)`` whose file is
        gone or unreadable (``remap`` writes them a new version).
        """
        recorded, missing = 0, []
        with self._mutation() as (store, _written):
            for seq, image_id, version in \
                    store.map_versions_without_targets():
                path = paths.map_path(self.conf, image_id, version)
                try:
                    bmap = mapformat.read(path)
                except (OSError, exception.MapFormatError) as e:
                    LOG.warning('map v%d of %s: no block counts (%s)',
                                version, image_id, e)
                    missing.append((image_id, version))
                    continue
                store.record_map_targets(seq, version, mapformat.target_blocks(
                    bmap.targets, bmap.extents))
                recorded += 1
        return recorded, missing

    # -- helpers -----------------------------------------------------------

    def _holders_of(self, image_id):
        """What the promotions of an image's shadows read, before the lock.

        The digest list of each image that shadows it, read from a
        snapshot (:meth:`ClusterStore.holders_of`), for a change that
        removes its keys (:meth:`ClusterStore.use_holders`).
        """
        with db_session.reader(self.conf) as s:
            store = db_store.ClusterStore(s)
            return store.holders_of(self._get(store, image_id))

    @contextlib.contextmanager
    def _mutation(self, content=None):
        """One locked transaction; map files it wrote go if it fails.

        Yields its :class:`ClusterStore` and the list of map files written.
        ``content``: the transaction changes the clusters, as an add
        (:data:`ADD`: through one ``add_keys``) or otherwise
        (:data:`OTHER`); it counts in the content generation, and its
        change is logged (:mod:`vmar_openstack.db.content_log`). None:
        it changes map versions only.
        """
        written = []
        try:
            with db_session.locked_writer(
                    self.conf, content=content is not None) as s:
                store = db_store.ClusterStore(s)
                yield store, written
                if content is not None:
                    store.log_content_change(add=content == ADD)
        except BaseException:
            self._unlink_unrecorded(written)
            raise
        if content is not None:
            self._compact_after_change()

    def _unlink_unrecorded(self, written):
        """Remove the map files of a failed transaction no commit records.

        On Galera two writers can both hold the library lock until one's
        commit fails; the one that failed must not remove the file of a
        map version the other committed (the same name, the same data).
        If the database cannot tell, the files stay (an unrecorded map
        file is harmless; ``vmar-manage check`` names it).
        """
        if not written:
            return
        named = [names.parse_map_file(os.path.basename(p)) for p in written]
        try:
            with db_session.reader(self.conf) as s:
                recorded = db_store.ClusterStore(s).recorded_map_versions(
                    [n for n in named if n is not None])
        except Exception as e:
            LOG.warning('keeping %d map files of a failed transaction: %s',
                        len(written), e)
            return
        for p, n in zip(written, named):
            if n not in recorded:
                fileutils.unlink(p)

    def _compact_after_change(self):
        # the change is committed: a failed compaction is left for the
        # next one (vmar-agent's pass, or the next change)
        try:
            self.compact()
        except Exception as e:
            LOG.warning('compacting the fingerprint index failed (left '
                        'for later): %s', e)

    def compact(self, max_seconds=None):
        """Write the fingerprint index's runs and overrides into its rows.

        Outside the library lock, one short transaction per step
        (:mod:`vmar_openstack.db.bulk`); a killed compaction loses only
        its current step. ``max_seconds``: stop after the first step past
        this long. Returns the steps done.
        """
        start = time.monotonic()
        steps = 0
        while self._compact_step():
            steps += 1
            if max_seconds is not None and (
                    time.monotonic() - start > max_seconds):
                break
        return steps

    @db_session.retry_conflicts()
    def _compact_step(self):
        with db_session.writer(self.conf) as s:
            return db_store.ClusterStore(s).compact_step()

    def digest_list(self, image_id):
        """The base's digest list, bytes.

        As ``doc/source/reference/mirror-format.rst`` specifies it. None
        when the library hashes with another algorithm than mirrors check
        (hosts then copy the base whole).
        """
        fps = self.fingerprints(image_id)
        if fps.algorithm != mirror_format.ALGORITHM:
            return None
        return mirror_format.digests_bytes(image_id, fps)

    def fingerprints(self, image_id):
        """The image's :class:`Fingerprints` in the library."""
        with db_session.reader(self.conf) as s:
            store = db_store.ClusterStore(s)
            img = self._get(store, image_id)
            return fingerprint.Fingerprints(img.algorithm, img.block_size,
                                            img.virtual_size,
                                            store.load_digests(img))

    def _get(self, store, image_id):
        img = store.get_image(image_id)
        if img is None:
            raise exception.ImageNotFound(image_id=image_id)
        return img

    def _fingerprint(self, image_id, path, disk_format, expected_size,
                     progress, keep_base, ahead=None):
        c = self.conf.vmar
        with fingerprint.checked_raw_view(
                path, disk_format, qemu_img=c.qemu_img, work_dir=c.work_dir,
                expected_size=expected_size,
                max_virtual_size=c.max_virtual_size_gb << 30) as raw:
            if ahead is not None:
                ahead.expect(-(-raw.virtual_size // c.block_size))
            # the file systems are read (by debugfs, xfs_db: processes of
            # their own) while the blocks are hashed, the layout and the
            # boot files at once; leaving the block waits for all, so a
            # failure leaves no reader behind
            with futures.ThreadPoolExecutor(
                    2, thread_name_prefix='vmar-introspect') as pool:
                lay = pool.submit(classify.classify, raw.path,
                                  raw.virtual_size, c.block_size, image_id)
                boot = pool.submit(introspect.boot_blocks, raw.path,
                                   raw.virtual_size, c.block_size)
                fps = fingerprint.hash_file(
                    raw.path, raw.virtual_size, c.block_size,
                    c.hash_algorithm, c.hash_workers, progress,
                    on_chunk=ahead.chunk if ahead else None)
                placed = False
                if keep_base:
                    dest = paths.base_path(self.conf, image_id)
                    if os.path.realpath(raw.path) != os.path.realpath(dest):
                        fileutils.copy_readonly(raw.path, dest)
                        placed = True
                    self._write_digests(image_id, fps)
            self._write_layout(image_id, lay.result())
            self._write_bootset(image_id, raw.virtual_size, boot.result(),
                                lay.result())
        return fps, placed

    def _write_digests(self, image_id, fps):
        """The digest list hosts check lazily fetched blocks against."""
        path = paths.digests_path(self.conf, image_id)
        if fps.algorithm != mirror_format.ALGORITHM:
            LOG.info('image %s: no digest list for lazy mirrors (they '
                     'check %s, the library hashes with %s)', image_id,
                     mirror_format.ALGORITHM, fps.algorithm)
            fileutils.unlink(path)
            return
        fileutils.write_atomic(path, mirror_format.digests_bytes(image_id,
                                                                 fps),
                               mode=0o444)

    def _write_bootset(self, image_id, size, blocks, lay):
        """The blocks its file systems say a boot reads (hosts prefetch).

        ``blocks`` are the boot files' (:func:`introspect.boot_blocks`);
        the metadata skeleton of the layout ``lay`` joins them.
        """
        bs = self.conf.vmar.block_size
        runs = bootset_format.merge(introspect.with_skeleton(blocks, lay))
        dest = paths.bootset_path(self.conf, image_id)
        if not runs:
            LOG.info('image %s: no boot files found; no boot working set',
                     image_id)
            fileutils.unlink(dest)
            return
        fileutils.write_atomic(dest, bootset_format.encode(
            bootset_format.Bootset(image_id, size, bs, 'introspected',
                                   tuple(runs))), mode=0o444)
        LOG.info('image %s: boot working set of %d blocks in %d runs',
                 image_id, sum(n for _f, n in runs), len(runs))

    def _write_layout(self, image_id, lay):
        """What each block is, by its file systems (hosts keep some warm)."""
        fileutils.write_atomic(paths.layout_path(self.conf, image_id),
                               layout_format.encode(lay), mode=0o444)

    def bootset(self, image_id):
        """The image's boot working set file, bytes; None if it has none."""
        return self._library_file(paths.bootset_path(self.conf, image_id))

    def layout(self, image_id):
        """The image's block layout file, bytes; None if it has none."""
        return self._library_file(paths.layout_path(self.conf, image_id))

    @staticmethod
    def _library_file(path):
        try:
            with open(path, 'rb') as f:
                return f.read()
        except FileNotFoundError:
            return None

    def _unplace(self, image_id):
        fileutils.unlink(paths.base_path(self.conf, image_id))
        fileutils.unlink(paths.digests_path(self.conf, image_id))
        fileutils.unlink(paths.bootset_path(self.conf, image_id))
        fileutils.unlink(paths.layout_path(self.conf, image_id))

    def _fill_image(self, img, fps, disk_format):
        img.disk_format = disk_format
        img.virtual_size = fps.virtual_size
        img.block_size = fps.block_size
        img.algorithm = fps.algorithm
        img.space_key = fp_keys.space_key(fps.algorithm, fps.block_size)
        img.n_blocks = fps.n_blocks
        img.zero_blocks = int(fps.zero_mask.sum())
        img.content_sha256 = _content_id(fps)

    # Times an add whose snapshot went stale leaves the lock to refresh it,
    # before it refreshes it under the lock (another add touching its
    # blocks each time: a stream of uploads of one family, fast).
    STALE_REFRESHES = 3

    def _commit_add(self, image_id, fps, disk_format, owner, visibility,
                    on_map_written, ahead):
        desc = types.SimpleNamespace(image_id=image_id, owner=owner,
                                     visibility=visibility, state='active',
                                     map_version=0)
        self._fill_image(desc, fps, disk_format)
        ahead.start_map(desc, fps.digests, self.conf.vmar.dedup_scope,
                        paths.map_path(self.conf, image_id, 1))
        # the digest list's object, written before the lock
        ref = self.lists.put(fps.digests)

        # A conflict (deadlock, Galera certification failure) undid the
        # whole transaction and removed the maps it wrote: run it again.
        # A prepared map serves one attempt only (that attempt installed,
        # and so used up, the map file: Ahead.map_used).
        @db_session.retry_conflicts()
        def commit(may_leave):
            return self._commit_add_once(image_id, fps, ref, desc,
                                         on_map_written, ahead,
                                         not ahead.map_used, may_leave)
        # the map's build and the changes' read before the lock, the
        # build first: the later the read, the less the lock's own
        for _attempt in range(self.STALE_REFRESHES):
            ahead.wait_map()
            ahead.read_changes()
            try:
                return commit(True)
            except ingest_ahead.StaleSnapshot as stale:
                LOG.debug('image %s: %s; refreshing the snapshot outside '
                          'the library lock', image_id, stale)
                ahead.refresh()
        ahead.wait_map()
        ahead.read_changes()
        return commit(False)

    def _commit_add_once(self, image_id, fps, ref, desc, on_map_written,
                         ahead, fresh_map, may_leave):
        """The locked transaction of an add.

        If changes of the clusters committed since the snapshot change the
        image's map (:meth:`Ahead.check`), it leaves at once (``may_leave``:
        :class:`StaleSnapshot`, nothing written) or builds the map under
        the lock. The keys they moved or inserted are looked up again;
        the others' answers stand.
        """
        with self._mutation(ADD) as (store, written):
            if store.get_image(image_id) is not None:
                raise exception.ImageExists('image %s was added concurrently'
                                            % image_id)
            found, stale = ahead.check(store, with_map=fresh_map)
            # a map a conflicted attempt installed is used up
            stale = stale or not fresh_map
            if stale and may_leave:
                raise ingest_ahead.StaleSnapshot()
            if stale:
                LOG.debug('image %s: the library changed while it was '
                          'hashed; building its map under the lock',
                          image_id)
            img = store.add_image(**vars(desc))
            self.lists.ensure(ref, fps.digests)
            store.record_digests(img, ref)
            new, new_filter, grouped = ahead.new_keys(found)
            known = store.add_keys(img.seq, ahead.keys,
                                   img.visibility == 'public', found=found,
                                   new=new, new_filter=new_filter,
                                   grouped=grouped)
            store.flush()
            # The new image has the largest sequence id, so it is never the
            # smallest candidate of another image: no other map changes.
            built = None if stale else ahead.map_result()
            if built is None:
                order = np.argsort(known[0])
                known = (known[0][order], known[1][order])
            outcome, _none = self._regenerate(
                store, written, img, set(), known={img.seq: known},
                digests={img.seq: fps.digests}, on_written=on_map_written,
                built=None if built is None else {img.seq: built})
            return outcome

    def _affected(self, store, img, digests=None):
        """Other images whose canonical target is ``img`` for some cluster.

        Called before and after a change; the union of both answers is the
        set of maps the change can alter (paper Fig. 7, update_list).
        A member's canonical target is its smallest allowed member (itself
        at worst), so only the members after ``img`` can have it, and only
        when none of the members before it is allowed: the work is linear
        in the members, however many a cluster has. A cluster's shadow
        holders read from its members as its members after them do.
        """
        scope = self.conf.vmar.dedup_scope
        ids = store.clusters_of_image(img, digests)
        members = store.member_lists(ids)
        for cid, sh in store.shadows_of(ids).items():
            members[cid] = np.union1d(members[cid], sh)
        seqs = set()
        for m in members.values():
            seqs.update(m.tolist())
        imgs = store.images_by_seq(seqs)
        imgs[img.seq] = img
        out = set()
        for m in members.values():
            before = [imgs[t] for t in m[m < img.seq].tolist() if t in imgs]
            for y in m[m > img.seq].tolist():
                if y in out or y not in imgs:
                    continue
                src = imgs[y]
                if mapgen.may_redirect(src, img, scope) and not any(
                        mapgen.may_redirect(src, t, scope) for t in before):
                    out.add(y)
        return out

    def _pend_others(self, store, written, img, affected, first=(),
                     **kwargs):
        """Write the maps of ``first``; leave those of ``affected`` pending.

        In the change's locked transaction: the maps of the other images
        ``affected`` are recorded pending, with ``img`` as their cause, and
        the change rewrites some after its commit, outside the lock
        (:meth:`_rewrite_after`). ``kwargs`` go to :meth:`_write_maps`.
        Returns ``({image id: new map version} of first, _Left)``.
        """
        deadline = time.monotonic() + self.conf.vmar.rewrite_seconds
        first = list(first)
        versions = (self._write_maps(store, first, written, **kwargs)
                    if first else {})
        others = sorted(set(affected) - {img.seq} - set(first))
        if others:
            store.pend_maps(others, img.image_id)
        return versions, _Left(img.image_id, others, deadline, bool(first))

    def _regenerate(self, store, written, img, affected, known=None,
                    digests=None, on_written=None, built=None):
        """The image's own map; the others' left for :meth:`_rewrite_after`.

        Returns ``(Outcome, _Left)``.
        """
        versions, left = self._pend_others(
            store, written, img, affected, first=[img.seq], known=known,
            digests=digests, on_written=on_written, built=built)
        version = versions.pop(img.image_id)
        LOG.info('image %s: map v%d', img.image_id, version)
        shared = img.n_blocks - img.zero_blocks
        frac = (img.redirected_blocks / shared) if shared else 0.0
        return Outcome(img.image_id, img.seq, version, versions, frac,
                       pending=len(left.seqs)), left

    def _rewrite_after(self, outcome, left):
        """Rewrite maps a committed change left pending, outside the lock.

        At most ``[vmar] rewrite_at_once`` of them, those some host
        exports first, and none after the first map built past ``[vmar]
        rewrite_seconds`` (counted from the change's first map): built in
        a snapshot, installed in a short locked transaction, as vmar-agent
        does (:meth:`rewrite_pending`). The others stay pending for the
        agent; so do these if their rewrite fails (the change stands).
        Returns ``outcome``, with them.
        """
        limit = self.conf.vmar.rewrite_at_once
        done = {}
        if (left.seqs and limit
                and not (left.own and time.monotonic() >= left.deadline)):
            try:
                done = self._rewrite_pending(limit, left.deadline,
                                             among=left.seqs)
            except Exception as e:
                LOG.warning('image %s: rewriting the maps of other images '
                            'after its change failed (left for vmar-agent): '
                            '%s', left.cause, e)
        outcome.regenerated.update(done)
        outcome.pending = len(left.seqs) - len(done)
        if done:
            LOG.info('image %s: %d maps of other images regenerated',
                     left.cause, len(done))
        if outcome.pending:
            LOG.info('image %s: %d maps of other images left for vmar-agent '
                     'to rewrite ([vmar] rewrite_at_once = %d, '
                     'rewrite_seconds = %g)', left.cause, outcome.pending,
                     limit, self.conf.vmar.rewrite_seconds)
        return outcome

    def rewrite_pending(self, limit, seconds=None):
        """Rewrite up to ``limit`` pending maps, oldest first.

        ``seconds``: stop after the first map built past this long.
        Returns ``{image id: new map version}``. The maps are built in a
        snapshot, and the locked transaction installs them
        (:class:`~vmar_openstack.ingest.ahead.Rewrites`); if a change other
        than an add committed meanwhile, they are built again, outside the
        lock, and at the last try under it. Takes the lock only when some
        map is pending: an ingest beside an idle pass keeps its lookups
        (the lock's generation does not move).
        """
        with db_session.reader(self.conf) as s:
            if not db_store.ClusterStore(s).pending_count():
                return {}
        return self._rewrite_pending(
            limit, None if seconds is None else time.monotonic() + seconds)

    @db_session.retry_conflicts()
    def _rewrite_pending(self, limit, deadline, among=None):
        """:meth:`rewrite_pending` until ``deadline``, of images ``among``.

        ``among``: those of these images' maps only (all if None).
        """
        for _attempt in range(self.STALE_REFRESHES):
            rewrites = ingest_ahead.Rewrites.prepare(self.conf, limit,
                                                     deadline, among)
            try:
                with self._mutation() as (store, written):
                    if rewrites.stand(store):
                        return self._write_maps(
                            store, rewrites.usable(store), written,
                            built=rewrites.maps)
            finally:
                rewrites.discard()
            LOG.debug('pending maps: a change of the clusters since their '
                      'snapshot; building them again outside the lock')
        with self._mutation() as (store, written):
            seqs = [p.seq for p in store.pending_maps(limit, among)]
            return self._write_maps(store, seqs, written, deadline=deadline)

    def pending_maps(self):
        """The maps left pending: :class:`db.store.Pending` rows."""
        with db_session.reader(self.conf) as s:
            return db_store.ClusterStore(s).pending_maps()

    def _write_maps(self, store, seqs, written, known=None, digests=None,
                    on_written=None, built=None, deadline=None):
        """Write and record a new map version of each image in ``seqs``.

        ``built`` holds maps already built, by seq (see :mod:`ahead`).
        ``deadline`` (``time.monotonic()``): stop after the first map
        written past it. Written in the order of ``seqs`` if a list, else
        ascending.
        """
        resolver = mapgen.Resolver(store, self.conf.vmar.dedup_scope,
                                   digests=digests)
        known = known or {}
        out, done = {}, []
        imgs = store.images_by_seq(seqs)
        for seq in seqs if isinstance(seqs, list) else sorted(seqs):
            image = imgs[seq]
            version = image.map_version + 1
            path = paths.map_path(self.conf, image.image_id, version)
            pre = (built or {}).get(seq)
            if pre is not None and pre.version == version:
                result, size, sha = pre.result, pre.size, pre.sha256
                fileutils.install(pre.tmp_path, path)
            else:
                result = resolver.build(image, known.get(seq))
                data = mapformat.encode(
                    image.image_id, image.virtual_size, image.block_size,
                    version, result.targets, result.extents)
                mapformat.write_atomic(path, data)
                size, sha = len(data), hashlib.sha256(data).hexdigest()
            written.append(path)
            store.record_map_version(
                seq, version, size, sha, len(result.extents),
                mapformat.target_blocks(result.targets, result.extents))
            if on_written:
                on_written(image.image_id, version, path, sha)
            image.map_version = version
            image.redirected_blocks = result.redirected_blocks
            image.n_extents = len(result.extents)
            out[image.image_id] = version
            done.append(seq)
            if deadline is not None and time.monotonic() >= deadline:
                break
        store.clear_pending(done)
        store.flush()
        return out
