"""Configuration options of vmar-openstack, one module per group.

Each group module defines ``GROUP`` and ``ALL_OPTS`` (and, if it needs
more than its options, ``register_extra(conf)``); this package registers
them.

Groups by audience:

* the library: ``[vmar]`` (:mod:`.vmar`), ``[vmar_database]``
  (:mod:`.database`); the Glance import plugin adds ``[vmar_import]``
  (:mod:`.glance_import`), vmar-agent ``[vmar_agent]`` (:mod:`.agent`);
* a compute host's export daemon: ``[vmar_host]`` (:mod:`.host`), with
  ``[vmar_glance]`` (:mod:`.glance`) or ``[vmar_rbd]`` (:mod:`.rbd`) for
  its store, ``[vmar_guest_cache]`` (:mod:`.guest_cache`) for the
  guests of guest-private and auto servers, and ``[vmar_peers]``
  (:mod:`.peers`) for what it serves other hosts;
* vmar-nova-compute: ``[vmar_compute]`` (:mod:`.compute`) alone;
* nova-scheduler's weigher: ``[vmar_scheduler]`` (:mod:`.scheduler`);
* shared: ``[vmar_reports]`` (:mod:`.reports`: hosts send, the agent
  listens), ``[vmar_metrics]`` (:mod:`.metrics`: the address of the
  endpoints).

:mod:`.opts` lists each audience's groups for ``oslo-config-generator``.
Every option is registered on ``CONF`` unless a caller names the groups
(``vmar-nova-compute`` registers ``[vmar_compute]`` alone).
"""

from oslo_config import cfg

from vmar_openstack.conf import agent
from vmar_openstack.conf import compute
from vmar_openstack.conf import database
from vmar_openstack.conf import glance
from vmar_openstack.conf import glance_import
from vmar_openstack.conf import guest_cache
from vmar_openstack.conf import host
from vmar_openstack.conf import metrics
from vmar_openstack.conf import peers
from vmar_openstack.conf import rbd
from vmar_openstack.conf import reports
from vmar_openstack.conf import scheduler
from vmar_openstack.conf import vmar

CONF = cfg.CONF

GROUPS = (vmar, database, glance_import, agent, host, guest_cache, glance,
          rbd, compute, scheduler, reports, metrics, peers)


def register_opts(conf=CONF, groups=GROUPS):
    """Register ``groups`` (every group's options) on ``conf``.

    Each ConfigOpts gets its own OptGroup objects: an OptGroup holds the
    per-option state (overrides included), so sharing one between two
    ConfigOpts would leak overrides from one into the other.
    """
    for module in groups:
        group = module.GROUP
        conf.register_group(cfg.OptGroup(group.name, title=group.title,
                                         help=group.help))
        conf.register_opts(module.ALL_OPTS, group=group.name)
        if hasattr(module, 'register_extra'):
            module.register_extra(conf)


register_opts()


def from_files(files):
    """A ConfigOpts of its own with every group, read from ``files``.

    What a process vmar runs with nothing but its configuration files
    (nbdkit's plugins, tools) loads.
    """
    conf = cfg.ConfigOpts()
    register_opts(conf)
    args = []
    for f in files:
        args += ['--config-file', f]
    conf(args, project='vmar', default_config_files=[])
    return conf
