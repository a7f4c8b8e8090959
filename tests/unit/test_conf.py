"""Configuration: registration, isolation and the generator entry point."""

from oslo_config import cfg
import testtools

from vmar_openstack import conf as vmar_conf
from vmar_openstack.conf import opts as conf_opts


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

    def test_list_opts_names_every_group(self):
        groups = {g.name: opts for g, opts in conf_opts.list_opts()}
        self.assertEqual({'vmar', 'vmar_database', 'vmar_glance',
                          'vmar_rbd', 'vmar_agent', 'vmar_metrics',
                          'vmar_scheduler'},
                         set(groups))
        self.assertIn('weight_multiplier',
                      {o.name for o in groups['vmar_scheduler']})
        self.assertIn('ceph_conf', {o.name for o in groups['vmar_rbd']})
        self.assertIn('auth_type', {o.name for o in groups['vmar_glance']})
        self.assertIn('map_owner', {o.name for o in groups['vmar_glance']})
        self.assertIn('pool', {o.name for o in groups['vmar_agent']})
        self.assertIn('dedup_scope',
                      {o.name for o in groups['vmar']})
        self.assertIn('connection',
                      {o.name for o in groups['vmar_database']})

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

    def test_compute_sample_has_what_nova_compute_reads(self):
        groups = {g.name: {o.name for o in opts}
                  for g, opts in conf_opts.list_compute_opts()}
        self.assertEqual({'vmar', 'vmar_glance', 'vmar_rbd'}, set(groups))
        self.assertLessEqual({'host_dir', 'export_socket', 'map_source',
                              'resume_interval', 'state_dir', 'qemu_img',
                              'fill', 'fill_delay', 'fill_rate'},
                             groups['vmar'])
        self.assertLessEqual({'ceph_conf', 'user', 'op_timeout'},
                             groups['vmar_rbd'])
        self.assertNotIn('block_size', groups['vmar'])
        self.assertLessEqual({'auth_type', 'map_wait'}, groups['vmar_glance'])

    def test_agent_sample_has_what_the_agent_reads(self):
        groups = {g.name: {o.name for o in opts}
                  for g, opts in conf_opts.list_agent_opts()}
        self.assertLessEqual({'pool', 'max_attempts'}, groups['vmar_agent'])
        self.assertIn('connection', groups['vmar_database'])
        self.assertIn('dedup_scope', groups['vmar'])
        self.assertNotIn('host_dir', groups['vmar'])
        self.assertEqual({'bind_host', 'agent_port'}, groups['vmar_metrics'])

    def test_scheduler_sample_has_what_the_weigher_reads(self):
        groups = {g.name: {o.name for o in opts}
                  for g, opts in conf_opts.list_scheduler_opts()}
        self.assertEqual({'vmar': {'state_dir'},
                          'vmar_database': {'connection', 'lock_timeout',
                                            'connection_debug'},
                          'vmar_scheduler': {'weight_multiplier'}}, groups)
