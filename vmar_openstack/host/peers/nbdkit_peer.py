"""nbdkit python plugin: the blocks a host holds, for other hosts.

Run by ``vmar-export serve`` (:meth:`.supervisor.Supervisor.start_peers`)
with ``[vmar_peers] listen_address`` set, behind nbdkit's TLS (client
certificates of the cloud's host CA), ``limit`` and ``rate`` filters. An
export is named by an image id and reads the host's whole base of it
(``bases/<id>``) or else its mirror (``mirrors/<id>``), read-only.

A peer answers only with what it holds and never fetches on another's
behalf: a mirror's missing blocks are holes, and block status (NBD
``base:allocation``) says so, so a host asks for the runs a peer holds and
fetches the rest from the store. Whatever a peer sends is checked against
the library's digest list by the host that reads it, as any fetched block.

It also serves the digest lists of the bases the host mirrors, under the
export names ``digests-export`` makes of an image id (``<id>.digests``):
a host that mirrors a base too reads the list from a peer, and checks it
against the SHA-256 vmar-agent published, instead of from the store.

Keys: ``host-dir=DIR`` (``[vmar_host] host_dir``); ``digests=FORMAT``
and ``digests-export=FORMAT``, ``{}`` standing for the image id: the
path of a digest list on the host and its export's name
(:func:`vmar_openstack.names.peer_digests_export`).

Standard library only: nbdkit runs the system's Python.
"""

import errno
import os
import uuid

import nbdkit

API_VERSION = 2

_keys = {}


def config(key, value):
    if key not in ('host-dir', 'digests', 'digests-export'):
        raise RuntimeError('unknown key %r (host-dir=, digests=, '
                           'digests-export=)' % key)
    if key in _keys:
        raise RuntimeError('%s= given twice' % key)
    _keys[key] = value


def config_complete():
    if 'host-dir' not in _keys:
        raise RuntimeError('host-dir= is needed')
    if ('digests' in _keys) != ('digests-export' in _keys):
        raise RuntimeError('digests= and digests-export= go together')


def _is_uuid(name):
    try:
        return str(uuid.UUID(name)) == name
    except ValueError:
        return False


def _paths(name):
    """The files an export name may read, in order: [] if none."""
    fmt = _keys.get('digests-export')
    if fmt:
        head, _brace, tail = fmt.partition('{}')
        inner = name[len(head):len(name) - len(tail)] if (
            name.startswith(head) and name.endswith(tail)
            and len(name) > len(head) + len(tail)) else ''
        if _is_uuid(inner) and name != inner:
            return [_keys['digests'].format(inner)]
    if _is_uuid(name):
        return [os.path.join(_keys['host-dir'], kind, name)
                for kind in ('bases', 'mirrors')]
    return []


def thread_model():
    return nbdkit.THREAD_MODEL_PARALLEL


def open(readonly):
    name = nbdkit.export_name()
    paths = _paths(name)
    if not paths:
        nbdkit.set_error(errno.EINVAL)
        raise RuntimeError('export %r is not an image id' % name)
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        nbdkit.debug('peer export %s: %s' % (name, path))
        return {'fd': fd, 'size': os.fstat(fd).st_size}
    nbdkit.set_error(errno.ENOENT)
    raise RuntimeError('this host holds no %s' % (
        'base of image %s' % name if _is_uuid(name) else name))


def close(h):
    os.close(h['fd'])


def get_size(h):
    return h['size']


def can_write(h):
    return False


def can_multi_conn(h):
    return True


def can_extents(h):
    return True


def pread(h, buf, offset, flags):
    view = memoryview(buf)
    while view:
        n = os.preadv(h['fd'], [view], offset)
        if n == 0:      # a mirror cut short under us: never serve zeros
            nbdkit.set_error(errno.EIO)
            raise RuntimeError('short read at %d' % offset)
        view, offset = view[n:], offset + n


def extents(h, count, offset, flags):
    """Data where the file holds data, holes elsewhere (SEEK_DATA)."""
    fd, end = h['fd'], min(offset + count, h['size'])
    out = []
    while offset < end:
        try:
            data = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as e:
            if e.errno != errno.ENXIO:
                raise
            data = end
        data = min(data, end)
        if data > offset:
            out.append((offset, data - offset,
                        nbdkit.EXTENT_HOLE | nbdkit.EXTENT_ZERO))
        if data >= end:
            break
        hole = min(os.lseek(fd, data, os.SEEK_HOLE), end)
        out.append((data, hole - data, 0))
        offset = hole
    return out
