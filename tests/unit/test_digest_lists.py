"""Digest lists out of the database: objects named by their SHA-256.

On the library's SQLite database and its directory; the functional suite
runs the library's tests on MariaDB, PostgreSQL and Galera with the same
objects (tests/functional/test_databases.py).
"""

import hashlib
import os
import types

import numpy as np
import sqlalchemy as sa

from tests import base
from vmar_openstack.db import digest_lists
from vmar_openstack.db import migration
from vmar_openstack.db import models
from vmar_openstack.db import session as db_session
from vmar_openstack.db import store as db_store
from vmar_openstack import exception
from vmar_openstack.ingest import check

A = '0d1a0000-0000-4000-8000-00000000000a'
B = '0d1a0000-0000-4000-8000-00000000000b'
C = '0d1a0000-0000-4000-8000-00000000000c'


def _digests(n, zero_every=3, size=32, seed=7):
    rng = np.random.default_rng(seed)
    d = rng.integers(1, 256, (n, size), dtype=np.uint8)
    d[::zero_every] = 0
    return d


class TestFormat(base.LibraryTestCase):

    def test_round_trip_keeps_every_row_and_drops_zero_ones(self):
        for d in (_digests(1000), _digests(7, zero_every=1),
                  _digests(9, zero_every=10 ** 6), _digests(0),
                  _digests(13, size=20)):
            data = digest_lists.encode(d)
            nonzero = int(d.any(axis=1).sum())
            self.assertEqual(32 + -(-len(d) // 8) + nonzero * d.shape[1],
                             len(data))
            out = digest_lists.decode(data)
            self.assertEqual(d.shape, out.shape)
            self.assertEqual(d.tobytes(), out.tobytes())

    def test_broken_objects_are_refused(self):
        good = digest_lists.encode(_digests(100))
        header_says_more = bytearray(good)
        header_says_more[24] += 1       # blocks that are not zero
        bits_say_more = bytearray(good)
        bits_say_more[32] |= 1          # block 0 is a zero block
        for bad, words in ((good[:20], 'shorter than its header'),
                           (b'X' + good[1:], 'not a version 1'),
                           (good[:-1], 'bytes for 100 blocks'),
                           (bytes(header_says_more), 'bytes for 100'),
                           (bytes(bits_say_more), 'its bitmap names')):
            e = self.assertRaises(exception.LibraryInconsistent,
                                  digest_lists.decode, bad)
            self.assertIn(words, str(e))


class TestLibraryLists(base.LibraryTestCase):

    def setUp(self):
        super().setUp()
        digest_lists.clear_cache()
        self.addCleanup(digest_lists.clear_cache)
        self.seeds = [None if i % 5 == 0 else i for i in range(300)]
        self.path = self.image('a.raw', self.seeds)

    def row(self, image_id):
        with db_session.reader(self.conf) as s:
            img = db_store.ClusterStore(s).get_image(image_id)
            return types.SimpleNamespace(
                digests_sha256=img.digests_sha256,
                digests_location=img.digests_location)

    def digests(self, image_id):
        with db_session.reader(self.conf) as s:
            st = db_store.ClusterStore(s)
            return st.load_digests(st.get_image(image_id)).copy()

    def blobs(self):
        with db_session.reader(self.conf) as s:
            return s.execute(sa.select(sa.func.count()).select_from(
                models.ImageDigests)).scalar()

    def test_an_add_names_an_object_and_writes_no_blob(self):
        self.lib.add(A, self.path)
        img = self.row(A)
        self.assertEqual(0, self.blobs())
        self.assertEqual('file:' + img.digests_sha256, img.digests_location)
        path = self.lib.lists.path(img.digests_sha256)
        with open(path, 'rb') as f:
            data = f.read()
        self.assertEqual(img.digests_sha256, hashlib.sha256(data).hexdigest())
        # zero blocks take no room in it
        self.assertEqual(32 + 38 + 240 * 32, len(data))
        want = np.zeros((300, 32), np.uint8)
        for i, s in enumerate(self.seeds):
            if s is not None:
                want[i] = np.frombuffer(hashlib.sha256(base.block(s))
                                        .digest(), np.uint8)
        self.assertEqual(want.tobytes(), self.digests(A).tobytes())
        self.assertEqual([], check.check(self.conf)[0])

    def test_a_corrupt_or_missing_object_is_a_clear_error(self):
        self.lib.add(A, self.path)
        img = self.row(A)
        path = self.lib.lists.path(img.digests_sha256)
        with open(path, 'rb') as f:
            data = bytearray(f.read())
        data[-1] ^= 1
        os.chmod(path, 0o644)
        with open(path, 'wb') as f:
            f.write(data)
        digest_lists.clear_cache()
        e = self.assertRaises(exception.LibraryInconsistent,
                              self.digests, A)
        self.assertIn('does not have its SHA-256', str(e))
        self.assertIn(A, str(e))
        os.unlink(path)
        e = self.assertRaises(exception.LibraryInconsistent,
                              self.digests, A)
        self.assertIn('is missing', str(e))

    def test_identical_images_share_one_object_until_both_go(self):
        self.lib.add(A, self.path)
        self.lib.add(B, self.image('b.raw', self.seeds))
        self.assertEqual(self.row(A).digests_location,
                         self.row(B).digests_location)
        self.assertEqual(1, len(self.lib.lists.objects()))
        self.lib.delete(A)
        # named by B: stays, however old
        self.assertEqual(0, self.lib.collect_digest_lists(min_age=0))
        digest_lists.clear_cache()
        self.assertEqual((300, 32), self.digests(B).shape)
        self.lib.delete(B)
        problems, warnings = check.check(self.conf)
        self.assertEqual([], problems)
        self.assertIn('1 digest list objects no image names', warnings[-1])
        # unnamed, but younger than min_age: an ingest may name it yet
        self.assertEqual(0, self.lib.collect_digest_lists(min_age=3600))
        self.assertEqual(1, self.lib.collect_digest_lists(min_age=0))
        self.assertEqual({}, self.lib.lists.objects())

    def test_new_content_names_a_new_object(self):
        self.lib.add(A, self.path)
        old = self.row(A).digests_location
        self.lib.update_content(A, self.image('c.raw', [1, 2, 3]))
        self.assertNotEqual(old, self.row(A).digests_location)
        self.assertEqual((3, 32), self.digests(A).shape)
        self.assertEqual(1, self.lib.collect_digest_lists(min_age=0))
        self.assertEqual([], check.check(self.conf)[0])

    def test_an_object_collected_after_put_is_written_again(self):
        # a map GC pass removed an old unnamed object of the same content
        # between the add's put (outside the lock) and its commit
        self.lib.add(A, self.path)
        self.lib.delete(A)
        real = self.lib.lists.put
        calls = []

        def put_then_collected(digests):
            ref = real(digests)
            calls.append(ref)
            if len(calls) == 1:
                self.assertEqual(1, len(self.lib.lists.collect(set(), 0)))
            return ref
        self.patch(self.lib.lists, 'put', put_then_collected)
        self.lib.add(B, self.image('b.raw', self.seeds))
        # written again under the lock
        self.assertEqual(2, len(calls))
        digest_lists.clear_cache()
        self.assertEqual((300, 32), self.digests(B).shape)
        self.assertEqual([], check.check(self.conf)[0])

    def test_the_cache_keeps_lists_within_its_bound(self):
        self.conf.set_override('digest_cache_mb', 0, group='vmar')
        self.lib.add(A, self.path)
        img = self.row(A)
        os.unlink(self.lib.lists.path(img.digests_sha256))
        # nothing kept: read from the object, which is gone
        self.assertRaises(exception.LibraryInconsistent, self.digests, A)


class TestMoveOut(base.LibraryTestCase):
    """Revision 0023: lists of before moved out, resumably, and back."""

    def setUp(self):
        super().setUp()
        digest_lists.clear_cache()
        self.addCleanup(digest_lists.clear_cache)
        self.ids = (A, B, C)
        for n, image_id in enumerate(self.ids):
            self.lib.add(image_id, self.image(
                '%d.raw' % n, [None if i % 4 == 0 else i + n for i in
                               range(200 + 50 * n)]), visibility='public')
        self.want = {i: self.digests(i) for i in self.ids}

    def digests(self, image_id):
        with db_session.reader(self.conf) as s:
            st = db_store.ClusterStore(s)
            return st.load_digests(st.get_image(image_id)).tobytes()

    def blobs(self):
        with db_session.reader(self.conf) as s:
            return s.execute(sa.select(sa.func.count(sa.distinct(
                models.ImageDigests.seq)))).scalar()

    def test_downgrade_moves_back_and_sync_moves_out_after_a_kill(self):
        migration.downgrade('0022', conf=self.conf)
        self.assertEqual(3, self.blobs())
        migration.upgrade('head', conf=self.conf)
        digest_lists.clear_cache()
        for o in self.lib.lists.objects().values():
            os.unlink(o)
        # not moved yet: read from the tables
        self.assertEqual(self.want, {i: self.digests(i) for i in self.ids})

        class Killed(Exception):
            pass

        def killed_after_the_first(n, _image_id):
            raise Killed()
        self.assertRaises(Killed, self.lib.move_digest_lists,
                          killed_after_the_first)
        self.assertEqual(2, self.blobs())
        self.assertEqual(2, self.lib.move_digest_lists())
        self.assertEqual(0, self.blobs())
        self.assertEqual(0, self.lib.move_digest_lists())
        digest_lists.clear_cache()
        self.assertEqual(self.want, {i: self.digests(i) for i in self.ids})
        self.assertEqual(3, len(self.lib.lists.objects()))
        self.assertEqual([], check.check(self.conf)[0])
