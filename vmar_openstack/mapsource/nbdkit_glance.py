"""nbdkit python plugin: stored Glance image data as read-only NBD exports.

Run by ``vmar-export serve``
(:meth:`.glance.GlanceSource.range_server_command`) with ``[vmar_host]
base_fetch = lazy`` and ``map_source = glance``: the export
daemon's ``vmar-mirror`` nodes open an export and read the blocks they
miss. An export named by an image id and size
(:func:`vmar_openstack.names.glance_fetch_export`) reads through Glance,
one range request a read (:class:`.glance.RangeReader`); one named by an
RBD snapshot (:func:`.rbd.fetch_export`) reads the snapshot from Ceph
(:class:`.rbd.Reader`). Peers are the peer fetcher's
(:mod:`.nbdkit_peers`), a child of each mirror's fetch quorum before this.
nbdkit's retry-request filter tries a failed read again; the mirror checks
every block against the digest list before a guest can read it.

Keys: ``site=DIR`` (the site directory vmar is installed in; nbdkit runs
the system's Python), ``config-file=FILE`` (repeatable: the service's
configuration).
"""

import errno
import site

import nbdkit

API_VERSION = 2

_keys = {'site': None, 'config-file': []}
_readers = {}


def config(key, value):
    if key == 'config-file':
        _keys[key].append(value)
    elif key == 'site':
        _keys[key] = value
    else:
        raise RuntimeError('unknown key %r (site=, config-file=)' % key)


def config_complete():
    if _keys['site']:
        site.addsitedir(_keys['site'])
    from vmar_openstack import conf as vmar_conf
    from vmar_openstack.mapsource import glance
    from vmar_openstack.mapsource import rbd

    conf = vmar_conf.from_files(_keys['config-file'])
    _readers['glance'] = glance.RangeReader(conf)
    if conf.vmar_rbd.ceph_conf:
        try:
            import rados  # noqa: F401 -- Debian's, in the system Python
            import rbd as librbd  # noqa: F401
        except ImportError as e:
            raise RuntimeError('[vmar_rbd] ceph_conf is set but Ceph\'s '
                               'Python bindings are missing (install '
                               'python3-rbd): %s' % e)
        _readers['rbd'] = rbd.Reader(conf)


def thread_model():
    return nbdkit.THREAD_MODEL_PARALLEL


def _failed(what, e):
    nbdkit.debug('%s: %s' % (what, e))
    nbdkit.set_error(errno.EIO)
    raise RuntimeError('%s: %s' % (what, e))


def open(readonly):
    # no request to Glance or Ceph here: see names.glance_fetch_export
    from vmar_openstack.mapsource import rbd
    from vmar_openstack import names
    name = nbdkit.export_name()
    try:
        if rbd.is_fetch_export(name):
            if 'rbd' not in _readers:
                raise ValueError('export %r: [vmar_rbd] ceph_conf is not '
                                 'set' % name)
            loc, size = rbd.parse_fetch_export(name)
            return {'read': _readers['rbd'].read, 'key': loc, 'size': size,
                    'what': 'RBD %s/%s@%s' % loc[1:]}
        image_id, size = names.parse_glance_fetch_export(name)
    except ValueError as e:
        nbdkit.set_error(errno.ENOENT)
        raise RuntimeError(str(e))
    return {'read': _readers['glance'].read,
            'key': image_id, 'size': size, 'what': 'image %s' % image_id}


def get_size(h):
    return h['size']


def can_write(h):
    return False


def can_multi_conn(h):
    return True


def pread(h, buf, offset, flags):
    try:
        buf[:] = h['read'](h['key'], offset, len(buf))
    except Exception as e:
        _failed('%s, %d bytes at %d' % (h['what'], len(buf), offset), e)
