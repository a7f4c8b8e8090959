"""Configuration options of vmar-openstack, one module per group.

Each group module defines ``GROUP`` and ``ALL_OPTS`` (and, if it needs
more than its options, ``register_extra(conf)``); this package registers
them.

``[vmar]`` (:mod:`.vmar`), ``[vmar_database]`` (:mod:`.database`),
``[vmar_glance]`` (:mod:`.glance`), ``[vmar_rbd]`` (:mod:`.rbd`),
``[vmar_agent]`` (:mod:`.agent`), ``[vmar_metrics]`` (:mod:`.metrics`)
and ``[vmar_scheduler]`` (:mod:`.scheduler`); :mod:`.opts` lists them for
``oslo-config-generator``. Every option is registered on ``CONF``.
"""

from oslo_config import cfg

from vmar_openstack.conf import agent
from vmar_openstack.conf import database
from vmar_openstack.conf import glance
from vmar_openstack.conf import metrics
from vmar_openstack.conf import rbd
from vmar_openstack.conf import scheduler
from vmar_openstack.conf import vmar

CONF = cfg.CONF

GROUPS = (vmar, database, glance, rbd, agent, metrics, scheduler)


def register_opts(conf=CONF):
    """Register every group's options on ``conf``.

    Each ConfigOpts gets its own OptGroup objects: an OptGroup holds the
    per-option state (overrides included), so sharing one between two
    ConfigOpts would leak overrides from one into the other.
    """
    for module in GROUPS:
        group = module.GROUP
        conf.register_group(cfg.OptGroup(group.name, title=group.title,
                                         help=group.help))
        conf.register_opts(module.ALL_OPTS, group=group.name)
        if hasattr(module, 'register_extra'):
            module.register_extra(conf)


register_opts()
