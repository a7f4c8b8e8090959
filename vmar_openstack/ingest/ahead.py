"""Work an ingest does before it takes the library lock.

While an image is being hashed, its fingerprint keys are looked up in a
read snapshot of the library, chunk by chunk, as the hashing threads
finish them; or, when the fingerprint table is small against the image,
the first chunk reads the whole table and the keys are found in it once
the image is hashed. Then its map is built from the same snapshot: for a
large image in a thread of its own, while the locked transaction updates
the cluster tables; for a small one before the lock is taken.

A new image has the largest sequence id, so its map depends only on the
clusters as they were before it joined them: the snapshot is enough while
the clusters are as it saw them. Every locked transaction that changes
them increments the lock row's content generation
(:func:`vmar_openstack.db.session.locked_writer`); map rewrites, GC and
publishes do not. When the locked transaction finds the content
generation moved, :meth:`Ahead.check` reads what the changes were
(:mod:`vmar_openstack.db.content_log`) and finds which of the image's keys
they touched, with no lookup per key: most often none (the adds since
share no block with it), and the snapshot's answers and map stand.
Otherwise the transaction leaves the lock (:class:`StaleSnapshot`), and
:meth:`Ahead.refresh` looks those keys up again in a new snapshot and
builds the map again, outside the lock.

vmar-agent's pass of the maps a change left pending
(:meth:`Library.rewrite_pending`) builds them the same way
(:class:`Rewrites`): in a snapshot, then the locked transaction installs
them. An add changes no other image's map, so they stand while every
change committed since was an add; after any other (an update, a
delete), the pass leaves the lock and builds them again.
"""

import dataclasses
import hashlib
import threading
import time
import types

import numpy as np

from vmar_openstack.db import content_log as db_content_log
from vmar_openstack.db import session as db_session
from vmar_openstack.db import store as db_store
from vmar_openstack import fileutils
from vmar_openstack import fingerprint
from vmar_openstack.fingerprint import keyfilter
from vmar_openstack.fingerprint import keys as fp_keys
from vmar_openstack.ingest import paths
from vmar_openstack import mapformat
from vmar_openstack import mapgen

# A sequence id above any real one: the map of a new image built before
# the image has its id. Maps name targets by image id, never by seq.
PROVISIONAL_SEQ = 2 ** 62


class StaleSnapshot(Exception):
    """Changes committed since the snapshot change the image's map.

    Raised in the locked transaction before it writes anything.
    """

    def __init__(self):
        super().__init__('changes committed since the snapshot change the '
                         'map')


def _maybe(keys, filters, tested=None):
    """Mask of those of ``keys`` any of ``filters`` may hold.

    ``tested``: ``(ids of filters, mask)`` of some of ``filters`` tested
    against these keys before (the filters kept alive meanwhile).
    """
    maybe = np.zeros(len(keys), dtype=bool)
    done = set()
    if tested is not None:
        done, mask = tested
        maybe |= mask
    for f in filters:
        if id(f) not in done:
            maybe |= f.might_contain(keys)
    return maybe


def _tested(keys, filters):
    """``(ids of filters, mask)`` for :func:`_maybe` ``tested``."""
    return {id(f) for f in filters}, _maybe(keys, filters)


def _exact(store, keys, maybe):
    """``(keys, clusters)`` of those of ``keys`` the mask ``maybe`` says."""
    if not maybe.any():
        return keys[:0], keys[:0]
    return store.key_clusters(keys[maybe])


@dataclasses.dataclass
class PreparedMap:
    """A map built ahead, written to a temporary file beside its name."""

    result: mapgen.MapResult
    version: int
    tmp_path: str
    size: int
    sha256: str


def prepare_map(path, image, version, result):
    """``result`` as map ``version`` of ``image``, in a temporary file.

    The file is beside ``path``, the map's name (:class:`PreparedMap`).
    """
    data = mapformat.encode(image.image_id, image.virtual_size,
                            image.block_size, version, result.targets,
                            result.extents)
    return PreparedMap(result, version, fileutils.write_temp(path, data),
                       len(data), hashlib.sha256(data).hexdigest())


class Rewrites:
    """The maps of pending images, built in a snapshot (:meth:`prepare`).

    For one pass of :meth:`Library.rewrite_pending`: its locked
    transaction installs those that :meth:`usable` gives, if the maps
    still :meth:`stand`, and :meth:`discard` removes the others' files.
    """

    def __init__(self, generation):
        self.generation = generation
        self.maps = {}      # seq -> PreparedMap, in the order built

    @classmethod
    def prepare(cls, conf, limit, deadline=None, among=None):
        """Build up to ``limit`` pending maps, oldest first.

        ``deadline`` (``time.monotonic()``): stop after the first map
        built past it. ``among``: of these images only (seqs).
        """
        with db_session.reader(conf, snapshot=True) as s:
            store = db_store.ClusterStore(s)
            out = cls(store.content_generation())
            try:
                pending = store.pending_maps(limit, among)
                imgs = store.images_by_seq([p.seq for p in pending])
                resolver = mapgen.Resolver(store, conf.vmar.dedup_scope)
                for p in pending:
                    image = imgs[p.seq]
                    result = resolver.build(image)
                    result.own_keys = None     # for an add's check only
                    version = image.map_version + 1
                    out.maps[p.seq] = prepare_map(
                        paths.map_path(conf, image.image_id, version),
                        image, version, result)
                    if deadline is not None and time.monotonic() >= deadline:
                        break
            except BaseException:
                out.discard()
                raise
        return out

    def stand(self, store):
        """Whether ``store`` would build the same maps (locked).

        True while every change of the clusters since the snapshot was an
        add: a new image has the largest sequence id, so it is never the
        smallest candidate of a cluster of another image.
        """
        return store.only_adds_since(self.generation)

    def usable(self, store):
        """Seqs of the maps built that are still pending, as built.

        Not those a change or a pass since rewrote (their version moved)
        or made pending again since, nor those of images deleted.
        """
        imgs = store.images_by_seq(store.pending_among(list(self.maps)))
        return [q for q, m in self.maps.items()
                if q in imgs and imgs[q].map_version + 1 == m.version]

    def discard(self):
        """Remove the files of the maps nobody installed."""
        for m in self.maps.values():
            fileutils.unlink(m.tmp_path)


class Ahead:
    """Lookups and a map made in a snapshot, for one image being added."""

    # keys per lookup while hashing: a chunk of a large image (8 Ki blocks)
    # or a few of a small one
    LOOKUP_BATCH = 1 << 13
    # Below this many blocks the map is built in the calling thread. The
    # map thread holds the GIL between numpy calls, and the locked
    # transaction takes it back after every statement: for a small image
    # (64 MiB: 5 ms of map work, dozens of statements) the waits cost more
    # than the overlap gains; for 4 GiB (0.7 s of map work, a few large
    # statements) the overlap saves half a second.
    THREAD_MIN_BLOCKS = 1 << 18
    # The whole fingerprint table is read once, and keys are looked up in
    # memory, when it holds at most this many rows per block of the image
    # (counted as the library's non-zero blocks, an upper bound):
    # a scan returns a row in about 0.4 us, a lookup by key costs about
    # 1.2 us (SQLite, a million keys). At most SCAN_MAX_ROWS rows (16
    # bytes each in memory).
    SCAN_ROWS_PER_BLOCK = 2
    SCAN_MAX_ROWS = 1 << 24

    def __init__(self, conf, algorithm, block_size):
        self.conf = conf
        self.space_key = fp_keys.space_key(algorithm, block_size)
        self._open_snapshot()
        self._pending, self._n_pending = [], 0
        self._looked, self._found_k, self._found_c = [], [], []
        self._thread = None
        self._result = None
        self._error = None
        # (found keys, the image's keys not in them, their KeyFilter,
        # the found keys grouped by cluster)
        self._new = None
        self._expected = 0
        self._table = None      # (keys, clusters) of a scan; False: none
        self._read = None       # read_changes(): (since, upto, Changes)
        # read_changes(): (since, found keys, the others, and the tests
        # of each against the changes read, for _maybe)
        self._tested = None

    def _open_snapshot(self):
        self._reader = db_session.reader(self.conf, snapshot=True)
        self.store = db_store.ClusterStore(self._reader.__enter__())
        try:
            self.generation = self.store.content_generation()
        except BaseException:
            self._reader.__exit__(None, None, None)
            self._reader = None
            raise

    def expect(self, n_blocks):
        """The image has about ``n_blocks`` blocks (before hashing)."""
        self._expected = n_blocks

    # -- while hashing -----------------------------------------------------

    def chunk(self, rows):
        """``on_chunk`` of :func:`fingerprint.hash_file`."""
        if self._table is None:
            self._choose()
        if self._table is not False:
            return   # the table is in memory: :meth:`found` looks up
        nonzero = fingerprint.words(rows).any(axis=1)
        if nonzero.any():
            self._pending.append(fp_keys.block_keys(rows[nonzero],
                                                    self.space_key))
            self._n_pending += int(nonzero.sum())
        if self._n_pending >= self.LOOKUP_BATCH:
            self._lookup_pending()

    def _lookup_pending(self):
        if not self._pending:
            return
        keys = fp_keys.unique(np.concatenate(self._pending))
        self._pending, self._n_pending = [], 0
        self._lookup(keys)

    def _choose(self):
        """Read the whole table now, or look keys up by key as they come."""
        limit = min(self.SCAN_MAX_ROWS,
                    self.SCAN_ROWS_PER_BLOCK * self._expected)
        self._table = False
        if self.store.count_fingerprints_at_most() <= limit:
            self._table = self.store.scan_fingerprints()

    def _in_memory(self, keys):
        """(keys, clusters) of the sorted ``keys`` in the scanned table."""
        tk, tc = self._table
        if not len(tk):
            return keys[:0], keys[:0]
        pos = np.minimum(np.searchsorted(tk, keys), len(tk) - 1)
        hit = tk[pos] == keys
        return keys[hit], tc[pos[hit]]

    def _lookup(self, keys):
        k, c = self.store.lookup(keys)
        self._looked.append(keys)
        self._found_k.append(k)
        self._found_c.append(c)

    def found(self, keys):
        """(keys, clusters) in the snapshot of the sorted distinct ``keys``.

        Sorted by key. Keys no chunk looked up are looked up now.
        """
        if self._table is None:
            self._choose()
        if self._table is not False:
            return self._in_memory(keys)
        self._lookup_pending()
        looked = fp_keys.unique(np.concatenate(
            [np.empty(0, np.int64)] + self._looked))
        missing = keys[~fp_keys.isin(keys, looked)]
        if len(missing):
            self._lookup(missing)
        fk = np.concatenate([np.empty(0, np.int64)] + self._found_k)
        fc = np.concatenate([np.empty(0, np.int64)] + self._found_c)
        fk, first, _inverse = fp_keys.unique_first(fk)
        fc = fc[first]
        keep = fp_keys.isin(fk, keys)
        return fk[keep], fc[keep]

    # -- once hashed ---------------------------------------------------------

    def start_map(self, image, digests, scope, path):
        """Start building the map of ``image`` (not in the library yet).

        ``image`` has the attributes of an image row except ``seq``; the
        map is written to a temporary file for its first version's
        ``path``, see :meth:`map_result`.
        Returns the image's sorted distinct keys and the ``(keys,
        clusters)`` of those found in the snapshot.
        """
        prov = types.SimpleNamespace(**vars(image))
        prov.seq = PROVISIONAL_SEQ
        index = mapgen.BlockIndex(prov, digests)
        self.keys = index.keys
        self.found_keys = self.found(self.keys)
        self._map_args = (prov, digests, index, scope, path)
        self._start_build()
        return self.keys, self.found_keys

    def _start_build(self):
        self.map_used = False
        prov, digests, index, scope, path = self._map_args
        keys, found = self.keys, self.found_keys
        clusters = np.full(len(keys), mapgen.NO_CLUSTER, dtype=np.int64)
        clusters[np.searchsorted(keys, found[0])] = found[1]
        args = (prov, digests, index, clusters, scope, path)
        if len(index.blocks) < self.THREAD_MIN_BLOCKS:
            self._prepare(found, args)
        else:
            self._thread = threading.Thread(
                target=self._prepare, args=(found, args),
                name='vmar-map-ahead', daemon=True)
            self._thread.start()

    def _prepare(self, found, build_args):
        try:
            new = np.setdiff1d(self.keys, found[0], assume_unique=True)
            self._new = (found[0], new, keyfilter.KeyFilter.of(new),
                         db_store.group_by_cluster(*found))
        except BaseException as e:   # re-raised by map_result()
            self._error = e
            return
        self._build(*build_args)

    def _unfound(self):
        """The image's keys the snapshot's answer lacks (sorted)."""
        new, _filter, _grouped = self.new_keys(self.found_keys)
        if new is None:
            fk = self.found_keys[0]
            new = self.keys[~fp_keys.isin(self.keys, fk)]
        return new

    def new_keys(self, found):
        """``(keys, KeyFilter, grouped)``: the image's keys not in ``found``.

        For the locked transaction's ``add_keys`` and its content log
        row, with ``found`` grouped by cluster
        (:func:`vmar_openstack.db.store.group_by_cluster`): computed
        beside the map's build, for the snapshot's answer; ``(None, None,
        None)`` if ``found`` is another.
        """
        new = self._new
        if new is not None and found is not None and new[0] is found[0]:
            return new[1:]
        return None, None, None

    # -- in the locked transaction, and after it ----------------------------

    def check(self, store, with_map=True):
        """``(found, stale)``: what changed since the snapshot, for ``store``.

        ``store``: the locked transaction's (or a newer snapshot's).
        ``found``: the image's ``(keys, clusters)`` found, as ``store``
        sees them, or None when the log cannot tell (the caller looks
        every key up). ``stale``: the map built from the snapshot is not
        the one ``store`` would build. No lookup per key of the image:
        only of those an add since may have inserted or moved (its
        filters, then an exact lookup of the few that pass), and the
        clusters it joined against the keys the map has no other target
        for. ``with_map``: False when no map was built (``stale`` is then
        True if anything changed).
        """
        return self._check(store, self.generation, with_map)

    def _check(self, store, since, with_map):
        """:meth:`check` against the snapshot of generation ``since``."""
        if store.content_generation() == since:
            return self.found_keys, False
        changes = self._changes_since(store, since)
        if changes is None:
            return None, True
        fk, fc = self.found_keys
        pre = self._tested
        if pre is None or pre[0] != since or pre[1] is not fk:
            # not tested before the lock (or against other keys)
            pre = (since, fk, self._unfound(), None, None)
        _since, _fk, unfound, inserted, moved = pre
        ik, ic = _exact(store, unfound,
                        _maybe(unfound, changes.inserted, inserted))
        mk, mc = _exact(store, fk, _maybe(fk, changes.moved, moved))
        if len(mk):
            moved = fc[np.searchsorted(fk, mk)] != mc
            mk, mc = mk[moved], mc[moved]
        found = fk, fc
        if len(ik) or len(mk):
            keep = ~fp_keys.isin(fk, mk)
            k = np.concatenate([fk[keep], ik, mk])
            c = np.concatenate([fc[keep], ic, mc])
            order = np.argsort(k)
            found = k[order], c[order]
        if len(ik) or not with_map:
            return found, True     # an add since holds keys the map owns
        # A cluster an add joined has a new member of a larger seq than
        # every other: the smallest one the image may read stays, unless
        # it had none (the image was its own target).
        own = self._prepared().result.own_keys
        own = own[fp_keys.isin(own, fk)]
        own_c = fc[np.searchsorted(fk, own)]
        return found, bool(fp_keys.isin(own_c, changes.clusters).any())

    def read_changes(self):
        """Read the log of the changes since the snapshot, before the lock.

        In a short read transaction of its own: the locked transaction's
        :meth:`check` then reads only the rows committed after this one
        (the filters of a base's add are about a megabyte), and tests the
        image's keys only against their filters: those read here it tests
        here (11 probes a key and a filter: about 0.2 s for a large image
        and an add).
        """
        with db_session.reader(self.conf) as s:
            store = db_store.ClusterStore(s)
            now = store.content_generation()
            changes = store.content_changes(self.generation)
        self._read = (self.generation, now, changes)
        self._tested = None
        if changes is not None and now != self.generation:
            fk = self.found_keys[0]
            unfound = self._unfound()
            self._tested = (self.generation, fk, unfound,
                            _tested(unfound, changes.inserted),
                            _tested(fk, changes.moved))

    def _changes_since(self, store, since):
        read_since, upto, early = self._read or (None, None, None)
        if read_since != since:
            return store.content_changes(since)
        if early is None:
            return None     # nor will the log tell under the lock
        late = store.content_changes(upto)
        if late is None:
            return None
        return db_content_log.Changes(
            early.inserted + late.inserted, early.moved + late.moved,
            np.union1d(early.clusters, late.clusters))

    def refresh(self):
        """A new snapshot: the found keys as it sees them, the map again.

        Outside the lock, after a locked transaction found the snapshot
        stale: the next one compares with this one.
        """
        self._discard_map()
        self._reader.__exit__(None, None, None)
        self._reader = None
        since = self.generation
        self._open_snapshot()
        found, _stale = self._check(self.store, since, with_map=False)
        if found is None:
            found = self.store.key_clusters(self.keys)
        self.found_keys = found
        self._start_build()

    def _build(self, prov, digests, index, clusters, scope, path):
        try:
            resolver = mapgen.Resolver(self.store, scope,
                                       digests={prov.seq: digests})
            resolver.register(prov)
            result = resolver.build(prov, (index.keys, clusters), index)
            self._result = prepare_map(path, prov, prov.map_version + 1,
                                       result)
        except BaseException as e:   # re-raised by map_result()
            self._error = e

    def map_result(self):
        """The :class:`PreparedMap` :meth:`start_map` built (waits).

        For the transaction that installs its file: the map is
        :attr:`map_used` after, until the next build.
        """
        self.map_used = True
        return self._prepared()

    def wait_map(self):
        """Wait until the map :meth:`start_map` began is built.

        Before the lock: a transaction that waited for it there would hold
        the lock through the per-block work of the build.
        """
        self._prepared()

    def _prepared(self):
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result

    def _discard_map(self):
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._result is not None:
            fileutils.unlink(self._result.tmp_path)
        self._result = self._error = self._new = None

    def close(self):
        """Wait for the map thread; remove a map file nobody installed."""
        self._discard_map()
        if self._reader is not None:
            self._reader.__exit__(None, None, None)
            self._reader = None
