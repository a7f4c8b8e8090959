"""How an add changes the cluster tables (vmar_openstack.db.store, bulk).

The fingerprint index's runs, overrides and two row tiers, and splits
made the cheap way round: the maps and ``vmar-manage check`` must not see
any of them.
"""

import hashlib
import threading

import fixtures
import numpy as np
import sqlalchemy as sa

from tests import base
from vmar_openstack.db import api as db_api
from vmar_openstack.db import bulk
from vmar_openstack.db import members as db_members
from vmar_openstack.db import migration
from vmar_openstack.db import models
from vmar_openstack.db import session as db_session
from vmar_openstack.db import store as db_store
from vmar_openstack.fingerprint import keys as fp_keys
from vmar_openstack import ingest
from vmar_openstack.ingest import check
from vmar_openstack import mapgen


def _uuid(n):
    return '%08d-0000-4000-8000-%012d' % (n, n)


class TestTiers(base.LibraryTestCase):

    def _tiers(self):
        with db_session.reader(self.conf) as s:
            return [dict(s.execute(sa.select(t.fp_key, t.cluster_id)).all())
                    for t in (models.Fingerprint, models.RecentFingerprint)]

    def _add(self, n, seeds):
        self.lib.add(_uuid(n), self.image('i%d' % n, seeds),
                     visibility='public')

    def _generation(self):
        with db_session.reader(self.conf) as s:
            return db_session.generation(s)

    @staticmethod
    def _slice(key, slices):
        return (key + (1 << 63)) // ((1 << 64) // slices)

    def _compaction_turn(self):
        with db_session.reader(self.conf) as s:
            return s.execute(sa.text(
                'SELECT turn FROM vmar_compaction')).scalar()

    def test_each_compaction_moves_one_slice_of_the_small_tier(self):
        self.useFixture(fixtures.MockPatchObject(bulk, 'SLICES', 4))
        seen = set()
        for n, seeds in enumerate((range(1, 25), range(13, 49),
                                   range(40, 90)), 1):
            self._add(n, seeds)
            # the add's compaction moved a slice at its last turn
            done = self._compaction_turn() % 4
            seen.add(done)
            main, recent = self._tiers()
            self.assertEqual(set(), set(main) & set(recent))
            self.assertTrue(all(self._slice(k, 4) != done for k in recent))
            self.assertTrue(all(self._slice(k, 4) in seen for k in main))
            self.assertEqual([], check.check(self.conf)[0])
        self.assertGreater(len(main), 0)
        self.assertGreater(len(recent), 0)
        # keys of both tiers are found, moved and deleted
        self._add(4, [1, 2, 30, 31, 60, 61, 400])
        self.lib.delete(_uuid(2))
        self.lib.delete(_uuid(1))
        self.assertEqual([], check.check(self.conf)[0])

    def test_an_add_that_would_overflow_the_small_tier_skips_it(self):
        self.useFixture(fixtures.MockPatchObject(bulk, 'MERGE_ROWS', 10))
        self._add(1, range(1, 25))
        main, recent = self._tiers()
        self.assertEqual((24, 0), (len(main), len(recent)))
        self._add(2, range(100, 104))
        main, recent = self._tiers()
        self.assertEqual(28, len(main) + len(recent))
        self.assertEqual([], check.check(self.conf)[0])

    def test_a_large_run_goes_to_the_large_tier_in_every_step(self):
        # compacted 5 keys a step, a run of 24 would fit the small tier
        # step by step: each key would be written there, then again
        self.useFixture(fixtures.MockPatchObject(bulk, 'MERGE_ROWS', 10))
        self.useFixture(fixtures.MockPatchObject(bulk, 'COMPACT_KEYS', 5))
        self._add(1, range(1, 25))
        main, recent = self._tiers()
        self.assertEqual((24, 0), (len(main), len(recent)))
        self._add(2, range(100, 104))
        main, recent = self._tiers()
        self.assertEqual((24, 4), (len(main), len(recent)))
        self.assertEqual([], check.check(self.conf)[0])

    def test_check_reports_a_key_in_both_tiers(self):
        self._add(1, range(1, 9))
        main, recent = self._tiers()
        key, cid = next(iter(recent.items()))
        with db_session.locked_writer(self.conf) as s:
            s.execute(sa.insert(models.Fingerprint).values(
                fp_key=key, cluster_id=cid))
        problems = check.check(self.conf)[0]
        self.assertIn('1 fingerprint keys are in both tiers of the '
                      'fingerprint table', problems)


class TestRuns(base.LibraryTestCase):
    """An add's new keys as one run; compaction outside the library lock."""

    def setUp(self):
        super().setUp()
        # this library compacts only when a test says so
        self.lib._compact_after_change = lambda: None

    def _add(self, lib, n, seeds, visibility='private'):
        lib.add(_uuid(n), self.image('i%d' % n, seeds),
                visibility=visibility, owner='p1')

    def _index(self, conf=None):
        with db_session.reader(conf or self.conf) as s:
            run = models.FingerprintRun
            # each run's cluster and keys left, its pieces summed
            runs = s.execute(sa.select(
                run.cluster_id, sa.func.sum(run.n_keys)).group_by(
                    run.id, run.cluster_id).order_by(run.id)).all()
            overrides = s.execute(sa.select(
                sa.func.count()).select_from(
                    models.FingerprintOverride)).scalar()
            rows = sum(s.execute(sa.select(sa.func.count()).select_from(
                t)).scalar() for t in (models.Fingerprint,
                                       models.RecentFingerprint))
            return [tuple(r) for r in runs], overrides, rows

    def _keys(self, conf=None):
        """Every key of the index, with its cluster's member set."""
        with db_session.reader(conf or self.conf) as s:
            store = db_store.ClusterStore(s)
            rows = store.fingerprint_rows()
            members = store.cluster_members({c for _k, c in rows})
            return [(k, members[c]) for k, c in rows]

    def _maps(self, conf=None):
        with db_session.reader(conf or self.conf) as s:
            return {i.image_id: s.get(models.MapVersion,
                                      (i.seq, i.map_version)).sha256
                    for i in db_store.ClusterStore(s).list_images()}

    def _other_library(self):
        """A second library in a directory of its own, that compacts."""
        tmp = self.useFixture(fixtures.TempDir()).path
        conf = base.new_conf()
        conf.set_override('state_dir', tmp, group='vmar')
        conf.set_override('hash_workers', 2, group='vmar')
        conf.set_override('connection', 'sqlite:///%s/vmar.sqlite' % tmp,
                          group='vmar_database')
        migration.upgrade('head', conf=conf)
        self.addCleanup(lambda: db_session.get_engine(conf).dispose())
        return ingest.Library(conf), conf

    def test_an_add_writes_one_run_and_no_row(self):
        self._add(self.lib, 1, range(1, 101))
        runs, overrides, rows = self._index()
        self.assertEqual(1, len(runs))
        self.assertEqual(100, runs[0][1])
        self.assertEqual((0, 0), (overrides, rows))
        before = self._keys()
        self.assertEqual(100, len(before))
        self.assertEqual([], check.check(self.conf)[0])
        self.assertGreater(self.lib.compact(), 0)
        self.assertEqual(([], 0, 100), self._index())
        self.assertEqual(before, self._keys())
        self.assertEqual([], check.check(self.conf)[0])

    def test_runs_give_the_maps_of_rows(self):
        # splits (moves of run keys), shadows, deletes and a re-add of
        # deleted content, never compacted here, compacted after every
        # change in the other library, and compacted at the end here
        other, other_conf = self._other_library()
        steps = [
            ('add', 1, range(1, 301), 'public'),
            ('add', 2, list(range(1, 291)) + list(range(1000, 1010)),
             'private'),
            ('add', 3, list(range(1, 11)) + list(range(2000, 2200)),
             'private'),
            ('add', 4, range(1, 301), 'private'),
            ('delete', 1), ('delete', 3),
            ('add', 5, list(range(2000, 2100)) + list(range(1, 50)),
             'public'),
        ]
        for step in steps:
            for lib in (self.lib, other):
                if step[0] == 'add':
                    self._add(lib, *step[1:])
                else:
                    lib.delete(_uuid(step[1]))
            self.assertEqual([], check.check(self.conf)[0], step)
            self.assertEqual([], check.check(other_conf)[0], step)
            self.assertEqual(self._maps(other_conf), self._maps(), step)
            self.assertEqual(self._keys(other_conf), self._keys(), step)
        runs, overrides, _rows = self._index()
        # one per add with new keys (image 4's are all image 1's)
        self.assertEqual(4, len(runs))
        self.assertGreater(overrides, 0)    # the moves and the deletes
        self.assertEqual(([], 0), self._index(other_conf)[:2])
        maps, keys = self._maps(), self._keys()
        self.lib.compact()
        self.assertEqual(([], 0), self._index()[:2])
        self.assertEqual(maps, self._maps())
        self.assertEqual(keys, self._keys())
        self.assertEqual([], check.check(self.conf)[0])

    def _pieces(self):
        with db_session.reader(self.conf) as s:
            run = models.FingerprintRun
            return [tuple(r) for r in s.execute(sa.select(
                run.id, run.piece, run.n_keys, run.key_blob).order_by(
                    run.id, run.piece))]

    def test_a_run_is_compacted_a_piece_at_a_time(self):
        # pieces of 7 keys: 100 new keys are 15 pieces
        self.useFixture(fixtures.MockPatchObject(bulk, 'COMPACT_KEYS', 7))
        self._add(self.lib, 1, range(1, 101))
        keys = self._keys()
        pieces = self._pieces()
        self.assertEqual(list(range(15)), [p[1] for p in pieces])
        self.assertEqual([7] * 14 + [2], [p[2] for p in pieces])
        blob = b''.join(p[3] for p in pieces)
        self.assertEqual(sorted(k for k, _m in keys),
                         [int.from_bytes(blob[i:i + 8], 'little', signed=True)
                          for i in range(0, len(blob), 8)])
        # a step folds the first piece and deletes it; the others' rows
        # are as they were (an update would replicate a blob on Galera)
        with db_session.writer(self.conf) as s:
            self.assertTrue(db_store.ClusterStore(s).compact_step())
        self.assertEqual(pieces[1:], self._pieces())
        _runs, overrides, rows = self._index()
        self.assertEqual((0, 7), (overrides, rows))
        self.assertEqual(keys, self._keys())
        self.assertEqual([], check.check(self.conf)[0])
        self.assertEqual(14, self.lib.compact())
        self.assertEqual(([], 0, 100), self._index())
        self.assertEqual(keys, self._keys())

    def test_a_locked_transaction_sees_one_index_beside_a_compaction(self):
        # A compaction takes no library lock: it commits while an add
        # holds it, and moves a run's keys into the row tiers. The add
        # must go on seeing the index as it was when it took the lock:
        # one that read the tiers before and the runs after would find
        # the keys nowhere, and add them again.
        if db_session.get_engine(self.conf).dialect.name == 'sqlite':
            self.skipTest('SQLite has one writer at a time')
        self._add(self.lib, 1, range(1, 101))
        keys = np.array(sorted(k for k, _m in self._keys()), np.int64)
        with db_session.locked_writer(self.conf, content=True) as s:
            store = db_store.ClusterStore(s)
            before = store.lookup(keys)
            self.assertEqual(100, len(before[0]))
            folded = []
            t = threading.Thread(target=lambda: folded.append(
                self.lib.compact()))
            t.start()
            t.join(self.conf.vmar_database.lock_timeout)
            # committed while the lock is held
            self.assertEqual([1], folded)
            self.assertEqual(([], 0, 100), self._index())
            self.assertEqual([], store.index_problems())
            after = store.lookup(keys)
            self.assertEqual([a.tolist() for a in before],
                             [a.tolist() for a in after])
        self.assertEqual([], check.check(self.conf)[0])

    def test_deleted_keys_added_again(self):
        self._add(self.lib, 1, range(1, 51))
        self.lib.delete(_uuid(1))
        self.assertEqual([], self._keys())
        self._add(self.lib, 2, range(1, 51))
        keys = self._keys()
        self.assertEqual(50, len(keys))
        with db_session.reader(self.conf) as s:
            seq = db_api.get_image(s, _uuid(2)).seq
        self.assertEqual({frozenset([seq])}, {m for _k, m in keys})
        self.assertEqual([], check.check(self.conf)[0])
        self.lib.compact()
        self.assertEqual(([], 0, 50), self._index())
        self.assertEqual(keys, self._keys())
        self.assertEqual([], check.check(self.conf)[0])

    def test_a_killed_compaction_loses_one_step(self):
        self.useFixture(fixtures.MockPatchObject(bulk, 'COMPACT_KEYS', 7))
        self._add(self.lib, 1, range(1, 101))
        self._add(self.lib, 2, list(range(1, 51)) + list(range(200, 230)))
        keys = self._keys()
        real = bulk.BulkSQL._put_rows
        calls = []

        def dies(sql, *args, **kwargs):
            calls.append(1)
            if len(calls) == 5:
                raise RuntimeError('killed')
            return real(sql, *args, **kwargs)
        with fixtures.MockPatchObject(bulk.BulkSQL, '_put_rows', dies):
            self.assertRaises(RuntimeError, self.lib.compact)
        runs, _overrides, rows = self._index()
        self.assertGreater(rows, 0)
        self.assertGreater(sum(n for _c, n in runs), 0)
        self.assertEqual(keys, self._keys())
        self.assertEqual([], check.check(self.conf)[0])
        self.lib.compact()
        self.assertEqual(([], 0, 130), self._index())
        self.assertEqual(keys, self._keys())
        self.assertEqual([], check.check(self.conf)[0])

    def test_check_reports_a_key_in_a_run_and_a_row(self):
        self._add(self.lib, 1, range(1, 9))
        with db_session.reader(self.conf) as s:
            key, cid = db_store.ClusterStore(s).fingerprint_rows()[0]
        with db_session.locked_writer(self.conf) as s:
            s.execute(sa.insert(models.Fingerprint).values(
                fp_key=key, cluster_id=cid))
        problems = check.check(self.conf)[0]
        self.assertEqual(1, sum('1 fingerprint keys of run' in p and
                                'also in a row tier' in p for p in problems))

    def test_downgrade_waits_for_the_compaction(self):
        self._add(self.lib, 1, range(1, 9))
        e = self.assertRaises(RuntimeError, migration.downgrade, '0024',
                              conf=self.conf)
        self.assertIn('vmar-manage db compact', str(e))
        self.lib.compact()
        migration.downgrade('0024', conf=self.conf)
        migration.upgrade('head', conf=self.conf)
        self.assertEqual([], check.check(self.conf)[0])


class TestSplits(base.LibraryTestCase):

    def _clusters(self, n):
        with db_session.reader(self.conf) as s:
            store = db_store.ClusterStore(s)
            img = store.get_image(_uuid(n))
            keys = fp_keys.image_key_set(img, store.load_digests(img))
            return dict(zip(*[a.tolist() for a in store.key_clusters(
                keys)]))

    def _add(self, n, seeds):
        # private images of one project: a public one before them would
        # make later images shadow holders, and nothing would split
        self.lib.add(_uuid(n), self.image('i%d' % n, seeds),
                     visibility='private', owner='p1')

    def test_image_holding_most_of_a_cluster_moves_only_the_rest(self):
        self._add(1, range(1, 301))
        before = self._clusters(1)
        self.assertEqual(1, len(set(before.values())))
        # image 2 holds 290 of the cluster's 300 keys
        self._add(2, list(range(1, 291)) + list(range(1000, 1010)))
        after = self._clusters(1)
        old = set(before.values())
        shared = {k: c for k, c in after.items() if c in old}
        # the 290 shared keys kept their cluster, which gained a member;
        # the 10 others moved to a new cluster with the old member set
        self.assertEqual(290, len(shared))
        self.assertEqual(2, len(set(after.values())))
        with db_session.reader(self.conf) as s:
            members = db_store.ClusterStore(s).cluster_members(
                set(after.values()))
            seqs = {db_api.get_image(s, _uuid(n)).seq for n in (1, 2)}
        self.assertEqual(frozenset(seqs), members[old.pop()])
        self.assertEqual([], check.check(self.conf)[0])
        # image 2's shared blocks read image 1
        with db_session.reader(self.conf) as s:
            self.assertEqual(290, db_api.get_image(
                s, _uuid(2)).redirected_blocks)

    def test_image_holding_little_of_a_cluster_moves_its_part(self):
        self._add(1, range(1, 301))
        before = set(self._clusters(1).values())
        self._add(2, list(range(1, 11)) + list(range(1000, 1290)))
        after = self._clusters(1)
        self.assertEqual(290, sum(1 for c in after.values() if c in before))
        self.assertEqual([], check.check(self.conf)[0])

    def test_corrupt_table_stops_a_flipping_add(self):
        self._add(1, range(1, 301))
        # a key of image 1 that image 2 will not hold goes missing
        digest = hashlib.sha256(base.block(300)).digest()
        victim = int.from_bytes(digest[:8], 'little', signed=True)
        with db_session.locked_writer(self.conf) as s:
            gone = sum(s.execute(sa.text(
                'DELETE FROM %s WHERE fp_key = :k' % t), {'k': victim}
            ).rowcount for t in ('vmar_fingerprints',
                                 'vmar_fingerprints_recent'))
        self.assertEqual(1, gone)
        e = self.assertRaises(RuntimeError, self.lib.add, _uuid(2),
                              self.image('i2', range(1, 291)),
                              visibility='private', owner='p1')
        self.assertIn('run vmar-manage check', str(e))
        with db_session.reader(self.conf) as s:
            self.assertIsNone(db_api.get_image(s, _uuid(2)))


class TestMemberLists(base.LibraryTestCase):

    def test_runs(self):
        for seqs, text in (([], ''), ([4], '4'), ([1, 2, 3], '1-3'),
                           ([7, 1, 3, 2, 9, 10], '1-3,7,9-10')):
            self.assertEqual(text, db_members.members_text(seqs))
            self.assertEqual(sorted(seqs),
                             db_members.parse_members(text).tolist())

    def test_add_and_remove(self):
        cases = [('', 5, '5'), ('5', 6, '5-6'), ('1-3', 4, '1-4'),
                 ('1-3', 7, '1-3,7'), ('1,7', 8, '1,7-8'),
                 ('2-4,9', 1, '1-4,9'), ('2-4,9', 6, '2-4,6,9')]
        for text, seq, want in cases:
            self.assertEqual(want, db_members.add_member(text, seq))
            self.assertEqual(db_members.members_text(
                db_members.parse_members(text)),
                db_members.remove_member(want, seq))

    def test_deltas(self):
        # (added, removed) after seq 5 joins, then leaves again
        for added, removed, joined in (('', '', ('5', '')),
                                       ('1-4', '', ('1-5', '')),
                                       ('', '3,5', ('', '3')),
                                       ('7', '5', ('7', ''))):
            got = db_members.delta_add(added, removed, 5)
            self.assertEqual(joined, got)
            self.assertEqual((db_members.members_text(
                db_members.parse_members(added)), removed),
                db_members.delta_remove(*got, 5))
        self.assertEqual([2, 3, 8, 9], db_members.resolve(
            '1-3,9', '8', '1').tolist())
        self.assertEqual([], db_members.resolve('', '', '').tolist())
        self.assertFalse(db_members.folds('1' * 128, '2' * 128))
        self.assertTrue(db_members.folds('1' * 128, '2' * 129))

    def test_smallest_reads_only_enough_runs(self):
        base = '1,3,5-9,20,30'
        for added, removed, k in (('', '', 2), ('2', '', 3),
                                  ('', '1,3', 3), ('', '5-9', 2),
                                  ('40', '1,3,5-9,20,30', 3)):
            self.assertEqual(
                db_members.resolve(base, added, removed)[:k].tolist(),
                db_members.smallest(base, added, removed, k).tolist())

    def test_check_reports_a_list_not_in_runs(self):
        self.lib.add(_uuid(1), self.image('a', range(1, 5)),
                     visibility='public')
        self.assertEqual([], check.check(self.conf)[0])
        with db_session.locked_writer(self.conf) as s:
            s.execute(sa.text("UPDATE vmar_clusters SET added = '1,1'"))
        problems = check.check(self.conf)[0]
        self.assertTrue(any('is not in ascending runs' in p
                            for p in problems), problems)


class TestAffected(base.LibraryTestCase):

    def test_work_is_linear_in_the_members(self):
        # a public base and snapshots of it in other projects: deleting
        # the base rewrites every snapshot's map; finding them asks about
        # each member a bounded number of times (it asked about every
        # pair of members, which a cluster of 10,000 never finished)
        n = 40
        self.lib.add(_uuid(1), self.image('b', range(1, 9)),
                     visibility='public', owner='p0')
        for i in range(2, n + 2):
            self.lib.add(_uuid(i), self.image(
                's%d' % i, list(range(1, 9)) + [100 + i]),
                visibility='private', owner='p%d' % i)
        calls = []
        real = mapgen.may_redirect

        def counted(src, tgt, scope):
            calls.append((src.seq, tgt.seq))
            return real(src, tgt, scope)

        self.useFixture(fixtures.MockPatchObject(mapgen, 'may_redirect',
                                                 counted))
        out = self.lib.delete(_uuid(1))
        self.assertEqual({_uuid(i) for i in range(2, n + 2)},
                         set(out.regenerated))
        self.assertLessEqual(len(calls), 2 * n)
        self.assertEqual([], check.check(self.conf)[0])


class TestMemberBases(base.LibraryTestCase):
    """Member sets as deltas against shared bases (revision 0015)."""

    def setUp(self):
        super().setUp()
        # fold after a few members, so a small library folds often
        self.useFixture(fixtures.MockPatchObject(db_members, 'DELTA_CHARS',
                                                 4))

    def _bases(self):
        with db_session.reader(self.conf) as s:
            return db_store.ClusterStore(s).member_bases()

    def _members(self, n):
        with db_session.reader(self.conf) as s:
            store = db_store.ClusterStore(s)
            img = store.get_image(_uuid(n))
            return sorted(tuple(sorted(m)) for m in store.cluster_members(
                store.clusters_of_image(img)).values())

    def test_adds_splits_and_deletes_keep_every_set(self):
        # a shared core every image joins, and scattered shares with the
        # first image: joins in order and out of order, splits, flips
        for n in range(1, 13):
            seeds = list(range(1, 9)) + list(range(100 * n, 100 * n + 4))
            if n % 3 == 0:
                seeds += list(range(10000, 10004))
            self.lib.add(_uuid(n), self.image('i%d' % n, seeds),
                         visibility='private', owner='p1')
            self.assertEqual([], check.check(self.conf)[0], n)
        self.assertGreater(len(self._bases()), 0)
        # the core: every image; the shares of 3, 6, 9 and 12; its own
        self.assertEqual([(1,), tuple(range(1, 13))], self._members(1))
        self.assertEqual([tuple(range(1, 13)), (3, 6, 9, 12), (6,)],
                         self._members(6))
        for n in (1, 6, 4, 12, 3):
            self.lib.delete(_uuid(n))
            # check also finds every base used and no delta redundant
            self.assertEqual([], check.check(self.conf)[0], n)
        self.assertEqual([(2,), (2, 5, 7, 8, 9, 10, 11)], self._members(2))
        # the share of 3, 6, 9 and 12 was left to 9 alone: it joined 9's
        # own cluster
        self.assertEqual([(2, 5, 7, 8, 9, 10, 11), (9,)], self._members(9))
        for n in (2, 5, 7, 8, 9, 10, 11):
            self.lib.delete(_uuid(n))
        self.assertEqual({}, self._bases())
        self.assertEqual([], check.check(self.conf)[0])

    def test_an_add_writes_a_short_delta_however_many_members(self):
        written = []
        real = bulk.BulkSQL.set_members

        def spy(sql, rows, also=''):
            written.extend(rows)
            return real(sql, rows, also)

        self.useFixture(fixtures.MockPatchObject(
            bulk.BulkSQL, 'set_members', spy))
        for n in range(1, 40):
            self.lib.add(_uuid(n), self.image('i%d' % n, [1, 2, 3, n + 10]),
                         visibility='private', owner='p1')
        # the core, at each join after the second image split it
        self.assertEqual(39 - 2, len(written))
        for row in written:
            self.assertLessEqual(len(row['added']) + len(row['removed']),
                                 db_members.DELTA_CHARS, row)
        self.assertEqual([], check.check(self.conf)[0])

    def test_check_reports_a_missing_or_unused_base(self):
        for n in range(1, 6):
            self.lib.add(_uuid(n), self.image('i%d' % n, [1, 2, n + 10]),
                         visibility='private', owner='p1')
        self.lib.delete(_uuid(2))   # the core's delta: 1,3-5 and 2: folds
        (bid,) = self._bases()
        with db_session.locked_writer(self.conf) as s:
            s.execute(sa.text("INSERT INTO vmar_member_bases (members_hash, "
                              "members) VALUES ('x', '1')"))
        problems = check.check(self.conf)[0]
        self.assertIn('member base %d is used by no cluster' % (bid + 1),
                      problems)
        self.assertIn('member base %d members_hash is not its members\' '
                      'hash' % (bid + 1), problems)
        with db_session.locked_writer(self.conf) as s:
            s.execute(sa.text('DELETE FROM vmar_member_bases WHERE id = :b'),
                      {'b': bid})
        problems = check.check(self.conf)[0]
        self.assertTrue(any('names missing member base %d' % bid in p
                            for p in problems), problems)


class TestShadows(base.LibraryTestCase):
    """Images after a public holder are shadow holders, not members."""

    def _add(self, n, seeds, visibility='private', owner=None):
        self.lib.add(_uuid(n), self.image('i%d' % n, seeds),
                     visibility=visibility, owner=owner or 'p%d' % n)

    def _state(self):
        with db_session.reader(self.conf) as s:
            store = db_store.ClusterStore(s)
            seqs = {i.image_id: i.seq for i in store.list_images()}
            shadows = {}
            for cid, seq in store.shadow_rows():
                shadows.setdefault(seq, set()).add(cid)
            return seqs, store.cluster_count(), shadows

    def _reads(self, n):
        """Image ids the current map of image ``n`` reads from."""
        with db_session.reader(self.conf) as s:
            img = db_api.get_image(s, _uuid(n))
            version = img.map_version
        return self.lib.bases_of(_uuid(n), version)

    def _family(self, snapshots):
        # a public base of 64 blocks, a public image derived from it (its
        # first 8 blocks changed), and private snapshots of either, each
        # rewriting a block of its own: what a cloud's catalogue is
        self._add(1, range(1, 65), 'public')
        self._add(2, list(range(1001, 1009)) + list(range(9, 65)), 'public')
        for n in range(3, 3 + snapshots):
            seeds = list(range(1, 65)) if n % 2 else (
                list(range(1001, 1009)) + list(range(9, 65)))
            seeds[8 + n] = 5000 + n
            self._add(n, seeds)

    def test_snapshots_split_no_cluster(self):
        self._family(30)
        seqs, clusters, shadows = self._state()
        # the base, the derived image's own blocks, and a cluster of each
        # snapshot's own block: the base's cluster did not split at the
        # derived image nor at each snapshot (that made 2 per image)
        self.assertEqual(2 + 30, clusters)
        for n in range(3, 33):
            self.assertIn(seqs[_uuid(n)], shadows)
            self.assertEqual({_uuid(1)} | ({_uuid(2)} if n % 2 == 0
                                           else set()) | {_uuid(n)},
                             self._reads(n))
        self.assertEqual([], check.check(self.conf)[0])

    def test_an_add_touches_the_same_rows_however_many_snapshots(self):
        touched = []
        real = bulk.BulkSQL.set_members

        def spy(sql, rows, also=''):
            touched.append(len(rows))
            return real(sql, rows, also)

        self._family(10)
        self.useFixture(fixtures.MockPatchObject(
            bulk.BulkSQL, 'set_members', spy))
        for n in range(13, 40):
            self._add(n, [1, 2, 3] + list(range(9, 65)) + [7000 + n])
        self.assertEqual([], touched)
        self.assertEqual([], check.check(self.conf)[0])

    def test_deleting_the_public_holder_makes_members_of_shadows(self):
        self._family(12)
        out = self.lib.delete(_uuid(1))
        # every image that read the base reads its own copy or image 2's
        self.assertEqual({_uuid(n) for n in range(2, 15)},
                         set(out.regenerated))
        for n in range(2, 15):
            self.assertNotIn(_uuid(1), self._reads(n))
        for n in range(4, 15, 2):
            # image 2 holds the base's blocks 9-64: they read it there
            self.assertIn(_uuid(2), self._reads(n))
        # blocks 1-8 of the odd snapshots: held by private images of
        # other projects only, each is a member now and reads itself
        self.assertEqual({_uuid(2), _uuid(3)}, self._reads(3))
        self.assertEqual([], check.check(self.conf)[0])
        for n in range(2, 15):
            self.lib.delete(_uuid(n))
            self.assertEqual([], check.check(self.conf)[0], n)
        self.assertEqual((0, {}), self._state()[1:])

    def test_the_public_holder_made_private_makes_members_of_shadows(self):
        self._family(6)
        self.lib.update_metadata(_uuid(1), visibility='private')
        self.assertEqual([], check.check(self.conf)[0])
        for n in range(3, 9):
            self.assertNotIn(_uuid(1), self._reads(n))
        # and public again: the shadows it uncovered stay members
        self.lib.update_metadata(_uuid(1), visibility='public')
        self.assertEqual([], check.check(self.conf)[0])
        for n in range(3, 9):
            self.assertIn(_uuid(1), self._reads(n))

    def test_made_private_when_a_recovery_joins_another_cluster(self):
        # X's keys: 10 (with T), 20 and 30 (its own; T shadows 30 behind
        # X), W shadows 10 behind X. X made private: T joins 30, which
        # moves into the cluster of {X, T}, the next cluster to recover
        # (found by a review: the keys of it were read before the move)
        self._add(1, [30], 'public')
        self._add(2, [10, 20, 30], owner='o')
        self._add(3, [10, 30], owner='o')
        self.lib.update_metadata(_uuid(2), visibility='public')
        self.lib.delete(_uuid(1))
        self._add(4, [10], owner='o')
        self.assertEqual([], check.check(self.conf)[0])
        self.lib.update_metadata(_uuid(2), visibility='private')
        self.assertEqual([], check.check(self.conf)[0])
        self.assertEqual({}, self._state()[2])

    def test_new_content_of_the_public_holder(self):
        self._family(6)
        self.lib.update_content(_uuid(1), self.image('new', range(200, 264)))
        self.assertEqual([], check.check(self.conf)[0])
        self.assertEqual({_uuid(3)}, self._reads(3) - {_uuid(2)})

    def test_check_reports_a_shadow_without_a_public_member_before(self):
        self._family(2)
        with db_session.locked_writer(self.conf) as s:
            s.execute(sa.text("UPDATE vmar_images SET visibility = "
                              "'private' WHERE image_id IN (:a, :b)"),
                      {'a': _uuid(1), 'b': _uuid(2)})
        problems = check.check(self.conf)[0]
        self.assertTrue(any('has no public member before it' in p
                            for p in problems), problems)
