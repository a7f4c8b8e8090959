"""How bench/bench_apps.py cuts a recorded run: behaviour, not figures.

The bench is loaded from its file (``bench/`` is not a package).
"""

import importlib.util
import os
import re

import testtools

_PATH = os.path.join(os.path.dirname(__file__), '..', '..', 'bench',
                     'bench_apps.py')
_SPEC = importlib.util.spec_from_file_location('bench_apps', _PATH)
apps = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(apps)


def trace():
    # [start, offset, length, end]: two boot reads, one read between the
    # marker and the application's start, two of the application's
    return {'booted': 10.0, 'app_start': 12.0, 'app_ready': 15.0,
            'reads': [[0.5, 0, 4096, 0.6], [9.0, 8192, 4096, 9.5],
                      [11.0, 4096, 4096, 12.5],
                      [12.0, 16384, 8192, 12.1],
                      [14.0, 65536, 4096, 14.2]]}


class TestSplit(testtools.TestCase):

    def test_cut_at_the_application_start(self):
        before, app = apps.split(trace())
        # a read started before the start stays before, even if it ended
        # after it; its replay waits for it and sleeps to the start
        self.assertEqual([[0.5, 0, 4096, 0.6], [9.0, 8192, 4096, 9.5],
                          [11.0, 4096, 4096, 12.5]], before['reads'])
        self.assertEqual(12.0, before['booted'])
        # the application's reads, timed from its start, to its answer
        self.assertEqual([[0.0, 16384, 8192, 0.1],
                          [2.0, 65536, 4096, 2.2]],
                         [[round(x, 6) for x in r] for r in app['reads']])
        self.assertEqual(3.0, app['booted'])

    def test_recorded_set_over_the_window(self):
        t = trace()
        everything = apps.recorded_part(t, 120)
        self.assertEqual(t['reads'], everything['reads'])
        # the window counts from the first read
        self.assertEqual(t['reads'][:2], apps.recorded_part(t, 9)['reads'])
        self.assertEqual([], apps.recorded_part(t, 0)['reads'])


class TestProbeLines(testtools.TestCase):

    def test_end_line(self):
        m = re.match(apps.END_RE, 'VMAR-APP nginx 1251865469')
        self.assertEqual((None, 'nginx', '1251865469'), m.groups())
        m = re.match(apps.END_RE, 'VMAR-APP-ERROR mariadb already running')
        self.assertEqual('-ERROR', m.group(1))
        # the start line is not an end
        self.assertIsNone(re.match(apps.END_RE, 'VMAR-APP-START nginx'))
