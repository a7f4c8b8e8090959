"""Validators of the ``vmar:`` flavor extra specs (nova-api plugin).

Loaded by nova-api through the ``nova.api.extra_spec_validators`` entry
point. Once loaded, ``vmar:`` is a known namespace: a key not listed here is
refused with HTTP 400 (at microversion 2.86 and later).
"""

from nova.api.validation.extra_specs import base
from oslo_utils import strutils

from vmar_openstack import names


def enabled(flavor):
    """Whether ``flavor`` boots its root disk from a VMAR view."""
    specs = getattr(flavor, 'extra_specs', None) or {}
    return strutils.bool_from_string(specs.get(names.SPEC_ENABLED, 'false'))


SWITCH_REFUSED = ('resizing from flavor %(old)s to %(new)s would %(what)s '
                  'the VMAR backend of the root disk, which has no '
                  'conversion: resize to a flavor with the same %(spec)s, or '
                  'snapshot the server and boot the snapshot with the new '
                  'flavor')


def switch_refusal(old_flavor, new_flavor):
    """Why a resize between the two flavors cannot be done, or None.

    The one move that cannot be done safely: the root disk would change
    backend (a qcow2 overlay on an NBD export, or Nova's image cache) and
    neither converts into the other. nova-api refuses it up front
    (:mod:`vmar_openstack.nova_api`), the compute host again.
    """
    old = enabled(old_flavor)
    if old == enabled(new_flavor):
        return None
    return SWITCH_REFUSED % {
        'old': old_flavor.name, 'new': new_flavor.name,
        'what': 'turn off' if old else 'turn on',
        'spec': names.SPEC_ENABLED}


EXTRA_SPEC_VALIDATORS = [
    base.ExtraSpecValidator(
        name=names.SPEC_ENABLED,
        description=(
            'Boot the root disk from a qcow2 overlay on the image\'s VMAR '
            'view, served by the compute host\'s vmar-export daemon, so '
            'that blocks shared between images are read and cached once.'),
        value={'type': bool, 'description': 'Whether to use VMAR.'},
    ),
    base.ExtraSpecValidator(
        name=names.SPEC_HOST_CACHE,
        description=(
            'How the export daemon caches the base images of this flavor\'s '
            'instances: ``base`` (default) caches them once in the host '
            'page cache, shared by every instance that reads the same '
            'block; ``none`` opens them O_DIRECT (a baseline, or tenants '
            'who must not share a cache).'),
        value={'type': str, 'enum': list(names.HOST_CACHE),
               'description': 'The host cache policy of the base data.'},
    ),
    base.ExtraSpecValidator(
        name=names.SPEC_GUEST_CACHE,
        description=(
            'What the guests of this flavor cache: ``private`` keeps only '
            'their private data (files written since boot) in their page '
            'cache and drops base data, which the host caches once; the '
            'server gets a virtio balloon with free page reporting, so the '
            'memory goes back to the host. ``auto`` lets the host switch '
            'between the two while the server runs: guest-private while '
            'host memory is under pressure. ``default`` (default) leaves '
            'the guest\'s page cache alone.'),
        value={'type': str, 'enum': list(names.GUEST_CACHE),
               'description': 'The guest cache policy.'},
    ),
]


def register():
    return EXTRA_SPEC_VALIDATORS
