"""The work an ingest does before it takes the library lock (ingest.ahead).

The lookups made while hashing and the map built from the snapshot must
be used only while nothing else committed, and must then give exactly the
map a build under the lock gives.
"""

import os
import random
import threading
from unittest import mock

import fixtures
import sqlalchemy as sa

from tests import base
from vmar_openstack.db import api as db_api
from vmar_openstack.db import content_log as db_content_log
from vmar_openstack.db import migration
from vmar_openstack.db import models
from vmar_openstack.db import session as db_session
from vmar_openstack.db import store as db_store
from vmar_openstack import exception
from vmar_openstack.fingerprint import keyfilter
from vmar_openstack import ingest
from vmar_openstack.ingest import ahead
from vmar_openstack.ingest import check
from vmar_openstack import mapformat
from vmar_openstack import mapgen


def _uuid(n):
    return '%08d-0000-4000-8000-%012d' % (n, n)


class TestAhead(base.LibraryTestCase):

    def _map(self, image_id):
        with db_session.reader(self.conf) as s:
            img = db_api.get_image(s, image_id)
            m = mapformat.read(ingest.map_path(self.conf, image_id,
                                               img.map_version))
        return [(m.targets[t].image_id, src, length, tb)
                for src, length, tb, t in m.extents.tolist()]

    def _spy(self):
        calls = {'built': 0, 'used': 0}
        real_build = ahead.Ahead._build
        real_result = ahead.Ahead.map_result

        def build(obj, *a):
            calls['built'] += 1
            return real_build(obj, *a)

        def result(obj):
            calls['used'] += 1
            return real_result(obj)

        self.useFixture(mockpatch('_build', build))
        self.useFixture(mockpatch('map_result', result))
        return calls

    def test_snapshot_map_is_used_when_nothing_committed(self):
        self._snapshot_map_is_used()

    def test_snapshot_map_built_in_a_thread(self):
        threads = []
        real_build = ahead.Ahead._build

        def build(obj, *a):
            threads.append(threading.current_thread().name)
            return real_build(obj, *a)
        self.useFixture(mockpatch('_build', build))
        self.useFixture(mockpatch('THREAD_MIN_BLOCKS', 0))
        self._snapshot_map_is_used()
        # both adds (the first image's and the second's)
        self.assertEqual(['vmar-map-ahead'] * 2, threads)

    def test_the_threads_map_is_built_before_the_lock(self):
        # the build is slow; the locked transaction must not wait for it
        events = []
        real_build = ahead.Ahead._build
        real_take = db_session._take_lock
        go = threading.Event()

        def build(obj, *a):
            go.wait(0.5)    # slow, unless the lock is taken first
            real_build(obj, *a)
            events.append('built')

        def take(*a, **k):
            events.append('lock')
            go.set()        # a build still waiting would now end
            return real_take(*a, **k)
        self.useFixture(mockpatch('_build', build))
        self.useFixture(mockpatch('THREAD_MIN_BLOCKS', 0))
        self.useFixture(fixtures.MockPatchObject(db_session, '_take_lock',
                                                 take))
        self.lib.add(_uuid(1), self.image('a', [1, 2, 3, None, 4]),
                     visibility='public')
        self.assertEqual(['built', 'lock'], events[:2])
        self.assertEqual(([], []), check.check(self.conf))

    def test_the_new_keys_are_found_before_the_lock(self):
        self.lib.add(_uuid(1), self.image('a', [1, 2, 3]),
                     visibility='public')
        seen, grouped_inside = [], []
        real = db_store.ClusterStore.add_keys
        real_group = db_store.group_by_cluster

        def add_keys(store, seq, keys, public, found=None, new=None,
                     new_filter=None, grouped=None):
            seen.append((keys, found, new, new_filter, grouped))
            return real(store, seq, keys, public, found=found, new=new,
                        new_filter=new_filter, grouped=grouped)

        def group_by_cluster(keys, clusters):
            if seen:    # inside add_keys
                grouped_inside.append(len(keys))
            return real_group(keys, clusters)
        self.useFixture(fixtures.MockPatchObject(
            db_store.ClusterStore, 'add_keys', add_keys))
        self.useFixture(fixtures.MockPatchObject(
            db_store, 'group_by_cluster', group_by_cluster))
        self.lib.add(_uuid(2), self.image('b', [2, 3, 7, None, 8]),
                     visibility='public')
        (keys, found, new, new_filter, grouped), = seen
        # the found keys grouped by cluster before the lock, not in it
        self.assertEqual([], grouped_inside)
        want_k, want_span = real_group(*found)
        self.assertEqual(want_k.tolist(), grouped[0].tolist())
        self.assertEqual(want_span, grouped[1])
        self.assertEqual(2, len(grouped[0]))
        self.assertIsNotNone(new)
        self.assertEqual(2, len(new))
        self.assertEqual(sorted(set(keys.tolist()) - set(found[0].tolist())),
                         new.tolist())
        # and the content log's filter of them, made with them
        self.assertEqual(2, new_filter.n_keys)
        with db_session.reader(self.conf) as s:
            row = s.execute(sa.select(models.ContentChange.key_filter)
                            .order_by(models.ContentChange.generation.desc())
                            ).scalars().first()
        self.assertEqual(new_filter.to_bytes(), row)
        self.assertEqual(([], []), check.check(self.conf))

    def _snapshot_map_is_used(self):
        self.lib.add(_uuid(1), self.image('a', [1, 2, 3, None, 4]),
                     visibility='public')
        calls = self._spy()
        # chunks of one block: the lookups happen while hashing
        with mock.patch.object(ahead.Ahead, 'LOOKUP_BATCH', 1):
            self.lib.add(_uuid(2), self.image('b', [9, 2, 3, None, 5, 1]),
                         visibility='public')
        self.assertEqual({'built': 1, 'used': 1}, calls)
        self.assertEqual([(_uuid(2), 0, 1, 0), (_uuid(1), 1, 2, 1),
                          (_uuid(2), 4, 1, 4), (_uuid(1), 5, 1, 0)],
                         self._map(_uuid(2)))
        self.assertEqual(([], []), check.check(self.conf))

    def test_commit_during_hashing_discards_the_snapshot(self):
        self._commit_during_hashing()

    def test_commit_during_hashing_discards_the_threads_map(self):
        self.useFixture(mockpatch('THREAD_MIN_BLOCKS', 0))
        self._commit_during_hashing()

    def _commit_during_hashing(self):
        self.lib.add(_uuid(1), self.image('a', [1, 2]), visibility='public')
        other = ingest.Library(self.conf)
        path_b = self.image('b', [3, 4, 5])
        real_start = ahead.Ahead.start_map
        interleaved = []

        def start_map(obj, *a):
            # another ingest commits after the snapshot was taken; it holds
            # blocks the image being added holds too, with a smaller seq
            if not interleaved:
                interleaved.append(True)
                other.add(_uuid(2), path_b, visibility='public')
            return real_start(obj, *a)

        calls = self._spy()
        locked = self._builds_under_the_lock()
        self.useFixture(mockpatch('start_map', start_map))
        self.lib.add(_uuid(3), self.image('c', [1, 4, 5, 6]),
                     visibility='public')
        # b's map, then c's from the stale snapshot (not used) and again
        # from a new one, outside the lock
        self.assertEqual({'built': 3, 'used': 2}, calls)
        self.assertEqual([], locked)
        self.assertEqual([(_uuid(1), 0, 1, 0), (_uuid(2), 1, 2, 1),
                          (_uuid(3), 3, 1, 3)], self._map(_uuid(3)))
        self.assertEqual(([], []), check.check(self.conf))

    def test_filters_read_before_the_lock_are_tested_there(self):
        # an add commits while c is hashed, before c reads the log: c's
        # keys meet that add's filters outside the lock, never inside
        self.lib.add(_uuid(1), self.image('a', [1, 2]), visibility='public')
        other = ingest.Library(self.conf)
        path_b = self.image('b', [3, 4, 5])
        state = {'locked': False}
        tested = []
        real_take = db_session._take_lock
        real_test = keyfilter.KeyFilter.might_contain

        def take(*a, **k):
            real_take(*a, **k)
            state['locked'] = True

        def might_contain(f, keys):
            tested.append(state['locked'])
            return real_test(f, keys)
        self.useFixture(fixtures.MockPatchObject(db_session, '_take_lock',
                                                 take))
        self.useFixture(fixtures.MockPatchObject(
            keyfilter.KeyFilter, 'might_contain', might_contain))
        observer = lambda *a: state.update(locked=False)  # noqa: E731
        db_session.LOCK_HOLD_OBSERVERS.append(observer)
        self.addCleanup(db_session.LOCK_HOLD_OBSERVERS.remove, observer)
        self._add_during_hashing(
            _uuid(3), [1, 4, 5, 6],
            lambda: other.add(_uuid(2), path_b, visibility='public'),
            visibility='public')
        self.assertIn(False, tested)        # tested, before the lock
        self.assertNotIn(True, tested)      # and not again under it
        self.assertEqual(
            self._serial_map([(_uuid(1), [1, 2], {'visibility': 'public'}),
                              (_uuid(2), [3, 4, 5], {'visibility': 'public'}),
                              (_uuid(3), [1, 4, 5, 6],
                               {'visibility': 'public'})]),
            self._map(_uuid(3)))
        self.assertEqual(([], []), check.check(self.conf))

    def _builds_under_the_lock(self, image_id=None):
        """Seqs of the maps a locked transaction builds itself.

        Of ``image_id`` only, if given.
        """
        seqs = []
        real = mapgen.Resolver.build

        def build(resolver, image, *a, **k):
            if image.seq != ahead.PROVISIONAL_SEQ and image_id in (
                    None, image.image_id):
                seqs.append(image.seq)
            return real(resolver, image, *a, **k)
        self.useFixture(fixtures.MockPatchObject(mapgen.Resolver, 'build',
                                                 build))
        return seqs

    def _add_during_hashing(self, image_id, blocks, during, **kw):
        """Add ``blocks``; ``during()`` runs once its snapshot is taken."""
        real_start = ahead.Ahead.start_map
        done = []

        def start_map(obj, *a):
            if not done:
                done.append(True)
                during()
            return real_start(obj, *a)
        with mock.patch.object(ahead.Ahead, 'start_map', start_map):
            return self.lib.add(image_id, self.image(str(image_id), blocks),
                                **kw)

    def _serial_map(self, adds):
        """The map of the last of ``adds``, added one after the other."""
        return self._serial_maps(adds)[adds[-1][0]]

    def _serial_maps(self, adds):
        """Every map of ``adds``, added one after the other.

        In a library of its own (SQLite), as if no add overlapped.
        """
        state = os.path.join(self.tmp, 'serial')
        os.makedirs(state)
        conf = base.new_conf()
        conf.set_override('state_dir', state, group='vmar')
        conf.set_override('connection', 'sqlite:///%s/lib.db' % state,
                          group='vmar_database')
        migration.upgrade('head', conf=conf)
        self.addCleanup(lambda: db_session.get_engine(conf).dispose())
        lib = ingest.Library(conf)
        for image_id, blocks, kw in adds:
            lib.add(image_id, self.image('s%s' % image_id, blocks), **kw)
        out = {}
        with db_session.reader(conf) as s:
            for image_id, _blocks, _kw in adds:
                img = db_api.get_image(s, image_id)
                m = mapformat.read(ingest.map_path(conf, image_id,
                                                   img.map_version))
                out[image_id] = [(m.targets[t].image_id, src, length, tb)
                                 for src, length, tb, t in
                                 m.extents.tolist()]
        return out

    def test_an_add_sharing_no_block_keeps_the_snapshot(self):
        self.lib.add(_uuid(1), self.image('a', [1, 2, 3]),
                     visibility='public')
        other = ingest.Library(self.conf)
        calls = self._spy()
        locked = self._builds_under_the_lock()
        refreshes = self._refreshes()
        self._add_during_hashing(
            _uuid(3), [1, 2, 7, 8],
            lambda: other.add(_uuid(2), self.image('b', [3, 9, 10]),
                              visibility='public'),
            visibility='public')
        # b shares block 3 with a, none with c: c's snapshot stands
        self.assertEqual({'built': 2, 'used': 2}, calls)
        self.assertEqual([], refreshes)
        self.assertEqual([], locked)
        self.assertEqual([(_uuid(1), 0, 2, 0), (_uuid(3), 2, 2, 2)],
                         self._map(_uuid(3)))
        self.assertEqual(([], []), check.check(self.conf))

    def _refreshes(self):
        """Per refresh of a snapshot, how many keys it looked up."""
        seen = []
        real = ahead.Ahead.refresh
        real_lookup = db_store.ClusterStore.lookup

        def refresh(obj):
            seen.append(0)
            return real(obj)

        def lookup(store, keys):
            if seen and store.session.info.get('vmar_lock_taken') is None:
                seen[-1] += len(keys)
            return real_lookup(store, keys)
        self.useFixture(mockpatch('refresh', refresh))
        self.useFixture(fixtures.MockPatchObject(db_store.ClusterStore,
                                                 'lookup', lookup))
        return seen

    def test_the_lock_reads_only_the_log_rows_after_its_last_read(self):
        self.lib.add(_uuid(1), self.image('a', [1, 2, 3]),
                     visibility='public')
        other = ingest.Library(self.conf)
        real_read = ahead.Ahead.read_changes
        real_since = db_content_log.since
        reads, tracking = [], []

        def read_changes(obj):
            mine = obj._map_args[0].image_id == _uuid(3)
            if mine:
                tracking.append(True)
            real_read(obj)
            if mine and len(tracking) == 1:
                # another add between this read and the locked transaction
                tracking.append(False)
                other.add(_uuid(10), self.image('o', [21]),
                          visibility='public')
                tracking.append(True)

        def since(session, first, last):
            if tracking and tracking[-1]:
                reads.append((session.info.get('vmar_lock_taken')
                              is not None, first, last))
            return real_since(session, first, last)
        self.useFixture(mockpatch('read_changes', read_changes))
        self.useFixture(fixtures.MockPatchObject(db_content_log, 'since',
                                                 since))
        self._add_during_hashing(
            _uuid(3), [1, 2, 5],
            lambda: other.add(_uuid(2), self.image('b', [3, 9]),
                              visibility='public'),
            visibility='public')
        # a is generation 1, b 2 (before the read), o 3 (after it): the
        # read outside the lock reads 2, the lock reads 3 alone
        self.assertEqual([(False, 1, 2), (True, 2, 3)], reads)
        self.assertEqual(([], []), check.check(self.conf))

    def test_a_map_rewrite_keeps_the_snapshot(self):
        self.lib.add(_uuid(1), self.image('a', [1, 2, 3]),
                     visibility='public')
        other = ingest.Library(self.conf)
        calls = self._spy()
        refreshes = self._refreshes()
        with db_session.reader(self.conf) as s:
            g0 = db_session.generation(s)
        self._add_during_hashing(
            _uuid(2), [1, 2, 5], lambda: other.remap(_uuid(1)),
            visibility='public')
        with db_session.reader(self.conf) as s:
            # the remap and the add both committed
            self.assertEqual(g0 + 2, db_session.generation(s))
        self.assertEqual({'built': 1, 'used': 1}, calls)
        self.assertEqual([], refreshes)
        self.assertEqual(([], []), check.check(self.conf))

    def test_a_delete_refreshes_every_key(self):
        self.lib.add(_uuid(1), self.image('a', [1, 2, 3]),
                     visibility='public')
        self.lib.add(_uuid(2), self.image('b', [1, 2, 4]),
                     visibility='public')
        other = ingest.Library(self.conf)
        refreshes = self._refreshes()
        locked = self._builds_under_the_lock(_uuid(3))
        self._add_during_hashing(_uuid(3), [1, 2, 3, 4],
                                 lambda: other.delete(_uuid(1)),
                                 visibility='public')
        # every key looked up again, outside the lock
        self.assertEqual([4], refreshes)
        self.assertEqual([], locked)
        self.assertEqual([(_uuid(2), 0, 2, 0), (_uuid(3), 2, 1, 2),
                          (_uuid(2), 3, 1, 2)], self._map(_uuid(3)))
        # (the deleted image's digest list waits for the map GC)
        self.assertEqual([], check.check(self.conf)[0])

    def test_overlapping_adds_refresh_only_the_touched_keys(self):
        # c found 1, 2 (a's) in the snapshot; b splits a's cluster (2
        # moves to a cluster of a and b) and inserts 7, which c has too
        kw = {'visibility': 'private', 'owner': 'p'}
        self.lib.add(_uuid(1), self.image('a', [1, 2, 3]), **kw)
        other = ingest.Library(self.conf)
        refreshes = self._refreshes()
        locked = self._builds_under_the_lock(_uuid(3))
        self._add_during_hashing(
            _uuid(3), [1, 2, 7, 8],
            lambda: other.add(_uuid(2), self.image('b', [2, 7]), **kw),
            **kw)
        # 7 (b inserted it), 2 (b moved it): nothing else
        self.assertEqual([2], refreshes)
        self.assertEqual([], locked)
        expect = self._serial_map([(_uuid(1), [1, 2, 3], kw),
                                   (_uuid(2), [2, 7], kw),
                                   (_uuid(3), [1, 2, 7, 8], kw)])
        self.assertEqual(expect, self._map(_uuid(3)))
        self.assertEqual(([], []), check.check(self.conf))

    def test_keys_moved_since_keep_the_map(self):
        # b splits a's cluster; c reads a for both keys either way
        kw = {'visibility': 'private', 'owner': 'p'}
        self.lib.add(_uuid(1), self.image('a', [1, 2, 3]), **kw)
        other = ingest.Library(self.conf)
        calls = self._spy()
        refreshes = self._refreshes()
        locked = self._builds_under_the_lock(_uuid(3))
        self._add_during_hashing(
            _uuid(3), [1, 2, 8],
            lambda: other.add(_uuid(2), self.image('b', [2, 9]), **kw),
            **kw)
        self.assertEqual([], refreshes)
        self.assertEqual([], locked)
        self.assertEqual({'built': 2, 'used': 2}, calls)
        expect = self._serial_map([(_uuid(1), [1, 2, 3], kw),
                                   (_uuid(2), [2, 9], kw),
                                   (_uuid(3), [1, 2, 8], kw)])
        self.assertEqual(expect, self._map(_uuid(3)))
        self.assertEqual(([], []), check.check(self.conf))

    def test_a_cluster_joined_since_changes_a_map_of_its_own_keys(self):
        # a is another project's: c is its own target for 1 and 2; b, of
        # c's project, joins a's cluster, and c must read b
        self.lib.add(_uuid(1), self.image('a', [1, 2, 3]),
                     visibility='private', owner='q')
        other = ingest.Library(self.conf)
        refreshes = self._refreshes()
        locked = self._builds_under_the_lock(_uuid(3))
        kw = {'visibility': 'private', 'owner': 'p'}
        self._add_during_hashing(
            _uuid(3), [1, 2, 8],
            lambda: other.add(_uuid(2), self.image('b', [1, 2, 3]), **kw),
            **kw)
        self.assertEqual(1, len(refreshes))
        self.assertEqual([], locked)
        self.assertEqual([(_uuid(2), 0, 2, 0), (_uuid(3), 2, 1, 2)],
                         self._map(_uuid(3)))
        self.assertEqual(([], []), check.check(self.conf))

    def test_a_log_past_its_time_refreshes_every_key(self):
        self.conf.set_override('content_log_seconds', 0, 'vmar')
        self.lib.add(_uuid(1), self.image('a', [1, 2]), visibility='public')
        other = ingest.Library(self.conf)
        refreshes = self._refreshes()
        self._add_during_hashing(
            _uuid(3), [5, 6],
            lambda: other.add(_uuid(2), self.image('b', [3]),
                              visibility='public'),
            visibility='public')
        self.assertEqual([2], refreshes)     # every key
        self.assertEqual(([], []), check.check(self.conf))

    def test_after_its_refreshes_an_add_looks_up_under_the_lock(self):
        # every refresh finds another add that inserted a key of c's
        self.lib.add(_uuid(1), self.image('a', [1, 2]), visibility='public')
        other = ingest.Library(self.conf)
        real = ahead.Ahead.refresh
        n = [10]

        def refresh(obj):
            real(obj)
            n[0] += 1
            other.add(_uuid(n[0]), self.image('o%d' % n[0], [1, n[0] - 5]),
                      visibility='public')
        self.useFixture(mockpatch('refresh', refresh))
        locked = self._builds_under_the_lock(_uuid(3))
        self._add_during_hashing(
            _uuid(3), [1, 2, 5, 6, 7, 8, 9],
            lambda: other.add(_uuid(2), self.image('b', [2, 5]),
                              visibility='public'),
            visibility='public')
        self.assertEqual(10 + ingest.Library.STALE_REFRESHES, n[0])
        with db_session.reader(self.conf) as s:
            seq = db_api.get_image(s, _uuid(3)).seq
        self.assertEqual([seq], locked)
        self.assertEqual(([], []), check.check(self.conf))

    def test_interleaved_adds_give_the_maps_of_serial_adds(self):
        # Random images of a small block universe, each added while
        # another add commits during its hashing; then the same images
        # one after the other, in the order they got their seqs, in a
        # library of their own: every map is the same.
        rnd = random.Random(51)
        owners = ('p', 'q', 'r')
        images = []
        for n in range(1, 31):
            blocks = sorted(rnd.sample(range(1, 30), rnd.randint(2, 9)))
            kw = {'visibility': rnd.choice(('public', 'private', 'private')),
                  'owner': rnd.choice(owners)}
            images.append((_uuid(n), blocks, kw))
        other = ingest.Library(self.conf)
        pending = list(images)
        while pending:
            image_id, blocks, kw = pending.pop(0)
            if pending and rnd.random() < 0.7:
                o_id, o_blocks, o_kw = pending.pop(0)

                def during(o_id=o_id, o_blocks=o_blocks, o_kw=o_kw):
                    other.add(o_id, self.image(o_id, o_blocks), **o_kw)
                self._add_during_hashing(image_id, blocks, during, **kw)
            else:
                self.lib.add(image_id, self.image(image_id, blocks), **kw)
        with db_session.reader(self.conf) as s:
            order = sorted(images,
                           key=lambda i: db_api.get_image(s, i[0]).seq)
        self.assertNotEqual([i[0] for i in images], [i[0] for i in order])
        maps = {i[0]: self._map(i[0]) for i in images}
        serial = self._serial_maps(order)
        self.assertEqual(serial, maps)
        self.assertEqual(([], []), check.check(self.conf))

    def test_lock_holds_are_observed_by_kind(self):
        from vmar_openstack.glance_hooks import metrics
        reg = metrics.registry(self.conf)
        seen = []
        self.useFixture(fixtures.MockPatchObject(
            db_session, 'LOCK_HOLD_OBSERVERS',
            db_session.LOCK_HOLD_OBSERVERS + [
                lambda s, c, ok: seen.append((c, ok))]))
        before = reg.get_sample_value(
            'vmar_agent_library_lock_hold_seconds_count', {'kind': 'content'})
        self.lib.add(_uuid(1), self.image('a', [1, 2]), visibility='public')
        self.lib.remap(_uuid(1))
        self.assertRaises(exception.ImageNotFound, self.lib.update_metadata,
                          _uuid(9), owner='p9')
        self.assertEqual([(True, True), (False, True), (True, False)], seen)
        # a delete of an image not there fails before it takes the lock
        self.assertRaises(exception.ImageNotFound, self.lib.delete, _uuid(9))
        self.assertEqual(3, len(seen))
        self.assertEqual((before or 0) + 2, reg.get_sample_value(
            'vmar_agent_library_lock_hold_seconds_count',
            {'kind': 'content'}))
        with db_session.reader(self.conf) as s:
            # the remap and the failed change changed no cluster
            self.assertEqual(1, db_session.content_generation(s))

    def test_generation_counts_commits_only(self):
        with db_session.reader(self.conf) as s:
            g0 = db_session.generation(s)
        self.lib.add(_uuid(1), self.image('a', [1]), visibility='public')
        self.assertRaises(exception.ImageExists, self.lib.add, _uuid(1),
                          self.image('a2', [1]))
        with db_session.reader(self.conf) as s:
            self.assertEqual(g0 + 1, db_session.generation(s))

    def test_hashing_failure_closes_the_snapshot(self):
        path = self.image('a', [1, 2])
        with mock.patch('vmar_openstack.fingerprint.hash_file',
                        side_effect=OSError('boom')):
            self.assertRaises(OSError, self.lib.add, _uuid(1), path)
        self.assertFalse(os.path.exists(ingest.base_path(self.conf,
                                                         _uuid(1))))
        # the library is writable: no snapshot or lock left behind
        self.lib.add(_uuid(1), path, visibility='public')


def mockpatch(name, new):
    return fixtures.MockPatchObject(ahead.Ahead, name, new)


class TestAheadByKey(TestAhead):
    """The same, looking keys up one by one instead of reading the table.

    An add reads the whole fingerprint table when it holds at most two
    rows per block of the image, as in most of these small libraries.
    """

    def setUp(self):
        super().setUp()
        self.useFixture(fixtures.MockPatchObject(
            ahead.Ahead, 'SCAN_ROWS_PER_BLOCK', 0))

    def test_reads_by_key(self):
        scans = []
        real = db_store.ClusterStore.scan_fingerprints

        def scan(store, *a, **k):
            scans.append(1)
            return real(store, *a, **k)
        self.useFixture(fixtures.MockPatchObject(
            db_store.ClusterStore, 'scan_fingerprints', scan))
        self.lib.add(_uuid(1), self.image('a', range(1, 9)))
        del scans[:]     # reading an empty library whole costs nothing
        self.lib.add(_uuid(2), self.image('b', range(5, 13)))
        self.assertEqual([], scans)
        self.assertEqual([], check.check(self.conf)[0])


class TestAheadScan(base.LibraryTestCase):

    def test_small_library_is_read_whole_and_gives_the_same_map(self):
        lookups = []
        real = db_store.ClusterStore.lookup

        def lookup(store, keys, *a, **k):
            if not a and not k:
                lookups.append(len(keys))
            return real(store, keys, *a, **k)
        self.useFixture(fixtures.MockPatchObject(db_store.ClusterStore,
                                                 'lookup', lookup))
        self.lib.add(_uuid(1), self.image('a', range(1, 17)),
                     visibility='public')
        self.lib.add(_uuid(2), self.image('b', range(9, 33)),
                     visibility='public')
        # 16 rows for a 24-block image: read whole, no lookup by key
        self.assertEqual([], lookups)
        with db_session.reader(self.conf) as s:
            self.assertEqual(8, db_api.get_image(
                s, _uuid(2)).redirected_blocks)
        self.assertEqual([], check.check(self.conf)[0])
