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

Keys: ``host-dir=DIR`` (``[vmar_host] host_dir``).

Standard library only: nbdkit runs the system's Python.
"""

import errno
import os
import uuid

import nbdkit

API_VERSION = 2

_host_dir = []


def config(key, value):
    if key != 'host-dir':
        raise RuntimeError('unknown key %r (host-dir=)' % key)
    _host_dir.append(value)


def config_complete():
    if len(_host_dir) != 1:
        raise RuntimeError('host-dir= is needed, once')


def thread_model():
    return nbdkit.THREAD_MODEL_PARALLEL


def open(readonly):
    name = nbdkit.export_name()
    try:
        ok = str(uuid.UUID(name)) == name
    except ValueError:
        ok = False
    if not ok:
        nbdkit.set_error(errno.EINVAL)
        raise RuntimeError('export %r is not an image id' % name)
    for kind in ('bases', 'mirrors'):
        path = os.path.join(_host_dir[0], kind, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        nbdkit.debug('peer export %s: %s' % (name, path))
        return {'fd': fd, 'size': os.fstat(fd).st_size}
    nbdkit.set_error(errno.ENOENT)
    raise RuntimeError('this host holds no base of image %s' % name)


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
