"""Checks nova-api makes before it accepts a move of a vmar server.

Two moves cannot be done safely, and are refused before anything changes
(doc/source/admin/multinode.rst):

* a resize between a vmar flavor and an ordinary one: the root disk would
  change backend (a qcow2 overlay on an NBD export, or Nova's own image
  cache), and neither side converts one into the other;
* any move to another host (cold or live migration, resize, evacuation)
  of a server whose image is gone from Glance (deleted, or not active),
  unless a host that serves peers holds every block only that image had:
  the destination's export fetches the blocks it lacks, and those are
  nowhere else a host can fetch them. Stock Nova copies a deleted image
  from the source host; with peers (doc/source/admin/peers.rst) the destination
  reads them from the hosts that hold them, which nova-api learns from
  their last reports in the library's database (``[vmar_database]
  connection`` in nova-api's configuration, as the weigher's): a whole
  base, or a mirror whose fill is done (``complete``), reported within
  ``[vmar_agent] holder_max_age``. Without that database every such move
  is refused.

Servers booted from volume are not concerned: their root disk is the
volume. Everything else is accepted as Nova accepts it. The checks run
around ``nova.compute.api.API``'s methods, in nova-api only
(:mod:`vmar_openstack.nova_wrappers`, installed by :mod:`.wsgi`).
"""

import datetime

from nova.compute import utils as compute_utils
from nova import exception
from nova.image import glance
from nova import objects
from oslo_log import log as logging

from vmar_openstack import conf as vmar_conf
from vmar_openstack.db import hosts as db_hosts
from vmar_openstack.db import session as db_session
from vmar_openstack.nova_imagebackend import extra_specs

CONF = vmar_conf.CONF
LOG = logging.getLogger(__name__)

IMAGE_GONE = ('its image %(image)s is %(state)s in Glance: another host '
              'could not fetch the blocks only that image holds. Snapshot '
              'the server and boot the snapshot, which holds all of its '
              'data, on the host you want')


NO_HOLDER = ('its image %(image)s is %(state)s in Glance and no host that '
             'serves peers holds every block only that image had: the fill '
             'of a mirror of it has not finished ([vmar_host] fill_delay '
             'after a server of it booted, then at fill_rate), or the '
             'hosts holding it stopped reporting. Try again once a host '
             'reports it complete (vmar-manage hosts list), or snapshot '
             'the server and boot the snapshot, which holds all of its '
             'data, on the host you want')


class MoveRefused(exception.NotSupported):
    """A move of a vmar server that cannot be done safely (HTTP 400)."""
    msg_fmt = 'Server %(uuid)s cannot be moved: %(reason)s'


def _vmar_root(context, instance, flavor=None):
    """Whether the root disk of ``instance`` is a vmar overlay."""
    return (extra_specs.enabled(flavor or instance.flavor)
            and not compute_utils.is_volume_backed_instance(context,
                                                            instance))


def image_refusal(context, instance):
    """Why ``instance`` cannot move to another host, or None."""
    if not _vmar_root(context, instance):
        return None
    try:
        image = glance.API().get(context, instance.image_ref)
    except exception.ImageNotFound:
        state = 'deleted'
    else:
        if image.get('status') == 'active':
            return None
        state = image.get('status') or 'unknown'
    holders = _complete_holders(instance.image_ref)
    if holders:
        LOG.info('moving server %s of the %s image %s: %s serve the blocks '
                 'only it had', instance.uuid, state, instance.image_ref,
                 ', '.join(holders))
        return None
    fmt = IMAGE_GONE if holders is None else NO_HOLDER
    return fmt % {'image': instance.image_ref, 'state': state}


def _complete_holders(image_id):
    """Hosts that serve every block only ``image_id`` had, or None.

    None: not known (no library database configured, or it failed).
    """
    if not db_session.configured(CONF):
        return None
    try:
        return db_hosts.HostReports(CONF).complete_holders(
            image_id, max_age=datetime.timedelta(
                seconds=CONF.vmar_agent.holder_max_age))
    except Exception as e:
        LOG.warning('who holds the blocks of %s is not known: %s',
                    image_id, e)
        return None


def check_move(context, instance):
    """Refuse a move of ``instance`` to another host that cannot be done.

    :raises MoveRefused: its image is gone from Glance.
    """
    reason = image_refusal(context, instance)
    if reason:
        raise MoveRefused(uuid=instance.uuid, reason=reason)


def check_resize(context, instance, flavor_id):
    """Refuse a resize (``flavor_id``) or cold migration (None).

    :raises CannotResizeDisk: the new flavor switches the vmar backend
        (nova-api answers 400 with the reason).
    :raises MoveRefused: see :func:`check_move`.
    """
    if flavor_id is not None:
        new = objects.Flavor.get_by_flavor_id(context, flavor_id,
                                              read_deleted='no')
        reason = extra_specs.switch_refusal(instance.flavor, new)
        if reason and not compute_utils.is_volume_backed_instance(
                context, instance):
            raise exception.CannotResizeDisk(reason=reason)
    check_move(context, instance)
