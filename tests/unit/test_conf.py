"""Configuration: registration, isolation and the generator entry point."""

from oslo_config import cfg
import testtools

from vmar_openstack import conf as vmar_conf


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
        groups = {g.name: opts for g, opts in vmar_conf.list_opts()}
        self.assertEqual({'vmar', 'vmar_database', 'vmar_glance',
                          'vmar_agent'}, set(groups))
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
