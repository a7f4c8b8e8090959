"""What the export daemon holds, and the QMP commands that change it.

For every export the daemon has:

* one node per base image, named ``vb<id>`` (buffered, the
  host-cache-for-base policy) or ``vd<id>`` (O_DIRECT, for images exported
  with ``host_cache=none``), where ``<id>`` is the image UUID in 22
  characters of base64url: a read-only ``file`` node of a whole base, or a
  ``vmar-mirror`` node over a base mirror (buffered only); base nodes are
  shared by every VMAR node that reads from them;
* for a mirror: its ``fetch`` child, a ``quorum`` node ``vq<id>`` that
  reads its children in turn until one answers (``read-pattern=fifo``):
  first ``vp<id>``, the host's peer fetcher, when the host reads from
  peers (:mod:`vmar_openstack.host.peers.source`), then ``vf<id>``, the
  source's reader of the base's own data, then one
  ``va<id>.<hash>`` per alternate map, a ``vmar`` node reading the base's
  blocks from the reader ``vf<other id>`` of an image that holds them
  (:mod:`vmar_openstack.mapformat.alternate`). ``vf`` nodes are shared;
  alternates found later join the quorum with ``x-blockdev-change``;
* one ``vmar`` node per map version, ``vm<id>.<version>``, reading its map
  and, through the base node prefix, its base nodes;
* one NBD export per holder, whose name carries the holder's key
  (:func:`vmar_openstack.names.export`) and whose QMP id is that name
  behind ``vmar-`` (QMP ids must start with a letter). The patched daemon
  lists no export (patch ``nbd/server: List no export`` of ``qemu/patches``).

Every function takes an open :class:`~vmar_openstack.host.exports.qmp.Monitor`.
"""

import base64
import contextlib
import hashlib
import os
import time
import uuid

from oslo_log import log as logging

from vmar_openstack import exception
from vmar_openstack.mapsource import readers

LOG = logging.getLogger(__name__)

_BUFFERED, _DIRECT, _VMAR = 'vb', 'vd', 'vm'
_FETCH, _ALT, _QUORUM, _PEER = 'vf', 'va', 'vq', 'vp'
_EXPORT_ID_PREFIX = 'vmar-'
# a prefetch's read-only export of one mirror node (QMP id and NBD name)
_PREFETCH_PREFIX = 'vmar-pf-'


# -- names ----------------------------------------------------------------

def b64id(image_id):
    return base64.urlsafe_b64encode(
        uuid.UUID(image_id).bytes).decode().rstrip('=')


def image_of(node):
    """The image id of a node named by :func:`base_node` and its kin."""
    b64 = node[2:24]
    return str(uuid.UUID(bytes=base64.urlsafe_b64decode(b64 + '==')))


def base_prefix(host_cache):
    return _BUFFERED if host_cache == 'base' else _DIRECT


def base_node(image_id, host_cache):
    return base_prefix(host_cache) + b64id(image_id)


def vmar_node(image_id, version):
    # node names are at most 31 characters: 'vm' + 22 + '.' + 6 digits
    # (names.MAX_MAP_VERSION)
    return '%s%s.%d' % (_VMAR, b64id(image_id), version)


def fetch_node(image_id):
    return _FETCH + b64id(image_id)


def peer_node(image_id):
    return _PEER + b64id(image_id)


def quorum_node(image_id):
    return _QUORUM + b64id(image_id)


def alt_node(base_id, image_id, version):
    # 'va' + 22 + '.' + 6 = 31 characters
    tag = hashlib.sha256(('%s.%d' % (image_id, version)).encode())
    return '%s%s.%s' % (_ALT, b64id(base_id), tag.hexdigest()[:6])


def export_id(name):
    """QMP ids must start with a letter; the NBD name is the bare name."""
    return _EXPORT_ID_PREFIX + name


def _export_name(qmp_id):
    return qmp_id[len(_EXPORT_ID_PREFIX):]


# -- queries --------------------------------------------------------------

VMAR_DRIVERS = ('vmar', 'vmar-mirror')


def missing_drivers(mon):
    """The vmar block drivers the daemon lacks (empty: it has them all).

    The daemon's QAPI schema says which block drivers ``blockdev-add``
    takes: the enum that lists ``raw`` and ``qcow2`` is BlockdevDriver.
    """
    for t in mon.execute('query-qmp-schema'):
        if t.get('meta-type') != 'enum':
            continue
        values = {m['name'] for m in t.get('members', [])}
        values.update(t.get('values', []))
        if {'raw', 'qcow2'} <= values:
            return [d for d in VMAR_DRIVERS if d not in values]
    return list(VMAR_DRIVERS)


def nodes(mon):
    """Names of every block node in the daemon."""
    return {n['node-name'] for n in mon.execute('query-named-block-nodes',
                                                {'flat': True})}


def export_ids(mon):
    """QMP ids of every export of a holder in the daemon."""
    return {e['id'] for e in mon.execute('query-block-exports')
            if not e['id'].startswith(_PREFETCH_PREFIX)}


def exported(mon):
    """Names of the NBD exports the daemon serves."""
    return {_export_name(i) for i in export_ids(mon)}


def read_counters(mon):
    """vmar node name -> its read counters.

    The driver's ImageInfoSpecificVmar, keys with underscores; they start
    at zero when the daemon (re)opens the node.
    """
    out = {}
    for n in mon.execute('query-named-block-nodes', {'flat': True}):
        spec = (n.get('image') or {}).get('format-specific') or {}
        if n.get('drv') == 'vmar' and spec.get('type') == 'vmar':
            out[n['node-name']] = {k.replace('-', '_'): v
                                   for k, v in spec['data'].items()}
    return out


def mirror_fetched(mon):
    """Image id -> bytes its ``vmar-mirror`` node fetched since it opened."""
    out = {}
    for n in mon.execute('query-named-block-nodes', {'flat': True}):
        spec = (n.get('image') or {}).get('format-specific') or {}
        if n.get('drv') == 'vmar-mirror' and spec.get('type') == 'vmar-mirror':
            out[image_of(n['node-name'])] = spec['data']['bytes-fetched']
    return out


def recorded(mon):
    """vmar node name -> the bitmap of blocks it recorded (bytes).

    Only nodes whose ``record-window`` has closed.
    """
    out = {}
    for n in mon.execute('query-named-block-nodes', {'flat': True}):
        spec = (n.get('image') or {}).get('format-specific') or {}
        data = spec.get('data') or {}
        if (n.get('drv') == 'vmar' and 'touched' in data
                and not data.get('recording')):
            out[n['node-name']] = base64.b64decode(data['touched'])
    return out


# -- options: the one place descriptions become blockdev-add options ------

def reader_options(reader):
    """The options of a mirror's fetch node (a :mod:`.readers` object)."""
    if isinstance(reader, readers.File):
        return {'driver': 'file', 'filename': reader.path, 'read-only': True}
    if isinstance(reader, readers.RangeExport):
        return {'driver': 'nbd', 'read-only': True, 'export': reader.export,
                'server': {'type': 'unix', 'path': reader.socket}}
    if isinstance(reader, readers.Qcow2):
        return {'driver': 'qcow2', 'read-only': True, 'backing': None,
                'file': reader_options(reader.file)}
    raise exception.ExportError('no node reads a %r' % (reader,))


def whole_base_options(path, direct, aio):
    """A read-only ``file`` node of a whole base."""
    return {'driver': 'file', 'filename': path, 'read-only': True,
            'cache': {'direct': direct}, 'aio': aio}


def mirror_options(image_id, mirror, readahead, aio, children):
    """A ``vmar-mirror`` node over a base mirror (buffered).

    Its fetch quorum reads ``children`` (node names) in turn.
    """
    return {'driver': 'vmar-mirror', 'read-only': False,
            'digests': mirror.digests, 'present': mirror.present,
            'readahead': readahead,
            'file': {'driver': 'file', 'filename': mirror.data, 'aio': aio},
            'fetch': {'driver': 'quorum', 'read-only': True,
                      'node-name': quorum_node(image_id),
                      'vote-threshold': 1, 'read-pattern': 'fifo',
                      'children': children}}


def alternate_options(path, reader_node):
    """A ``vmar`` node reading a base's blocks through an alternate map."""
    return {'driver': 'vmar', 'read-only': True,
            'file': {'driver': 'file', 'read-only': True, 'filename': path},
            'targets': [reader_node]}


# -- changes --------------------------------------------------------------

def add_nodes(mon, exp, have, map_file, base_spec, gather_gap,
              fetch_nodes=lambda image_id, host_cache: (),
              record_window=lambda exp: 0):
    """Add the base and vmar nodes of ``exp`` missing from ``have``.

    ``have`` (a set of node names) is updated. ``map_file`` gives the path
    of a map file; ``base_spec(image_id, host_cache)`` the ``blockdev-add``
    options of a base node but its name: a ``file`` node, or a
    ``vmar-mirror`` node for a base the host mirrors;
    ``fetch_nodes(image_id, host_cache)`` the ``(name, options, child)``
    of the nodes a mirror's fetch quorum needs first, ``child`` for its
    own children (added to a live quorum when new);
    ``record_window(exp)`` the seconds its new vmar node records the
    blocks it reads (0: none).

    A fetch node that cannot be opened now (its image's source is away:
    a qcow2 reader reads its header at open) is left out of the quorum,
    unless it is the base's own reader: an alternate or the peer fetcher
    is a fallback, never a reason for a mirror not to be served.
    """
    for tid, _size in exp.targets:
        name = base_node(tid, exp.host_cache)
        for node, spec, child in fetch_nodes(tid, exp.host_cache):
            if node in have:
                continue
            try:
                mon.execute('blockdev-add', dict(spec, **{'node-name': node}))
            except exception.ExportError as e:
                if node == fetch_node(tid):
                    raise
                LOG.warning('base %s: fetch node %s left out: %s', tid,
                            node, e)
                continue
            have.add(node)
            if child and name in have:
                mon.execute('x-blockdev-change', {
                    'parent': quorum_node(tid), 'node': node})
        if name in have:
            continue
        spec = base_spec(tid, exp.host_cache)
        fetch = spec.get('fetch')
        if isinstance(fetch, dict) and fetch.get('driver') == 'quorum':
            fetch['children'] = [c for c in fetch['children'] if c in have]
        mon.execute('blockdev-add', dict(spec, **{'node-name': name}))
        have.add(name)
    name = vmar_node(exp.image_id, exp.map_version)
    if name not in have:
        spec = {
            'driver': 'vmar', 'node-name': name, 'read-only': True,
            'file': {'driver': 'file', 'read-only': True,
                     'filename': map_file(exp.image_id, exp.map_version)},
            'base-node-prefix': base_prefix(exp.host_cache),
            'gather-gap': gather_gap}
        window = record_window(exp)
        if window:
            spec['record-window'] = window
        mon.execute('blockdev-add', spec)
        have.add(name)


def add_export(mon, exp):
    """Serve every NBD name of ``exp`` (one per holder) not served yet."""
    live = export_ids(mon)
    for name in exp.nbd_names():
        if export_id(name) not in live:
            mon.execute('block-export-add', {
                'type': 'nbd', 'id': export_id(name),
                'node-name': vmar_node(exp.image_id, exp.map_version),
                'name': name, 'writable': False})


def del_names(mon, names, timeout=30):
    """Stop serving the NBD exports ``names``.

    Returns once their clients are gone.
    """
    live = export_ids(mon)
    for name in names:
        if export_id(name) in live:
            mon.execute('block-export-del', {'id': export_id(name)})
    for name in names:
        _wait_export_gone(mon, name, timeout)


def _wait_export_gone(mon, name, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if export_id(name) not in export_ids(mon):
            return
        time.sleep(0.05)
    raise exception.ExportError('export %s still has clients after %ds'
                                % (name, timeout))


def add_prefetch_export(mon, node, key):
    """Serve ``node`` read-only to a prefetch; its NBD name."""
    name = _PREFETCH_PREFIX + key
    mon.execute('block-export-add', {'type': 'nbd', 'id': name,
                                     'node-name': node, 'name': name,
                                     'writable': False})
    return name


def del_prefetch_exports(mon, names=None, nodes=None, timeout=30):
    """Stop prefetch exports: ``names``, those of ``nodes``, or all.

    Their clients are cut off (the prefetch fails; nothing waits on it).
    """
    gone, every = [], names is None and nodes is None
    for e in mon.execute('query-block-exports'):
        if e['id'].startswith(_PREFETCH_PREFIX) and (
                every or e['id'] in (names or ())
                or e['node-name'] in (nodes or ())):
            mon.execute('block-export-del', {'id': e['id'], 'mode': 'hard'})
            gone.append(e['id'])
    deadline = time.monotonic() + timeout
    while set(gone) & {e['id'] for e in mon.execute('query-block-exports')}:
        if time.monotonic() > deadline:
            raise exception.ExportError('prefetch exports %s still there '
                                        'after %ds' % (gone, timeout))
        time.sleep(0.05)


def del_unused_nodes(mon, exports,
                     fetch_nodes=lambda image_id, host_cache: ()):
    """Delete the nodes no export in ``exports`` reads from."""
    wanted = set()
    for exp in exports:
        wanted.add(vmar_node(exp.image_id, exp.map_version))
        for tid, _size in exp.targets:
            wanted.add(base_node(tid, exp.host_cache))
            wanted.update(n for n, _s, _c in fetch_nodes(tid,
                                                         exp.host_cache))
    doomed = {n for n in nodes(mon) if n[:2] in (_BUFFERED, _DIRECT)
              and n not in wanted}
    if doomed:
        del_prefetch_exports(mon, nodes=doomed)
    # parents first: vmar nodes hold base nodes, mirrors (through their
    # quorum) alternates and readers, alternates readers
    for kinds in ((_VMAR,), (_BUFFERED, _DIRECT), (_ALT,), (_FETCH, _PEER)):
        for name in sorted(nodes(mon)):
            if name[:2] in kinds and name not in wanted:
                mon.execute('blockdev-del', {'node-name': name})


def nbd_running(mon, socket):
    """Whether the daemon already serves NBD (an adopted daemon).

    Probes with a server on ``socket + '.probe'``, stopped again at once.
    """
    probe = socket + '.probe'
    try:
        mon.execute('nbd-server-start', {
            'addr': {'type': 'unix', 'data': {'path': probe}}})
    except exception.ExportError as e:
        if 'already running' in str(e):
            return True
        raise
    mon.execute('nbd-server-stop')
    with contextlib.suppress(FileNotFoundError):
        os.unlink(probe)
    return False


def start_nbd(mon, path):
    """Serve NBD on the unix socket ``path``."""
    mon.execute('nbd-server-start', {
        'addr': {'type': 'unix', 'data': {'path': path}}})
