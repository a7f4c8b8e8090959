"""The all-in-one scenario (tools/aio_scenario.py), as CI runs it."""

import os
import subprocess
import sys

import testtools

from tools.vmarenv import qemu_env


class TestAllInOne(testtools.TestCase):

    def test_scenario(self):
        env = dict(os.environ, VMAR_QEMU_PREFIX=qemu_env.qemu_prefix())
        proc = subprocess.run(
            [sys.executable, os.path.join(qemu_env.TOP, 'tools',
                                          'aio_scenario.py'),
             '--json', os.path.join(qemu_env.TOP, 'bench', 'out',
                                    'aio.json')],
            capture_output=True, text=True, env=env, timeout=1800)
        out = proc.stdout
        self.assertEqual(0, proc.returncode, out[-4000:] + proc.stderr[-3000:])
        for step in range(2, 8):
            self.assertRegex(out, r'ok: %d\. ' % step)
        self.assertEqual('PASS', out.strip().splitlines()[-1])
