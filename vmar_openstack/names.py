"""The contract between the library side and the host side.

Every name vmar-openstack builds and later parses back, and the layout of
what the library publishes in Glance, in one place. A name format is a
fact shared by several components (the library writes a map file that a
host's map source finds again; vmar-agent publishes a hidden Glance image
that a host finds by its id; the export service names an export that the
Nova backend reads back from an overlay's backing URI), so each one has a
single builder and a single parser here:

* files: maps ``<id>.<version>.vmap``, digest lists ``<id>.vdig``, boot
  working sets ``<id>.vboot``;
* NBD: export names ``<id>.<version>[.<key>]``, ``nbd+unix`` URIs, and the
  export names of a host's range server (:func:`glance_fetch_export`,
  :func:`rbd_fetch_export`);
* Glance: the hidden images vmar-agent publishes (map, digest list, boot
  working set: ids, names, properties) and whose of them a host trusts
  (:func:`published_by`);
* Nova: the flavor extra specs; notifications of hosts to vmar-agent;
* guests: the channel sockets of guest-private and auto servers and the
  virtio-serial port the guest component opens;
* peers: a peer server's address, the file of a base's holders.

``glance_hooks`` (the library side) and ``mapsource`` (the host side)
both import it; neither imports the other. This module imports nothing of
the project.
"""

import collections
import re
import secrets
import urllib.parse
import uuid

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


def layout_file(image_id):
    """File name of the block layout of an image: ``<id>.vlayout``."""
    return '%s.vlayout' % image_id


# the flavor extra specs of vmar servers (validated by nova-api through
# vmar_openstack.nova_imagebackend.extra_specs)
SPEC_ENABLED = 'vmar:enabled'
SPEC_HOST_CACHE = 'vmar:host_cache'
# the values of SPEC_HOST_CACHE, and of an export's host_cache: 'base' once
# in the host page cache (shared by every reader), 'none' O_DIRECT
HOST_CACHE = ('base', 'none')
SPEC_GUEST_CACHE = 'vmar:guest_cache'
# the values of SPEC_GUEST_CACHE: 'default' the guest caches as it does,
# 'private' it drops base data, 'auto' the host switches between the two
# from its memory pressure
GUEST_CACHE = ('default', 'private', 'auto')

# notifications of compute hosts to vmar-agent
# (vmar_openstack.host.observe.report)
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


# -- what vmar-agent publishes in Glance, and hosts find -----------------

MAP_NAMESPACE = uuid.UUID('6f1c7a52-3f0e-5b8a-9a57-0c4d8e2b1d90')
DIGESTS_NAMESPACE = uuid.UUID('0b6a3c8e-41d2-5f97-8e1a-6c2f9d4b7a35')
BOOTSET_NAMESPACE = uuid.UUID('5d2e8f14-7a3b-5c69-b0d4-19e7c3a6f852')
LAYOUT_NAMESPACE = uuid.UUID('8c41f0d2-93b5-5e7a-a6c8-2d1f7e9b4035')
# properties of the hidden images (os_hidden): whose they are, which
# version, and the SHA-256 of their data
PROP_OF = 'vmar_map_of'
# of a snapshot built from its delta by the import plugin: its parent,
# and "<algorithm>:<hex>" of the file it handed Glance, which Glance's
# os_hash_value must match
PROP_PARENT = 'vmar_parent'
PROP_STORED_HASH = 'vmar_stored_hash'
PROP_VERSION = 'vmar_map_version'
PROP_SHA256 = 'vmar_map_sha256'
PROP_DIGESTS_SHA256 = 'vmar_digests_sha256'
PROP_BOOTSET_SHA256 = 'vmar_bootset_sha256'
PROP_LAYOUT_SHA256 = 'vmar_layout_sha256'


def map_image_id(image_id, version):
    """The id of the hidden image of one map version."""
    return str(uuid.uuid5(MAP_NAMESPACE, '%s.%d' % (image_id, version)))


def map_image_name(image_id, version):
    return 'vmar-map-%s-v%d' % (image_id, version)


def digests_image_id(image_id):
    """The id of the hidden image of a base's digest list."""
    return str(uuid.uuid5(DIGESTS_NAMESPACE, image_id))


def digests_image_name(image_id):
    return 'vmar-digests-%s' % image_id


def bootset_image_id(image_id, source='introspected'):
    """The hidden image of an image's boot working set from ``source``.

    A recorded set has an id of its own: Glance never reuses the id of a
    deleted image, so an introspected set cannot be replaced in place.
    """
    if source == 'introspected':
        return str(uuid.uuid5(BOOTSET_NAMESPACE, image_id))
    return str(uuid.uuid5(BOOTSET_NAMESPACE, '%s.%s' % (image_id, source)))


def bootset_image_name(image_id, source='introspected'):
    return 'vmar-bootset-%s%s' % ('' if source == 'introspected'
                                  else source + '-', image_id)


def layout_image_id(image_id):
    """The id of the hidden image of an image's block layout."""
    return str(uuid.uuid5(LAYOUT_NAMESPACE, image_id))


def layout_image_name(image_id):
    return 'vmar-layout-%s' % image_id


def published_by(image, owner):
    """Whether a host trusts a hidden image.

    ``owner`` (``[vmar_glance] map_owner``) published it, or no owner is
    set.
    """
    return owner is None or image.get('owner') == owner


# -- the export names of a host's range server (nbdkit) ------------------

RANGE_SERVER_SOCKET = 'glance-fetch.sock'     # in [vmar_host] host_dir
# the peer fetcher's (:func:`peer_fetch_export`), beside it
PEER_FETCH_SOCKET = 'peer-fetch.sock'
_RBD_EXPORT_PREFIX = 'rbd/'


def glance_fetch_export(image_id, size):
    """The export reading the stored bytes of a Glance image of ``size``.

    The size travels in the name so that the server opens an export
    without asking Glance: a restarted daemon re-adds the nodes of its
    mirrors while Glance is away, and serves the blocks they hold.
    """
    return '%s/%d' % (image_id, size)


def parse_glance_fetch_export(name):
    """(image id, size) of a :func:`glance_fetch_export` name; ValueError."""
    image_id, _slash, size = name.partition('/')
    if not size.isdigit():
        raise ValueError('export %r is not <image id>/<size>' % name)
    return str(uuid.UUID(image_id)), int(size)


def rbd_fetch_export(pool, image, snapshot, size):
    """The export reading an RBD snapshot of ``size`` bytes.

    Like :func:`glance_fetch_export`, the name carries everything the
    server needs to open it without asking anyone.
    """
    return _RBD_EXPORT_PREFIX + '/'.join(
        [urllib.parse.quote(p, safe='') for p in (pool, image, snapshot)]
        + [str(size)])


def is_rbd_fetch_export(name):
    return name.startswith(_RBD_EXPORT_PREFIX)


def parse_rbd_fetch_export(name):
    """(pool, image, snapshot, size) of a :func:`rbd_fetch_export` name.

    :raises ValueError: not such a name.
    """
    parts = (name[len(_RBD_EXPORT_PREFIX):].split('/')
             if is_rbd_fetch_export(name) else [])
    if len(parts) != 4 or not all(parts) or not parts[3].isdigit():
        raise ValueError('export %r is not rbd/<pool>/<image>/<snapshot>/'
                         '<size>' % name)
    pool, image, snap = (urllib.parse.unquote(p) for p in parts[:3])
    return pool, image, snap, int(parts[3])


# -- the channels to the guest component (guest-private caching) ---------

# The virtio-serial port vmar-guest opens in the guest
# (/dev/virtio-ports/<name>; guest/vmar-guest.c: opt.channel)
GUEST_CHANNEL_PORT = 'org.opendev.vmar.guest.0'
# Guest cache modes a server's channel is made for: vmar-guest drops base
# data all the time, or when the host says so
GUEST_CHANNEL_MODES = GUEST_CACHE[1:]
_GUEST_CHANNEL = re.compile(r'^(?P<id>%s)\.(?P<mode>%s)\.sock$' % (
    _UUID, '|'.join(GUEST_CHANNEL_MODES)))

GuestChannel = collections.namedtuple('GuestChannel', 'instance mode')


def guest_channel(instance_uuid, mode):
    """File name of a server's channel socket, in the channel directory.

    The flavor's mode is in the name, so that a restarted daemon knows
    which servers it decides for without asking anyone.
    """
    if mode not in GUEST_CHANNEL_MODES or not is_uuid(instance_uuid):
        raise ValueError('no guest channel for %r in mode %r'
                         % (instance_uuid, mode))
    return '%s.%s.sock' % (instance_uuid, mode)


def parse_guest_channel(name):
    """:class:`GuestChannel` of a :func:`guest_channel` name, or None."""
    m = _GUEST_CHANNEL.match(name)
    return GuestChannel(m.group('id'), m.group('mode')) if m else None


# -- peers (doc/source/admin/peers.rst) ------------------------------------

def peer_address(host, port):
    """``host:port`` of a peer server, ``[v6 address]:port`` for IPv6."""
    host = str(host)
    return '%s:%d' % ('[%s]' % host if ':' in host else host, int(port))


def parse_peer_address(text):
    """``(host, port)`` of a :func:`peer_address`.

    :raises ValueError: not ``host:port``.
    """
    if not isinstance(text, str):
        raise ValueError('peer address %r is not a string' % (text,))
    host, _colon, port = text.rpartition(':')
    host = host.strip('[]')
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError('peer address %r is not host:port' % text)
    return host, int(port)


_PEER_FETCH_PREFIX = 'peer/'


def peer_fetch_export(image_id, size):
    """The export of the host's peer fetcher reading ``image_id`` from peers.

    Raw image content of ``size`` bytes (the map's target size), the
    bytes peers' mirrors and bases hold, whatever format the store keeps
    the image in. Like :func:`glance_fetch_export`, the name carries what
    the fetcher needs to open it without asking anyone.
    """
    return '%s%s/%d' % (_PEER_FETCH_PREFIX, image_id, size)


def peer_digests_export(image_id):
    """The peer server's export of a host's digest list of ``image_id``.

    What a host that mirrors the base kept from the library (mirror-
    format.rst), served to other hosts, which check it against the SHA-256
    vmar-agent published before they use it.
    """
    return '%s.digests' % image_id


def parse_peer_fetch_export(name):
    """(image id, size) of a :func:`peer_fetch_export` name; ValueError."""
    rest = name[len(_PEER_FETCH_PREFIX):] if name.startswith(
        _PEER_FETCH_PREFIX) else ''
    image_id, _slash, size = rest.partition('/')
    if not size.isdigit():
        raise ValueError('export %r is not peer/<image id>/<size>' % name)
    return str(uuid.UUID(image_id)), int(size)


def holders_file(base_id):
    """Name of the file of a base's holders, in a host's ``peers/``."""
    return '%s.json' % base_id
