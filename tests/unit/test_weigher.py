"""Similarity-aware placement: hosts' holdings, shares, the vmar weigher.

The library, the host reports and the map targets are real (SQLite); the
weigher runs under Nova's own weight handler with Nova's HostState and
RequestSpec objects. The multi-host functional test is issue 17's
``tools/run-tests.sh --multinode`` stage.
"""

import datetime
import os
import shutil
import threading
from unittest import mock
import uuid

import fixtures
import sqlalchemy as sa

from nova import objects
from nova.scheduler import host_manager
from nova.scheduler import weights
from oslo_config import cfg
from oslo_config import fixture as config_fixture
import oslo_messaging

from tests import base
from vmar_openstack import conf as vmar_conf
from vmar_openstack.db import hosts as db_hosts
from vmar_openstack.db import models
from vmar_openstack.db import session as db_session
from vmar_openstack.glance_hooks import agent
from vmar_openstack.glance_hooks import metrics
from vmar_openstack.host.exports import hostdir
from vmar_openstack.host.observe import report
from vmar_openstack import ingest
from vmar_openstack.ingest import paths as ingest_paths
from vmar_openstack import mapformat
from vmar_openstack.mapformat import mirror as mirror_format
from vmar_openstack.nova_scheduler import weigher

A = '0a000000-0000-4000-8000-00000000000a'
B = '0b000000-0000-4000-8000-00000000000b'
C = '0c000000-0000-4000-8000-00000000000c'
BS = 4096


class HoldingsTestCase(base.LibraryTestCase):
    """Images A and B in the library.

    A has 4 data blocks; B's map reads 2 blocks of A and 1 of its own (its
    4th block is zero).
    """

    def setUp(self):
        super().setUp()
        self.lib.add(A, self.image('a', [1, 2, 3, 4]), visibility='public')
        self.lib.add(B, self.image('b', [1, 2, 5, None]),
                     visibility='public')
        self.reports = db_hosts.HostReports(self.conf)


class TestShares(HoldingsTestCase):

    def test_map_targets_count_the_blocks_read_from_each_base(self):
        bmap = mapformat.read(ingest.map_path(self.conf, B, 1))
        self.assertEqual({A: 2, B: 1}, dict(mapformat.target_blocks(
            bmap.targets, bmap.extents)))

    def test_share_of_whole_bases_and_mirrors(self):
        self.reports.record('whole-a', [], {A: None})
        self.reports.record('half-a', [], {A: 2})            # 2 of 4
        self.reports.record('all-of-b', [], {B: 1})   # B's 1 canonical
        self.reports.record('both', [], {A: None, B: None})
        self.reports.record('other', [], {C: None})
        self.reports.record('silent', [])
        shares = self.reports.shares(B)
        self.assertEqual({'whole-a', 'half-a', 'all-of-b', 'both'},
                         set(shares))
        self.assertAlmostEqual(2 / 3, shares['whole-a'])
        self.assertAlmostEqual(1 / 3, shares['half-a'])
        # B's mirror holds every block any map reads from B
        self.assertAlmostEqual(1 / 3, shares['all-of-b'])
        self.assertAlmostEqual(1.0, shares['both'])
        # A reads only itself
        self.assertAlmostEqual(0.5, self.reports.shares(A)['half-a'])

    def test_hosts_exporting_a_map_will_hold_what_it_reads(self):
        # before any guest has read a block: the report of a spawn
        self.reports.record('serves-b', [(B, 1)], {})
        self.reports.record('serves-a', [(A, 1)], {A: 1})
        self.reports.record('old-b', [(B, 99)], {})  # no such version
        shares = self.reports.shares(B)
        self.assertEqual({'serves-b', 'serves-a'}, set(shares))
        # the image itself: every block it reads
        self.assertAlmostEqual(1.0, shares['serves-b'])
        # A's export reads all of A: B's 2 blocks of A, not B's own
        self.assertAlmostEqual(2 / 3, shares['serves-a'])
        # B's export reads 2 of A's 4 canonical blocks; a mirror holding
        # more counts for more, never less
        self.assertAlmostEqual(0.5, self.reports.shares(A)['serves-b'])
        self.reports.record('serves-b', [(B, 1)], {A: 3})
        self.assertAlmostEqual(0.75, self.reports.shares(A)['serves-b'])
        self.reports.record('serves-b', [], {})
        self.assertNotIn('serves-b', self.reports.shares(A))

    def test_host_names_with_the_separators_of_a_group(self):
        # each base's holders and each version's hosts come as one string
        # per group; a name that would cut it wrongly is read row by row
        for host in ('a,b', 'c d', 'e f,g', 'plain'):
            self.reports.record(host, [(B, 1)] if host != 'plain' else [],
                                {A: 2})
        shares = self.reports.shares(B)
        self.assertEqual({'a,b', 'c d', 'e f,g'},
                         {h for h, f in shares.items() if f == 1.0})
        self.assertAlmostEqual(1 / 3, shares['plain'])
        self.assertEqual({'a,b': 0.5, 'c d': 0.5, 'e f,g': 0.5,
                          'plain': 0.5}, self.reports.base_shares([A])[A])

    def test_shares_keep_the_precision_they_are_stored_with(self):
        # a third: MariaDB writes its FLOAT as text with 6 digits
        self.lib.add(C, self.image('c', [7, 8, 9]), visibility='public')
        self.reports.record('h', [], {C: 1})
        self.assertAlmostEqual(1 / 3, self.reports.base_shares([C])[C]['h'],
                               places=7)
        self.assertAlmostEqual(1 / 3, self.reports.shares(C)['h'],
                               places=7)

    def test_unknown_images_and_forgotten_hosts(self):
        self.reports.record('h', [], {A: None})
        self.assertEqual({}, self.reports.shares(C))
        self.assertTrue(self.reports.forget('h'))
        self.assertEqual({}, self.reports.shares(B))

    def test_a_report_without_holds_keeps_the_last_ones(self):
        self.reports.record('h', [(B, 1)], {A: None})
        self.reports.record('h', [(B, 2)])
        self.assertEqual([((B, 2),), ((A, None),)],
                         [x for h in self.reports.list()
                          for x in (h.exports, h.holds)])
        self.reports.record('h', [(B, 2)], {})
        self.assertEqual({}, self.reports.shares(B))

    def test_servers_of_an_earlier_map_version_of_the_image(self):
        # B's servers started before its map changed read v1 still
        self.lib.remap(B)
        self.reports.record('old', [(B, 1)], {})
        self.reports.record('cur', [(B, 2)], {})
        self.reports.record('mirror', [], {A: 2})
        shares = self.reports.shares(B)
        self.assertEqual({'old', 'cur', 'mirror'}, set(shares))
        self.assertEqual((1.0, 1.0), (shares['old'], shares['cur']))
        # 2 of A's 4 canonical blocks, of the 2 B reads there, of 3
        self.assertAlmostEqual(1 / 3, shares['mirror'])

    def test_new_map_versions_and_deleted_images(self):
        self.reports.record('h', [], {A: None})
        self.lib.remap(B)
        self.assertAlmostEqual(2 / 3, self.reports.shares(B)['h'])
        self.lib.delete(B)
        self.assertEqual({}, self.reports.shares(B))


class TestUnchangedReports(HoldingsTestCase):
    """A report that says what the last one said writes its row alone."""

    def statements(self, fn):
        """The SQL statements ``fn`` runs, as text."""
        seen = []

        def count(conn, cursor, statement, *args):
            seen.append(statement)
        engine = db_session.get_engine(self.conf)
        sa.event.listen(engine, 'before_cursor_execute', count)
        try:
            fn()
        finally:
            sa.event.remove(engine, 'before_cursor_execute', count)
        return seen

    def record(self, **kw):
        args = dict(host='h', exports=[(B, 1)], holds={A: 2},
                    peer_address='h:1', complete=(A,))
        args.update(kw)
        return self.reports.record(**args)

    def test_an_unchanged_report_moves_its_time_and_order(self):
        t0 = datetime.datetime(2026, 11, 29, 0, 0, 0)
        self.assertTrue(self.record(reported_at=t0, order=('r', 1),
                                    load_per_cpu=0.5))
        whole = self.statements(lambda: self.record(
            reported_at=t0, order=('r', 2), exports=[(A, 1)]))
        t1 = t0 + datetime.timedelta(seconds=60)
        same = self.statements(lambda: self.assertTrue(self.record(
            reported_at=t1, order=('r', 3), exports=[(A, 1)],
            load_per_cpu=1.5)))
        # the host's row read and written, the epoch read; no row of the
        # report's tables
        self.assertLessEqual(len(same), 4, same)
        self.assertGreater(len(whole), 10, whole)
        self.assertFalse([q for q in same if 'vmar_host_' in q], same)
        (h,) = self.reports.list()
        self.assertEqual((t1, ((A, 1),), ((A, 2),), 'h:1', 1.5, (A,)),
                         (h.reported_at, h.exports, h.holds,
                          h.peer_address, h.load_per_cpu, h.complete))
        with db_session.reader(self.conf) as s:
            row = s.get(models.HostReport, 'h')
            self.assertEqual(('r', 3), (row.report_run, row.report_seq))
        # an older report is still refused
        self.assertFalse(self.record(order=('r', 2), exports=[(A, 1)]))

    def test_each_thing_a_report_says_is_written_when_it_changes(self):
        self.record()
        for change in ({'exports': [(B, 1), (A, 1)]}, {'holds': {A: 3}},
                       {'holds': {A: 3, B: None}}, {'complete': ()},
                       {'peer_address': None}, {'peer_address': 'h:2'}):
            kw = dict(exports=[(B, 1)], holds={A: 2}, complete=(A,),
                      peer_address='h:1')
            kw.update(change)
            self.record(**kw)
            (h,) = self.reports.list()
            self.assertEqual(
                (tuple(sorted(kw['exports'])), tuple(sorted(
                    kw['holds'].items(), key=str)), tuple(kw['complete']),
                 kw['peer_address']),
                (h.exports, h.holds, h.complete, h.peer_address), change)
        # a report that says nothing of its holds keeps the last ones
        self.record(holds={A: 3, B: None})
        self.record(holds=None)
        self.assertEqual(((A, 3), (B, None)), self.reports.list()[0].holds)

    def test_shares_follow_a_maps_change_under_an_unchanged_report(self):
        # C reads blocks 1-4 from A and holds 6 and 7: 2 canonical blocks
        self.lib.add(C, self.image('c', [1, 2, 3, 4, 6, 7]),
                     visibility='public')
        self.record(exports=[], holds={C: 2}, complete=())
        self.assertEqual({C: {'h': 1.0}}, self.reports.base_shares([C]))
        # A goes: B (public, before C) becomes canonical for 1 and 2, and
        # C for 3 and 4; C's map is rewritten: 4 canonical blocks
        self.lib.delete(A)
        self.lib.remap(C)
        self.assertEqual(4, dict(mapformat.target_blocks(
            *(lambda m: (m.targets, m.extents))(mapformat.read(
                ingest.map_path(self.conf, C, 2)))))[C])
        self.record(exports=[], holds={C: 2}, complete=())
        self.assertEqual({C: {'h': 0.5}}, self.reports.base_shares([C]))
        # and again with nothing changed: a plain report
        same = self.statements(lambda: self.record(
            exports=[], holds={C: 2}, complete=()))
        self.assertFalse([q for q in same if 'vmar_host_' in q], same)
        self.assertEqual({C: {'h': 0.5}}, self.reports.base_shares([C]))


class TestReportsBesideTheLibrary(HoldingsTestCase):
    """Reports are not library mutations (issue 35: a thousand hosts)."""

    def generation(self):
        with db_session.reader(self.conf) as s:
            return db_session.generation(s)

    def test_a_report_does_not_count_in_the_generation(self):
        # an ingest that prepared its lookups and map in a snapshot uses
        # them only if the generation did not move meanwhile (ingest/ahead)
        before = self.generation()
        self.reports.record('h1', [(B, 1)], {A: None}, peer_address='h1:1')
        self.reports.record('h1', [(A, 1)], {A: 3})
        self.assertTrue(self.reports.forget('h1'))
        self.assertEqual(before, self.generation())

    def test_a_report_does_not_wait_for_the_library_lock(self):
        if db_session.get_engine(self.conf).dialect.name == 'sqlite':
            self.skipTest('SQLite has one writer at a time')
        inside, release = threading.Event(), threading.Event()

        def hold():
            with db_session.locked_writer(self.conf):
                inside.set()
                release.wait(30)
        t = threading.Thread(target=hold)
        t.start()
        self.addCleanup(t.join)
        self.addCleanup(release.set)
        self.assertTrue(inside.wait(30))
        done = threading.Event()

        def report():
            # written, then unchanged: both read the maps epoch on the
            # lock row the ingest holds
            for outcome in (db_hosts.Recorded.WRITTEN,
                            db_hosts.Recorded.UNCHANGED):
                self.assertEqual(outcome, self.reports.record(
                    'h1', [(B, 1)], {A: None}))
            done.set()
        threading.Thread(target=report, daemon=True).start()
        # recorded while an ingest holds the lock (its lock_timeout would
        # fail it otherwise)
        self.assertTrue(done.wait(self.conf.vmar_database.lock_timeout),
                        'the report waited for the library lock')
        release.set()
        self.assertEqual([((B, 1),)], [h.exports for h in
                                       self.reports.list()])

    def test_first_reports_of_many_hosts_at_once(self):
        # a thousand hosts' first reports after the agent starts: on
        # MariaDB the empty rows' gap locks deadlocked them
        errors = []

        def report(k):
            try:
                self.reports.record('h%02d' % k, [(A, 1)], {A: k + 1},
                                    peer_address='h%02d:1' % k)
            except Exception as e:      # noqa: B902  counted below
                errors.append(e)
        threads = [threading.Thread(target=report, args=(k,))
                   for k in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual([], errors)
        self.assertEqual(16, self.reports.counts()['vmar_hosts'])
        self.assertEqual(16, len(self.reports.holders(A)))

    def test_reports_of_one_host_at_once_leave_one_whole_report(self):
        self.reports.record('h1', [], {})
        errors = []

        def report(k):
            try:
                self.reports.record(
                    'h1', [(A, k), (B, k)], {A: k, B: None})
            except Exception as e:      # noqa: B902  counted below
                errors.append(e)
        threads = [threading.Thread(target=report, args=(k,))
                   for k in range(1, 9)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual([], errors)
        (h,) = self.reports.list()
        # the exports and holds of one report, not a mix of several
        k = h.exports[0][1]
        self.assertEqual(((A, k), (B, k)), h.exports)
        self.assertEqual(tuple(sorted(((A, k), (B, None)))), h.holds)


class TestHostSide(HoldingsTestCase):

    def test_holdings_of_whole_bases_and_mirrors(self):
        root = self.scratch()
        files = hostdir.HostDir(root, None)
        os.makedirs(os.path.join(root, 'bases'))
        with open(os.path.join(root, 'bases', A), 'wb') as f:
            f.write(bytes(4 * BS))
        m = files.mirror(B)
        os.makedirs(os.path.dirname(m.data))
        open(m.data, 'wb').close()
        mirror_format.create_present(m.present, mirror_format.Header(
            B, 4 * BS, BS))
        with open(m.present, 'r+b') as f:
            f.seek(mirror_format.PRESENT_HEADER_SIZE)
            f.write(bytes([0b101]))
        # a mirror still being made: no present file yet
        open(files.mirror(C).data, 'wb').close()
        self.assertEqual({A: None, B: 2}, files.holdings())
        self.conf.set_override('host', 'h1', group='vmar_host')
        self.assertEqual([[A, None], [B, 2]],
                         report.payload(self.conf, root)['holds'])

    def test_agent_records_holds_and_drops_bad_ones(self):
        ep = agent.HostReportEndpoint(self.conf, None)
        handled = oslo_messaging.NotificationResult.HANDLED
        self.assertEqual(handled, ep.info({}, 'vmar-export.h',
                                          'vmar.host.exports', {
                                              'host': 'h', 'exports': [],
                                              'holds': [[A, None], [B, 1]]},
                                          {}))
        self.assertEqual([((A, None), (B, 1))],
                         [h.holds for h in self.reports.list()])
        for v, bad in enumerate(([[A, -1]], [['x', 1]], [[A]], 'x',
                                 [[A, 'n']], [[7, 1]], [[A, 2 ** 64]],
                                 [[A, True]], [[A, 1.5]], [[A, None, 1]])):
            self.assertEqual(handled, ep.info(
                {}, 'p', 'vmar.host.exports',
                {'host': 'h', 'exports': [[B, v + 1]], 'holds': bad}, {}))
            # the exports are recorded, what it held before stands
            self.assertEqual([(((B, v + 1),), ((A, None), (B, 1)))],
                             [(h.exports, h.holds)
                              for h in self.reports.list()])

    def test_agent_counts_reports_by_outcome(self):
        ep = agent.HostReportEndpoint(self.conf, None)

        def count(outcome):
            return metrics.REPORTS.labels(outcome)._value.get()
        before = {o: count(o) for o in ('written', 'unchanged', 'older')}
        report = {'host': 'h', 'exports': [[B, 1]], 'holds': [[A, None]],
                  'run': 'r', 'seq': 2}
        for seq in (2, 3, 1):
            ep.info({}, 'p', 'vmar.host.exports', dict(report, seq=seq), {})
        self.assertEqual({'written': 1, 'unchanged': 1, 'older': 1},
                         {o: count(o) - n for o, n in before.items()})

    def test_an_older_report_of_a_run_is_not_recorded_over_a_newer(self):
        """Change reports come a second apart: the pool may swap two."""
        ep = agent.HostReportEndpoint(self.conf, None)
        handled = oslo_messaging.NotificationResult.HANDLED

        def send(version, **order):
            self.assertEqual(handled, ep.info(
                {}, 'vmar-export.h', 'vmar.host.exports',
                {'host': 'h', 'exports': [[A, version]], **order}, {}))
            (h,) = self.reports.list()
            return h.exports
        self.assertEqual(((A, 2),), send(2, run='r1', seq=2))
        # its predecessor, recorded second: left out
        self.assertEqual(((A, 2),), send(1, run='r1', seq=1))
        self.assertEqual(((A, 3),), send(3, run='r1', seq=3))
        # the daemon restarted: its numbers start again
        self.assertEqual(((A, 4),), send(4, run='r2', seq=1))
        # a host of before says nothing of order: recorded
        self.assertEqual(((A, 5),), send(5))
        self.assertEqual(((A, 6),), send(6, run='r2', seq=1))
        # a malformed order is ignored, the report recorded
        for v, bad in enumerate(({'run': 'r2', 'seq': -1},
                                 {'run': 'r2', 'seq': '9'},
                                 {'run': 'r2', 'seq': True},
                                 {'run': 'r' * 37, 'seq': 9},
                                 {'run': 7, 'seq': 9}, {'seq': 9})):
            self.assertEqual(((A, 7 + v),), send(7 + v, **bad))

    def test_holders_of_a_base_best_first(self):
        """Who a host missing blocks of a base is sent to (issue 34)."""
        def report(host, holds, peer='10.0.0.%d:10810', load=0.5, at=None):
            self.reports.record(
                host, [], holds, reported_at=at,
                peer_address=peer and peer % int(host[1:]),
                load_per_cpu=load)
        report('h1', {A: 3})
        report('h2', {A: None}, load=0.9)       # whole, busy: before mirrors
        report('h3', {A: 1}, load=0.1)          # the least loaded mirror
        report('h4', {A: 4}, load=0.1)          # as loaded, fuller: first
        report('h5', {A: None}, peer=None)      # serves no peer
        report('h6', {A: 0})                    # an empty mirror
        report('h7', {B: None})                 # another base
        report('h8', {A: None}, at=models.utcnow()
               - datetime.timedelta(hours=1))   # stopped reporting
        self.assertEqual(
            [('h8', '10.0.0.8:10810', None), ('h2', '10.0.0.2:10810', None),
             ('h4', '10.0.0.4:10810', 4), ('h3', '10.0.0.3:10810', 1),
             ('h1', '10.0.0.1:10810', 3)],
            [(h.host, h.peer_address, h.blocks)
             for h in self.reports.holders(A)])
        self.assertEqual(['h2', 'h4', 'h3'], [
            h.host for h in self.reports.holders(
                A, exclude='h1', max_age=datetime.timedelta(minutes=5),
                limit=3)])
        self.assertEqual([], self.reports.holders(C))
        # a report without a peer server clears it
        report('h2', {A: None}, peer=None)
        self.assertNotIn('h2', [h.host for h in self.reports.holders(A)])

    def test_agent_records_the_peer_server(self):
        ep = agent.HostReportEndpoint(self.conf, None)

        def send(**extra):
            ep.info({}, 'vmar-export.h', 'vmar.host.exports', dict(
                {'host': 'h', 'exports': [], 'holds': [[A, None]]},
                **extra), {})
            return [(h.peer_address, h.load_per_cpu)
                    for h in self.reports.list()]
        self.assertEqual([('10.0.0.1:10810', 0.25)],
                         send(peer='10.0.0.1:10810', load=0.25))
        self.assertEqual([('[fd00::1]:10810', None)],
                         send(peer='[fd00::1]:10810'))
        # an earlier release's report: no peer server
        self.assertEqual([(None, None)], send())
        for bad in ({'peer': 'x'}, {'peer': 7}, {'peer': 'h:0'},
                    {'peer': 'h:1', 'load': 'high'},
                    {'peer': 'h:1', 'load': -1}):
            # the rest of the report stands; no peer is named
            self.assertEqual([(None, None)], send(**bad))
        self.assertEqual([A], [b for h in self.reports.list()
                               for b, _n in h.holds])

    def test_holders_over_rpc(self):
        self.conf.set_override('holder_max_age', 60, group='vmar_agent')
        self.reports.record('h1', [], {A: 2}, peer_address='10.0.0.1:1',
                            load_per_cpu=0.2)
        self.reports.record('h2', [], {A: None}, peer_address='10.0.0.2:1')
        ep = agent.HoldersEndpoint(self.conf)
        self.assertEqual(
            [{'host': 'h2', 'peer': '10.0.0.2:1', 'blocks': None}],
            ep.holders({}, A.upper(), host='h1'))
        self.assertEqual(2, len(ep.holders({}, A, host='h9')))
        self.assertEqual(1, len(ep.holders({}, A, host='h9', limit=1)))
        self.assertRaises(ValueError, ep.holders, {}, 'not-a-uuid', 'h1')

    def test_report_names_the_peer_server(self):
        root = self.scratch()
        self.conf.set_override('host', 'h1', group='vmar_host')
        body = report.payload(self.conf, root)
        self.assertNotIn('peer', body)
        self.conf.set_override('listen_address', 'fd00::5',
                               group='vmar_peers')
        body = report.payload(self.conf, root)
        self.assertEqual('[fd00::5]:10810', body['peer'])
        self.assertGreaterEqual(body['load'], 0)

    def test_complete_mirrors_hold_every_block_only_their_image_has(self):
        """What a host can serve once an image is deleted (issue 34)."""
        root = self.scratch()
        files = hostdir.HostDir(root, None)
        # B's map reads blocks 0 and 1 from A, block 2 from B itself
        version = self.lib.remap(B)
        os.makedirs(os.path.join(root, 'maps'))
        shutil.copy(ingest_paths.map_path(self.conf, B, version),
                    files.map_file(B, version))
        m = files.mirror(B)
        os.makedirs(os.path.dirname(m.data))
        open(m.data, 'wb').close()
        mirror_format.create_present(m.present, mirror_format.Header(
            B, 4 * BS, BS))

        def present(bits):
            with open(m.present, 'r+b') as f:
                f.seek(mirror_format.PRESENT_HEADER_SIZE)
                f.write(bytes([bits]))
            return files.complete_mirrors([(B, version)])
        self.assertEqual(set(), present(0b0011))     # A's blocks only
        self.assertEqual({B}, present(0b0100))       # B's own block
        # a version whose map the host lacks says nothing of it
        self.assertEqual(set(), files.complete_mirrors([(B, version),
                                                        (B, version + 1)]))
        # not exported: not asked; a whole base: not a mirror
        self.assertEqual(set(), files.complete_mirrors([]))
        # the report asks about the host's exports: none here
        self.conf.set_override('host', 'h1', group='vmar_host')
        self.assertEqual([], report.payload(self.conf, root)['complete'])

    def test_complete_holders(self):
        def record(host, holds, complete=(), peer='10.0.0.1:1', age=0):
            self.reports.record(
                host, [], holds, peer_address=peer, complete=complete,
                reported_at=models.utcnow() - datetime.timedelta(
                    seconds=age))
        record('h1', {A: 3})                    # a mirror still filling
        record('h2', {A: 4}, complete=[A])      # filled
        record('h3', {A: None})                 # the whole base
        record('h4', {A: None}, peer=None)      # serves no peer
        record('h5', {A: 4}, complete=[A], age=3600)
        self.assertEqual(['h2', 'h3', 'h5'],
                         self.reports.complete_holders(A))
        self.assertEqual(['h2', 'h3'], self.reports.complete_holders(
            A, max_age=datetime.timedelta(minutes=5)))
        self.assertEqual([], self.reports.complete_holders(B))
        self.assertEqual((A,), [h for h in self.reports.list()
                                if h.host == 'h2'][0].complete)

    def test_agent_records_complete_mirrors(self):
        ep = agent.HostReportEndpoint(self.conf, None)

        def send(complete):
            ep.info({}, 'vmar-export.h', 'vmar.host.exports', {
                'host': 'h', 'exports': [[B, 1]], 'holds': [[A, 4], [B, 1]],
                'peer': '10.0.0.1:1', 'complete': complete}, {})
            (h,) = self.reports.list()
            return h.complete, h.exports
        self.assertEqual(((A,), ((B, 1),)), send([A]))
        # an earlier release's report, and bad ones: nothing is complete,
        # the rest of the report stands
        for bad in (None, 'x', [C], ['x'], [7], {A: 1}):
            self.assertEqual(((), ((B, 1),)), send(bad))

    def test_holdings_skip_what_is_not_vmars(self):
        root = self.scratch()
        os.makedirs(os.path.join(root, 'bases', 'lost+found'))
        with open(os.path.join(root, 'bases', A), 'wb') as f:
            f.write(bytes(BS))
        self.assertEqual({A: None}, hostdir.HostDir(root, None).holdings())


class TestLeads(HoldingsTestCase):
    """Places in a burst, what vmar-agent tells hosts to wait for."""

    def test_a_burst_has_a_lead(self):
        """The first host to ask for a base nobody holds fetches it first."""
        self.conf.set_override('holder_max_age', 60, group='vmar_agent')
        for h in ('h1', 'h2', 'h3'):
            self.reports.record(h, [], {}, peer_address='%s:1' % h)
        self.reports.record('h4', [], {})       # serves no peer
        ep = agent.HoldersEndpoint(self.conf)
        lead = {'host': 'h2', 'peer': 'h2:1', 'blocks': 0, 'lead': True}
        # a host without a peer server cannot lead: nobody could read it
        self.assertEqual([], ep.holders({}, A, host='h4'))
        self.assertEqual([], ep.holders({}, A, host='h2'))
        self.assertEqual([lead], ep.holders({}, A, host='h1'))
        self.assertEqual([lead], ep.holders({}, A, host='h3'))
        # the lead itself is told of no lead; another base has its own
        self.assertEqual([], ep.holders({}, A, host='h2'))
        self.assertEqual([], ep.holders({}, B, host='h3'))
        self.assertEqual('h3', ep.holders({}, B, host='h1')[0]['host'])
        # once mirrors hold blocks: holders first, the lead last, with
        # what it holds
        self.reports.record('h1', [], {A: 5}, peer_address='h1:1')
        self.reports.record('h2', [], {A: 3}, peer_address='h2:1')
        self.assertEqual(
            [{'host': 'h1', 'peer': 'h1:1', 'blocks': 5},
             dict(lead, blocks=3)], ep.holders({}, A, host='h3'))
        # a whole copy serves every run: no lead to wait for
        self.reports.record('h1', [], {A: None}, peer_address='h1:1')
        self.assertEqual([{'host': 'h1', 'peer': 'h1:1', 'blocks': None},
                          {'host': 'h2', 'peer': 'h2:1', 'blocks': 3}],
                         ep.holders({}, A, host='h3'))

    def test_a_burst_is_a_tree(self):
        """No host leads more than fetch_lead_fanout others."""
        self.conf.set_override('holder_max_age', 60, group='vmar_agent')
        self.conf.set_override('fetch_lead_fanout', 2, group='vmar_agent')
        hosts = ['h%d' % i for i in range(7)]
        for h in hosts:
            self.reports.record(h, [], {}, peer_address='%s:1' % h)
        self.reports.record('x', [], {})        # serves no peer
        ep = agent.HoldersEndpoint(self.conf)

        def lead(host):
            return [h['host'] for h in ep.holders({}, A, host=host)]
        # in the order they ask: h0 first; h1, h2 wait for h0; h3, h4 for
        # h1; h5, h6 for h2
        got = {h: lead(h) for h in hosts}
        self.assertEqual({'h0': [], 'h1': ['h0'], 'h2': ['h0'],
                          'h3': ['h1'], 'h4': ['h1'], 'h5': ['h2'],
                          'h6': ['h2']}, got)
        # asked again, a host keeps its place
        self.assertEqual(['h1'], lead('h4'))
        # a host without a peer server waits too, and takes no place
        self.assertEqual(['h3'], lead('x'))
        self.assertEqual(['h3'], lead('x'))
        self.assertEqual(7, self.reports.counts()['vmar_fetch_leads'])
        # a forgotten lead passes its followers on to its own lead
        self.assertTrue(self.reports.forget('h1'))
        self.assertEqual({'h3': ['h0'], 'h4': ['h0'], 'h5': ['h2']},
                         {h: lead(h) for h in ('h3', 'h4', 'h5')})
        self.assertTrue(self.reports.forget('h0'))
        self.assertEqual({'h2': [], 'h3': ['h2'], 'h6': ['h2']},
                         {h: lead(h) for h in ('h2', 'h3', 'h6')})

    def test_a_lead_lasts_its_time(self):
        self.conf.set_override('holder_max_age', 60, group='vmar_agent')
        self.conf.set_override('fetch_lead_seconds', 300,
                               group='vmar_agent')
        for h in ('h1', 'h2'):
            self.reports.record(h, [], {}, peer_address='%s:1' % h)
        ep = agent.HoldersEndpoint(self.conf)
        self.assertEqual([], ep.holders({}, A, host='h1'))
        self.assertEqual(['h1'], [h['host'] for h in ep.holders(
            {}, A, host='h2')])
        # past it, the next host to ask leads
        with db_session.writer(self.conf) as s:
            s.execute(sa.update(models.FetchLead).values(
                since=models.utcnow() - datetime.timedelta(seconds=301)))
        self.assertEqual([], ep.holders({}, A, host='h2'))
        self.assertEqual(['h2'], [h['host'] for h in ep.holders(
            {}, A, host='h1')])
        # a forgotten host leads no more: h1 is first now
        self.assertTrue(self.reports.forget('h2'))
        self.assertEqual(1, self.reports.counts()['vmar_fetch_leads'])
        self.assertEqual([], ep.holders({}, A, host='h1'))
        # 0: no leads at all
        self.conf.set_override('fetch_lead_seconds', 0, group='vmar_agent')
        ep = agent.HoldersEndpoint(self.conf)
        self.assertEqual([], ep.holders({}, B, host='h1'))
        self.assertEqual([], ep.holders({}, B, host='h2'))
        self.assertEqual(1, self.reports.counts()['vmar_fetch_leads'])

    def test_hosts_asking_at_once_get_one_place_each(self):
        self.conf.set_override('holder_max_age', 60, group='vmar_agent')
        self.conf.set_override('fetch_lead_fanout', 2, group='vmar_agent')
        hosts = ['h%d' % i for i in range(8)]
        for h in hosts:
            self.reports.record(h, [], {}, peer_address='%s:1' % h)
        ep = agent.HoldersEndpoint(self.conf)
        got, errors = {}, []

        def ask(h):
            try:
                got[h] = [x['host'] for x in ep.holders({}, A, host=h)]
            except Exception as e:      # reported below
                errors.append(e)
        threads = [threading.Thread(target=ask, args=(h,)) for h in hosts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual([], errors)
        with db_session.reader(self.conf) as s:
            rows = s.execute(sa.select(models.FetchLead.seq,
                                       models.FetchLead.host).order_by(
                models.FetchLead.seq)).all()
        order = [r.host for r in rows]
        self.assertEqual(sorted(hosts), sorted(order))
        # one first host; each other waits for the one its place says
        self.assertEqual({order[0]: []}, {h: v for h, v in got.items()
                                          if not v})
        for i, h in enumerate(order[1:], 1):
            self.assertEqual([order[(i - 1) // 2]], got[h])


class TestWeigher(HoldingsTestCase):

    def setUp(self):
        super().setUp()
        objects.register_all()
        fixture = self.useFixture(config_fixture.Config(vmar_conf.CONF))
        fixture.config(connection=self.database_url(), group='vmar_database')
        self.reports.record('h1', [], {A: None})
        self.reports.record('h2', [], {A: None, B: None})
        self.hosts = [host_manager.HostState(h, h, str(uuid.uuid4()))
                      for h in ('h0', 'h1', 'h2')]

    def spec(self, image_id=B, vmar='true'):
        return objects.RequestSpec(
            flavor=objects.Flavor(extra_specs={'vmar:enabled': vmar}),
            image=objects.ImageMeta(id=image_id))

    def weighed(self, spec):
        return [(w.obj.host, round(w.weight, 3)) for w in
                weights.HostWeightHandler().get_weighed_objects(
                    [weigher.VmarWeigher()], self.hosts, spec)]

    def test_hosts_holding_more_of_the_image_weigh_more(self):
        self.assertEqual([('h2', 5.0), ('h1', 3.333), ('h0', 0.0)],
                         self.weighed(self.spec()))

    def test_the_option_is_read_at_each_request(self):
        w = weigher.VmarWeigher()
        handler = weights.HostWeightHandler()
        for m in (5.0, 2.0):
            vmar_conf.CONF.set_override('weight_multiplier', m,
                                        group='vmar_scheduler')
            got = [(o.obj.host, round(o.weight, 3)) for o in
                   handler.get_weighed_objects([w], self.hosts,
                                               self.spec())]
            self.assertEqual([('h2', m), ('h1', round(m * 2 / 3, 3)),
                              ('h0', 0.0)], got)

    def test_aggregate_multiplier_overrides_the_option(self):
        self.hosts[1].aggregates = [objects.Aggregate(
            metadata={'vmar_weight_multiplier': '9'})]
        self.assertEqual([('h1', 6.0), ('h2', 5.0), ('h0', 0.0)],
                         self.weighed(self.spec()))

    def test_ordinary_flavors_and_unknown_images_weigh_nothing(self):
        for spec in (self.spec(vmar='false'), self.spec(image_id=C),
                     objects.RequestSpec(
                         flavor=objects.Flavor(extra_specs={
                             'vmar:enabled': 'true'}),
                         image=objects.ImageMeta())):
            self.assertEqual({0.0}, {w for _h, w in self.weighed(spec)})

    def test_boots_from_volume_weigh_nothing(self):
        spec = self.spec()
        spec.is_bfv = True
        self.assertEqual({0.0}, {w for _h, w in self.weighed(spec)})

    def test_one_weigher_weighs_each_request_by_its_own_image(self):
        w = weigher.VmarWeigher()
        objs = [weights.WeighedHost(h, 0.0) for h in self.hosts]
        self.assertEqual([0.0, 2 / 3, 1.0], w.weigh_objects(objs,
                                                            self.spec()))
        self.assertEqual([0.0, 1.0, 1.0], w.weigh_objects(objs,
                                                          self.spec(A)))

    def test_an_unreachable_database_weighs_nothing_for_a_while(self):
        self.useFixture(config_fixture.Config(vmar_conf.CONF)).config(
            connection='sqlite:///%s/no/such/dir/x.sqlite' % self.tmp,
            group='vmar_database')
        w = weigher.VmarWeigher()
        calls = []
        real = db_hosts.HostReports.shares

        def counted(reports, image_id, *args):
            calls.append(image_id)
            return real(reports, image_id, *args)
        self.useFixture(fixtures.MockPatchObject(
            db_hosts.HostReports, 'shares', counted))
        for _ in range(3):
            self.assertEqual({}, w.shares(self.spec()))
        self.assertEqual([B], calls)

    def test_an_unset_database_weighs_nothing(self):
        # a scheduler whose files set no connection (oslo.config still
        # reports a cleared override as one: a configuration of its own)
        unset = cfg.ConfigOpts()
        vmar_conf.register_opts(unset)
        unset([], project='vmar', default_config_files=[])
        state = self.useFixture(fixtures.TempDir()).path
        unset.set_default('state_dir', state, group='vmar')
        with mock.patch.object(weigher, 'CONF', unset):
            self.assertEqual({0.0},
                             {w for _h, w in self.weighed(self.spec())})
        # and it opened no database of its own (the default one)
        self.assertEqual([], os.listdir(state))


class TestBackfill(HoldingsTestCase):
    """Maps written before revision 0010 get their counts from the files."""

    def forget_counts(self):
        with db_session.locked_writer(self.conf) as s:
            s.execute(sa.delete(models.MapTarget))

    def test_counts_of_earlier_maps_come_from_their_files(self):
        self.reports.record('h', [], {A: None})
        self.forget_counts()
        self.assertEqual({}, self.reports.shares(B))
        self.assertEqual((2, []), self.lib.backfill_map_targets())
        self.assertAlmostEqual(2 / 3, self.reports.shares(B)['h'])
        # once done, nothing more to do
        self.assertEqual((0, []), self.lib.backfill_map_targets())

    def test_a_lost_map_file_is_named(self):
        self.forget_counts()
        os.unlink(ingest.map_path(self.conf, B, 1))
        self.assertEqual((1, [(B, 1)]), self.lib.backfill_map_targets())
