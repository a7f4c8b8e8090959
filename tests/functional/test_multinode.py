"""Several compute hosts: every move of a vmar server (issue 17).

``tools/cloud.sh up --computes 3`` (three hosts in namespaces of their own,
doc/source/multinode.rst), then tools/multinode_scenario.py: live and cold
migration, resize to another host and to the same one, the resize nova-api
refuses, the moves it refuses for a server whose image was deleted, shelve
and unshelve onto another host, evacuation of a killed host. Then
``down``: nothing of the hosts (process, namespace, interface, mount) is
left.

The stage takes about 15 minutes on two cores under TCG: it runs with
``tools/run-tests.sh --multinode`` (``VMAR_MULTINODE=1``), not by default.
"""

import os
import subprocess

import testtools

from tools.cloud import config
from tools import multinode_scenario
from tools.vmarenv import qemu_env

from tests.functional import test_cloud


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
