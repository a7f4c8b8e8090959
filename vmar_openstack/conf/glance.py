"""``[vmar_glance]``: how vmar-agent and compute hosts reach Glance.

The group holds vmar's own options and keystoneauth's session, auth and
adapter options, registered through ``keystoneauth1.loading``.
"""

from keystoneauth1 import loading as ks_loading
from oslo_config import cfg

GROUP = cfg.OptGroup(
    'vmar_glance', title='VMAR access to Glance',
    help='How vmar-agent and compute hosts reach Glance (keystoneauth '
         'session, auth and adapter options).')

glance_opts = [
    cfg.StrOpt('map_owner',
               help='Project that owns the map images vmar-agent publishes '
                    '(the agent\'s project). Hosts ignore map images owned by '
                    'anyone else. Unset: the project of these credentials, '
                    'as Glance reports it.'),
    cfg.IntOpt('map_wait', default=300, min=0,
               help='Compute hosts: seconds to wait for vmar-agent to '
                    'publish the map of an image that is active in Glance '
                    'but has none yet (a snapshot just taken by shelve, '
                    'an image just uploaded) before the boot fails.'),
]

ALL_OPTS = glance_opts


def sample_extra():
    """keystoneauth's options of the group, for the sample files."""
    return (ks_loading.get_session_conf_options()
            + ks_loading.get_auth_common_conf_options()
            + ks_loading.get_auth_plugin_conf_options('password')
            + ks_loading.get_adapter_conf_options(include_deprecated=False))


def register_extra(conf):
    """keystoneauth's options and defaults, after :data:`ALL_OPTS`."""
    ks_loading.register_session_conf_options(conf, GROUP.name)
    ks_loading.register_auth_conf_options(conf, GROUP.name)
    ks_loading.register_adapter_conf_options(conf, GROUP.name,
                                             include_deprecated=False)
    conf.set_default('service_type', 'image', group=GROUP.name)
    # no Glance call may hang an agent (which may hold the library lock)
    conf.set_default('timeout', 120, group=GROUP.name)
