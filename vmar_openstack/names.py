"""Every name vmar-openstack builds and later parses back, in one place.

A name format is a fact shared by several components (the library writes a
map file that a host's map source finds again; the export service names an
export that the Nova backend reads back from an overlay's backing URI), so
each one has a single builder and a single parser here. This module imports
nothing of the project.
"""

import collections
import re
import secrets
import urllib.parse

# Map versions fit in six digits: QEMU node names are at most 31 characters
# ('vm' + 22 characters of base64 + '.' + 6 digits).
MAX_MAP_VERSION = 999999

_UUID = r'[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}'
_VERSION = r'[0-9]{1,%d}' % len(str(MAX_MAP_VERSION))
_ID = re.compile(r'^%s$' % _UUID)
_MAP_FILE = re.compile(r'^(?P<id>%s)\.(?P<v>%s)\.vmap$' % (_UUID, _VERSION))
# the key of an export's holder: 128 random bits, in hex
_KEY = r'[0-9a-f]{32}'
_EXPORT = re.compile(r'^(?P<id>%s)\.(?P<v>%s)(?:\.(?P<key>%s))?$'
                     % (_UUID, _VERSION, _KEY))

ExportName = collections.namedtuple('ExportName', 'image_id version key')


def map_file(image_id, version):
    """File name of one map version of an image: ``<id>.<version>.vmap``."""
    return '%s.%d.vmap' % (image_id, version)


def parse_map_file(name):
    """``(image_id, version)`` of a map file name, or None."""
    m = _MAP_FILE.match(name)
    return (m.group('id'), int(m.group('v'))) if m else None


def digest_file(image_id):
    """File name of the digest list of a base: ``<id>.vdig``."""
    return '%s.vdig' % image_id


def is_uuid(name):
    """Whether ``name`` is an image id as vmar names files after it."""
    return _ID.match(name) is not None


def bootset_file(image_id):
    """File name of the boot working set of an image: ``<id>.vboot``."""
    return '%s.vboot' % image_id


# the flavor extra specs of vmar servers (validated by nova-api through
# vmar_openstack.nova_imagebackend.extra_specs)
SPEC_ENABLED = 'vmar:enabled'
SPEC_HOST_CACHE = 'vmar:host_cache'
# the values of SPEC_HOST_CACHE, and of an export's host_cache: 'base' once
# in the host page cache (shared by every reader), 'none' O_DIRECT
HOST_CACHE = ('base', 'none')
SPEC_GUEST_CACHE = 'vmar:guest_cache'

# notifications of compute hosts to vmar-agent (vmar_openstack.export.report)
HOST_EXPORTS_EVENT = 'vmar.host.exports'
HOST_BOOTSET_EVENT = 'vmar.host.bootset'


def new_key():
    """A holder's key: what only its overlay knows of its export's name."""
    return secrets.token_hex(16)


def export(image_id, version, key=None):
    """The NBD export name of one map version of an image.

    ``<id>.<version>.<key>`` for the one holder of ``key``; without a key,
    ``<id>.<version>``, the name of the export record, under which holders
    from before per-holder keys are still served.
    """
    name = '%s.%d' % (image_id, version)
    return name if key is None else '%s.%s' % (name, key)


def parse_export(name):
    """The :class:`ExportName` of an export name, or None."""
    m = _EXPORT.match(name)
    return ExportName(m.group('id'), int(m.group('v')),
                      m.group('key')) if m else None


def nbd_uri(export_name, socket):
    """The ``nbd+unix`` URI QEMU and libvirt open an export by."""
    return 'nbd+unix:///%s?socket=%s' % (export_name, socket)


def parse_nbd_uri(uri):
    """``(export_name, socket)`` of an ``nbd+unix`` URI, or None.

    None too for a URI that names its socket more than once. ``socket`` is
    None if the URI names none.
    """
    u = urllib.parse.urlsplit(uri)
    if u.scheme != 'nbd+unix':
        return None
    sockets = urllib.parse.parse_qs(u.query).get('socket', [None])
    if len(sockets) != 1:
        return None
    return u.path.lstrip('/'), sockets[0]
