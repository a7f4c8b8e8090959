"""The demo's host side (tools/demo_host.py) on the real patched daemon.

Two small, similar images in a private library; the tool exports them with
``vmar-export``, reads them both ways and measures the page cache. Needs
root (it sets the read-ahead), ``fincore`` and matplotlib.
"""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

from tests import base
from tools.vmarenv import qemu_env
from vmar_openstack.host.cache import pagecache

TOOL = os.path.join(qemu_env.TOP, 'tools', 'demo_host.py')
PNG_MAGIC = b'\x89PNG\r\n\x1a\n'
A_ID = '0d3a5b6e-7c0f-4d7e-9a51-3b7d6f0e1a01'
B_ID = '0d3a5b6e-7c0f-4d7e-9a51-3b7d6f0e1a02'
N = 3000


def _load_tool():
    spec = importlib.util.spec_from_file_location('demo_host', TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def tool_read_knob(knob):
    with open(knob) as f:
        return int(f.read())


class TestDemoHost(base.LibraryTestCase):

    # The demo sets the read-ahead of the disk its state is on, and the
    # tests assert it is put back: on a disk of their own, so that the
    # fresh-root demo CI runs beside them (same machine, same disk) cannot
    # change it under them.
    own_disk = True

    def setUp(self):
        super().setUp()
        self.prefix = qemu_env.qemu_prefix()
        # every 7th block zero; b shares 7 blocks in 10 with a
        self.seeds_a = [None if i % 7 == 0 else i for i in range(N)]
        self.seeds_b = [None if i % 7 == 0 else
                        (i if i % 10 < 7 else 100000 + i) for i in range(N)]
        self.raw_a = self.image('a.raw', self.seeds_a)
        self.raw_b = self.image('b.raw', self.seeds_b)
        self.lib.add(A_ID, self.raw_a, visibility='public')
        self.lib.add(B_ID, self.raw_b, visibility='public')
        self.conf_file = self.write_conf_file()
        self.socket = os.path.join(self.tmp, 'host', 'nbd.sock')
        self.addCleanup(self._kill_leftovers)

    def args(self, raw_a=None):
        return [sys.executable, TOOL, 'run', '--config-file', self.conf_file,
                '--qemu-prefix', self.prefix,
                '--image', 'a', A_ID, raw_a or self.raw_a,
                '--image', 'b', B_ID, self.raw_b, '--pair', 'a', 'b',
                '--json', os.path.join(self.tmp, 'out.json')]

    def ours(self):
        """Pids of processes whose command line names this test's files."""
        pids = []
        for name in os.listdir('/proc'):
            if not name.isdigit() or int(name) == os.getpid():
                continue
            try:
                with open('/proc/%s/cmdline' % name, 'rb') as f:
                    if self.tmp.encode() in f.read():
                        pids.append(int(name))
            except OSError:
                pass
        return pids

    def _kill_leftovers(self):
        # only if a test failed: nothing of ours may outlive the test
        for pid in self.ours():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def assertNothingLeft(self):
        deadline = time.time() + 5
        while self.ours() and time.time() < deadline:
            time.sleep(0.1)
        self.assertEqual([], self.ours())

    def wait_for_socket(self, proc):
        deadline = time.time() + 60
        while not os.path.exists(self.socket):
            if proc.poll() is not None:
                self.fail('demo_host.py exited with %d before serving'
                          % proc.returncode)
            self.assertLess(time.time(), deadline)
            time.sleep(0.02)

    def test_run(self):
        self.knob = pagecache.readahead_knob(self.tmp)
        self.machine_ra = self.knob and tool_read_knob(self.knob)
        proc = subprocess.run(self.args(), capture_output=True, text=True)
        self.assertEqual(0, proc.returncode, proc.stdout + proc.stderr)
        with open(os.path.join(self.tmp, 'out.json')) as f:
            res = json.load(f)

        # the chart, named on its own line, is a PNG
        charts = [line[len('chart: '):] for line in proc.stdout.splitlines()
                  if line.startswith('chart: ')]
        self.assertEqual([os.path.join(self.tmp, 'demo-host.png')], charts)
        with open(charts[0], 'rb') as f:
            self.assertEqual(PNG_MAGIC, f.read(8))

        # the library's figures: histogram and the limit from the seeds
        a = {s for s in self.seeds_a if s is not None}
        b = {s for s in self.seeds_b if s is not None}
        self.assertEqual({'1': len(a ^ b), '2': len(a & b)},
                         res['histogram'])
        self.assertEqual(len(a | b), res['limit_blocks'])
        self.assertEqual(len(a | b) * base.BS, res['limit_bytes'])
        self.assertIn('%d bytes' % res['limit_bytes'], proc.stdout)
        maps = {m['image']: m['map_bytes'] for m in res['maps']}
        for name, image_id in (('a', A_ID), ('b', B_ID)):
            self.assertEqual(os.path.getsize(
                os.path.join(self.tmp, 'maps', '%s.1.vmap' % image_id)),
                maps[name])

        # the page cache each way: the bases of both, then both raw files;
        # the exports first with the kernel's default read-ahead, then
        # with the disk's own if that differs
        ways = list(res['cache'])
        self.assertEqual('export', ways[0])
        self.assertEqual('raw', ways[-1])
        self.assertLessEqual(len(ways), 3)
        raw = res['cache']['raw']['files']
        self.assertEqual([self.raw_a, self.raw_b], [f['file'] for f in raw])
        slack = 1 << 20
        for way in ways[:-1]:
            exp = res['cache'][way]['files']
            self.assertEqual(
                sorted(os.path.join(self.tmp, 'host', 'bases', i)
                       for i in (A_ID, B_ID)),
                sorted(f['file'] for f in exp))
            for f in exp + raw:
                self.assertGreaterEqual(f['cached'], 0)
                self.assertLessEqual(f['cached'], f['size'])
                self.assertIn('%13d' % f['cached'], proc.stdout)
            self.assertLessEqual(res['totals'][way],
                                 res['totals']['raw'] + slack)
        if self.knob and os.access(self.knob, os.W_OK):
            self.assertEqual(128, res['cache']['export']['readahead_kb'])
            self.assertEqual(self.machine_ra, tool_read_knob(self.knob))
        self.assertIn('exports read back equal to the raw files', proc.stdout)

        # nothing it started is left
        for pid in res['pids'].values():
            self.assertFalse(os.path.exists('/proc/%d' % pid)
                             and self.tmp.encode() in open(
                                 '/proc/%d/cmdline' % pid, 'rb').read())
        self.assertNothingLeft()
        self.assertFalse(os.path.exists(self.socket))

    def test_exports_read_back_equal(self):
        tool = _load_tool()
        with tool.HostSide(self.tmp, self.tmp, self.prefix) as host:
            for image_id, raw in ((A_ID, self.raw_a), (B_ID, self.raw_b)):
                uri = host.add(image_id)
                out = os.path.join(self.tmp, 'read-back')
                subprocess.run(
                    [qemu_env.qemu_bin('qemu-img'), 'convert', '-f', 'raw',
                     '-O', 'raw', uri, out], check=True)
                self.assertEqual(qemu_env.sha256_file(raw),
                                 qemu_env.sha256_file(out))
                os.unlink(out)
            pids = [host.proc.pid]
            with open(os.path.join(self.tmp, 'host', 'qsd.pid')) as f:
                pids.append(int(f.read()))
        self.assertEqual([], host.left)
        for pid in pids:
            self.assertFalse(os.path.exists('/proc/%d' % pid))
        self.assertNothingLeft()

    def test_error_stops_the_export(self):
        # a's export cannot read back equal to b's raw file
        proc = subprocess.run(self.args(raw_a=self.raw_b),
                              capture_output=True, text=True)
        self.assertEqual(1, proc.returncode, proc.stdout + proc.stderr)
        self.assertIn('differs', proc.stderr)
        self.assertNotIn('chart:', proc.stdout)
        self.assertNothingLeft()

    def test_interrupt_stops_the_export(self):
        knob = pagecache.readahead_knob(self.tmp)
        ra = knob and tool_read_knob(knob)
        # as from a terminal: a runner started in the background by a
        # non-interactive shell (nohup ... &) ignores SIGINT, and a child
        # would inherit that and never see the Ctrl-C
        proc = subprocess.Popen(
            self.args(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                        signal.SIG_DFL))
        self.wait_for_socket(proc)
        self.assertTrue(self.ours())
        proc.send_signal(signal.SIGINT)         # what Ctrl-C sends
        out, err = proc.communicate(timeout=60)
        self.assertEqual(130, proc.returncode, out + err)
        self.assertIn('interrupted', err)
        self.assertNothingLeft()
        if knob:
            self.assertEqual(ra, tool_read_knob(knob))

    def test_stop_after_a_hard_kill(self):
        knob = pagecache.readahead_knob(self.tmp)
        ra = knob and tool_read_knob(knob)
        proc = subprocess.Popen(self.args(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        self.wait_for_socket(proc)
        proc.kill()                             # no cleanup can run
        proc.wait()
        self.assertTrue(self.ours())            # serve and its daemon
        stop = subprocess.run([sys.executable, TOOL, 'stop', '--state',
                               self.tmp], capture_output=True, text=True)
        self.assertEqual(0, stop.returncode, stop.stderr)
        self.assertIn('stopped vmar-export serve', stop.stdout)
        self.assertNothingLeft()
        if knob:        # put back if the kill came while it was changed
            self.assertEqual(ra, tool_read_knob(knob))
        # a second stop finds nothing to do
        stop = subprocess.run([sys.executable, TOOL, 'stop', '--state',
                               self.tmp], capture_output=True, text=True)
        self.assertEqual(('', 0), (stop.stdout, stop.returncode))
