"""The work an ingest does before it takes the library lock (ingest.ahead).

The lookups made while hashing and the map built from the snapshot must
be used only while nothing else committed, and must then give exactly the
map a build under the lock gives.
"""

import os
import threading
from unittest import mock

import fixtures

from tests import base
from vmar_openstack.db import api as db_api
from vmar_openstack.db import session as db_session
from vmar_openstack.db import store as db_store
from vmar_openstack import exception
from vmar_openstack import ingest
from vmar_openstack.ingest import ahead
from vmar_openstack.ingest import check
from vmar_openstack import mapformat


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
        self.useFixture(mockpatch('start_map', start_map))
        self.lib.add(_uuid(3), self.image('c', [1, 4, 5, 6]),
                     visibility='public')
        # built from the stale snapshot, but not used
        self.assertEqual({'built': 2, 'used': 1}, calls)
        self.assertEqual([(_uuid(1), 0, 1, 0), (_uuid(2), 1, 2, 1),
                          (_uuid(3), 3, 1, 3)], self._map(_uuid(3)))
        self.assertEqual(([], []), check.check(self.conf))

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
