"""Work an ingest does before it takes the library lock.

While an image is being hashed, its fingerprint keys are looked up in a
read snapshot of the library, chunk by chunk, as the hashing threads
finish them; or, when the fingerprint table is small against the image,
the first chunk reads the whole table and the keys are found in it once
the image is hashed. Then its map is built from the same snapshot: for a
large image in a thread of its own, while the locked transaction updates
the cluster tables; for a small one before the lock is taken.

A new image has the largest sequence id, so its map depends only on the
clusters as they were before it joined them: the snapshot is enough. Its
answers are used only if no other mutation committed since the snapshot
was taken. Every locked transaction increments the lock row's generation
(:func:`vmar_openstack.db.session.locked_writer`), so the locked
transaction compares the generation it found with the snapshot's, and
looks everything up again under the lock when they differ.
"""

import dataclasses
import hashlib
import threading
import types

import numpy as np

from vmar_openstack.db import session as db_session
from vmar_openstack.db import store as db_store
from vmar_openstack import fileutils
from vmar_openstack import fingerprint
from vmar_openstack.fingerprint import keys as fp_keys
from vmar_openstack import mapformat
from vmar_openstack import mapgen

# A sequence id above any real one: the map of a new image built before
# the image has its id. Maps name targets by image id, never by seq.
PROVISIONAL_SEQ = 2 ** 62


@dataclasses.dataclass
class PreparedMap:
    """A map built ahead, written to a temporary file beside its name."""

    result: mapgen.MapResult
    version: int
    tmp_path: str
    size: int
    sha256: str


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
        self._reader = db_session.reader(conf)
        self.store = db_store.ClusterStore(self._reader.__enter__())
        try:
            self.generation = self.store.generation()
        except BaseException:
            self._reader.__exit__(None, None, None)
            raise
        self._pending, self._n_pending = [], 0
        self._looked, self._found_k, self._found_c = [], [], []
        self._thread = None
        self._result = None
        self._error = None
        self._expected = 0
        self._table = None      # (keys, clusters) of a scan; False: none

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
        keys = index.keys
        found = self.found(keys)
        clusters = np.full(len(keys), mapgen.NO_CLUSTER, dtype=np.int64)
        clusters[np.searchsorted(keys, found[0])] = found[1]
        args = (prov, digests, index, clusters, scope, path)
        if len(index.blocks) < self.THREAD_MIN_BLOCKS:
            self._build(*args)
        else:
            self._thread = threading.Thread(
                target=self._build, args=args, name='vmar-map-ahead',
                daemon=True)
            self._thread.start()
        return keys, found

    def _build(self, prov, digests, index, clusters, scope, path):
        try:
            resolver = mapgen.Resolver(self.store, scope,
                                       digests={prov.seq: digests})
            resolver.register(prov)
            result = resolver.build(prov, (index.keys, clusters), index)
            version = prov.map_version + 1
            data = mapformat.encode(prov.image_id, prov.virtual_size,
                                    prov.block_size, version,
                                    result.targets, result.extents)
            self._result = PreparedMap(
                result, version, fileutils.write_temp(path, data),
                len(data), hashlib.sha256(data).hexdigest())
        except BaseException as e:   # re-raised by map_result()
            self._error = e

    def map_result(self):
        """The :class:`PreparedMap` :meth:`start_map` built (waits)."""
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result

    def close(self):
        """Wait for the map thread; remove a map file nobody installed."""
        if self._thread is not None:
            self._thread.join()
        if self._result is not None:
            fileutils.unlink(self._result.tmp_path)
        self._reader.__exit__(None, None, None)
