"""The option lists of ``oslo-config-generator`` (``oslo.config.opts``).

One list per audience, each of whole groups:

``list_opts``
    the library's file, /etc/vmar/vmar.conf (``vmar-manage``):
    ``etc/vmar/vmar.conf.sample``.
``list_host_opts``
    a compute host's export daemon, /etc/vmar/vmar-export.conf
    (``vmar-export``): ``etc/vmar/vmar-export.conf.sample``.
``list_compute_opts``
    what ``vmar-nova-compute`` reads from nova.conf:
    ``etc/vmar/nova.conf.vmar.sample``.
``list_agent_opts``
    ``vmar-agent`` (besides oslo.messaging's and oslo.log's options):
    ``etc/vmar/vmar-agent.conf.sample``.
``list_scheduler_opts``
    the ``vmar`` weigher in nova-scheduler's nova.conf:
    ``etc/vmar/nova-scheduler.conf.vmar.sample``.
``list_control_plane_opts``
    every group of the control plane's programs once (the library,
    ``vmar-agent``, the weigher): the configuration reference's page of
    that audience (``doc/source/configuration/library.rst``).

The Glance import plugin's list is
:func:`vmar_openstack.glance_hooks.opts.list_import_opts`.
"""

from vmar_openstack.conf import agent
from vmar_openstack.conf import compute
from vmar_openstack.conf import database
from vmar_openstack.conf import glance
from vmar_openstack.conf import guest_cache
from vmar_openstack.conf import host
from vmar_openstack.conf import metrics
from vmar_openstack.conf import peers
from vmar_openstack.conf import rbd
from vmar_openstack.conf import reports
from vmar_openstack.conf import scheduler
from vmar_openstack.conf import vmar


def _listed(*modules):
    return [(m.GROUP, m.ALL_OPTS + (m.sample_extra()
                                    if hasattr(m, 'sample_extra') else []))
            for m in modules]


def list_opts():
    return _listed(vmar, database)


def list_host_opts():
    return _listed(host, guest_cache, peers, reports, glance, rbd, metrics)


def list_compute_opts():
    return _listed(compute)


def list_agent_opts():
    return _listed(vmar, database, agent, reports, glance, metrics)


def list_scheduler_opts():
    return _listed(database, scheduler)


def list_control_plane_opts():
    return _listed(vmar, database, agent, scheduler, reports, glance,
                   metrics)
