"""The fill queue: when a fill starts, and what a failed one leaves.

The export service is a stand-in here (no daemon); the fill itself runs
on the real daemon in tests/functional/test_export.py (TestFill).
"""

import os
import threading
import time
import types

import fixtures
import numpy as np
import testtools

from vmar_openstack.host.cache import prefetch
from vmar_openstack import mapformat
from vmar_openstack import names


class TestFillQueue(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.host = self.useFixture(fixtures.TempDir()).path
        self.conf = types.SimpleNamespace(vmar_host=types.SimpleNamespace(
            fill=True, fill_delay=0))
        self.svc = types.SimpleNamespace(conf=self.conf, host_dir=self.host)
        self.pf = prefetch.Prefetcher(self.svc)
        self.exported = True
        self.pf._exported = lambda name: self.exported
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
        _prefetches, fills = prefetch.pending(self.host)
        self.assertGreater(fills[self.name], time.time() + 500)
        # due now
        path = os.path.join(prefetch.fill_dir(self.host), self.name)
        os.utime(path, (time.time() - 1, time.time() - 1))
        self.pf.poll()
        self.assertTrue(self.done.wait(10))
        for t in self.pf.running.values():
            t.join(10)
        self.assertEqual([self.name], self.filled)
        self.assertFalse(os.path.exists(path))

    def failing_fill(self):
        def fail(name):
            raise OSError('the store is away')
        self.pf.fill = fail
        prefetch.request_fill(self.host, self.name, 0)
        path = os.path.join(prefetch.fill_dir(self.host), self.name)
        os.utime(path, (time.time() - 1, time.time() - 1))
        self.pf.poll()
        for t in list(self.pf.running.values()):
            t.join(10)
        return path

    def test_a_failed_fill_is_queued_again_a_minute_later(self):
        # fill_delay 0: not at once again
        path = self.failing_fill()
        self.assertTrue(os.path.exists(path))
        self.assertGreater(os.stat(path).st_mtime, time.time() + 50)

    def test_a_fill_cut_off_by_the_removal_of_its_export_is_dropped(self):
        self.exported = False
        self.assertFalse(os.path.exists(self.failing_fill()))

    def test_no_fill_starts_while_fill_is_off(self):
        self.pf.fill = self.fill
        self.conf.vmar_host.fill = False
        prefetch.request_fill(self.host, self.name, 0)
        path = os.path.join(prefetch.fill_dir(self.host), self.name)
        os.utime(path, (time.time() - 1, time.time() - 1))
        self.pf.poll()
        self.assertEqual({}, self.pf.running)
        self.assertTrue(os.path.exists(path))

    def test_names_not_of_exports_are_left_alone(self):
        self.pf.fill = self.fill
        os.makedirs(prefetch.fill_dir(self.host))
        stray = os.path.join(prefetch.fill_dir(self.host), '.tmp-x')
        open(stray, 'w').close()
        os.utime(stray, (0, 0))
        self.pf.poll()
        self.assertEqual({}, self.pf.running)


class TestMissingRanges(testtools.TestCase):

    def test_what_the_map_reads_less_what_is_present(self):
        bs = 4096
        b = '00000000-0000-4000-8000-00000000000a'
        m = '00000000-0000-4000-8000-00000000000b'
        # image m: blocks 0-3 from base b's 10-13, 4-5 zero, 6-9 its own
        ext = np.array([(0, 4, 10, 0), (6, 4, 6, 1)],
                       dtype=mapformat.EXTENT_DTYPE)
        bmap = mapformat.decode(mapformat.encode(
            m, 10 * bs, bs, 1, [mapformat.Target(b, 20 * bs),
                                mapformat.Target(m, 10 * bs, True)], ext))
        none = np.zeros(20, dtype=bool)
        self.assertEqual([(10 * bs, 4 * bs)],
                         prefetch.missing_ranges(bmap, 0, none, None))
        self.assertEqual([(6 * bs, 2 * bs), (8 * bs, 2 * bs)],
                         prefetch.missing_ranges(bmap, 1, none, 2 * bs))
        some = none.copy()
        some[[11, 12]] = True
        self.assertEqual([(10 * bs, bs), (13 * bs, bs)],
                         prefetch.missing_ranges(bmap, 0, some, None))
        some[10:14] = True
        self.assertEqual([], prefetch.missing_ranges(bmap, 0, some, None))
