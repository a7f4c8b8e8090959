"""The peer server's command and its supervision (issue 34).

nbdkit and QEMU's TLS clients are tested for real in
tests/functional/test_peers.py; here, what the export daemon asks of
them and how it keeps the server up.
"""

import hashlib
import json
import os
import sys
import time
import types
import uuid

import fixtures
import numpy as np
import testtools

from tests import base
from vmar_openstack import exception
from vmar_openstack import fingerprint
from vmar_openstack.host.exports import hostdir
from vmar_openstack.host.observe import metrics
from vmar_openstack.host.observe import status
from vmar_openstack.host.peers import digests as peer_digests
from vmar_openstack.host.peers import discovery
from vmar_openstack.host.peers import server as peers
from vmar_openstack.host.peers import source as peer_source
from vmar_openstack.host import supervisor
from vmar_openstack.mapformat import mirror as mirror_format
from vmar_openstack import names


class TestPeers(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.conf = base.new_conf()
        self.conf.set_override('host_dir', self.tmp, group='vmar_host')
        for f in peers.SERVER_FILES:
            open(os.path.join(self.tmp, f), 'w').close()
        self.conf.set_override('tls_dir', self.tmp, group='vmar_peers')

    def test_off_by_default(self):
        self.assertFalse(peers.enabled(self.conf))

    def test_digest_lists_are_copied_with_tls(self):
        self.conf.set_override('tls_dir', '/etc/a,b', group='vmar_peers')
        got = peer_digests.PeerDigests(self.conf, None).command(
            ('fd00::2', 10810), 'i', '/x')
        self.assertEqual(['convert', '-O', 'raw', '--object',
                          'tls-creds-x509,id=tls0,endpoint=client,'
                          'dir=/etc/a,,b', '--image-opts'], got[1:7])
        self.assertIn('file.server.host=fd00::2,file.server.port=10810,'
                      'file.export=%s,file.tls-creds=tls0'
                      % names.peer_digests_export('i'), got[7])
        self.assertEqual('/x', got[8])
        # the peer server serves them under that name
        self.conf.set_override('tls_dir', self.tmp, group='vmar_peers')
        cmd = peers.command(self.conf, 'pid')
        self.assertIn('digests-export=%s' % names.peer_digests_export('{}'),
                      cmd)
        self.assertIn('digests=%s' % hostdir.Layout(self.tmp).mirror(
            '{}').digests, cmd)
        self.conf.set_override('listen_address', '10.0.0.5',
                               group='vmar_peers')
        self.assertTrue(peers.enabled(self.conf))

    def test_command(self):
        self.conf.set_override('listen_address', '10.0.0.5',
                               group='vmar_peers')
        cmd = peers.command(self.conf, '/run/p.pid')
        for arg in ('--tls=require', '--tls-verify-peer',
                    '--tls-certificates=%s' % self.tmp, '--filter=limit',
                    '--filter=rate', 'limit=64', 'host-dir=%s' % self.tmp,
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

    def test_the_peer_fetcher_is_told_where_digest_lists_are(self):
        self.assertIsNone(peers.fetcher_command(self.conf))
        self.conf.set_override('peers', ['10.0.0.6:10810'],
                               group='vmar_peers')
        # hosts that copy whole bases fetch no runs
        self.conf.set_override('base_fetch', 'full', group='vmar_host')
        self.assertIsNone(peers.fetcher_command(self.conf))
        self.conf.set_override('base_fetch', 'lazy', group='vmar_host')
        cmd, sock, env = peers.fetcher_command(self.conf)
        self.assertEqual(os.path.join(self.tmp, 'peer-fetch.sock'), sock)
        self.assertEqual(peers.FETCHER_PLUGIN, cmd[cmd.index('python') + 1])
        for arg in ('digests=%s/mirrors/{}.digests' % self.tmp,
                    'counts=%s/peers/reads.json' % self.tmp):
            self.assertIn(arg, cmd)
        self.assertFalse([a for a in cmd if a.startswith('holders=')])
        # a run no peer holds goes to the store at once: no retries
        self.assertFalse([a for a in cmd if 'retry' in a])
        self.assertNotIn('PYTHONPATH', env)
        # discovery: where the holders are, too
        self.conf.set_override('peers', [], group='vmar_peers')
        self.conf.set_override('discover', True, group='vmar_peers')
        self.assertIn('holders=%s/peers/{}.json' % self.tmp,
                      peers.fetcher_command(self.conf)[0])
        # fetch = false turns the client side off
        self.conf.set_override('fetch', False, group='vmar_peers')
        self.assertIsNone(peers.fetcher_command(self.conf))
        self.assertFalse(peer_source.enabled(self.conf))

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
        self.conf = base.new_conf()
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
            'vmar_openstack.host.supervisor.time.monotonic',
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


class TestFetcherSupervision(testtools.TestCase):
    """Supervisor._check_fetchers: the nbdkits reads need, kept up."""

    def setUp(self):
        super().setUp()
        self.sup = supervisor.Supervisor.__new__(supervisor.Supervisor)
        self.sup.conf = base.new_conf()
        self.sup.peer_fetcher_missing = False
        self.started = []

        def start(*args):
            self.started.append(FakeProc())
            return self.started[-1]
        self.sup.start_fetcher = start
        self.useFixture(fixtures.MockPatchObject(peers, 'start_fetcher',
                                                 start))

    def test_exited_ones_are_restarted_absent_ones_left(self):
        self.sup.fetcher, self.sup.peer_fetcher = FakeProc(), None
        self.assertEqual(0.5, self.sup._check_fetchers(0.5, 10))
        self.assertEqual([], self.started)
        self.sup.fetcher.returncode = 1
        self.sup.peer_fetcher = FakeProc(-9)
        self.sup._check_fetchers(0.5, 10)
        self.assertEqual(2, len(self.started))
        self.assertEqual([self.sup.fetcher, self.sup.peer_fetcher],
                         self.started)

    def test_a_peer_fetcher_that_cannot_start_is_tried_again_later(self):
        now = [1000.0]
        self.useFixture(fixtures.MockPatch(
            'vmar_openstack.host.supervisor.time.monotonic',
            lambda: now[0]))
        fails = ['nbdkit: python plugin missing']

        def start(conf):
            if fails:
                raise exception.ExportError(fails.pop())
            self.started.append(FakeProc())
            return self.started[-1]
        self.useFixture(fixtures.MockPatchObject(peers, 'start_fetcher',
                                                 start))
        self.sup.fetcher = FakeProc()
        self.sup._start_peer_fetcher()
        self.assertIsNone(self.sup.peer_fetcher)
        now[0] += supervisor.PEERS_RETRY - 1
        self.sup._check_fetchers(0.5, 10)
        self.assertEqual([], self.started)
        now[0] += 1
        self.sup._check_fetchers(0.5, 10)
        self.assertEqual(self.started, [self.sup.peer_fetcher])

    def test_a_failed_restart_backs_off(self):
        self.sup.fetcher, self.sup.peer_fetcher = FakeProc(1), None

        def fail():
            raise exception.ExportError('nbdkit missing')
        self.sup.start_fetcher = fail
        self.useFixture(fixtures.MockPatch(
            'vmar_openstack.host.supervisor.time.sleep'))
        self.assertEqual(1.0, self.sup._check_fetchers(0.5, 10))
        self.assertEqual(10, self.sup._check_fetchers(8, 10))


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
        for host, port, text in (('10.0.0.2', 10810, '10.0.0.2:10810'),
                                 ('fd00::2', 10810, '[fd00::2]:10810'),
                                 ('compute-2', 1, 'compute-2:1')):
            self.assertEqual(text, names.peer_address(host, port))
            self.assertEqual((host, port), names.parse_peer_address(text))
        for bad in ('10.0.0.2', 'host:port', ':10810', 'h:0', 'h:65536',
                    None, 7):
            self.assertRaises(ValueError, names.parse_peer_address, bad)

    def test_candidates_are_the_holders_then_the_configured_peers(self):
        tmp = self.useFixture(fixtures.TempDir()).path
        path = os.path.join(tmp, 'holders.json')
        reader = peer_source.PeerReader(
            ['10.0.0.9:1', '10.0.0.2:1'], tmp, None,
            holders_path=lambda image_id: path)
        configured = [('10.0.0.9', 1), ('10.0.0.2', 1)]
        self.assertEqual(configured, reader.candidates('i'))

        def write(holders, mtime):
            with open(path, 'w') as f:
                json.dump({'holders': holders}, f)
            os.utime(path, ns=(mtime, mtime))
        write([{'host': 'b', 'peer': '10.0.0.2:1'},
               {'host': 'c', 'peer': '[fd00::3]:1'}], 1)
        self.assertEqual([('10.0.0.2', 1), ('fd00::3', 1), ('10.0.0.9', 1)],
                         reader.candidates('i'))
        # read again once the daemon rewrote it
        write([], 2)
        self.assertEqual(configured, reader.candidates('i'))
        # unreadable: the configured peers, and a log line
        write([{'host': 'b'}], 3)
        log = self.useFixture(fixtures.FakeLogger())
        self.assertEqual(configured, reader.candidates('i'))
        self.assertIn('unreadable', log.output)


class FakeNbd(types.ModuleType):
    """Test double of python3-libnbd (Debian's, in the system Python only).

    Every connection is refused, as a peer host that is down refuses it.
    The real libnbd against real peers is tests/functional/test_peers.py.
    """

    TLS_REQUIRE = 2
    CONTEXT_BASE_ALLOCATION = 'base:allocation'

    class Error(Exception):
        def __init__(self, message, errno=None):
            super().__init__(message)
            self.errno = errno

    def __init__(self):
        super().__init__('nbd')
        error = self.Error

        class NBD:
            def __getattr__(self, name):
                return lambda *args: None

            def aio_connect_tcp(self, host, port):
                raise error('nbd_aio_connect_tcp: connect: Connection '
                            'refused', 111)
        self.NBD = NBD


class TestDownPeers(testtools.TestCase):
    """A peer that cannot be reached is skipped for a while, not waited on.

    The peer refuses connections (libnbd's test double); the reader is the
    real one, its clock the test's.
    """

    def setUp(self):
        super().setUp()
        self.nbd = FakeNbd()
        self.useFixture(fixtures.MockPatchObject(sys, 'modules', dict(
            sys.modules, nbd=self.nbd)))
        tmp = self.useFixture(fixtures.TempDir()).path
        self.image = str(uuid.uuid4())
        src = os.path.join(tmp, 'image.raw')
        with open(src, 'wb') as f:
            f.write(b'\x11' * 4 * 4096)
        digests = os.path.join(tmp, 'image.digests')
        with open(digests, 'wb') as f:
            f.write(mirror_format.digests_bytes(
                self.image, fingerprint.hash_file(src, 4 * 4096)))
        self.now = [100.0]
        self.peer = ('10.0.0.2', 10810)
        self.reader = peer_source.PeerReader(
            ['10.0.0.2:10810'], tmp, lambda i: digests,
            clock=lambda: self.now[0], down_seconds=10)

    def test_an_unreachable_peer_is_skipped_for_down_seconds(self):
        self.assertIsNone(self.reader.read(self.image, 0, 4096))
        self.assertEqual(1, self.reader.counts['unreachable'])
        self.assertEqual(110.0, self.reader.bad_until[self.peer])
        # not asked again meanwhile: the store at once
        self.now[0] += 9
        self.assertIsNone(self.reader.read(self.image, 4096, 4096))
        self.assertEqual(1, self.reader.counts['unreachable'])
        self.now[0] += 1
        self.assertIsNone(self.reader.read(self.image, 4096, 4096))
        self.assertEqual(2, self.reader.counts['unreachable'])

    def test_a_down_mark_never_shortens_a_bad_one(self):
        self.reader.bad_until[self.peer] = 400.0
        self.reader._down(self.peer)
        self.assertEqual(400.0, self.reader.bad_until[self.peer])

    def test_a_peer_without_the_image_is_not_down(self):
        nbd = self.nbd
        self.assertTrue(peer_source._not_held(nbd.Error(
            "nbd_connect_tcp: handshake: server has no export named 'x': "
            "No such file or directory", 2)))
        self.assertFalse(peer_source._not_held(nbd.Error(
            'nbd_connect_tcp: connect: Connection refused', 111)))


class TestRereadAndLead(testtools.TestCase):
    """What the reader does with a run that fails its digest, and a lead.

    ``_read_from`` (libnbd on a real peer: tests/functional/test_peers.py)
    is replaced by the run each step of the test sends.
    """

    def setUp(self):
        super().setUp()
        tmp = self.useFixture(fixtures.TempDir()).path
        self.image = str(uuid.uuid4())
        self.good = b'\x11' * 4096
        src = os.path.join(tmp, 'image.raw')
        with open(src, 'wb') as f:
            f.write(self.good * 4)
        digests = os.path.join(tmp, 'image.digests')
        with open(digests, 'wb') as f:
            f.write(mirror_format.digests_bytes(
                self.image, fingerprint.hash_file(src, 4 * 4096)))
        self.holders = os.path.join(tmp, 'holders.json')
        with open(self.holders, 'w') as f:
            json.dump({'holders': [{'host': 'l', 'peer': '10.0.0.3:1',
                                    'blocks': 0, 'lead': True}]}, f)
        self.slept = []
        self.reader = peer_source.PeerReader(
            ['10.0.0.2:1'], tmp, lambda i: digests, lead_wait=2.0,
            holders_path=lambda i: self.holders, sleep=self.slept.append)
        self.sent = []

        def read_from(peer, image_id, offset, length, wait=0):
            self.asked.append((peer[0], wait))
            return self.sent.pop(0) if self.sent else None
        self.asked = []
        self.reader._read_from = read_from

    def test_a_bad_run_is_read_once_more(self):
        bad = b'\x12' + self.good[1:]
        # being written when first read: the second read is good
        self.sent = [bad, self.good]
        self.assertEqual(self.good, self.reader.read(self.image, 0, 4096))
        self.assertEqual(0, self.reader.counts['bad_blocks'])
        self.assertEqual([peer_source._REREAD_PAUSE], self.slept)
        # bad twice: the peer is bad
        self.sent = [bad, bad]
        self.assertIsNone(self.reader.read(self.image, 0, 4096))
        self.assertEqual(1, self.reader.counts['bad_blocks'])
        # the configured peer (asked first: the lead comes last)
        self.assertIn(('10.0.0.2', 1), self.reader.bad_until)

    def test_the_lead_is_waited_for_after_the_holders(self):
        self.assertEqual(('10.0.0.3', 1), self.reader.lead(self.image))
        self.assertIsNone(self.reader.read(self.image, 0, 4096))
        # the holders file's peers but the lead, the configured one, then
        # the lead once, with the wait (whose first question is at once)
        self.assertEqual([('10.0.0.2', 0), ('10.0.0.3', 2.0)], self.asked)
        # a lead not waited for (it missed a run lately): no second ask
        self.reader.no_wait_until[(('10.0.0.3', 1), self.image)] = (
            time.monotonic() + 60)
        self.asked.clear()
        self.reader.read(self.image, 0, 4096)
        self.assertEqual([('10.0.0.3', 0), ('10.0.0.2', 0)], self.asked)


class AgentDouble:
    """Test double of vmar-agent's holders RPC.

    The real one, over a real RabbitMQ, is in tests/functional/
    test_glance.py's peer test. This one answers from a dict, or fails
    like an agent that does not answer.
    """

    def __init__(self, answers):
        self.answers = answers
        self.asked = []

    def call(self, ctxt, method, base_id, host, limit):
        self.asked.append((method, base_id, host, limit))
        answer = self.answers[base_id]
        if isinstance(answer, Exception):
            raise answer
        return answer


class TestDiscovery(testtools.TestCase):

    A = '0a000000-0000-4000-8000-00000000000a'
    B = '0b000000-0000-4000-8000-00000000000b'

    def setUp(self):
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.conf = base.new_conf()
        self.conf.set_override('host', 'me', group='vmar_host')
        self.agent = AgentDouble({})
        self.found = discovery.Discovery(self.conf, self.tmp, self.agent)
        self.layout = hostdir.Layout(self.tmp)

    def holders(self, base_id):
        with open(self.layout.holders_file(base_id)) as f:
            return json.load(f)['holders']

    def mirror(self, base_id):
        m = self.layout.mirror(base_id)
        os.makedirs(os.path.dirname(m.data), exist_ok=True)
        open(m.data, 'wb').close()
        mirror_format.create_present(m.present, mirror_format.Header(
            base_id, 8 * 4096, 4096))

    def test_off_without_discover_or_a_bus(self):
        self.assertIsNone(discovery.start(self.conf, self.tmp))
        self.conf.set_override('discover', True, group='vmar_peers')
        log = self.useFixture(fixtures.FakeLogger())
        self.assertIsNone(discovery.start(self.conf, self.tmp))
        self.assertIn('no transport_url', log.output)

    def test_answers_are_written_checked(self):
        self.agent.answers[self.A] = [
            {'host': 'h2', 'peer': '10.0.0.2:10810', 'blocks': None},
            {'host': 'h3', 'peer': '[fd00::3]:10810', 'blocks': 7}]
        self.found.refresh([self.A])
        self.assertEqual(self.agent.answers[self.A], self.holders(self.A))
        self.assertEqual([('holders', self.A, 'me', 4)], self.agent.asked)
        # an answer naming a malformed peer is not written: the last stands
        self.agent.answers[self.A] = [{'host': 'h4', 'peer': 'nowhere'}]
        self.found.refresh([self.A])
        self.assertEqual('h2', self.holders(self.A)[0]['host'])
        self.assertEqual(1, self.found.failed)

    def test_an_agent_that_does_not_answer_leaves_the_last_answer(self):
        self.agent.answers[self.A] = [
            {'host': 'h2', 'peer': '10.0.0.2:1', 'blocks': 1}]
        self.found.refresh([self.A])
        self.agent.answers[self.A] = TimeoutError('no answer')
        log = self.useFixture(fixtures.FakeLogger())
        self.found.refresh([self.A])
        self.assertEqual('h2', self.holders(self.A)[0]['host'])
        self.assertIn('vmar-agent did not answer', log.output)

    def test_a_silent_agent_is_not_waited_for_again_at_once(self):
        self.agent.answers = {self.A: TimeoutError('no answer'),
                              self.B: []}
        self.useFixture(fixtures.FakeLogger())
        self.found.refresh([self.A, self.B])
        # the round ended at the first silence
        self.assertEqual([self.A], [a[1] for a in self.agent.asked])
        # an export added meanwhile does not wait for it
        self.found.ensure([self.B])
        self.assertEqual(1, len(self.agent.asked))
        # the periodic step asks again, and an answer ends the silence
        self.agent.answers[self.A] = []
        self.found.refresh([self.A])
        self.found.ensure([self.B])
        self.assertEqual([self.A, self.A, self.B],
                         [a[1] for a in self.agent.asked])

    def test_step_asks_for_the_mirrors_and_prunes(self):
        self.agent.answers = {self.A: [], self.B: []}
        self.mirror(self.A)
        # a whole base needs no peer
        os.makedirs(os.path.join(self.tmp, 'bases'))
        open(self.layout.base_file(self.B), 'wb').close()
        self.found.refresh([self.B])
        self.found.step()
        self.assertEqual([self.B, self.A],
                         [a[1] for a in self.agent.asked])
        self.assertEqual([], self.holders(self.A))
        # B's answer stays while it is fresh: an export being added asks
        # before it makes its mirrors
        path = self.layout.holders_file(self.B)
        self.assertTrue(os.path.exists(path))
        # older: gone, the host does not mirror it
        old = time.time() - self.found.interval - 1
        os.utime(path, (old, old))
        self.found.step()
        self.assertFalse(os.path.exists(path))

    def test_ensure_asks_only_for_missing_or_old_answers(self):
        self.agent.answers = {self.A: [], self.B: []}
        self.found.refresh([self.A])
        self.found.ensure([self.A, self.B])
        self.assertEqual([self.A, self.B], [a[1] for a in self.agent.asked])
        old = os.stat(self.layout.holders_file(self.A)).st_mtime - 3600
        os.utime(self.layout.holders_file(self.A), (old, old))
        self.found.ensure([self.A, self.B])
        self.assertEqual([self.A, self.B, self.A],
                         [a[1] for a in self.agent.asked])


class TestPeerCounts(testtools.TestCase):
    """What a host tells of its peer reads: file, status, metrics."""

    def test_counts_are_written_at_most_once_a_second(self):
        tmp = self.useFixture(fixtures.TempDir()).path
        path = os.path.join(tmp, 'reads.json')
        now = [100.0]
        reader = peer_source.PeerReader([], tmp, None, counts_path=path,
                                        clock=lambda: now[0])
        self.assertEqual(dict.fromkeys(peer_source.COUNTS, 0),
                         peer_source.read_counts(path))
        reader._count(peer_reads=1, peer_bytes=4096)
        reader._count(peer_reads=1, peer_bytes=4096)
        got = peer_source.read_counts(path)
        self.assertEqual((1, 4096), (got['peer_reads'], got['peer_bytes']))
        # a bad block is written at once
        reader._count(bad_blocks=1)
        got = peer_source.read_counts(path)
        self.assertEqual((2, 1), (got['peer_reads'], got['bad_blocks']))
        now[0] += 1
        reader._count(timeouts=1)
        self.assertEqual(reader.counts, peer_source.read_counts(path))
        # a change within the second is written by the second's end
        reader._count(peer_reads=1)
        self.assertEqual(2, peer_source.read_counts(path)['peer_reads'])
        deadline = time.monotonic() + 10
        while peer_source.read_counts(path)['peer_reads'] != 3:
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.05)
        bad = os.path.join(tmp, 'bad.json')
        with open(bad, 'w') as f:
            f.write('{')
        log = self.useFixture(fixtures.FakeLogger())
        self.assertEqual(0, peer_source.read_counts(bad)['peer_reads'])
        self.assertIn('unreadable', log.output)

    def test_metrics(self):
        st = status.PeersStatus(
            '10.0.0.1:10810', dict(peer_source.read_counts('/nonexistent'),
                                   peer_reads=3, bad_blocks=1),
            {TestDiscovery.A: ['h2', 'h3']}, 5, 1)
        got = {m.name: m.samples for m in metrics._peer_metrics(st)}
        self.assertEqual(3, got['vmar_peer_reads'][0].value)
        self.assertEqual(1, got['vmar_peer_bad_blocks'][0].value)
        self.assertEqual(5, got['vmar_peer_discovery_answers'][0].value)
        self.assertEqual(({'base': TestDiscovery.A}, 2),
                         (got['vmar_peer_holders'][0].labels,
                          got['vmar_peer_holders'][0].value))
        # every count the reader keeps is a metric
        self.assertEqual(set(peer_source.COUNTS),
                         {k for k, _n, _d in metrics._PEER_COUNTS})


class TestConnectionPool(testtools.TestCase):
    """The fetcher's threads share a few connections per peer and image."""

    def test_at_most_a_few_lent_then_busy(self):
        reader = peer_source.PeerReader([], '/tls', None, timeout=0.05)
        key = (('10.0.0.2', 1), 'i')
        # none idle: the first CONNECTIONS borrowers make their own
        for _ in range(peer_source.CONNECTIONS):
            self.assertIsNone(reader._borrow(key))
        self.assertRaises(peer_source.PeerBusy, reader._borrow, key)
        # one given back is lent again, not made anew
        reader._give_back(key, 'h')
        self.assertEqual('h', reader._borrow(key))
        # one given back as unusable frees a place
        reader._give_back(key, None)
        self.assertIsNone(reader._borrow(key))
        # another image of the same peer has its own
        self.assertIsNone(reader._borrow((key[0], 'j')))
        # a drop forgets the idle ones
        reader._give_back(key, 'g')
        reader._drop(*key)
        self.assertIsNone(reader._borrow(key))
