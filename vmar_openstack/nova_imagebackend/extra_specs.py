"""Validators of the ``vmar:`` flavor extra specs (nova-api plugin).

Loaded by nova-api through the ``nova.api.extra_spec_validators`` entry
point. Once loaded, ``vmar:`` is a known namespace: a key not listed here is
refused with HTTP 400 (at microversion 2.86 and later).
"""

from nova.api.validation.extra_specs import base

from vmar_openstack import names

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
        value={'type': str, 'enum': ['base', 'none'],
               'description': 'The host cache policy of the base data.'},
    ),
    base.ExtraSpecValidator(
        name=names.SPEC_GUEST_CACHE,
        description=(
            'What the guests of this flavor cache: ``private`` keeps only '
            'their private data (files written since boot) in their page '
            'cache and drops base data, which the host caches once; the '
            'server gets a virtio balloon with free page reporting, so the '
            'memory goes back to the host. ``default`` (default) leaves '
            'the guest\'s page cache alone.'),
        value={'type': str, 'enum': ['private', 'default'],
               'description': 'The guest cache policy.'},
    ),
]


def register():
    return EXTRA_SPEC_VALIDATORS
