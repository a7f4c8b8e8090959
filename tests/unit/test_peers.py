"""The peer server's command and its supervision (issue 34).

nbdkit and QEMU's TLS clients are tested for real in
tests/functional/test_peers.py; here, what the export daemon asks of
them and how it keeps the server up.
"""

import hashlib
import os

import fixtures
import numpy as np
from oslo_config import cfg
import testtools

from vmar_openstack import conf as vmar_conf
from vmar_openstack import exception
from vmar_openstack.export import peers
from vmar_openstack.export import supervisor
from vmar_openstack.mapsource import peers as peer_source


class TestPeers(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.conf = cfg.ConfigOpts()
        vmar_conf.register_opts(self.conf)
        self.conf([], project='vmar', default_config_files=[])
        self.conf.set_override('host_dir', self.tmp, group='vmar_host')
        for f in peers.SERVER_FILES:
            open(os.path.join(self.tmp, f), 'w').close()
        self.conf.set_override('tls_dir', self.tmp, group='vmar_peers')

    def test_off_by_default(self):
        self.assertFalse(peers.enabled(self.conf))
        self.conf.set_override('listen_address', '10.0.0.5',
                               group='vmar_peers')
        self.assertTrue(peers.enabled(self.conf))

    def test_command(self):
        self.conf.set_override('listen_address', '10.0.0.5',
                               group='vmar_peers')
        cmd = peers.command(self.conf, '/run/p.pid')
        for arg in ('--tls=require', '--tls-verify-peer',
                    '--tls-certificates=%s' % self.tmp, '--filter=limit',
                    '--filter=rate', 'limit=16', 'host-dir=%s' % self.tmp,
                    # 100 MiB/s, in bits (nbdkit's rate filter)
                    'rate=838860800'):
            self.assertIn(arg, cmd)
        self.assertEqual(['--ipaddr', '10.0.0.5', '--port', '10810'],
                         cmd[cmd.index('--ipaddr'):cmd.index('--ipaddr') + 4])
        # the filters come before the plugin
        self.assertLess(cmd.index('--filter=rate'), cmd.index('python'))
        self.conf.set_override('rate_mib', 0, group='vmar_peers')
        cmd = peers.command(self.conf, '/run/p.pid')
        self.assertNotIn('--filter=rate', cmd)
        self.assertFalse([a for a in cmd if a.startswith('rate=')])

    def test_the_range_server_is_told_where_digest_lists_are(self):
        self.assertEqual([], peers.range_server_keys(self.conf))
        self.conf.set_override('peers', ['10.0.0.6:10810'],
                               group='vmar_peers')
        key, = peers.range_server_keys(self.conf)
        self.assertEqual('digests=%s/mirrors/{}.digests' % self.tmp, key)

    def test_missing_credentials(self):
        os.unlink(os.path.join(self.tmp, 'server-key.pem'))
        e = self.assertRaises(exception.ExportError, peers.command,
                              self.conf, '/run/p.pid')
        self.assertIn('needs server-key.pem in [vmar_peers] tls_dir', str(e))


class FakeProc:
    def __init__(self, rc=None):
        self.returncode = rc

    def poll(self):
        return self.returncode


class TestSupervision(testtools.TestCase):
    """Supervisor._check_peers: started, restarted, retried later."""

    def setUp(self):
        super().setUp()
        self.conf = cfg.ConfigOpts()
        vmar_conf.register_opts(self.conf)
        self.conf([], project='vmar', default_config_files=[])
        self.conf.set_override('listen_address', '127.0.0.1',
                               group='vmar_peers')
        self.sup = supervisor.Supervisor.__new__(supervisor.Supervisor)
        self.sup.conf = self.conf
        self.sup.peers, self.sup.peers_retry_at = None, 0
        self.started = []
        self.fail = []

        def start(conf):
            if self.fail:
                raise exception.ExportError(self.fail.pop())
            self.started.append(FakeProc())
            return self.started[-1]
        self.useFixture(fixtures.MockPatchObject(peers, 'start', start))
        self.now = [1000.0]
        self.useFixture(fixtures.MockPatch(
            'vmar_openstack.export.supervisor.time.monotonic',
            lambda: self.now[0]))

    def test_started_then_restarted_when_it_exits(self):
        self.sup._check_peers()
        self.sup._check_peers()
        self.assertEqual(1, len(self.started))
        self.started[0].returncode = -9
        self.sup._check_peers()
        self.assertEqual(2, len(self.started))
        self.assertIs(self.started[1], self.sup.peers)

    def test_a_failed_start_is_tried_again_later(self):
        self.fail.append('no certificates')
        self.sup._check_peers()
        self.assertIsNone(self.sup.peers)
        self.now[0] += supervisor.PEERS_RETRY - 1
        self.sup._check_peers()
        self.assertEqual([], self.started)
        self.now[0] += 1
        self.sup._check_peers()
        self.assertEqual(1, len(self.started))

    def test_off(self):
        self.conf.set_override('listen_address', None, group='vmar_peers')
        self.sup._check_peers()
        self.assertEqual([], self.started)


class TestPeerReaderChecks(testtools.TestCase):
    """What the range server checks of a peer's run (no peer needed)."""

    def rows(self, *blocks):
        out = [bytes(32) if not any(b) else hashlib.sha256(
            b.ljust(4096, b'\0')).digest() for b in blocks]
        return np.frombuffer(b''.join(out), np.uint8).reshape(-1, 32)

    def test_each_block_against_its_digest(self):
        a, z, t = b'a' * 4096, bytes(4096), b'tail'
        rows = self.rows(a, z, t)
        self.assertIsNone(peer_source._first_bad(a + z + t, 0, 4096, rows))
        # a zero row must be a zero block; the partial tail is padded
        self.assertEqual(1, peer_source._first_bad(a + a, 0, 4096, rows))
        self.assertIsNone(peer_source._first_bad(t, 8192, 4096, rows))
        self.assertEqual(2, peer_source._first_bad(b'tall', 8192, 4096,
                                                   rows))
        # past the image: bad
        self.assertEqual(3, peer_source._first_bad(a, 12288, 4096, rows))

    def test_addresses(self):
        self.assertEqual(('10.0.0.2', 10810),
                         peer_source._address('10.0.0.2:10810'))
        self.assertEqual(('fd00::2', 10810),
                         peer_source._address('[fd00::2]:10810'))
        for bad in ('10.0.0.2', 'host:port', ':10810'):
            self.assertRaises(ValueError, peer_source._address, bad)
