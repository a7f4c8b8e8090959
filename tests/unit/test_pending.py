"""Maps a change leaves for vmar-agent ([vmar] rewrite_at_once)."""

from tests import base
from vmar_openstack.db import api as db_api
from vmar_openstack.db import hosts as db_hosts
from vmar_openstack.db import session as db_session
from vmar_openstack.ingest import check
from vmar_openstack.ingest import paths
from vmar_openstack import mapformat


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
                         {p[0] for p in pending})
        self.assertEqual({_uuid(1)}, {p[1] for p in pending})
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
        first = self.lib.pending_maps()[0][0]
        # the first map past the time ends the pass: one, the oldest
        self.assertEqual([first], list(self.lib.rewrite_pending(
            10, seconds=0)))
        self.assertEqual(3, len(self.lib.pending_maps()))

    def test_a_rewrite_or_a_delete_of_a_pending_map_clears_it(self):
        self.lib.delete(_uuid(1))
        pending = [p[0] for p in self.lib.pending_maps()]
        self.lib.remap(pending[0])
        self.lib.delete(pending[1])
        self.assertEqual(set(pending[2:]),
                         {p[0] for p in self.lib.pending_maps()})
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
