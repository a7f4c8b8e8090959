"""Blocks of Glance images read straight from Ceph RBD.

glance_store's ``rbd`` store keeps each image as an RBD image named by the
image id, with a protected snapshot (``snap``) that never changes, and
gives its location as ``rbd://<fsid>/<pool>/<image>/<snapshot>``
(``direct_url`` with ``show_image_direct_url = True``, as Nova's own RBD
backend needs). The store cannot serve byte ranges through Glance's data
API (it has no random access), so a lazy host on such a cloud reads the
snapshot itself, with a Ceph user of its own (``[vmar_rbd]``).

The reads run in the host's range server (nbdkit's python plugin,
:mod:`.nbdkit_glance`, in the system's Python, where Debian's
``python3-rbd`` is), never in the export daemon: librados connects when an
image is first read, so a daemon restarting while the cluster is away
still opens every mirror and serves what they hold. Every block read is
checked against the digest list like any other fetched block.

This module names the range server's RBD exports (:func:`fetch_export`:
the one place that format is written) and reads them (:class:`Reader`);
it imports the Ceph bindings only when a read needs them.
"""

import collections
import configparser
import threading
import urllib.parse

from vmar_openstack.exception import SourceError

SCHEME = 'rbd://'
_EXPORT_PREFIX = 'rbd/'

Location = collections.namedtuple('Location', 'fsid pool image snapshot')


def parse_location(url):
    """The :class:`Location` of a glance_store RBD URL; None if not RBD.

    Only the four-part form names a snapshot a host can read.

    :raises ValueError: an RBD URL of another form.
    """
    if not isinstance(url, str) or not url.startswith(SCHEME):
        return None
    parts = url[len(SCHEME):].split('/')
    if len(parts) != 4 or not all(parts):
        raise ValueError('RBD location %r is not rbd://<fsid>/<pool>/'
                         '<image>/<snapshot>' % url)
    return Location(*(urllib.parse.unquote(p) for p in parts))


def image_location(image):
    """The RBD location of a Glance image's data, or None.

    From ``direct_url``, else the first RBD entry of ``locations``.
    """
    urls = [image.get('direct_url')] + [
        loc.get('url') for loc in image.get('locations') or ()
        if isinstance(loc, dict)]
    for url in urls:
        try:
            loc = parse_location(url)
        except ValueError:
            continue
        if loc is not None:
            return loc
    return None


def conf_fsid(path):
    """The ``fsid`` a Ceph configuration file names, or None.

    Ceph spells keys with spaces or underscores; a client's file need not
    name its cluster.
    """
    parser = configparser.RawConfigParser(strict=False,
                                          inline_comment_prefixes=(';', '#'))
    try:
        with open(path) as f:
            parser.read_file(f)
    except (OSError, configparser.Error) as e:
        raise SourceError('cannot read Ceph configuration %s: %s'
                          % (path, e))
    return parser.get('global', 'fsid', fallback=None)


def fetch_export(loc, size):
    """The range server's export name of an RBD snapshot of ``size``.

    Like :func:`.glance.fetch_export`, the name carries everything the
    server needs to open it without asking anyone.
    """
    return _EXPORT_PREFIX + '/'.join(
        [urllib.parse.quote(p, safe='')
         for p in (loc.pool, loc.image, loc.snapshot)] + [str(size)])


def is_fetch_export(name):
    return name.startswith(_EXPORT_PREFIX)


def parse_fetch_export(name):
    """(:class:`Location` without fsid, size) of a :func:`fetch_export`.

    :raises ValueError: not such a name.
    """
    parts = name[len(_EXPORT_PREFIX):].split('/') if is_fetch_export(
        name) else []
    if len(parts) != 4 or not all(parts) or not parts[3].isdigit():
        raise ValueError('export %r is not rbd/<pool>/<image>/<snapshot>/'
                         '<size>' % name)
    pool, image, snap = (urllib.parse.unquote(p) for p in parts[:3])
    return Location(None, pool, image, snap), int(parts[3])


class Reader:
    """Byte ranges of RBD snapshots, under the host's Ceph user.

    One cluster connection for the process, made at the first read (and
    at the next one, if connecting failed); one open image per snapshot,
    kept for the process's life. librbd handles are safe for concurrent
    reads.
    """

    def __init__(self, conf):
        self.conf = conf.vmar_rbd
        self._lock = threading.Lock()
        self._cluster = None
        self._ioctxs = {}
        self._images = {}

    def _connect(self):
        import rados
        c = self.conf
        timeouts = {'client_mount_timeout': str(c.connect_timeout),
                    'rados_osd_op_timeout': str(c.op_timeout),
                    'rados_mon_op_timeout': str(c.op_timeout)}
        cluster = rados.Rados(conffile=c.ceph_conf, rados_id=c.user,
                              conf=timeouts)
        try:
            cluster.connect(timeout=c.connect_timeout)
        except Exception:
            cluster.shutdown()
            raise
        return cluster

    def _image(self, loc):
        import rbd
        with self._lock:
            image = self._images.get(loc)
            if image is not None:
                return image
            if self._cluster is None:
                self._cluster = self._connect()
            ioctx = self._ioctxs.get(loc.pool)
            if ioctx is None:
                ioctx = self._ioctxs[loc.pool] = self._cluster.open_ioctx(
                    loc.pool)
            image = rbd.Image(ioctx, loc.image, snapshot=loc.snapshot,
                              read_only=True)
            self._images[loc] = image
            return image

    def read(self, loc, offset, length):
        """``length`` bytes of the snapshot at ``loc`` from ``offset``.

        :raises SourceError: anything but exactly those bytes.
        """
        what = '%s/%s@%s, bytes %d-%d' % (loc.pool, loc.image, loc.snapshot,
                                          offset, offset + length - 1)
        try:
            data = self._image(loc).read(offset, length)
        except Exception as e:
            # a timeout or an error of the cluster's. The connection stays:
            # librados finds monitors and OSDs again by itself, and another
            # thread may be reading through the same handle.
            raise SourceError('RBD %s: %s: %s' % (what, type(e).__name__, e))
        if len(data) != length:
            raise SourceError('RBD %s: %d bytes came' % (what, len(data)))
        return data
