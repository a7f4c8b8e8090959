"""Configuration: registration, isolation and the generator entry point."""

import fixtures
from oslo_config import cfg
import testtools

from vmar_openstack import conf as vmar_conf
from vmar_openstack.conf import opts as conf_opts
from vmar_openstack.glance_hooks import opts as glance_opts


class TestConf(testtools.TestCase):

    def _conf(self):
        c = cfg.ConfigOpts()
        vmar_conf.register_opts(c)
        c([], project='vmar', default_config_files=[])
        return c

    def test_overrides_do_not_leak_between_config_objects(self):
        a, b = self._conf(), self._conf()
        a.set_override('map_dir', '/somewhere', group='vmar')
        self.assertEqual('/somewhere', a.vmar.map_dir)
        self.assertEqual('/var/lib/vmar/maps', b.vmar.map_dir)

    def test_block_size_must_be_a_power_of_two(self):
        c = self._conf()
        self.assertRaises(ValueError, c.set_override, 'block_size', 12288,
                          group='vmar')
        self.assertRaises(ValueError, c.set_override, 'block_size', 2048,
                          group='vmar')
        c.set_override('block_size', 65536, group='vmar')
        self.assertEqual(65536, c.vmar.block_size)

    def test_database_default_is_under_the_state_dir(self):
        c = self._conf()
        c.set_override('state_dir', '/srv/vmar', group='vmar')
        self.assertEqual('sqlite:////srv/vmar/vmar.sqlite',
                         c.vmar_database.connection)

    def groups(self, lister):
        return {getattr(g, 'name', g): {o.name for o in opts}
                for g, opts in lister()}

    def test_each_sample_lists_whole_groups_of_its_audience(self):
        samples = {
            conf_opts.list_opts: {'vmar', 'vmar_database'},
            conf_opts.list_host_opts: {'vmar_host', 'vmar_guest_cache',
                                       'vmar_peers', 'vmar_reports',
                                       'vmar_glance', 'vmar_rbd',
                                       'vmar_metrics'},
            conf_opts.list_compute_opts: {'vmar_compute'},
            conf_opts.list_agent_opts: {'vmar', 'vmar_database',
                                        'vmar_agent', 'vmar_reports',
                                        'vmar_glance', 'vmar_metrics'},
            conf_opts.list_scheduler_opts: {'vmar_database',
                                            'vmar_scheduler'},
            glance_opts.list_import_opts: {'image_import_opts', 'vmar',
                                           'vmar_import', 'vmar_database'},
        }
        registered = {m.GROUP.name: {o.name for o in m.ALL_OPTS}
                      for m in vmar_conf.GROUPS}
        listed = set()
        for lister, names in samples.items():
            groups = self.groups(lister)
            self.assertEqual(names, set(groups), lister.__name__)
            for name in names & set(registered):
                # whole groups: every option of the group, none picked
                self.assertLessEqual(registered[name], groups[name], name)
            listed |= names
        # every group is in some sample
        self.assertLessEqual(set(registered), listed)

    def test_nova_compute_holds_no_credentials(self):
        groups = self.groups(conf_opts.list_compute_opts)
        # (a snapshot by delta reaches Glance as the user, with Nova's
        # own client and token: no option of vmar's holds a credential)
        self.assertEqual({'vmar_compute': {'api_socket', 'api_timeout',
                                           'resume_interval', 'qemu_img',
                                           'guest_reporting_order',
                                           'snapshot_delta',
                                           'snapshot_import_timeout'}},
                         groups)

    def test_the_daemons_sample_has_its_store_access(self):
        groups = self.groups(conf_opts.list_host_opts)
        self.assertLessEqual({'host_dir', 'export_socket', 'map_source',
                              'api_socket', 'api_socket_group', 'fill',
                              'metrics_port', 'qemu_img'},
                             groups['vmar_host'])
        self.assertLessEqual({'auth_type', 'map_wait'}, groups['vmar_glance'])
        self.assertLessEqual({'ceph_conf', 'user', 'op_timeout'},
                             groups['vmar_rbd'])

    def test_dead_options_are_gone(self):
        self.assertNotIn('chunk_size', self.groups(
            conf_opts.list_host_opts)['vmar_glance'])

    def test_agent_sample_has_what_the_agent_reads(self):
        groups = self.groups(conf_opts.list_agent_opts)
        self.assertLessEqual({'pool', 'max_attempts', 'metrics_port'},
                             groups['vmar_agent'])
        self.assertIn('report_topic', groups['vmar_reports'])
        self.assertEqual({'bind_host'}, groups['vmar_metrics'])

    def test_files_of_earlier_releases_are_read(self):
        """Options that moved out of [vmar] and [vmar_metrics]."""
        path = self.useFixture(fixtures.TempDir()).path + '/old.conf'
        with open(path, 'w') as f:
            f.write('[vmar]\nstate_dir = /srv/lib\nhost_dir = /srv/host\n'
                    'export_socket = /run/x/nbd.sock\nbase_fetch = full\n'
                    'resume_interval = 7\nreport_topic = t\n'
                    'mapgen_failure_fatal = true\n'
                    '[vmar_metrics]\nexport_port = 9101\n'
                    'agent_port = 9102\n')
        c = cfg.ConfigOpts()
        vmar_conf.register_opts(c)
        c(['--config-file', path], project='vmar', default_config_files=[])
        self.assertEqual('/srv/lib', c.vmar.state_dir)
        self.assertEqual(('/srv/host', '/run/x/nbd.sock', 'full', 9101),
                         (c.vmar_host.host_dir, c.vmar_host.export_socket,
                          c.vmar_host.base_fetch, c.vmar_host.metrics_port))
        self.assertEqual(7, c.vmar_compute.resume_interval)
        self.assertEqual('t', c.vmar_reports.report_topic)
        self.assertTrue(c.vmar_import.mapgen_failure_fatal)
        self.assertEqual(9102, c.vmar_agent.metrics_port)
