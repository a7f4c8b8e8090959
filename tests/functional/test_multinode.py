"""Several compute hosts: every move of a vmar server (issue 17).

``tools/cloud.sh up --computes 3`` (three hosts in namespaces of their own,
doc/source/admin/multinode.rst), then tools/multinode_scenario.py: live and
cold migration, resize to another host and to the same one, the resize nova-api
refuses, the moves it refuses for a server whose image was deleted, shelve
and unshelve onto another host, evacuation of a killed host. Then
``down``: nothing of the hosts (process, namespace, interface, mount) is
left. Before the moves: every host runs a peer server on its own address
with its own credentials of the cloud's CA (issue 34).

The stage takes about 15 minutes on two cores under TCG: it runs with
``tools/run-tests.sh --multinode`` (``VMAR_MULTINODE=1``), not by default.
"""

import configparser
import os
import stat
import subprocess

import testtools

from tools.cloud import config
from tools.cloud import hosts
from tools import multinode_scenario
from tools.vmarenv import qemu_env

from tests.functional import test_cloud


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def check_peers(test, cloud):
    """Every host serves peers on its address, with its own credentials.

    ``[vmar_peers]`` in the host's own vmar-export.conf, the cloud's CA and
    the host's certificates (0700 directories, 0600 keys, a server
    certificate for the host's address), the peer server up in ``vmar-export
    status``, and a TLS session of each host with the next one's server.
    """
    ca = cloud.path(config.PEER_CA)
    test.assertEqual(0o700, _mode(ca))
    test.assertEqual(0o600, _mode(os.path.join(ca, 'ca-key.pem')))
    every = [hosts.Host(cloud, spec) for spec in cloud.hosts]
    for host in every:
        conf = configparser.ConfigParser(interpolation=None)
        conf.read(host.path('etc', 'vmar-export.conf'))
        test.assertEqual({'listen_address': host.address, 'discover': 'true',
                          'tls_dir': cloud.path('vmar', config.PEER_TLS)},
                         dict(conf['vmar_peers']))
        tls = host.path('vmar', config.PEER_TLS)
        test.assertEqual(0o700, _mode(tls))
        test.assertEqual(sorted(hosts.PEER_TLS_FILES), sorted(os.listdir(tls)))
        for name in ('server-key.pem', 'client-key.pem'):
            test.assertEqual(0o600, _mode(os.path.join(tls, name)))
        for role in ('server', 'client'):
            verify = subprocess.run(
                ['openssl', 'verify', '-CAfile',
                 os.path.join(ca, 'ca-cert.pem'),
                 os.path.join(tls, '%s-cert.pem' % role)],
                capture_output=True, text=True)
            test.assertEqual(0, verify.returncode, verify.stdout
                             + verify.stderr)
        san = subprocess.run(
            ['openssl', 'x509', '-noout', '-ext', 'subjectAltName', '-in',
             os.path.join(tls, 'server-cert.pem')],
            capture_output=True, text=True, check=True).stdout
        test.assertIn('IP Address:%s' % host.address, san)
        test.assertIn('peers: serving on %s:10810' % host.address,
                      host.vmar_export('status'))
    for client, server in zip(every, every[1:] + every[:1]):
        # raises unless the TLS session with client certificates is made
        client.peer_exports(server.address)


@testtools.skipUnless(os.geteuid() == 0, 'tools/cloud.sh runs as root')
@testtools.skipUnless(os.environ.get('VMAR_MULTINODE') == '1',
                      'tools/run-tests.sh --multinode runs it')
class TestMultinode(test_cloud.TestCloud):

    def test_up_user_path_down(self):
        self.skipTest('the single-host path is test_cloud\'s')

    def _logs(self):
        out = []
        for name in os.listdir(os.path.join(self.state, 'log')):
            if name.startswith(('nova-compute@', 'vmar-export@',
                                'nova-conductor')) and name.endswith('.log'):
                with open(os.path.join(self.state, 'log', name),
                          errors='replace') as f:
                    lines = [ln for ln in f if ' ERROR ' in ln or
                             ' WARNING ' in ln]
                out.append('--- %s\n%s' % (name, ''.join(lines[-30:])))
        return '\n'.join(out)

    def test_moves(self):
        up = self.cloud('up', '--computes', '3')
        openrc = up.stdout.strip().splitlines()[-1]
        cloud = config.Cloud(self.state)
        cloud.load()
        self.assertEqual(['compute-1', 'compute-2', 'compute-3'],
                         [h['name'] for h in cloud.hosts])
        # three hypervisors, each its own libvirt (host UUID) and address
        hypervisors = self.openstack(openrc, 'hypervisor', 'list', '-f',
                                     'value', '-c', 'Hypervisor Hostname',
                                     '-c', 'Host IP', '-c', 'State')
        for h in cloud.hosts:
            self.assertIn('%s %s up' % (h['name'], h['address']),
                          hypervisors)
        self.assertEqual(3, len({h['libvirt_host_uuid']
                                 for h in cloud.hosts}))
        check_peers(self, cloud)
        # again: nothing to start
        self.assertNotIn('started', self.cloud('up').stderr)

        moves = multinode_scenario.Moves(self.state, openrc,
                                         qemu_env.test_guest())
        try:
            moves.run()
        except multinode_scenario.ScenarioError as e:
            self.fail('%s\n%s' % (e, self._logs()))

        netns = [h.netns for h in moves.hosts.values()]
        self.cloud('down')
        self.assertEqual([], test_cloud._cloud_processes(self.state))
        ip = subprocess.run(['ip', 'netns', 'list'], capture_output=True,
                            text=True, check=True).stdout
        for name in netns:
            self.assertNotIn(name, ip)
        self.assertNotEqual(0, subprocess.run(
            ['ip', 'link', 'show', config.BRIDGE],
            capture_output=True).returncode)
        self.assertEqual([], [m for m in test_cloud._mounts()
                              if self.state in m])
