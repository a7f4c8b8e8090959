"""tools/cloud.sh: up, the user's path with the real CLI, down.

The user's path is tools/cloud_scenario.py (doc/source/install/cloud.rst). The
cloud runs from a state directory of its own (``VMAR_CLOUD_STATE``),
so it never meets a cloud someone else started. ``down`` must leave no
process, mount or file of the cloud outside that directory.

CI's run leaves out the steps of :data:`cloud_scenario.UserPath.FULL_ONLY`
(``tools/run-tests.sh --full`` sets ``VMAR_CLOUD_ALL_STEPS``).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import fixtures
import testtools

from tools import cloud_scenario
from tools.vmarenv import qemu_env

TOP = qemu_env.TOP
CLOUD_SH = os.path.join(TOP, 'tools', 'cloud.sh')
BIN_DIR = os.path.dirname(sys.executable)
# where a service that ignored its configuration would write
OUTSIDE = ('/etc/keystone', '/etc/nova', '/etc/glance', '/etc/neutron',
           '/etc/placement', '/var/lib/nova', '/var/lib/glance',
           '/var/lib/neutron', '/var/lib/keystone', '/var/lib/placement',
           '/var/log/nova', '/var/log/glance', '/var/log/keystone',
           '/var/log/neutron', '/var/lib/vmar')


def _mounts():
    with open('/proc/self/mountinfo') as f:
        return sorted(line.split(' - ')[0].split(' ', 4)[4]
                      for line in f)


def _cloud_processes(state_dir):
    """pids whose environment tag or command line names state_dir."""
    found = []
    tag = ('VMAR_CLOUD_OWNER=%s:' % state_dir).encode()
    needle = (state_dir + '/').encode()
    for entry in os.listdir('/proc'):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open('/proc/%s/environ' % entry, 'rb') as f:
                env = f.read()
            with open('/proc/%s/cmdline' % entry, 'rb') as f:
                cmdline = f.read()
        except OSError:
            continue
        if tag in env or needle in cmdline:
            found.append((int(entry), cmdline.replace(b'\0', b' ')[:200]))
    return found


def _newer_files(roots, marker):
    since = os.stat(marker).st_mtime
    new = []
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                path = os.path.join(dirpath, name)
                try:
                    if os.lstat(path).st_mtime >= since:
                        new.append(path)
                except OSError:
                    pass
    return new


@testtools.skipUnless(os.geteuid() == 0, 'tools/cloud.sh runs as root')
class TestCloud(testtools.TestCase):

    def setUp(self):
        super().setUp()
        # short: unix socket paths live under it
        self.state = tempfile.mkdtemp(prefix='vmarcloud-', dir='/var/tmp')
        os.chmod(self.state, 0o755)
        # Nova's image cache manager every 10 s: the user path watches it.
        # In this process's environment too: the path restarts nova-compute
        # with an in-process up, which renders nova.conf again.
        self.useFixture(fixtures.EnvironmentVariable(
            'VMAR_CLOUD_IMAGE_CACHE_INTERVAL', '10'))
        self.env = dict(os.environ, VMAR_CLOUD_STATE=self.state)
        self.env.pop('VMAR_FUNCTIONAL_OWNER', None)
        fd, self.marker = tempfile.mkstemp(prefix='vmar-cloud-marker-')
        os.close(fd)
        self.addCleanup(os.unlink, self.marker)
        self.addCleanup(shutil.rmtree, self.state, ignore_errors=True)
        self.addCleanup(self.cloud, 'down', '--purge', check=False)
        self.mounts = _mounts()

    def cloud(self, *args, check=True):
        result = subprocess.run(
            [CLOUD_SH] + list(args), env=self.env, capture_output=True,
            text=True, stdin=subprocess.DEVNULL, timeout=1800)
        if check:
            self.assertEqual(0, result.returncode, '%s\n%s' % (
                result.stdout[-3000:], result.stderr[-6000:]))
        return result

    def _logs(self, failure=''):
        """The tails of the logs that say why a step failed.

        First the agent's lines that name an image the ``failure`` text
        names (the output of a long failure is cut in its middle).
        """
        out = []
        ids = set(re.findall(
            r'[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}',
            failure))
        for name in ('vmar-agent', 'glance-api', 'vmar-export',
                     'nova-compute', 'nova-conductor'):
            path = os.path.join(self.state, 'log', name + '.log')
            if os.path.exists(path):
                with open(path, errors='replace') as f:
                    # the image cache manager's INFO lines every 10 s
                    # would push out the lines that say why
                    lines = [line for line in f
                             if 'nova.virt.libvirt.imagecache' not in line]
                named = [line for line in lines
                         if any(i in line for i in ids)]
                if named and name == 'vmar-agent':
                    out.insert(0, '--- %s, its lines naming %s\n%s' % (
                        path, ', '.join(sorted(ids)), ''.join(named[-25:])))
                # a failure the tail no longer holds (an event retried,
                # then parked) says what broke first
                bad = [line for line in lines[:-40]
                       if ' WARNING ' in line or ' ERROR ' in line]
                if bad:
                    out.append('--- %s, its warnings and errors before\n%s'
                               % (path, ''.join(bad[-10:])))
                out.append('--- %s\n%s' % (path, ''.join(lines[-40:])))
        return '\n'.join(out)

    def openstack(self, openrc, *args):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith('OS_')}
        with open(openrc) as f:
            for line in f:
                key, value = line.replace('export ', '', 1).strip().split(
                    '=', 1)
                env[key] = value
        result = subprocess.run(
            [os.path.join(BIN_DIR, 'openstack')] + list(args), env=env,
            capture_output=True, text=True, stdin=subprocess.DEVNULL,
            timeout=600)
        self.assertEqual(0, result.returncode, 'openstack %s:\n%s%s' % (
            ' '.join(args), result.stdout, result.stderr))
        return result.stdout

    def test_up_user_path_down(self):
        """up, authenticated calls, the user's path (issue 14), down.

        One cloud for all of it: bringing one up takes minutes.
        """
        up = self.cloud('up')
        openrc = up.stdout.strip().splitlines()[-1]
        self.assertEqual(os.path.join(self.state, 'openrc'), openrc)

        self.assertTrue(self.openstack(openrc, 'token', 'issue', '-f',
                                       'value', '-c', 'id').strip())
        types = self.openstack(openrc, 'endpoint', 'list', '-f', 'value',
                               '-c', 'Service Type').split()
        self.assertEqual({'identity', 'image', 'placement', 'compute',
                          'network'}, set(types))
        self.openstack(openrc, 'network', 'list')
        # nova-compute reports to the API as up
        deadline = time.time() + 120
        while True:
            services = self.openstack(
                openrc, 'compute', 'service', 'list', '-f', 'value',
                '-c', 'Binary', '-c', 'State')
            if 'nova-compute up' in services:
                break
            self.assertLess(time.time(), deadline, services)
            time.sleep(5)
        self.assertIn('QEMU', self.openstack(
            openrc, 'hypervisor', 'list', '-f', 'value', '-c',
            'Hypervisor Type'))
        image = os.path.join(self.state, 'tiny.raw')
        with open(image, 'wb') as f:
            f.write(os.urandom(1 << 20))
            f.truncate(16 << 20)
        self.assertEqual('active', self.openstack(
            openrc, 'image', 'create', '--file', image, '--disk-format',
            'raw', '--container-format', 'bare', 'tiny', '-f', 'value',
            '-c', 'status').strip())
        self.assertIn('vmar:enabled', self.openstack(
            openrc, 'flavor', 'create', '--vcpus', '1', '--ram', '256',
            '--disk', '1', '--property', 'vmar:enabled=true', 'vmar.tiny',
            '-f', 'value', '-c', 'properties'))

        # up again: nothing to start
        again = self.cloud('up')
        self.assertEqual(openrc, again.stdout.strip().splitlines()[-1])
        self.assertNotIn('started', again.stderr)
        status = self.cloud('status').stdout.splitlines()[1:]
        self.assertGreaterEqual(len(status), 13)
        for line in status:
            self.assertEqual('up', line.split()[1], line)

        # the user's path, with the openstack CLI (tools/cloud_scenario.py)
        path = cloud_scenario.UserPath(self.state, openrc,
                                       qemu_env.image_library())
        self.openstack(openrc, 'image', 'delete', 'tiny')
        self.openstack(openrc, 'flavor', 'delete', 'vmar.tiny')
        steps = path.STEPS
        if not os.environ.get('VMAR_CLOUD_ALL_STEPS'):
            steps = tuple(s for s in steps if s not in path.FULL_ONLY)
        try:
            figures = path.run(steps)
        except cloud_scenario.ScenarioError as e:
            self.fail('%s\n%s' % (e, self._logs(str(e))))
        out_dir = os.path.join(TOP, 'bench', 'out')
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, 'cloud-user-path.json'), 'w') as f:
            json.dump(figures, f, indent=1, sort_keys=True)

        self.cloud('down')
        self.assertEqual([], _cloud_processes(self.state))
        # (other jobs may mount things meanwhile: only ours count)
        new = set(_mounts()) - set(self.mounts)
        self.assertEqual([], [m for m in new if 'libvirt' in m])
        self.assertEqual([], [m for m in _mounts() if self.state in m])
        self.assertEqual([], _newer_files(OUTSIDE, self.marker))
        self.assertEqual(3, self.cloud('status', check=False).returncode)
