"""Every name vmar-openstack builds and later parses back, in one place.

A name format is a fact shared by several components (the library writes a
map file that a host's map source finds again; the export service names an
export that the Nova backend reads back from an overlay's backing URI), so
each one has a single builder and a single parser here. This module imports
nothing of the project.
"""

import re
import urllib.parse

# Map versions fit in six digits: QEMU node names are at most 31 characters
# ('vm' + 22 characters of base64 + '.' + 6 digits).
MAX_MAP_VERSION = 999999

_UUID = r'[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}'
_VERSION = r'[0-9]{1,%d}' % len(str(MAX_MAP_VERSION))
_MAP_FILE = re.compile(r'^(?P<id>%s)\.(?P<v>%s)\.vmap$' % (_UUID, _VERSION))
_EXPORT = re.compile(r'^(?P<id>%s)\.(?P<v>%s)$' % (_UUID, _VERSION))


def map_file(image_id, version):
    """File name of one map version of an image: ``<id>.<version>.vmap``."""
    return '%s.%d.vmap' % (image_id, version)


def parse_map_file(name):
    """``(image_id, version)`` of a map file name, or None."""
    m = _MAP_FILE.match(name)
    return (m.group('id'), int(m.group('v'))) if m else None


def export(image_id, version):
    """The NBD export name of one map version of an image."""
    return '%s.%d' % (image_id, version)


def parse_export(name):
    """``(image_id, version)`` of an export name, or None."""
    m = _EXPORT.match(name)
    return (m.group('id'), int(m.group('v'))) if m else None


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
