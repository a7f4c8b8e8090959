"""Removing map versions: what hosts hold, ages, and host reports.

Glance is the in-memory double of tests/unit/test_publish.py; the library
and the host reports are real (SQLite). The functional test against
RabbitMQ, glance-api, vmar-agent and a vmar-export host is
tests/functional/test_glance.py TestGlance.test_map_versions_gc.
"""

import datetime
import os
import threading

import oslo_messaging

from tests import base
from tests.unit import test_publish
from vmar_openstack.db import hosts as db_hosts
from vmar_openstack.glance_hooks import agent
from vmar_openstack.glance_hooks import gc
from vmar_openstack.glance_hooks import metrics
from vmar_openstack import ingest
from vmar_openstack.mapformat import bootset
from vmar_openstack import names

A = '0a000000-0000-4000-8000-00000000000a'
B = '0b000000-0000-4000-8000-00000000000b'
DAY = 86400


class TestMapGC(base.LibraryTestCase):

    def setUp(self):
        super().setUp()
        self.glance = test_publish.FakeGlance()
        self.handler = agent.Handler(self.conf, self.glance, self.lib)
        self.reports = db_hosts.HostReports(self.conf)
        for image_id, seeds in ((A, [1, 2, 3]), (B, [1, 2, 4])):
            self.lib.add(image_id, self.image(image_id, seeds),
                         visibility='public')
            self.handler.publisher.current(image_id)
        # a second version of each: the first is superseded
        for image_id in (A, B):
            self.lib.remap(image_id)
            self.handler.publisher.current(image_id)
        self.superseded_at = {sv.image_id: sv.superseded_at
                              for sv in self.lib.superseded()}

    def image(self, name, seeds):
        os.makedirs(os.path.join(self.tmp, 'img'), exist_ok=True)
        return base.write_image(os.path.join(self.tmp, 'img', name), seeds)

    def published(self, image_id, version):
        return names.map_image_id(image_id, version) in \
            self.glance.images.store

    def later(self, seconds):
        return max(self.superseded_at.values()) + datetime.timedelta(
            seconds=seconds)

    def test_only_versions_superseded_and_unheld_go(self):
        self.assertEqual({(A, 1), (B, 1)}, {(sv.image_id, sv.version)
                                            for sv in self.lib.superseded()})
        # too young
        p = gc.plan(self.conf, self.lib, DAY, now=self.later(60))
        self.assertEqual([], p.deletable)
        self.assertIn('superseded less than', p.kept[(A, 1)])
        # a host holds A v1; another has not reported since
        self.reports.record('h1', [(A, 1), (A, 2)],
                            reported_at=self.later(10))
        self.reports.record('h2', [], reported_at=self.later(-3600))
        p = gc.plan(self.conf, self.lib, 60, now=self.later(DAY))
        self.assertEqual([], p.deletable)
        self.assertEqual('held by h1', p.kept[(A, 1)])
        self.assertEqual('h2 did not report since it was superseded',
                         p.kept[(B, 1)])
        # h2 reports: B v1 goes, in Glance, on disk and in the records
        self.reports.record('h2', [(B, 2)], reported_at=self.later(20))
        self.conf.set_override('map_gc_min_age', 0, group='vmar_agent')
        p = agent.collect_garbage(self.conf, self.handler, dry_run=True)
        self.assertEqual([(B, 1)], [(sv.image_id, sv.version)
                                    for sv in p.deletable])
        self.assertTrue(self.published(B, 1))
        agent.collect_garbage(self.conf, self.handler)
        self.assertFalse(self.published(B, 1))
        self.assertFalse(os.path.exists(ingest.map_path(self.conf, B, 1)))
        self.assertEqual({(A, 1)}, {(sv.image_id, sv.version)
                                    for sv in self.lib.superseded()})
        # current versions are untouched
        for image_id in (A, B):
            self.assertTrue(self.published(image_id, 2))
            self.assertTrue(os.path.exists(ingest.map_path(self.conf,
                                                           image_id, 2)))
        self.assertTrue(self.published(A, 1))
        # h1 lets A v1 go; a current version cannot be dropped
        self.reports.record('h1', [(A, 2)])
        agent.collect_garbage(self.conf, self.handler)
        self.assertFalse(self.published(A, 1))
        self.assertEqual([], self.lib.superseded())
        self.assertFalse(self.lib.drop_map_version(A, 2))

    def test_digest_list_of_a_deleted_base_goes_with_the_last_map(self):
        # B reads blocks 1 and 2 from A; A is deleted
        for image_id in (A, B):
            self.handler.publisher.digests(image_id)
        self.assertIn(A, self.lib.bases_of(B, 2))
        self.handler.delete({'id': A})
        self.assertNotIn(A, self.lib.bases_of(B, 3))
        dig = {i: names.digests_image_id(i) for i in (A, B)}
        self.assertFalse(self.published(A, 2))
        self.assertIn(dig[A], self.glance.images.store)
        self.conf.set_override('map_gc_min_age', 0, group='vmar_agent')
        # a host still runs B v2, which reads A: A's digest list stays
        self.reports.record('h1', [(B, 2)])
        p = agent.collect_garbage(self.conf, self.handler)
        self.assertEqual([(B, 1)], [(sv.image_id, sv.version)
                                    for sv in p.deletable])
        self.assertIn(dig[A], self.glance.images.store)
        # it stops: B v2 goes, and A's digest list with it; B's stays
        self.reports.record('h1', [(B, 3)])
        agent.collect_garbage(self.conf, self.handler)
        self.assertNotIn(dig[A], self.glance.images.store)
        self.assertIn(dig[B], self.glance.images.store)
        self.assertTrue(self.published(B, 3))

    def test_maps_hosts_export_outlive_their_deleted_image(self):
        """A server of a deleted image can still move (issue 34)."""
        for image_id in (A, B):
            self.handler.publisher.digests(image_id)
        dig = names.digests_image_id(A)
        # h1 (no peer server) and h2 run servers of A v1 and v2 when A is
        # deleted: only what a host serving peers exports is kept
        self.reports.record('h1', [(A, 1)])
        self.reports.record('h2', [(A, 2)], peer_address='10.0.0.2:10810')
        self.handler.delete({'id': A})
        self.assertTrue(self.published(A, 2))
        self.assertFalse(self.published(A, 1))
        self.conf.set_override('map_gc_min_age', 0, group='vmar_agent')
        # B's old versions (which read A) go; A v2 and A's digest list,
        # which a host moving the server checks A's blocks against, stay
        self.reports.record('h1', [(A, 2), (B, 3)])
        self.reports.record('h2', [(A, 2)], peer_address='10.0.0.2:10810')
        agent.collect_garbage(self.conf, self.handler)
        self.assertEqual([], self.lib.superseded())
        self.assertTrue(self.published(A, 2))
        self.assertIn(dig, self.glance.images.store)
        # h1's server left; h2's still runs: still held
        self.reports.record('h1', [(B, 3)])
        agent.collect_garbage(self.conf, self.handler)
        self.assertTrue(self.published(A, 2))
        # deleted: both go; B's own stay
        self.reports.record('h2', [])
        agent.collect_garbage(self.conf, self.handler)
        self.assertFalse(self.published(A, 2))
        self.assertNotIn(dig, self.glance.images.store)
        self.assertTrue(self.published(B, 3))
        self.assertIn(names.digests_image_id(B), self.glance.images.store)

    def test_forgotten_host_holds_nothing(self):
        self.reports.record('gone', [(A, 1), (B, 1)])
        self.conf.set_override('map_gc_min_age', 0, group='vmar_agent')
        self.assertEqual([], agent.collect_garbage(
            self.conf, self.handler).deletable)
        self.assertTrue(self.reports.forget('gone'))
        self.assertFalse(self.reports.forget('gone'))
        self.assertEqual(2, len(agent.collect_garbage(
            self.conf, self.handler).deletable))


class TestHostReportEndpoint(base.LibraryTestCase):

    def test_reports_replace_the_last_one_and_bad_ones_are_dropped(self):
        ep = agent.HostReportEndpoint(self.conf, None)
        reports = db_hosts.HostReports(self.conf)
        handled = oslo_messaging.NotificationResult.HANDLED
        for payload in ({'host': 'h', 'exports': [[A, 1], [B, 3]]},
                        {'host': 'h', 'exports': [[A, 2]]}):
            self.assertEqual(handled, ep.info({}, 'vmar-export.h',
                                              'vmar.host.exports', payload,
                                              {}))
        self.assertEqual([('h', ((A, 2),))],
                         [(h.host, h.exports) for h in reports.list()])
        for bad in ({'exports': []}, {'host': 'x', 'exports': [['no', 1]]},
                    {'host': '', 'exports': []}, 'nonsense',
                    {'host': 'x', 'exports': [[A, 'v']]}):
            self.assertEqual(handled, ep.info({}, 'p', 'vmar.host.exports',
                                              bad, {}))
        self.assertEqual(['h'], [h.host for h in reports.list()])


class TestReportWorkers(base.LibraryTestCase):
    """[vmar_agent] report_workers: reports recorded at once."""

    def setUp(self):
        super().setUp()
        self.conf.set_override('report_workers', 2, group='vmar_agent')
        self.conf.set_override('retry_delay', 0, group='vmar_agent')
        self.ep = agent.HostReportEndpoint(self.conf, None)
        self.lock = threading.Lock()
        self.inside, self.most = 0, 0
        self.go = threading.Event()
        self.real = self.ep.reports.record
        self.ep.reports.record = self.record

    def record(self, host, *args, **kw):
        with self.lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
        try:
            self.assertTrue(self.go.wait(10))
            if host.startswith('bad'):
                raise RuntimeError('the database is away')
            return self.real(host, *args, **kw)
        finally:
            with self.lock:
                self.inside -= 1

    def send(self, host, results):
        results[host] = self.ep.info(
            {}, 'vmar-export.' + host, 'vmar.host.exports',
            {'host': host, 'exports': [[A, 1]]}, {})

    def waiting(self):
        return metrics.REPORTS_WAITING.collect()[0].samples[0].value

    def wait_for(self, probe):
        for _ in range(1000):
            if probe():
                return
            self.go.wait(0.01)
        self.fail('never: %s' % probe)

    def test_reports_past_the_workers_wait_for_a_slot(self):
        results = {}
        hosts = ['bad-1'] + ['h%d' % i for i in range(5)]
        threads = [threading.Thread(target=self.send, args=(h, results))
                   for h in hosts]
        for t in threads:
            t.start()
        # two record, four wait in the gauge and not in the database
        self.wait_for(lambda: self.inside == 2 and self.waiting() == 4)
        self.go.set()
        for t in threads:
            t.join(30)
        self.assertEqual(2, self.most)
        self.assertEqual(0, self.waiting())
        # the failed one is redelivered and gave its slot back
        self.assertEqual(oslo_messaging.NotificationResult.REQUEUE,
                         results.pop('bad-1'))
        self.assertEqual({h: oslo_messaging.NotificationResult.HANDLED
                          for h in hosts[1:]}, results)
        self.assertEqual(sorted(hosts[1:]), sorted(
            h.host for h in db_hosts.HostReports(self.conf).list()))


class TestRecordedBootsets(TestMapGC):
    """vmar.host.bootset: the agent publishes the first recorded set."""

    def send(self, payload):
        ep = agent.HostReportEndpoint(self.conf, self.handler)
        return ep.info({}, 'vmar-export.h', 'vmar.host.bootset', payload, {})

    def bset(self, image_id=A, size=None, source='recorded',
             extents=((0, 2),)):
        return bootset.encode(bootset.Bootset(
            image_id, size or 3 * 4096, 4096, source, extents)).decode()

    def test_first_recorded_set_is_published_once(self):
        handled = oslo_messaging.NotificationResult.HANDLED
        rid = names.bootset_image_id(A, 'recorded')
        self.assertNotEqual(names.bootset_image_id(A), rid)
        self.assertEqual(handled, self.send({'image_id': A,
                                             'bootset': self.bset()}))
        first = self.glance.images.store[rid]['data']
        self.assertEqual(self.bset().encode(), first)
        # a later host's recording changes nothing
        self.send({'image_id': A, 'bootset': self.bset(extents=((1, 1),))})
        self.assertEqual(first, self.glance.images.store[rid]['data'])

    def test_bad_sets_are_dropped(self):
        handled = oslo_messaging.NotificationResult.HANDLED
        gone = '0c000000-0000-4000-8000-00000000000c'
        for payload in ({'image_id': A},
                        {'image_id': 'x', 'bootset': self.bset()},
                        {'image_id': B, 'bootset': self.bset()},
                        {'image_id': A, 'bootset': self.bset(
                            source='introspected')},
                        {'image_id': A, 'bootset': self.bset(size=8192,
                                                             extents=())},
                        {'image_id': gone, 'bootset': self.bset(gone)},
                        {'image_id': A, 'bootset': '{'}, 'nonsense'):
            self.assertEqual(handled, self.send(payload))
        self.assertFalse([k for k in self.glance.images.store
                          if k in (names.bootset_image_id(i, 'recorded')
                                   for i in (A, B, gone))])
