"""A host of the previous release upgrades to the host API, guests reading.

The previous release (:data:`PREVIOUS`, the last commit before the host
API) runs the host: its ``vmar-export serve`` with its ``[vmar]``
configuration file, exports made by its own command line (the flock
protocols, ``exports.json``, lazy mirrors whose ``.reader`` files hold
QEMU options), and a guest's QEMU reading one export over one NBD
connection. Then ``serve`` is replaced by this tree's, with the same file:
the new daemon adopts the running qemu-storage-daemon, and the guest
keeps reading through the upgrade on its one connection. After it, the
new commands release references and add exports that read the old
mirrors, a restarted qemu-storage-daemon is rebuilt from the old
records, and the old lock files are gone.
"""

import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time

from tests.functional import test_export
from tools.vmarenv import qemu_env

PREVIOUS = '6c9c2ef0784acc394223d4a7ac4171c65c40133c'
TOP = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def previous_tree(dest):
    """The previous release's source at ``dest`` (git archive)."""
    if not os.path.isdir(os.path.join(TOP, '.git')):
        raise RuntimeError('%s is not a git checkout: the previous release '
                           'cannot be had' % TOP)
    tar = os.path.join(dest, 'previous.tar')
    subprocess.run(['git', '-C', TOP, 'archive', '-o', tar, PREVIOUS,
                    'vmar_openstack'], check=True, capture_output=True)
    with tarfile.open(tar) as t:
        t.extractall(dest, filter='data')
    os.unlink(tar)
    return dest


class Guest(object):
    """A guest's QEMU block client: one NBD connection, reads on demand.

    Stock qemu-io (Debian's, as a guest's QEMU), interactive: each
    :meth:`read` is one command on the same connection.
    """

    def __init__(self, uri):
        self.proc = subprocess.Popen(
            [qemu_env.SYSTEM_QEMU_IO, '-r', '-f', 'raw', uri],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, bufsize=1)

    def read(self, offset, length=65536):
        """qemu-io's answer to one read: 'read N/N bytes...' or a failure."""
        self.proc.stdin.write('read %d %d\n' % (offset, length))
        self.proc.stdin.flush()
        while True:
            line = self.proc.stdout.readline()
            if not line:
                return 'qemu-io exited'
            line = line.replace('qemu-io> ', '').strip()
            if line.startswith('read ') or 'failed' in line:
                return line

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(10)


class TestUpgradeFromThePreviousRelease(test_export.LazyExportTestCase):

    def setUp(self):
        super().setUp()
        self.old_tree = previous_tree(tempfile.mkdtemp(dir=self.tmp))
        # the previous release's file: every host option under [vmar]
        self.old_conf = os.path.join(self.tmp, 'old.conf')
        with open(self.old_conf, 'w') as f:
            f.write('[DEFAULT]\nlog_file = %s/old.log\n'
                    '[vmar]\nstate_dir = %s\nhost_dir = %s\n'
                    'map_source_dir = %s\nexport_socket = %s\n'
                    'qemu_storage_daemon = %s\nbase_fetch = lazy\n'
                    'prefetch = false\nfill = false\n'
                    '[vmar_database]\nconnection = %s\n'
                    % (self.tmp, self.tmp, self.conf.vmar_host.host_dir,
                       self.tmp, self.sock,
                       qemu_env.qemu_bin('qemu-storage-daemon'),
                       self.conf.vmar_database.connection))

    def old(self, *args, wait=True):
        """The previous release's ``vmar-export ARGS``."""
        cmd = [sys.executable, '-m', 'vmar_openstack.cmd.export',
               '--config-file', self.old_conf] + list(args)
        env = dict(os.environ, PYTHONPATH=self.old_tree)
        # not from the tree: python -m puts the working directory first
        if not wait:
            return subprocess.Popen(cmd, env=env, start_new_session=True,
                                    stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, cwd='/')
        return subprocess.run(cmd, env=env, capture_output=True, text=True,
                              cwd='/')

    def new(self, *args):
        """This tree's ``vmar-export ARGS``, with the same file."""
        return subprocess.run(
            [sys.executable, '-m', 'vmar_openstack.cmd.export',
             '--config-file', self.old_conf] + list(args),
            capture_output=True, text=True, cwd=TOP)

    def wait_for(self, predicate, what, timeout=60):
        deadline = time.time() + timeout
        while not predicate():
            self.assertLess(time.time(), deadline, what)
            time.sleep(0.1)

    def test_guests_read_on_and_references_still_go(self):
        host = self.conf.vmar_host.host_dir
        nginx, python3 = test_export._id('nginx'), test_export._id('python3')
        # the previous release runs the host (a socket left by an earlier
        # run would pass for its own)
        for sock in (self.sock, os.path.join(self.sock_dir, 'api.sock')):
            if os.path.exists(sock):
                os.unlink(sock)
        old_serve = self.old('serve', wait=False)
        self.addCleanup(self._stop, old_serve)
        self.wait_for(lambda: os.path.exists(self.sock), 'old serve')
        uris = {}
        for image_id, holder in ((nginx, 'vm1'), (python3, 'vm2')):
            r = self.old('add', image_id, '--holder', holder)
            self.assertEqual(0, r.returncode, r.stderr)
            uris[holder] = r.stdout.strip().split()[-1]
        self.assertTrue(os.path.exists(os.path.join(host, 'exports.lock')))
        with open(os.path.join(host, 'mirrors', nginx + '.reader')) as f:
            self.assertEqual('file', json.load(f)['driver'])   # old format
        guest = Guest(uris['vm2'])
        self.addCleanup(guest.close)
        size = os.path.getsize(self.images['python3'])
        offsets = iter(range(0, size, 1 << 20))
        self.assertIn('read 65536/65536', guest.read(next(offsets)))
        qsd = self.qsd_pid()

        # the upgrade: the old serve goes (SIGKILL leaves its daemon
        # running, as a package upgrade's restart of the service would
        # not), and this tree's serve takes over with the same file
        os.kill(old_serve.pid, signal.SIGKILL)
        old_serve.wait()
        self.assertIn('read 65536/65536', guest.read(next(offsets)))
        new_serve = self.serve_with(self.old_conf)
        self.wait_for(lambda: os.path.exists(os.path.join(
            self.sock_dir, 'api.sock')), 'the new host API')
        self.wait_for(lambda: self.new('list').returncode == 0
                      and 'MISSING' not in self.new('list').stdout,
                      'the new serve restored the exports')
        self.assertEqual(qsd, self.qsd_pid())      # adopted, not restarted
        for offset in offsets:
            self.assertIn('read 65536/65536', guest.read(offset))
        # nothing takes the old locks any more
        self.assertFalse(os.path.exists(os.path.join(host, 'exports.lock')))
        self.assertFalse(os.path.exists(os.path.join(host, 'locks')))

        # a deleted server's reference goes through the new API
        r = self.new('release', 'vm1')
        self.assertEqual(0, r.returncode, r.stderr)
        self.assertIn('released 1 exports', r.stdout)
        listing = self.new('list').stdout
        self.assertNotIn('vm1', listing)
        self.assertIn('vm2', listing)
        # a new export reads the old mirrors, through their old readers
        r = self.new('add', nginx, '--holder', 'vm3')
        self.assertEqual(0, r.returncode, r.stderr)
        compare = subprocess.run(
            [qemu_env.SYSTEM_QEMU_IMG, 'compare', '-f', 'raw', '-F', 'raw',
             r.stdout.strip().split()[-1], self.images['nginx']],
            capture_output=True, text=True)
        self.assertEqual(0, compare.returncode, compare.stdout)
        # a daemon restarted by the new serve is rebuilt from the records
        # the old release wrote
        os.kill(self.qsd_pid(), signal.SIGKILL)
        self.wait_for(lambda: self.qsd_alive_and_not(qsd),
                      'the new serve restarted the daemon')
        self.wait_for(lambda: 'MISSING' not in self.new('list').stdout
                      and self.new('list').returncode == 0,
                      'the exports restored')
        compare = subprocess.run(
            [qemu_env.SYSTEM_QEMU_IMG, 'compare', '-f', 'raw', '-F', 'raw',
             uris['vm2'], self.images['python3']],
            capture_output=True, text=True)
        self.assertEqual(0, compare.returncode, compare.stdout)
        # the last reference goes with its holder, and its files with it
        guest.close()
        for holder in ('vm2', 'vm3'):
            r = self.new('release', holder)
            self.assertEqual(0, r.returncode, r.stderr)
        self.assertIn('image', self.new('list').stdout)   # header only
        with open(os.path.join(host, 'exports.json')) as f:
            self.assertEqual({}, json.load(f)['exports'])
        self._stop(new_serve)

    def qsd_alive_and_not(self, pid):
        try:
            now = self.qsd_pid()
        except (OSError, ValueError):
            return False
        return now != pid and os.path.exists('/proc/%d' % now)

    def serve_with(self, conf_file):
        proc = subprocess.Popen(
            [sys.executable, '-m', 'vmar_openstack.cmd.export',
             '--config-file', conf_file, 'serve'],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, cwd=TOP)
        self.addCleanup(self._stop, proc)
        return proc
