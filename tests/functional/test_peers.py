"""The peer server on the real thing: nbdkit, TLS, QEMU's NBD client.

A host's peer server (:mod:`vmar_openstack.host.peers.server`) serves what its
mirrors and whole bases hold to hosts with a certificate of the cloud's
host CA; here a "host" is qemu-io of the built QEMU with the x509
credentials the export daemon would use. The certificates are made with
openssl for each run.
"""

import hashlib
import json
import os
import signal
import subprocess
import threading
import time
import uuid

import fixtures
from oslo_config import cfg
import testtools

from tools.vmarenv import pki
from tools.vmarenv import process
from tools.vmarenv import qemu_env
from tools.vmarenv import range_env
from vmar_openstack import conf as vmar_conf
from vmar_openstack import exception
from vmar_openstack import fileutils
from vmar_openstack import fingerprint
from vmar_openstack.host.exports import hostdir
from vmar_openstack.host.peers import digests as peer_digests
from vmar_openstack.host.peers import server as peers
from vmar_openstack.host.peers import source as peer_source
from vmar_openstack.mapformat import mirror as mirror_format
from vmar_openstack import names

BS = 4096


def _until(predicate, timeout, what):
    """Wait for ``predicate()``; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError('no %s in %d s' % (what, timeout))
        time.sleep(0.05)


MIB = 1 << 20


class PeerServerTestCase(testtools.TestCase):
    """A peer host's server, with a mirror and a whole base it holds."""

    def setUp(self):
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        ca = os.path.join(self.tmp, 'ca')
        pki.make_ca(ca, 'vmar test host CA')
        self.server_tls = os.path.join(self.tmp, 'server')
        pki.make_cert(ca, self.server_tls, 'server', '127.0.0.1',
                      'IP:127.0.0.1')
        self.client_tls = os.path.join(self.tmp, 'client')
        pki.make_cert(ca, self.client_tls, 'client', 'compute-2')
        rogue = os.path.join(self.tmp, 'rogue-ca')
        pki.make_ca(rogue, 'not the cloud')
        self.rogue_tls = os.path.join(self.tmp, 'rogue')
        pki.make_cert(rogue, self.rogue_tls, 'client', 'guest')
        # the rogue client trusts both CAs (QEMU checks its own certificate
        # and the server's against that file), so only the server can
        # refuse it
        with open(os.path.join(self.rogue_tls, 'ca-cert.pem'), 'a') as out, \
                open(os.path.join(ca, 'ca-cert.pem')) as real:
            out.write(real.read())

        self.host_dir = os.path.join(self.tmp, 'host')
        for d in ('mirrors', 'bases'):
            os.makedirs(os.path.join(self.host_dir, d))
        # a mirror holding blocks 0-1 and 16 of 64, and a whole base
        self.mirror_id, self.base_id = str(uuid.uuid4()), str(uuid.uuid4())
        self.size = 64 * BS
        path = os.path.join(self.host_dir, 'mirrors', self.mirror_id)
        with open(path, 'wb') as f:
            f.truncate(self.size)
            f.write(b'\x11' * 2 * BS)
            f.seek(16 * BS)
            f.write(b'\x22' * BS)
        with open(os.path.join(self.host_dir, 'bases', self.base_id),
                  'wb') as f:
            f.write(b'\x33' * self.size)

        self.conf = cfg.ConfigOpts()
        vmar_conf.register_opts(self.conf)
        self.conf([], project='vmar', default_config_files=[])
        self.conf.set_override('host_dir', self.host_dir, group='vmar_host')
        self.port = process.free_port()
        for k, v in (('listen_address', '127.0.0.1'),
                     ('listen_port', self.port),
                     ('tls_dir', self.server_tls), ('max_clients', 2)):
            self.conf.set_override(k, v, group='vmar_peers')
        self.proc = peers.start(self.conf)
        self.addCleanup(self.proc.wait)
        self.addCleanup(self.proc.terminate)

    def qemu(self, tool, image_id, *args, tls=None, with_tls=True):
        """Run a QEMU tool on a peer's export, as another host would."""
        tls = tls or self.client_tls
        opts = {'driver': 'nbd', 'export': image_id, 'read-only': 'on',
                'server.type': 'inet', 'server.host': '127.0.0.1',
                'server.port': str(self.port)}
        cmd = [qemu_env.qemu_bin(tool)]
        cmd += ['map', '--output=json'] if tool == 'qemu-img' else ['-r']
        if with_tls:
            cmd += ['--object', 'tls-creds-x509,id=tls0,endpoint=client,'
                    'dir=%s' % tls]
            opts['tls-creds'] = 'tls0'
        cmd += ['--image-opts', ','.join('%s=%s' % kv for kv in opts.items())]
        return subprocess.run(cmd + list(args), capture_output=True,
                              text=True, timeout=60)


class TestPeerServer(PeerServerTestCase):

    def test_a_host_reads_what_a_peer_holds(self):
        r = self.qemu('qemu-io', self.mirror_id, '-c', 'read -P 0x11 0 8k',
                      '-c', 'read -P 0x22 64k 4k')
        self.assertEqual(0, r.returncode, r.stdout + r.stderr)
        self.assertNotIn('Pattern verification failed', r.stdout)
        r = self.qemu('qemu-io', self.base_id, '-c',
                      'read -P 0x33 0 %d' % self.size)
        self.assertEqual(0, r.returncode, r.stdout + r.stderr)
        self.assertNotIn('Pattern verification failed', r.stdout)

    def test_block_status_says_what_a_mirror_lacks(self):
        r = self.qemu('qemu-img', self.mirror_id)
        self.assertEqual(0, r.returncode, r.stdout + r.stderr)
        data = [(e['start'], e['length']) for e in json.loads(r.stdout)
                if e['data']]
        self.assertEqual([(0, 2 * BS), (16 * BS, BS)], data)

    def assert_refused(self, r, why):
        self.assertNotEqual(0, r.returncode, r.stdout)
        self.assertNotIn('read 4096/4096', r.stdout)
        self.assertIn(why, r.stderr)

    def test_only_hosts_of_the_cloud_can_read(self):
        # the host's own certificate works (so what fails below is the
        # refusal, not the setup)
        r = self.qemu('qemu-io', self.mirror_id, '-c', 'read 0 4k')
        self.assertIn('read 4096/4096', r.stdout, r.stderr)
        # no TLS: nbdkit asks for it before anything else
        self.assert_refused(
            self.qemu('qemu-io', self.mirror_id, '-c', 'read 0 4k',
                      with_tls=False),
            'TLS negotiation required')
        # TLS with a certificate of another CA (a guest's, say): the server
        # ends the handshake (the client's words differ by QEMU version
        # and timing; the server's log says why)
        self.assert_refused(
            self.qemu('qemu-io', self.mirror_id, '-c', 'read 0 4k',
                      tls=self.rogue_tls), "can't open")
        with open(os.path.join(self.host_dir, 'peers.log')) as f:
            self.assertIn('gnutls_handshake: Error in the certificate',
                          f.read())

    def test_only_image_ids_it_holds(self):
        r = self.qemu('qemu-io', self.base_id, '-c', 'read 0 4k')
        self.assertIn('read 4096/4096', r.stdout, r.stderr)
        for name in (str(uuid.uuid4()), '../host/bases/' + self.base_id,
                     self.mirror_id + '.digests'):
            self.assert_refused(
                self.qemu('qemu-io', name, '-c', 'read 0 4k'),
                'Requested export not available')
        with open(os.path.join(self.host_dir, 'peers.log')) as f:
            log = f.read()
        self.assertIn('this host holds no base of image', log)
        self.assertIn('is not an image id', log)

    def test_a_peer_server_without_its_credentials_says_so(self):
        self.conf.set_override('tls_dir', os.path.join(self.tmp, 'none'),
                               group='vmar_peers')
        e = self.assertRaises(exception.ExportError, peers.start, self.conf)
        self.assertIn('the peer server needs ca-cert.pem, server-cert.pem, '
                      'server-key.pem in [vmar_peers] tls_dir', str(e))


class PeerFetcherTestCase(PeerServerTestCase):
    """A reading host's peer fetcher beside the peer.

    The real one: nbdkit with ``nbdkit_peers.py`` in the system Python,
    libnbd as the peer client.
    """

    def setUp(self):
        super().setUp()
        self.reader_dir = os.path.join(self.tmp, 'reader-host')
        layout = hostdir.Layout(self.reader_dir)
        # the reading host's digest lists: the images' true contents (the
        # peer's mirror holds blocks 0, 1 and 16 of its image)
        whole = bytearray(b'\x44' * self.size)
        whole[0:2 * BS] = b'\x11' * 2 * BS
        whole[16 * BS:17 * BS] = b'\x22' * BS
        for image_id, data in ((self.mirror_id, bytes(whole)),
                               (self.base_id, b'\x33' * self.size)):
            src = os.path.join(self.tmp, image_id + '.raw')
            with open(src, 'wb') as f:
                f.write(data)
            fps = fingerprint.hash_file(src, self.size)
            path = layout.mirror(image_id).digests
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, 'wb') as f:
                f.write(mirror_format.digests_bytes(image_id, fps))
        conf_file = os.path.join(self.tmp, 'reader.conf')
        self.closed = closed = process.free_port()     # the store
        with open(conf_file, 'w') as f:
            f.write('[vmar_host]\nhost_dir = %s\nbase_fetch = lazy\n'
                    'fetch_retries = 0\n'
                    '[vmar_glance]\nauth_type = none\n'
                    'endpoint = http://127.0.0.1:%d\n'
                    'endpoint_override = http://127.0.0.1:%d\n'
                    '[vmar_peers]\n%stls_dir = %s\n'
                    'bad_peer_seconds = 600\nread_timeout = 2\n'
                    # asked again at once (unit tests keep time for it)
                    'down_peer_seconds = 0\n'
                    % (self.reader_dir, closed, closed, self.peers_conf(),
                       self.client_tls))
        self.log = os.path.join(self.tmp, 'fetch.log')
        proc, self.sock = range_env.start_peer_fetcher(conf_file, self.log)
        self.addCleanup(range_env.stop, proc)

    def peers_conf(self):
        """How the reading host knows the peer: ``[vmar_peers]`` lines."""
        return 'peers = 127.0.0.1:%d\n' % self.port

    def fetch_log(self):
        with open(self.log, errors='replace') as f:
            return f.read()

    def fetch(self, image_id, *commands):
        """qemu-io on the peer fetcher's export of an image, as a mirror."""
        spec = ('driver=nbd,server.type=unix,server.path=%s,export=%s'
                % (self.sock, names.peer_fetch_export(image_id, self.size)))
        cmd = [qemu_env.qemu_bin('qemu-io'), '-r', '--image-opts', spec]
        for c in commands:
            cmd += ['-c', c]
        return subprocess.run(cmd, capture_output=True, text=True,
                              timeout=120)

    def assert_read(self, image_id, command):
        r = self.fetch(image_id, command)
        self.assertEqual(0, r.returncode, r.stdout + r.stderr)
        self.assertNotIn('fail', r.stdout + r.stderr, self.fetch_log())

    def assert_failed(self, image_id, command):
        r = self.fetch(image_id, command)
        self.assertIn('Input/output error', r.stdout + r.stderr)


class TestPeerFetcherReadsPeers(PeerFetcherTestCase):
    """A lazy host's peer fetcher serves what its peer holds, and only that.

    Whatever it serves came from the peer, checked, and whatever the peer
    lacks fails at once, for the mirror's quorum to ask the store next.
    """

    def test_runs_a_peer_holds_come_from_it(self):
        self.assert_read(self.mirror_id, 'read -P 0x11 0 8k')
        self.assert_read(self.mirror_id, 'read -P 0x22 64k 4k')
        self.assert_read(self.base_id, 'read -P 0x33 0 %d' % self.size)

    def test_a_run_the_peer_lacks_fails_at_once(self):
        # block 2 is a hole in the peer's mirror: failed, not retried (the
        # quorum's next child, the store, reads it)
        self.assert_failed(self.mirror_id, 'read 8k 4k')
        self.assertEqual(1, self.fetch_log().count(
            'no peer holds 4096 bytes at 8192 of image %s' % self.mirror_id))
        self.assertEqual(1, peer_source.read_counts(hostdir.Layout(
            self.reader_dir).peer_counts_file())['not_held'])

    def test_a_peer_that_sends_a_bad_block_is_not_asked_for_a_while(self):
        path = os.path.join(self.host_dir, 'mirrors', self.mirror_id)
        with open(path, 'r+b') as f:
            f.seek(16 * BS + 100)
            f.write(b'\x99')
        self.assert_failed(self.mirror_id, 'read 64k 4k')
        self.assertIn('sent block 16 of image %s that does not match its '
                      'digest: not asked again for 600 s' % self.mirror_id,
                      self.fetch_log())
        # its good blocks are not asked for either now
        self.assert_failed(self.mirror_id, 'read 0 4k')

    def test_a_hung_peer_is_given_up_on(self):
        self.assert_read(self.mirror_id, 'read -P 0x11 0 4k')
        # the peer host stops answering (its nbdkit stopped): the read
        # goes to the store after read_timeout, not never
        os.kill(self.proc.pid, signal.SIGSTOP)
        self.addCleanup(os.kill, self.proc.pid, signal.SIGCONT)
        self.assert_failed(self.mirror_id, 'read 4k 4k')
        self.assertIn('did not answer for image %s within 2 s: not asked '
                      'for 0 s' % self.mirror_id, self.fetch_log())
        # back: asked again (a new connection)
        os.kill(self.proc.pid, signal.SIGCONT)
        self.assert_read(self.mirror_id, 'read -P 0x11 4k 4k')


class TestLeadOfABurst(PeerFetcherTestCase):
    """A run no holder has is waited for at the base's lead, a while.

    The peer is the lead vmar-agent named in the reading host's holders
    file (what discovery writes); its mirror gets a block while the reading
    host waits, as a lead's mirror does while it fetches from the store.
    """

    def peers_conf(self):
        return 'discover = true\nlead_wait = 3\n'

    def setUp(self):
        super().setUp()
        layout = hostdir.Layout(self.reader_dir)
        path = layout.holders_file(self.mirror_id)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, 'w') as f:
            json.dump({'base_id': self.mirror_id, 'holders': [{
                'host': 'compute-1', 'peer': '127.0.0.1:%d' % self.port,
                'blocks': 0, 'lead': True}]}, f)
        self.counts = lambda: peer_source.read_counts(
            layout.peer_counts_file())

    def test_a_run_the_lead_gets_meanwhile_comes_from_it(self):
        # what the lead holds comes at once
        self.assert_read(self.mirror_id, 'read -P 0x11 0 8k')
        self.assertEqual(0, self.counts()['lead_waits'])
        reading = subprocess.Popen(
            [qemu_env.qemu_bin('qemu-io'), '-r', '--image-opts',
             'driver=nbd,server.type=unix,server.path=%s,export=%s' % (
                 self.sock, names.peer_fetch_export(self.mirror_id,
                                                    self.size)),
             '-c', 'read -P 0x44 8k 4k'],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.addCleanup(reading.kill)
        # the reading host is waiting; then the lead's fetch lands
        _until(lambda: self.counts()['lead_waits'] == 1, 10,
               'a wait at the lead')
        with open(os.path.join(self.host_dir, 'mirrors', self.mirror_id),
                  'r+b') as f:
            f.seek(2 * BS)
            f.write(b'\x44' * BS)
        out, _ = reading.communicate(timeout=60)
        self.assertEqual(0, reading.returncode, out + self.fetch_log())
        _until(lambda: self.counts()['peer_reads'] == 2, 10, 'the counts')
        self.assertEqual((1, 0), (self.counts()['lead_waits'],
                                  self.counts()['lead_misses']))

    def test_a_lead_that_never_gets_it_is_not_waited_for_again(self):
        # block 3: the lead never fetches it; after lead_wait, the store
        self.assert_failed(self.mirror_id, 'read 12k 4k')
        _until(lambda: self.counts()['lead_misses'] == 1, 10, 'the counts')
        # the next miss goes to the store at once: no second wait (the
        # lead is asked once per read: with the wait, or, not waited for,
        # as any other holder)
        self.assert_failed(self.mirror_id, 'read 16k 4k')
        _until(lambda: self.counts()['not_held'] == 2, 10, 'the counts')
        self.assertEqual(1, self.counts()['lead_waits'])
        # what it holds still comes from it
        self.assert_read(self.mirror_id, 'read -P 0x11 0 4k')


class TestDigestListsFromPeers(PeerServerTestCase):
    """A host reads a base's digest list from a peer, checked, or not.

    The peer server is the real one; the reading host's
    :class:`~vmar_openstack.host.peers.digests.PeerDigests` copies the
    peer's ``<id>.digests`` export with the real qemu-img over NBD with
    TLS.
    """

    def setUp(self):
        super().setUp()
        src = os.path.join(self.tmp, 'base.raw')
        with open(src, 'wb') as f:
            f.write(os.urandom(5 * BS + 100))       # a partial last block
        self.body = mirror_format.digests_bytes(
            self.mirror_id, fingerprint.hash_file(src, 5 * BS + 100))
        # not a multiple of 512: QEMU's NBD client rounds it up
        self.assertNotEqual(0, len(self.body) % 512)
        self.sha = hashlib.sha256(self.body).hexdigest()
        self.peer_copy = hostdir.Layout(self.host_dir).mirror(
            self.mirror_id).digests
        reader = os.path.join(self.tmp, 'reader-host')
        self.holders = hostdir.Layout(reader).holders_file
        os.makedirs(os.path.dirname(self.holders(self.mirror_id)))
        conf = cfg.ConfigOpts()
        vmar_conf.register_opts(conf)
        conf([], project='vmar', default_config_files=[])
        conf.set_override('qemu_img', qemu_env.qemu_bin('qemu-img'),
                          group='vmar_host')
        for k, v in (('tls_dir', self.client_tls), ('lead_wait', 5.0),
                     ('read_timeout', 5.0)):
            conf.set_override(k, v, group='vmar_peers')
        self.fetcher = peer_digests.PeerDigests(conf, self.holders)
        self.dest = os.path.join(self.tmp, 'got.digests')

    def name_peer(self, lead=False):
        with open(self.holders(self.mirror_id), 'w') as f:
            json.dump({'holders': [dict(
                {'host': 'compute-1', 'peer': '127.0.0.1:%d' % self.port,
                 'blocks': 0}, **({'lead': True} if lead else {}))]}, f)

    def test_a_peers_copy_is_read_and_checked(self):
        with open(self.peer_copy, 'wb') as f:
            f.write(self.body)
        # no holder named: nothing asked
        self.assertFalse(self.fetcher.fetch(self.mirror_id, self.dest,
                                            self.sha))
        self.name_peer()
        self.assertTrue(self.fetcher.fetch(self.mirror_id, self.dest,
                                           self.sha))
        with open(self.dest, 'rb') as f:
            self.assertEqual(self.body, f.read())
        self.assertEqual(1, self.fetcher.from_peers)
        # a copy that is not the published one is not kept
        self.assertFalse(self.fetcher.fetch(self.mirror_id, self.dest,
                                            'f' * 64))
        self.assertFalse(os.path.exists(self.dest))
        self.assertEqual(1, self.fetcher.refused)

    def test_a_lead_is_waited_for(self):
        self.name_peer(lead=True)

        def later():
            time.sleep(0.5)
            fileutils.write_atomic(self.peer_copy, self.body)
        t = threading.Thread(target=later)
        t.start()
        self.addCleanup(t.join)
        self.assertTrue(self.fetcher.fetch(self.mirror_id, self.dest,
                                           self.sha))
        with open(self.dest, 'rb') as f:
            self.assertEqual(self.body, f.read())

    def test_a_lead_that_never_gets_it(self):
        self.name_peer(lead=True)
        self.fetcher.lead_wait = 0.5
        self.assertFalse(self.fetcher.fetch(self.mirror_id, self.dest,
                                            self.sha))
        self.assertFalse(os.path.exists(self.dest))
