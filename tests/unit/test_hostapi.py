"""The host API: its wire format, its server and its client, over a real
unix socket, with the daemon's service replaced by a dict (the service's
own operations have their functional tests in test_export)."""

import json
import os
import socket
import subprocess
import threading
from unittest import mock

import fixtures
from oslo_config import cfg
import testtools

from vmar_openstack import conf as vmar_conf
from vmar_openstack import exception
from vmar_openstack.host import api
from vmar_openstack.host.exports import state as export_state
from vmar_openstack import hostapi
from vmar_openstack.hostapi import protocol

IMAGE = '11111111-2222-3333-4444-555555555555'
HOLDER = 'aaaaaaaa-2222-3333-4444-555555555555'
NOBODY = 65534


class Service(object):
    """The operations of ExportService the API calls, over a dict."""

    def __init__(self, conf, sock):
        self.conf = conf
        self.socket = sock
        self.exports = {}
        self.ready = threading.Event()
        self.ready.set()
        self.calls = []
        self.guests = None

    def wait_ready(self, timeout=60):
        if not self.ready.is_set():
            raise exception.ExportDaemonDown(reason='restarting')

    def add(self, image_id, host_cache='base', holder='cli', version=None,
            key=None, whole=False):
        self.calls.append(('add', image_id, holder, version, key, whole))
        if image_id == 'no-map':
            raise exception.ExportError('no map of image %s' % image_id)
        exp = self.exports.setdefault(
            image_id, export_state.Export(image_id, version or 1, host_cache,
                                          [], [(image_id, 4096)]))
        if holder not in exp.holders:
            exp.holders.append(holder)
            exp.keys[holder] = key or '0' * 32
        return exp

    def uri(self, exp, holder):
        return 'nbd+unix:///%s?socket=%s' % (exp.holder_name(holder),
                                             self.socket)

    def virtual_size(self, exp):
        return 1 << 30

    def release(self, holder):
        out = []
        for exp in list(self.exports.values()):
            if holder in exp.holders:
                exp.holders.remove(holder)
                out.append(exp.name)
        return out

    def holders(self):
        out = {}
        for exp in self.exports.values():
            for h in exp.holders:
                out.setdefault(h, []).append(exp.name)
        return out

    def list(self):
        return dict((e.name, e) for e in self.exports.values()), {
            n for e in self.exports.values() for n in e.nbd_names()}


class ApiTestCase(testtools.TestCase):

    group = None

    def setUp(self):
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        os.chmod(self.tmp, 0o755)
        self.conf = cfg.ConfigOpts()
        vmar_conf.register_opts(self.conf)
        self.conf([], project='vmar')
        self.conf.set_override('export_socket',
                               os.path.join(self.tmp, 'nbd.sock'),
                               'vmar_host')
        self.conf.set_override('api_socket_group', self.group, 'vmar_host')
        self.service = Service(self.conf, self.conf.vmar_host.export_socket)
        self.server = api.ApiServer(self.service).start()
        self.addCleanup(self.server.stop)
        self.client = hostapi.Client.from_host_conf(self.conf)


class TestCalls(ApiTestCase):

    def test_the_socket_sits_beside_the_nbd_socket(self):
        self.assertEqual(os.path.join(self.tmp, 'api.sock'),
                         self.client.path)
        st = os.stat(self.client.path)
        self.assertEqual(0o660, st.st_mode & 0o777)

    def test_hello_names_the_versions_and_the_nbd_socket(self):
        hello = self.client.hello()
        self.assertEqual([1], hello['versions'])
        self.assertEqual(self.conf.vmar_host.export_socket,
                         hello['nbd_socket'])
        self.assertEqual(os.getpid(), hello['pid'])
        # no guest channels while they are off
        self.assertIsNone(self.client.guest_channel_dir())

    def test_hello_names_the_guest_channel_directory(self):
        self.service.guests = mock.Mock(dir='/run/vmar/guests')
        self.assertEqual('/run/vmar/guests', self.client.guest_channel_dir())

    def test_add_returns_the_holders_uri_and_no_other_key(self):
        self.client.add(IMAGE, holder='other', key='f' * 32)
        exp = self.client.add(IMAGE, holder=HOLDER, version=1,
                              key='e' * 32)
        self.assertEqual('nbd+unix:///%s.1.%s?socket=%s' % (
            IMAGE, 'e' * 32, self.conf.vmar_host.export_socket), exp['uri'])
        self.assertEqual(1 << 30, exp['virtual_size'])
        self.assertEqual(['other', HOLDER], exp['holders'])
        # the keys are secrets of their holders: never listed
        self.assertNotIn('keys', exp)
        self.assertNotIn('f' * 32, json.dumps(self.client.list()))
        self.assertEqual(('add', IMAGE, HOLDER, 1, 'e' * 32, False),
                         self.service.calls[-1])

    def test_release_holders_and_health(self):
        self.client.add(IMAGE, holder=HOLDER)
        self.assertEqual({HOLDER: [IMAGE + '.1']}, self.client.holders())
        served = IMAGE + '.1.' + '0' * 32
        health = self.client.health([served, IMAGE + '.1.' + '1' * 32])
        self.assertTrue(health['daemon_up'])
        self.assertEqual([served], health['served'])
        # names carry the holders' keys: none comes back unasked
        self.assertEqual([], self.client.health()['served'])
        self.assertEqual([IMAGE + '.1'], self.client.release(HOLDER))
        self.assertEqual({}, self.client.holders())

    def test_errors_come_back_as_their_class(self):
        e = self.assertRaises(exception.ExportError, self.client.add,
                              'no-map')
        self.assertIn('no map of image no-map', str(e))
        self.service.ready.clear()
        self.assertRaises(exception.ExportDaemonDown, self.client.add,
                          IMAGE)

    def test_a_missing_argument_is_a_clear_error(self):
        e = self.assertRaises(exception.HostApiError, self.client.call,
                              'release')
        self.assertIn('bad arguments', str(e))

    def test_unknown_version_and_operation(self):
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(self.client.path)
            f = s.makefile('rwb')
            for req, error in (({'api': 2, 'op': 'hello'},
                                'UnsupportedVersion'),
                               ({'api': 1, 'op': 'format-disk'},
                                'HostApiError'),
                               ([1], 'HostApiError')):
                f.write(json.dumps(req).encode() + b'\n')
                f.flush()
                self.assertEqual(error,
                                 json.loads(f.readline())['error']['type'])
            f.write(b'not json\n')
            f.flush()
            self.assertIn('not JSON',
                          json.loads(f.readline())['error']['message'])

    def test_many_callers_at_once(self):
        errors = []

        def spawn(i):
            try:
                holder = 'h%d' % i
                self.client.add(IMAGE, holder=holder)
                self.client.release(holder)
            except Exception as e:     # noqa: reported below
                errors.append(e)
        threads = [threading.Thread(target=spawn, args=(i,))
                   for i in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual([], errors)
        self.assertEqual({}, self.client.holders())

    def test_a_daemon_not_running(self):
        self.server.stop()
        e = self.assertRaises(exception.ExportDaemonDown, self.client.hello)
        self.assertIn(self.client.path, str(e))


class TestProtocol(testtools.TestCase):

    def test_round_trip_and_limits(self):
        msg = protocol.request('add', {'image_id': IMAGE})
        self.assertEqual(msg, protocol.decode(protocol.encode(msg)))
        self.assertRaises(exception.HostApiError, protocol.decode,
                          b'{"api": 1')
        self.assertRaises(exception.HostApiError, protocol.encode,
                          {'x': 'y' * protocol.MAX_LINE})

    def test_every_operation_has_a_server_side(self):
        self.assertEqual(set(protocol.OPS), set(api.OPS))
        for op in protocol.OPS:
            self.assertTrue(callable(getattr(hostapi.Client, op)), op)


# what the refused caller runs: the protocol by hand, with nothing of the
# tree (nobody cannot read a virtualenv under /root)
_CALLER = '''
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except PermissionError as e:
    sys.exit('denied: %s' % e)
try:
    s.sendall(b'{"api": 1, "op": "hello", "args": {}}\\n')
except BrokenPipeError:
    pass    # a refusal is sent before the request is read
reply = json.loads(s.makefile('rb').readline())
if 'error' in reply:
    sys.exit('denied: %(type)s %(message)s' % reply['error'])
print(reply['result']['versions'])
'''
SYSTEM_PYTHON = '/usr/bin/python3'


@testtools.skipUnless(os.geteuid() == 0 and os.path.exists(SYSTEM_PYTHON),
                      'needs root and %s to call as nobody' % SYSTEM_PYTHON)
class TestAccess(ApiTestCase):
    """Who may call: root and the socket's group, nobody else."""

    group = 'staff'

    def call_as_nobody(self, groups=()):
        out = subprocess.run(
            [SYSTEM_PYTHON, '-c', _CALLER, self.client.path],
            user=NOBODY, group=NOBODY, extra_groups=list(groups),
            env={'PATH': '/usr/bin:/bin'}, capture_output=True, text=True,
            cwd='/')
        return (out.stdout + out.stderr).strip()

    def test_the_socket_belongs_to_the_group(self):
        import grp
        st = os.stat(self.client.path)
        self.assertEqual(grp.getgrnam('staff').gr_gid, st.st_gid)
        self.assertEqual(0o660, st.st_mode & 0o777)

    def test_a_caller_outside_the_group_is_refused(self):
        self.assertIn('denied: [Errno 13] Permission denied',
                      self.call_as_nobody())

    def test_the_daemon_refuses_it_even_past_the_mode(self):
        # a socket whose mode was widened (or a copy of its fd) still
        # answers only root and the group
        os.chmod(self.client.path, 0o666)
        out = self.call_as_nobody()
        self.assertIn('denied: HostApiDenied', out)
        self.assertIn('uid %d' % NOBODY, out)

    def test_a_member_of_the_group_is_served(self):
        self.assertEqual('[1]', self.call_as_nobody(groups=['staff']))
