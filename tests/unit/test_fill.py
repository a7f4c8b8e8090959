"""The fill queue: when a fill starts, and what a failed one leaves.

The export service is a stand-in here (no daemon); the fill itself runs
on the real daemon in tests/functional/test_export.py (TestFill).
"""

import os
import threading
import time
import types

import fixtures
import testtools

from vmar_openstack.export import prefetch
from vmar_openstack import names


class TestFillQueue(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.host = self.useFixture(fixtures.TempDir()).path
        conf = types.SimpleNamespace(vmar=types.SimpleNamespace(
            fill_delay=600))
        self.svc = types.SimpleNamespace(conf=conf, host_dir=self.host)
        self.pf = prefetch.Prefetcher(self.svc)
        self.name = names.export('0e000000-0000-4000-8000-00000000000e', 1,
                                 names.new_key())
        self.filled = []
        self.done = threading.Event()

    def fill(self, name):
        self.filled.append(name)
        self.done.set()

    def test_a_fill_starts_when_it_is_due(self):
        self.pf.fill = self.fill
        prefetch.request_fill(self.host, self.name, 600)
        self.pf.poll()
        self.assertEqual({}, self.pf.running)
        # due now
        path = os.path.join(prefetch.fill_dir(self.host), self.name)
        os.utime(path, (time.time() - 1, time.time() - 1))
        self.pf.poll()
        self.assertTrue(self.done.wait(10))
        for t in self.pf.running.values():
            t.join(10)
        self.assertEqual([self.name], self.filled)
        self.assertFalse(os.path.exists(path))

    def test_a_failed_fill_is_queued_again_later(self):
        def fail(name):
            raise OSError('the store is away')
        self.pf.fill = fail
        prefetch.request_fill(self.host, self.name, 0)
        path = os.path.join(prefetch.fill_dir(self.host), self.name)
        os.utime(path, (time.time() - 1, time.time() - 1))
        self.pf.poll()
        for t in list(self.pf.running.values()):
            t.join(10)
        self.assertTrue(os.path.exists(path))
        self.assertGreater(os.stat(path).st_mtime, time.time() + 500)

    def test_names_not_of_exports_are_left_alone(self):
        self.pf.fill = self.fill
        os.makedirs(prefetch.fill_dir(self.host))
        stray = os.path.join(prefetch.fill_dir(self.host), '.tmp-x')
        open(stray, 'w').close()
        os.utime(stray, (0, 0))
        self.pf.poll()
        self.assertEqual({}, self.pf.running)
