"""Maps against a brute-force oracle, through add, update and delete."""

import os
import random

import fixtures
import numpy as np
import testtools

from tests import base
from vmar_openstack.db import api as db_api
from vmar_openstack.db import bulk
from vmar_openstack.db import session as db_session
from vmar_openstack.db import store as db_store
from vmar_openstack.fingerprint import keys as fp_keys
from vmar_openstack import ingest
from vmar_openstack.ingest import ahead
from vmar_openstack.ingest import check
from vmar_openstack import mapformat
from vmar_openstack import mapgen
from vmar_openstack.mapgen import cache as mapgen_cache


def _uuid(n):
    return '%08x-0000-4000-8000-%012x' % (n, n)


class Oracle:
    """The canonical-target rule, computed from raw content directly."""

    def __init__(self, scope):
        self.scope = scope
        self.images = {}   # seq -> dict(id, owner, vis, blocks, size)

    def allowed(self, src, tgt):
        if src == tgt or self.scope == 'global':
            return True
        t = self.images[tgt]
        if t['vis'] == 'public':
            return True
        return (self.scope == 'project' and self.images[src]['owner']
                is not None and t['owner'] == self.images[src]['owner'])

    def expected(self, seq):
        """Per block: (target seq, target block) or None for zero."""
        img = self.images[seq]
        n = len(img['blocks'])
        partial = img['size'] % base.BS != 0
        out = []
        for b, content in enumerate(img['blocks']):
            if content is None:
                out.append(None)
                continue
            if partial and b == n - 1:
                out.append((seq, b))
                continue
            best = None
            for s in sorted(self.images):
                if not self.allowed(seq, s):
                    continue
                other = self.images[s]
                limit = len(other['blocks']) - (
                    1 if other['size'] % base.BS else 0)
                if s == seq:
                    limit = n - (1 if partial else 0)
                for tb in range(limit):
                    if other['blocks'][tb] == content:
                        best = (s, tb)
                        break
                if best:
                    break
            out.append(best)
        return out


class TestMapsAgainstOracle(base.LibraryTestCase):

    def _seq_of(self, image_id):
        with db_session.reader(self.conf) as s:
            return db_api.get_image(s, image_id).seq

    def _check_all(self, oracle):
        problems, _warnings = check.check(self.conf)
        self.assertEqual([], problems)
        by_id = {v['id']: k for k, v in oracle.images.items()}
        for seq, img in oracle.images.items():
            with db_session.reader(self.conf) as s:
                version = db_api.get_image(s, img['id']).map_version
            m = mapformat.read(ingest.map_path(self.conf, img['id'],
                                               version))
            got = [None] * len(img['blocks'])
            for src, length, tb, ti in m.extents.tolist():
                tseq = by_id[m.targets[ti].image_id]
                for i in range(length):
                    got[src + i] = (tseq, tb + i)
            self.assertEqual(oracle.expected(seq), got,
                             'map of image seq %d' % seq)
            # and the reference reader rebuilds the content
            out = os.path.join(self.tmp, 'rebuilt')
            with open(out, 'wb') as f:
                mapformat.reconstruct(
                    m, lambda tid: ingest.base_path(self.conf, tid), f)
            with open(out, 'rb') as f, open(ingest.base_path(
                    self.conf, img['id']), 'rb') as g:
                self.assertEqual(g.read(), f.read())

    def _content(self, rnd, pool):
        n = rnd.randint(1, 24)
        return [None if rnd.random() < 0.2 else rnd.choice(pool)
                for _ in range(n)]

    def _run(self, scope, seed, steps=14):
        self.conf.set_override('dedup_scope', scope, group='vmar')
        rnd = random.Random(seed)
        pool = list(range(1000 + seed * 100, 1000 + seed * 100 + 12))
        oracle = Oracle(scope)
        next_id = 1
        for step in range(steps):
            op = rnd.random()
            live = sorted(oracle.images)
            if op < 0.55 or len(live) < 2:
                blocks = self._content(rnd, pool)
                tail = b''
                if rnd.random() < 0.2:
                    tail = base.block(rnd.choice(pool))[:512]
                    blocks.append(('tail', tail))
                image_id = _uuid(next_id)
                path = self.image('img%d' % next_id,
                                  [b if not isinstance(b, tuple) else None
                                   for b in blocks[:len(blocks) - (
                                       1 if tail else 0)]], tail)
                next_id += 1
                owner = rnd.choice(['p1', 'p2', None])
                vis = rnd.choice(['public', 'private', 'shared'])
                self.lib.add(image_id, path, owner=owner, visibility=vis)
                seq = self._seq_of(image_id)
                oracle.images[seq] = {'id': image_id, 'owner': owner,
                                      'vis': vis, 'blocks': blocks,
                                      'size': os.path.getsize(path)}
            elif op < 0.7:
                seq = rnd.choice(live)
                self.lib.delete(oracle.images[seq]['id'])
                del oracle.images[seq]
            elif op < 0.85:
                seq = rnd.choice(live)
                vis = rnd.choice(['public', 'private'])
                owner = rnd.choice(['p1', 'p2'])
                self.lib.update_metadata(oracle.images[seq]['id'],
                                         owner=owner, visibility=vis)
                oracle.images[seq].update(vis=vis, owner=owner)
            else:
                seq = rnd.choice(live)
                blocks = self._content(rnd, pool)
                path = self.image('upd%d' % step, blocks)
                self.lib.update_content(oracle.images[seq]['id'], path)
                oracle.images[seq].update(blocks=blocks,
                                          size=os.path.getsize(path))
            self._check_all(oracle)

    def test_project_scope(self):
        self._run('project', 1)

    def test_project_scope_longer(self):
        self._run('project', 2, steps=24)

    def test_public_scope(self):
        self._run('public', 7)

    def test_global_scope(self):
        self._run('global', 11)


class TestMapsAgainstOracleTiers(TestMapsAgainstOracle):
    """The same runs with the shortcuts of an add at their extremes.

    The small fingerprint tier is small and merges a third of its keys
    per add, every split that
    can be done the other way round is (vmar_openstack.db.store, _flips), and
    an add looks its keys up by key, never by reading the whole table
    (which the small libraries here otherwise nearly always do).
    """

    def setUp(self):
        super().setUp()
        for obj, name, value in ((bulk, 'MERGE_ROWS', 6),
                                 (bulk, 'SLICES', 3),
                                 (ahead.Ahead, 'SCAN_ROWS_PER_BLOCK', 0),
                                 (db_store, 'FLIP_MIN_SAVING', 1),
                                 (db_store, 'FLIP_LOOKUPS_PER_MOVE', 1 << 30),
                                 (db_store, 'FLIP_BLOCKS_PER_MOVE', 1 << 30)):
            self.useFixture(fixtures.MockPatchObject(obj, name, value))


class TestScopeIsolation(base.LibraryTestCase):
    """A tenant's map never points into another tenant's private image."""

    def test_private_image_of_other_project_is_not_a_target(self):
        shared = [1, 2, 3, 4]
        a = self.image('a', shared + [10])
        b = self.image('b', shared + [20])
        self.lib.add(_uuid(1), a, owner='alice', visibility='private')
        self.lib.add(_uuid(2), b, owner='bob', visibility='private')
        m = mapformat.read(ingest.map_path(self.conf, _uuid(2), 1))
        self.assertEqual([_uuid(2)], [t.image_id for t in m.targets])
        # made public: bob's map now points into alice's image
        out = self.lib.update_metadata(_uuid(1), visibility='public')
        self.assertEqual({_uuid(2): 2}, out.regenerated)
        m = mapformat.read(ingest.map_path(self.conf, _uuid(2), 2))
        self.assertEqual({_uuid(1), _uuid(2)},
                         {t.image_id for t in m.targets})
        # and private again: back to itself only
        self.lib.update_metadata(_uuid(1), visibility='private')
        m = mapformat.read(ingest.map_path(self.conf, _uuid(2), 3))
        self.assertEqual([_uuid(2)], [t.image_id for t in m.targets])

    def test_delete_regenerates_dependants(self):
        a = self.image('a', [1, 2, 3, None])
        b = self.image('b', [None, 1, 2, 3, 9])
        self.lib.add(_uuid(1), a, visibility='public')
        out = self.lib.add(_uuid(2), b)
        self.assertEqual({}, out.regenerated)
        self.assertGreater(out.shared_fraction, 0.7)
        out = self.lib.delete(_uuid(1))
        self.assertEqual({_uuid(2): 2}, out.regenerated)
        m = mapformat.read(ingest.map_path(self.conf, _uuid(2), 2))
        self.assertEqual([_uuid(2)], [t.image_id for t in m.targets])
        self.assertEqual([], check.check(self.conf)[0])
        self.assertFalse(os.path.exists(ingest.base_path(self.conf,
                                                         _uuid(1))))


class TestExtents(base.LibraryTestCase):

    def test_contiguous_runs_merge_and_zero_blocks_are_absent(self):
        a = self.image('a', list(range(100, 164)))
        b = self.image('b', [None] * 8 + list(range(100, 132)) + [None] * 8
                       + list(range(140, 164)))
        self.lib.add(_uuid(1), a, visibility='public')
        self.lib.add(_uuid(2), b, visibility='public')
        m = mapformat.read(ingest.map_path(self.conf, _uuid(2), 1))
        self.assertEqual([(8, 32, 0, 0), (48, 24, 40, 0)],
                         [tuple(e) for e in m.extents.tolist()])
        self.assertEqual(_uuid(1), m.targets[0].image_id)
        lk = mapformat.Lookup(m)
        self.assertIsNone(lk.find(0))
        self.assertEqual(0, lk.find(8))
        self.assertEqual(1, lk.find(50))
        self.assertIsNone(lk.find(45))
        self.assertLessEqual(lk.probes, 3)

    def test_identical_image_maps_entirely_to_the_first(self):
        a = self.image('a', list(range(1, 40)))
        self.lib.add(_uuid(1), a, visibility='public')
        out = self.lib.add(_uuid(2), a, visibility='public')
        self.assertEqual(1.0, out.shared_fraction)
        m = mapformat.read(ingest.map_path(self.conf, _uuid(2), 1))
        self.assertEqual([(0, 39, 0, 0)], m.extents.tolist())

    def test_repeated_block_within_image_maps_to_its_first_copy(self):
        a = self.image('a', [5, 6, 5, 5, 7])
        self.lib.add(_uuid(1), a)
        m = mapformat.read(ingest.map_path(self.conf, _uuid(1), 1))
        per_block = {}
        for src, length, tb, _ti in m.extents.tolist():
            for i in range(length):
                per_block[src + i] = tb + i
        self.assertEqual({0: 0, 1: 1, 2: 0, 3: 0, 4: 4}, per_block)


class TestKeyCollision(base.LibraryTestCase):
    """Two digests with the same 8-byte key never redirect to each other."""

    def test_forged_key_collision_is_not_a_redirect(self):
        a = self.image('a', [1, 2])
        b = self.image('b', [3, 4, 1])

        def colliding(digests, skey):
            # every block gets the same key: the worst possible collision
            return np.zeros(len(digests), dtype=np.int64) ^ np.int64(skey)
        self.patch(fp_keys, 'block_keys', colliding)
        self.lib.add(_uuid(1), a, visibility='public')
        self.lib.add(_uuid(2), b, visibility='public')
        self.assertEqual([], check.check(self.conf)[0])
        m = mapformat.read(ingest.map_path(self.conf, _uuid(2), 1))
        # blocks 0 and 1 are new content; block 2 equals image 1's block 0
        per_block = {}
        for src, length, tb, ti in m.extents.tolist():
            for i in range(length):
                per_block[src + i] = (m.targets[ti].image_id, tb + i)
        self.assertEqual({0: (_uuid(2), 0), 1: (_uuid(2), 1),
                          2: (_uuid(1), 0)}, per_block)


class TestKeyArrays(testtools.TestCase):
    """The sort helpers agree with numpy's own (slower) functions."""

    def _cases(self):
        rng = np.random.default_rng(7)
        yield np.zeros(0, dtype=np.int64)
        yield np.array([5], dtype=np.int64)
        yield rng.integers(-2 ** 63, 2 ** 63 - 1, size=5000)
        # many duplicates, as identical blocks within an image
        yield rng.integers(0, 40, size=5000)
        yield np.repeat(np.arange(10, 0, -1), 300)

    def test_stable_order(self):
        for keys in self._cases():
            np.testing.assert_array_equal(
                np.argsort(keys, kind='stable'), fp_keys.stable_order(keys))

    def test_unique_and_unique_first(self):
        for keys in self._cases():
            np.testing.assert_array_equal(np.unique(keys),
                                          fp_keys.unique(keys))
            want = np.unique(keys, return_index=True, return_inverse=True)
            got = fp_keys.unique_first(keys)
            for w, g in zip(want, got):
                np.testing.assert_array_equal(w.reshape(-1), g)


class TestFirstOccurrenceCache(testtools.TestCase):
    """The per-process cache of first-occurrence tables."""

    def _item(self, n):
        class Item:
            digests = np.zeros((n, 32), np.uint8)
            keys = np.zeros(n, np.int64)
            blocks = np.zeros(n, np.int64)
        return Item()

    def test_put_again_replaces_and_evicts_oldest(self):
        one = self._item(100)            # 4800 bytes
        lru = mapgen_cache.LRU(3 * 4800)
        lru.put('a', one)
        lru.put('a', self._item(100))    # the same key again: one entry
        self.assertEqual(4800, lru.size)
        lru.put('b', self._item(100))
        lru.put('c', self._item(100))
        self.assertIsNotNone(lru.get('a'))   # now the most recent
        lru.put('d', self._item(100))
        self.assertIsNone(lru.get('b'))      # the least recent went
        self.assertEqual(['c', 'a', 'd'], list(lru.items))
        self.assertEqual(3 * 4800, lru.size)

    def test_block_index_matches_first_occurrence(self):
        rng = np.random.default_rng(3)
        digests = np.zeros((50, 32), np.uint8)
        digests[:, :8] = rng.integers(0, 6, size=(50, 8))   # repeats
        digests[7] = 0                                       # a zero block

        class Image:
            virtual_size = 50 * 4096
            block_size = 4096
            space_key = 0
        index = mapgen.BlockIndex(Image, digests)
        a = mapgen.FirstOccurrence(Image, digests, index)
        b = mapgen.FirstOccurrence(Image, digests)
        np.testing.assert_array_equal(a.keys, b.keys)
        np.testing.assert_array_equal(a.blocks, b.blocks)
        self.assertNotIn(7, a.blocks.tolist())
        found, blocks = a.find(digests[[3, 20, 41]])
        self.assertTrue(found.all())
        for q, blk in zip((3, 20, 41), blocks.tolist()):
            self.assertEqual(digests[q].tobytes(), digests[blk].tobytes())
            self.assertLessEqual(blk, q)
