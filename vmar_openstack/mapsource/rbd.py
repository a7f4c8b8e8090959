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
import errno
import threading
import time
import urllib.parse

from vmar_openstack.exception import SourceError
from vmar_openstack import names

SCHEME = 'rbd://'

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

    The name's format is the contract's (:func:`names.rbd_fetch_export`).
    """
    return names.rbd_fetch_export(loc.pool, loc.image, loc.snapshot, size)


def is_fetch_export(name):
    return names.is_rbd_fetch_export(name)


def parse_fetch_export(name):
    """(:class:`Location` without fsid, size) of a :func:`fetch_export`.

    :raises ValueError: not such a name.
    """
    pool, image, snap, size = names.parse_rbd_fetch_export(name)
    return Location(None, pool, image, snap), size


def _connection_error(e):
    """Whether ``e`` (from librados or librbd) is the connection's."""
    return (getattr(e, 'errno', None) in (errno.ETIMEDOUT, errno.ESHUTDOWN,
                                          errno.ENOTCONN)
            or type(e).__name__ in ('Timeout', 'TimedOut',
                                    'ConnectionShutdown'))


class _Connection:
    """One librados connection, its pool contexts and open snapshots."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.ioctxs = {}
        self.images = {}
        self.users = 0          # reads in flight through it
        self.retired = False    # closed when the last of them ends

    def close(self):
        for handle in list(self.images.values()) + list(
                self.ioctxs.values()):
            try:
                handle.close()
            except Exception:   # noqa: S110 -- closing a failed connection
                pass
        self.cluster.shutdown()


class Reader:
    """Byte ranges of RBD snapshots, under the host's Ceph user.

    One cluster connection at a time, made at the first read, with the
    images it has opened (librbd handles are safe for concurrent reads;
    they stay open as long as the connection). A read that timed out
    retires it: the next read connects afresh, and the old connection is
    shut down once no read uses it any more. A librados
    client whose requests timed out while an OSD was down does not find
    the OSD again when it comes back (measured with Ceph 16.2.15: still
    timing out a minute after the OSD was up again, while a new client
    read at once), so a connection that failed is never reused.
    """

    # seconds a failed connect is remembered: reads meanwhile fail at once
    # instead of each trying in turn for connect_timeout
    CONNECT_BACKOFF = 5

    def __init__(self, conf):
        self.conf = conf.vmar_rbd
        self._lock = threading.Lock()           # the dicts and counts
        self._connect_lock = threading.Lock()   # one connect at a time
        self._conn = None
        self._failed = (0.0, None)              # (monotonic, error)

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
        return _Connection(cluster)

    def _acquire(self):
        """The current connection, counted as used; connects if none.

        The connect runs outside :attr:`_lock` (reads through other
        connections go on), one at a time; a failure is remembered for
        :attr:`CONNECT_BACKOFF` seconds.
        """
        with self._connect_lock:
            with self._lock:
                if self._conn is not None:
                    self._conn.users += 1
                    return self._conn
            when, error = self._failed
            if time.monotonic() - when < self.CONNECT_BACKOFF:
                raise error
            try:
                conn = self._connect()
            except Exception as e:
                self._failed = (time.monotonic(), e)
                raise
            with self._lock:
                self._conn = conn
                conn.users += 1
                return conn

    def _release(self, conn, failed):
        with self._lock:
            if failed and self._conn is conn:
                self._conn = None
                conn.retired = True
            conn.users -= 1
            done = conn.retired and conn.users == 0
        if done:
            conn.close()

    def _image(self, conn, loc):
        import rbd
        with self._lock:
            image = conn.images.get(loc)
            ioctx = conn.ioctxs.get(loc.pool)
        if image is not None:
            return image
        if ioctx is None:
            ioctx = conn.cluster.open_ioctx(loc.pool)
            with self._lock:
                ioctx = conn.ioctxs.setdefault(loc.pool, ioctx)
        image = rbd.Image(ioctx, loc.image, snapshot=loc.snapshot,
                          read_only=True)
        with self._lock:
            kept = conn.images.setdefault(loc, image)
        if kept is not image:
            image.close()
        return kept

    def read(self, loc, offset, length):
        """``length`` bytes of the snapshot at ``loc`` from ``offset``.

        :raises SourceError: anything but exactly those bytes.
        """
        what = '%s/%s@%s, bytes %d-%d' % (loc.pool, loc.image, loc.snapshot,
                                          offset, offset + length - 1)
        try:
            conn = self._acquire()
        except Exception as e:
            raise SourceError('RBD %s: cannot connect to Ceph: %s: %s'
                              % (what, type(e).__name__, e))
        broken = False
        try:
            data = self._image(conn, loc).read(offset, length)
        except Exception as e:
            # a connection that timed out is not used again; an error of
            # one image (gone, no permission) says nothing about it
            broken = _connection_error(e)
            raise SourceError('RBD %s: %s: %s' % (what, type(e).__name__, e))
        finally:
            self._release(conn, broken)
        if len(data) != length:
            raise SourceError('RBD %s: %d bytes came' % (what, len(data)))
        return data
