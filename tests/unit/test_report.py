"""The host's reports to vmar-agent: when they are sent.

The notifier is a test double for oslo.messaging's Notifier (RabbitMQ);
test_glance's TestGlance.test_a_new_export_is_reported_at_once sends
through the real one.
"""

import os
import threading

import fixtures
import testtools

from tests import base
from vmar_openstack.host.observe import report
from vmar_openstack import periodic

WAIT = 30   # bound on a wait for a thread that should act at once


class RecordingNotifier:
    """Test double of oslo_messaging.Notifier: keeps what is sent."""

    def __init__(self):
        self.sent = []
        self.cond = threading.Condition()

    def info(self, ctxt, event_type, payload):
        with self.cond:
            self.sent.append((event_type, payload))
            self.cond.notify_all()

    def wait_for(self, n):
        with self.cond:
            if not self.cond.wait_for(lambda: len(self.sent) >= n, WAIT):
                raise AssertionError('%d reports sent, not %d'
                                     % (len(self.sent), n))


class Counter(periodic.Periodic):
    """A Periodic counting its steps, which the test can hold up."""

    def __init__(self, interval, settle=0.0):
        super().__init__(interval, settle)
        self.steps = 0
        self.stepped = threading.Condition()

    def step(self):
        with self.stepped:
            self.steps += 1
            self.stepped.notify_all()

    def wait_for(self, n):
        with self.stepped:
            if not self.stepped.wait_for(lambda: self.steps >= n, WAIT):
                raise AssertionError('%d steps, not %d' % (self.steps, n))


class TestPeriodic(testtools.TestCase):

    def test_wakes_within_the_settling_time_make_one_step(self):
        p = Counter(3600, settle=2).start()
        self.addCleanup(p.stop)
        p.wait_for(1)
        for _i in range(5):
            p.wake()
        p.wait_for(2)
        # the thread is past its settling time: the wakes were cleared
        self.assertFalse(p.woken.is_set())
        self.assertEqual(2, p.steps)

    def test_stop_does_not_wait_for_the_settling_time(self):
        p = Counter(3600, settle=3600).start()
        p.wait_for(1)
        p.wake()
        p.stop()        # returns: the thread did not wait an hour
        self.assertFalse(p.thread.is_alive())


class TestReporter(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.root = self.useFixture(fixtures.TempDir()).path
        os.makedirs(os.path.join(self.root, 'bases'))
        self.conf = base.new_conf()
        self.conf.set_override('host', 'h1', group='vmar_host')
        self.conf.set_override('report_interval', 3600, group='vmar_host')
        self.notifier = RecordingNotifier()

    def reporter(self, delay):
        self.conf.set_override('report_change_delay', delay,
                               group='vmar_host')
        r = report.Reporter(self.conf, self.root, self.notifier).start()
        self.addCleanup(r.stop)
        self.notifier.wait_for(1)       # the first report, at start
        return r

    def test_changes_are_reported_before_the_interval_ends(self):
        r = self.reporter(0.2)
        r.changed()
        r.changed()
        self.notifier.wait_for(2)
        event, body = self.notifier.sent[1]
        self.assertEqual('vmar.host.exports', event)
        self.assertEqual('h1', body['host'])

    def test_reports_are_numbered_in_the_daemons_run(self):
        r = self.reporter(0.01)
        r.changed()
        self.notifier.wait_for(2)
        (_e, one), (_e, two) = self.notifier.sent[:2]
        self.assertEqual((r.run, r.run), (one['run'], two['run']))
        self.assertEqual((1, 2), (one['seq'], two['seq']))
        other = report.Reporter(self.conf, self.root, self.notifier)
        self.assertNotEqual(r.run, other.run)

    def test_a_delay_of_0_leaves_changes_to_the_next_interval(self):
        r = self.reporter(0)
        r.changed()
        self.assertFalse(r.woken.is_set())
        r.stop()
        self.assertEqual(1, len(self.notifier.sent))
