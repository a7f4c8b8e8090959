"""Maps a change leaves for vmar-agent ([vmar] rewrite_at_once, _seconds)."""

import os
from unittest import mock

from tests import base
from vmar_openstack.db import api as db_api
from vmar_openstack.db import hosts as db_hosts
from vmar_openstack.db import session as db_session
from vmar_openstack.db import store as db_store
from vmar_openstack.ingest import ahead as ingest_ahead
from vmar_openstack.ingest import check
from vmar_openstack.ingest import paths
from vmar_openstack import mapformat
from vmar_openstack import mapgen


def _uuid(n):
    return '%08d-0000-4000-8000-%012d' % (n, n)


class TestPendingMaps(base.LibraryTestCase):

    def setUp(self):
        super().setUp()
        self.conf.set_override('rewrite_at_once', 2, group='vmar')
        # a public base and six snapshots of it in other projects: each
        # reads the base's blocks
        self.lib.add(_uuid(1), self.image('b', range(1, 9)),
                     visibility='public', owner='p0')
        self.snaps = [_uuid(i) for i in range(2, 8)]
        for i, s in enumerate(self.snaps, 2):
            self.lib.add(s, self.image('s%d' % i, list(range(1, 9)) +
                                       [100 + i]),
                         visibility='private', owner='p%d' % i)

    def targets(self, image_id):
        """The images the current map of ``image_id`` reads."""
        with db_session.reader(self.conf) as s:
            version = db_api.get_image(s, image_id).map_version
        return {t.image_id for t in mapformat.read(paths.map_path(
            self.conf, image_id, version)).targets}

    def test_a_delete_rewrites_a_few_and_leaves_the_rest(self):
        # a host runs the last snapshot: its map goes first
        db_hosts.HostReports(self.conf).record(
            'h1', [(self.snaps[-1], 1)])
        out = self.lib.delete(_uuid(1))
        self.assertEqual(2, len(out.regenerated))
        self.assertIn(self.snaps[-1], out.regenerated)
        self.assertEqual(4, out.pending)
        pending = self.lib.pending_maps()
        self.assertEqual(set(self.snaps) - set(out.regenerated),
                         {p.image_id for p in pending})
        self.assertEqual({_uuid(1)}, {p.cause for p in pending})
        for s in self.snaps:
            # a pending map still reads the deleted base; a rewritten one
            # reads the snapshot's own blocks
            self.assertEqual({s, _uuid(1)} if s not in out.regenerated
                             else {s}, self.targets(s))
        problems, warnings = check.check(self.conf)
        self.assertEqual([], problems)
        self.assertEqual(4, sum('waits for vmar-agent' in w
                                for w in warnings), warnings)
        done = self.lib.rewrite_pending(3)
        self.assertEqual(3, len(done))
        self.assertEqual(1, len(self.lib.pending_maps()))
        self.assertEqual(1, len(self.lib.rewrite_pending(3)))
        self.assertEqual({}, self.lib.rewrite_pending(3))
        for s in self.snaps:
            self.assertEqual({s}, self.targets(s))
        # the deleted base's digest list goes with the map GC
        self.assertEqual(1, self.lib.collect_digest_lists(min_age=0))
        self.assertEqual(([], []), check.check(self.conf))

    def test_a_pass_stops_at_its_time(self):
        self.lib.delete(_uuid(1))
        first = self.lib.pending_maps()[0].image_id
        # the first map past the time ends the pass: one, the oldest
        self.assertEqual([first], list(self.lib.rewrite_pending(
            10, seconds=0)))
        self.assertEqual(3, len(self.lib.pending_maps()))

    def test_a_rewrite_or_a_delete_of_a_pending_map_clears_it(self):
        self.lib.delete(_uuid(1))
        pending = [p.image_id for p in self.lib.pending_maps()]
        self.lib.remap(pending[0])
        self.lib.delete(pending[1])
        self.assertEqual(set(pending[2:]),
                         {p.image_id for p in self.lib.pending_maps()})
        self.assertEqual([], check.check(self.conf)[0])

    def test_a_metadata_change_is_bounded_too(self):
        # the base goes private: no snapshot of another project may read
        # it any more
        out = self.lib.update_metadata(_uuid(1), visibility='private')
        self.assertEqual((2, 4), (len(out.regenerated), out.pending))
        self.lib.rewrite_pending(10)
        for s in self.snaps:
            self.assertEqual({s}, self.targets(s))
        self.assertEqual(([], []), check.check(self.conf))

    def loads_under_lock(self, holders_of=None, change=None):
        """Delete the base (or ``change()``); the lists its clusters read.

        Those ``remove_keys`` reads, in the locked transaction (no map is
        rebuilt under the lock here).
        """
        self.conf.set_override('rewrite_at_once', 0, group='vmar')
        loads, removing = [], []
        real_load = db_store.ClusterStore.load_digests
        real_remove = db_store.ClusterStore.remove_keys

        def load(store, image):
            if removing:
                loads.append(image.image_id)
            return real_load(store, image)

        def remove(store, seq, keys):
            removing.append(seq)
            try:
                return real_remove(store, seq, keys)
            finally:
                removing.pop()

        with mock.patch.object(db_store.ClusterStore, 'load_digests',
                               load), \
                mock.patch.object(db_store.ClusterStore, 'remove_keys',
                                  remove), \
                mock.patch.object(db_store.ClusterStore, 'holders_of',
                                  holders_of
                                  or db_store.ClusterStore.holders_of):
            (change or (lambda: self.lib.delete(_uuid(1))))()
        self.lib.rewrite_pending(10)
        for s in self.snaps:
            self.assertEqual({s}, self.targets(s))
        self.assertEqual([], check.check(self.conf)[0])
        return loads

    def test_a_delete_reads_its_shadows_lists_before_the_lock(self):
        # the six snapshots shadow the public base: its delete promotes
        # them, from what was read of their lists before the lock
        self.assertEqual([], self.loads_under_lock())

    def test_new_content_reads_its_shadows_lists_before_the_lock(self):
        self.assertEqual([], self.loads_under_lock(change=lambda: (
            self.lib.update_content(_uuid(1), self.image(
                'new', range(200, 208))))))

    def test_a_list_changed_since_is_read_under_the_lock(self):
        real = db_store.ClusterStore.holders_of

        def stale(store, image):
            # as if every shadow's content changed after the snapshot
            got = real(store, image)
            return got._replace(held={(q, 'f' * 64): bits for (q, _sha), bits
                                      in got.held.items()})

        self.assertEqual(set(self.snaps), set(self.loads_under_lock(stale)))

    def test_a_delete_stops_at_its_time(self):
        self.conf.set_override('rewrite_at_once', 6, group='vmar')
        self.conf.set_override('rewrite_seconds', 0, group='vmar')
        db_hosts.HostReports(self.conf).record(
            'h1', [(self.snaps[2], 1)])
        out = self.lib.delete(_uuid(1))
        # the first map past the time ends the rewrites: the exported one
        self.assertEqual([self.snaps[2]], list(out.regenerated))
        self.assertEqual(5, out.pending)
        self.assertEqual(set(self.snaps) - {self.snaps[2]},
                         {p.image_id for p in self.lib.pending_maps()})
        self.assertEqual([], check.check(self.conf)[0])
        self.assertEqual(5, len(self.lib.rewrite_pending(10)))
        for s in self.snaps:
            self.assertEqual({s}, self.targets(s))
        self.assertEqual([], check.check(self.conf)[0])

    def test_a_change_past_its_time_writes_its_own_map_only(self):
        self.conf.set_override('rewrite_at_once', 6, group='vmar')
        self.conf.set_override('rewrite_seconds', 0, group='vmar')
        out = self.lib.update_metadata(_uuid(1), visibility='private')
        self.assertEqual((2, {}, 6),
                         (out.map_version, out.regenerated, out.pending))
        self.assertEqual([], check.check(self.conf)[0])
        self.lib.rewrite_pending(10)
        for s in self.snaps:
            self.assertEqual({s}, self.targets(s))
        self.assertEqual(([], []), check.check(self.conf))

    def test_within_the_bound_nothing_waits(self):
        self.conf.set_override('rewrite_at_once', 6, group='vmar')
        out = self.lib.delete(_uuid(1))
        self.assertEqual((6, 0), (len(out.regenerated), out.pending))
        self.assertEqual([], self.lib.pending_maps())
        # an idle pass is no library mutation: ingests keep their lookups
        before = self.generation()
        self.assertEqual({}, self.lib.rewrite_pending(10))
        self.assertEqual(before, self.generation())

    def generation(self):
        with db_session.reader(self.conf) as s:
            return db_session.generation(s)

    def pass_(self, between=None, run=None):
        """A pass of up to 10 pending maps, with ``between`` before its lock.

        ``between(n)`` runs after the pass's ``n``-th build of its maps in
        a snapshot, before it takes the lock. ``run``: what to run instead
        of the pass (a change, which rewrites some after its commit).
        Returns ``(what the pass or run returned, the images whose maps
        were built under the lock, how many times maps were built in a
        snapshot)``.
        """
        under, prepared, meanwhile = [], [], []
        real_build = mapgen.Resolver.build
        real_prepare = ingest_ahead.Rewrites.prepare.__func__

        def build(resolver, image, *args, **kwargs):
            if (not meanwhile
                    and resolver.store.session.info.get('vmar_lock_taken')):
                under.append(image.image_id)
            return real_build(resolver, image, *args, **kwargs)

        def prepare(cls, *args, **kwargs):
            out = real_prepare(cls, *args, **kwargs)
            prepared.append(out)
            if between is not None:
                meanwhile.append(True)
                try:
                    between(len(prepared))
                finally:
                    meanwhile.pop()
            return out

        with mock.patch.object(mapgen.Resolver, 'build', build), \
                mock.patch.object(ingest_ahead.Rewrites, 'prepare',
                                  classmethod(prepare)):
            done = (run or (lambda: self.lib.rewrite_pending(10)))()
        return done, under, len(prepared)

    def assert_rewritten(self, snaps):
        """The maps of ``snaps`` read their own blocks; the library checks.

        The checker compares every current map with the one the tables
        give now, and finds any map file left behind.
        """
        self.assertEqual([], self.lib.pending_maps())
        for s in snaps:
            self.assertEqual({s}, self.targets(s))
        self.assertEqual([], check.check(self.conf)[0])

    def test_a_pass_builds_its_maps_before_the_lock(self):
        self.conf.set_override('rewrite_at_once', 0, group='vmar')
        self.lib.delete(_uuid(1))
        done, under, prepared = self.pass_()
        self.assertEqual((set(self.snaps), [], 1),
                         (set(done), under, prepared))
        self.assert_rewritten(self.snaps)

    def test_an_add_meanwhile_keeps_the_maps_built(self):
        # a public image of the snapshots' blocks and one of a snapshot's
        # own: of the largest seq, it is the target of no other map
        self.conf.set_override('rewrite_at_once', 0, group='vmar')
        self.lib.delete(_uuid(1))
        done, under, prepared = self.pass_(lambda n: self.lib.add(
            _uuid(20), self.image('n', list(range(1, 9)) + [103]),
            visibility='public', owner='p9'))
        self.assertEqual((set(self.snaps), [], 1),
                         (set(done), under, prepared))
        self.assert_rewritten(self.snaps)

    def test_a_delete_meanwhile_builds_them_again(self):
        self.conf.set_override('rewrite_at_once', 0, group='vmar')
        self.lib.delete(_uuid(1))

        def between(n):
            if n == 1:
                self.lib.delete(self.snaps[0])

        done, under, prepared = self.pass_(between)
        self.assertEqual((set(self.snaps[1:]), [], 2),
                         (set(done), under, prepared))
        self.assert_rewritten(self.snaps[1:])

    def test_a_pass_stale_each_time_builds_under_the_lock_at_last(self):
        self.conf.set_override('rewrite_at_once', 0, group='vmar')
        self.lib.delete(_uuid(1))
        done, under, prepared = self.pass_(
            lambda n: self.lib.update_metadata(self.snaps[n - 1],
                                               owner='q%d' % n))
        # each change rewrote its own image's map; the others, built in
        # three snapshots, are built at last under the lock
        self.assertEqual(self.lib.STALE_REFRESHES, prepared)
        self.assertEqual(set(self.snaps[prepared:]), set(done))
        self.assertEqual(set(self.snaps[prepared:]), set(under))
        self.assert_rewritten(self.snaps)

    def test_a_map_rewritten_meanwhile_is_left_as_it_is(self):
        self.conf.set_override('rewrite_at_once', 0, group='vmar')
        self.lib.delete(_uuid(1))
        remapped = self.snaps[0]
        done, under, prepared = self.pass_(
            lambda n: self.lib.remap(remapped))
        self.assertEqual((set(self.snaps[1:]), [], 1),
                         (set(done), under, prepared))
        with db_session.reader(self.conf) as s:
            # the remap's version (v2), not one the pass built before it
            self.assertEqual(2, db_api.get_image(s, remapped).map_version)
        self.assert_rewritten(self.snaps)

    def test_a_delete_writes_no_map_under_the_lock(self):
        # it rewrites two maps after its commit, the exported one first
        db_hosts.HostReports(self.conf).record(
            'h1', [(self.snaps[-1], 1)])
        out, under, prepared = self.pass_(
            run=lambda: self.lib.delete(_uuid(1)))
        self.assertEqual(([], 1, 2, 4),
                         (under, prepared, len(out.regenerated),
                          out.pending))
        self.assertIn(self.snaps[-1], out.regenerated)
        for s in out.regenerated:
            self.assertEqual({s}, self.targets(s))
        self.assertEqual([], check.check(self.conf)[0])
        self.lib.rewrite_pending(10)
        self.assert_rewritten(self.snaps)

    def test_a_metadata_change_writes_its_own_map_only_under_the_lock(self):
        out, under, prepared = self.pass_(
            run=lambda: self.lib.update_metadata(_uuid(1),
                                                 visibility='private'))
        self.assertEqual(([_uuid(1)], 1, 2, 4),
                         (under, prepared, len(out.regenerated),
                          out.pending))
        self.lib.rewrite_pending(10)
        self.assert_rewritten(self.snaps)

    def test_a_failed_rewrite_after_a_change_leaves_the_maps_pending(self):
        with mock.patch.object(ingest_ahead.Rewrites, 'prepare',
                               side_effect=OSError(28, 'No space left')):
            out = self.lib.delete(_uuid(1))
        # the delete stands; every other map waits for the agent
        self.assertEqual(({}, 6), (out.regenerated, out.pending))
        self.assertFalse(self.lib.has_image(_uuid(1)))
        self.assertEqual(set(self.snaps),
                         {p.image_id for p in self.lib.pending_maps()})
        self.assertEqual([], check.check(self.conf)[0])
        self.assertEqual(6, len(self.lib.rewrite_pending(10)))
        self.assert_rewritten(self.snaps)

    def test_a_failed_writer_keeps_the_files_a_commit_records(self):
        # two Galera nodes both hold the lock until one's commit fails:
        # the one that failed wrote the same names as the one committed
        with db_session.reader(self.conf) as s:
            version = db_api.get_image(s, self.snaps[0]).map_version
        recorded = paths.map_path(self.conf, self.snaps[0], version)
        unrecorded = paths.map_path(self.conf, self.snaps[0], version + 1)
        with open(recorded, 'rb') as f, open(unrecorded, 'wb') as g:
            g.write(f.read())
        with self.assertRaises(RuntimeError):
            with self.lib._mutation() as (_store, written):
                written.extend([recorded, unrecorded])
                raise RuntimeError('certification failed')
        self.assertTrue(os.path.exists(recorded))
        self.assertFalse(os.path.exists(unrecorded))
        self.assertEqual([], check.check(self.conf)[0])
