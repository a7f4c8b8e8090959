"""Checks nova-api makes before it accepts a move of a vmar server.

Two moves cannot be done safely, and are refused before anything changes
(doc/source/multinode.rst):

* a resize between a vmar flavor and an ordinary one: the root disk would
  change backend (a qcow2 overlay on an NBD export, or Nova's own image
  cache), and neither side converts one into the other;
* any move to another host (cold or live migration, resize, evacuation)
  of a server whose image is gone from Glance (deleted, or not active):
  the destination's export fetches the blocks it lacks from the image in
  Glance, and the blocks only that image held are nowhere else a host can
  fetch them. Stock Nova copies a deleted image from the source host; a
  vmar host has no such route, and the guest would pause on its first
  read of such a block.

Servers booted from volume are not concerned: their root disk is the
volume. Everything else is accepted as Nova accepts it. The checks run
around ``nova.compute.api.API``'s methods, in nova-api only
(:mod:`vmar_openstack.nova_wrappers`, installed by :mod:`.wsgi`).
"""

from nova.compute import utils as compute_utils
from nova import exception
from nova.image import glance
from nova import objects

from vmar_openstack.nova_imagebackend import extra_specs

IMAGE_GONE = ('its image %(image)s is %(state)s in Glance: another host '
              'could not fetch the blocks only that image holds. Snapshot '
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
    return IMAGE_GONE % {'image': instance.image_ref, 'state': state}


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
