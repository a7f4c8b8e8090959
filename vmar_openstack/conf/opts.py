"""The option lists of ``oslo-config-generator`` (``oslo.config.opts``).

``list_opts``: every option (``etc/vmar/vmar.conf.sample``).
``list_compute_opts``: what ``vmar-nova-compute`` reads from nova.conf
(``etc/vmar/nova.conf.vmar.sample``). ``list_agent_opts``: what
``vmar-agent`` reads besides oslo.messaging's and oslo.log's options
(``etc/vmar/vmar-agent.conf.sample``). ``list_scheduler_opts``: what the
``vmar`` weigher reads from nova-scheduler's nova.conf
(``etc/vmar/nova-scheduler.conf.vmar.sample``).
"""

from vmar_openstack.conf import agent
from vmar_openstack.conf import database
from vmar_openstack.conf import glance
from vmar_openstack.conf import metrics
from vmar_openstack.conf import rbd
from vmar_openstack.conf import scheduler
from vmar_openstack.conf import vmar

# [vmar] options a compute host reads besides host_opts
_HOST_EXTRA = ('state_dir', 'work_dir', 'qemu_img')


def _glance():
    return glance.ALL_OPTS + glance.keystoneauth_opts()


def list_opts():
    return [(vmar.GROUP, vmar.ALL_OPTS),
            (database.GROUP, database.ALL_OPTS),
            (glance.GROUP, _glance()),
            (rbd.GROUP, rbd.ALL_OPTS),
            (agent.GROUP, agent.ALL_OPTS),
            (metrics.GROUP, metrics.ALL_OPTS),
            (scheduler.GROUP, scheduler.ALL_OPTS)]


def list_compute_opts():
    host = [o for o in vmar.library_opts if o.name in _HOST_EXTRA]
    return [(vmar.GROUP, host + vmar.host_opts),
            (glance.GROUP, _glance()),
            (rbd.GROUP, rbd.ALL_OPTS)]


def list_agent_opts():
    topic = [o for o in vmar.host_opts if o.name == 'report_topic']
    return [(vmar.GROUP, vmar.library_opts + topic),
            (database.GROUP, database.ALL_OPTS),
            (glance.GROUP, _glance()),
            (agent.GROUP, agent.ALL_OPTS),
            (metrics.GROUP, [o for o in metrics.ALL_OPTS
                             if o.name != 'export_port'])]


def list_scheduler_opts():
    # [vmar] state_dir: the default database URL is under it
    state = [o for o in vmar.library_opts if o.name == 'state_dir']
    return [(vmar.GROUP, state),
            (database.GROUP, database.ALL_OPTS),
            (scheduler.GROUP, scheduler.ALL_OPTS)]
