"""nbdkit python plugin: the host's peer fetcher.

Run by ``vmar-export serve`` (:func:`vmar_openstack.host.peers.server.
fetcher_command`) when the host reads from peers
(:func:`.peers.enabled`): each lazy mirror's fetch quorum has an NBD
client of it as its first child, then the store's reader. An export named
by :func:`vmar_openstack.names.peer_fetch_export` is an image's raw
content; a read of a run returns it from the first peer that holds it,
every block checked against the image's digest list
(:class:`.peers.PeerReader`), and fails when no peer does, so that the
quorum asks the store next. No retry filter: a run no peer holds is not
asked again, the store is.

Keys: ``site=DIR`` (the site directory vmar is installed in; nbdkit runs
the system's Python), ``config-file=FILE`` (repeatable: the service's
configuration), ``digests=PATH`` (an image's digest list on this host),
``holders=PATH`` (the file of its holders, with discovery), ``{}``
standing for the image id, and ``counts=PATH`` (where the peer reads are
counted): the export daemon says where
(:func:`vmar_openstack.host.peers.server.fetcher_command`).
"""

import errno
import site

import nbdkit

API_VERSION = 2

_keys = {'site': None, 'config-file': [], 'digests': None, 'holders': None,
         'counts': None}
_reader = []


def config(key, value):
    if key == 'config-file':
        _keys[key].append(value)
    elif key in ('site', 'digests', 'holders', 'counts'):
        _keys[key] = value
    else:
        raise RuntimeError('unknown key %r (site=, config-file=, digests=, '
                           'holders=, counts=)' % key)


def config_complete():
    if _keys['site']:
        site.addsitedir(_keys['site'])
    if not _keys['digests']:
        raise RuntimeError('the peer fetcher needs digests= (where the '
                           'host keeps its digest lists)')
    from vmar_openstack import conf as vmar_conf
    from vmar_openstack.host.peers import source as peers

    conf = vmar_conf.from_files(_keys['config-file'])
    p = conf.vmar_peers
    holders = _keys['holders']
    _reader.append(peers.PeerReader(
        p.peers, p.tls_dir, _keys['digests'].format, p.bad_peer_seconds,
        timeout=p.read_timeout, down_seconds=p.down_peer_seconds,
        lead_wait=p.lead_wait,
        holders_path=holders.format if holders else None,
        counts_path=_keys['counts']))


def thread_model():
    return nbdkit.THREAD_MODEL_PARALLEL


def open(readonly):
    from vmar_openstack import names
    try:
        image_id, size = names.parse_peer_fetch_export(nbdkit.export_name())
    except ValueError as e:
        nbdkit.set_error(errno.ENOENT)
        raise RuntimeError(str(e))
    return {'image': image_id, 'size': size}


def get_size(h):
    return h['size']


def can_write(h):
    return False


def can_multi_conn(h):
    return True


def pread(h, buf, offset, flags):
    data = _reader[0].read(h['image'], offset, len(buf))
    if data is None:
        # the quorum's next child, the store, reads it
        nbdkit.set_error(errno.EIO)
        raise RuntimeError('no peer holds %d bytes at %d of image %s'
                           % (len(buf), offset, h['image']))
    buf[:] = data
