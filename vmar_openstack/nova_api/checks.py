"""Checks nova-api makes before it accepts an operation on a vmar server.

Only one move cannot be done safely: a resize between a vmar flavor and an
ordinary one. The root disk would change backend (a qcow2 overlay on an
NBD export, or Nova's own image cache), and neither side converts one into
the other. Everything else (resize between vmar flavors, cold and live
migration, evacuation, shelve and unshelve) is accepted as Nova accepts it.
"""

import functools

from nova.compute import api as compute_api
from nova import exception
from nova import objects

from vmar_openstack.nova_imagebackend import extra_specs

_ORIGINALS = {}


def register():
    """Wrap ``API.resize`` (idempotent)."""
    API = compute_api.API
    if (API, 'resize') in _ORIGINALS:
        return
    original = API.resize
    _ORIGINALS[(API, 'resize')] = original

    @functools.wraps(original)
    def resize(self, context, instance, flavor_id=None, *args, **kwargs):
        if flavor_id is not None:
            new = objects.Flavor.get_by_flavor_id(context, flavor_id,
                                                  read_deleted='no')
            reason = extra_specs.switch_refusal(instance.flavor, new)
            if reason:
                # nova-api answers 400 with the reason
                raise exception.CannotResizeDisk(reason=reason)
        return original(self, context, instance, flavor_id, *args, **kwargs)
    API.resize = resize


def unregister():
    """Undo :func:`register` (for tests)."""
    for (cls, name), original in _ORIGINALS.items():
        setattr(cls, name, original)
    _ORIGINALS.clear()
