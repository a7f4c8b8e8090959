"""The ``glance`` map source, and the layout of maps in Glance.

Compute hosts have no database credentials, so maps reach them through
Glance, the service they already fetch images from, with its authentication
and its stores. ``vmar-agent`` publishes every map version as a hidden image
(``os_hidden``) that it owns:

==================== =========================================================
id                   ``uuid5(MAP_NAMESPACE, '<image id>.<version>')``: one
                     id per version, so publishing is idempotent and a
                     version, once active, never changes (Glance image data
                     is immutable)
name                 ``vmar-map-<image id>-v<version>``
disk/container       ``raw`` / ``bare``
properties           ``vmar_map_of`` (image id), ``vmar_map_version``,
                     ``vmar_map_sha256`` (of the map file)
visibility, owner    ``private``, the agent's project (``[vmar_glance]
                     map_owner``)
==================== =========================================================

The digest list of each base (``doc/source/reference/mirror-format.rst``),
which hosts check lazily fetched blocks against, is published the same way,
once per image (an image's data never changes):

==================== =========================================================
id                   ``uuid5(DIGESTS_NAMESPACE, '<image id>')``
name                 ``vmar-digests-<image id>``
properties           ``vmar_map_of`` (image id), ``vmar_digests_sha256``
==================== =========================================================

A host trusts a map image only when its owner is the map owner, its
properties name the image and version it asked for, its data has the
recorded SHA-256, and the map's own header agrees; a digest list image
likewise. Base images are the Glance images themselves: with ``[vmar_host]
base_fetch = full`` a host streams one to a temporary file, checks
Glance's ``os_hash_value`` and the format (``format_inspector``, backing
files refused), converts it to raw if it is not, and the export service
checks its size against the map. With ``lazy``, the host's mirrors read
byte ranges of raw images (:class:`RangeReader`, served to the export
daemon by nbdkit: :mod:`.nbdkit_glance`), or, for images Glance keeps in
Ceph, the RBD snapshots themselves (:mod:`.rbd`), and check every block
against the digest list before a guest sees it.
"""

import os
import subprocess
import sysconfig
import tempfile
import time
import urllib.parse

from glanceclient import client as glance_client
from glanceclient import exc as glance_exc
from keystoneauth1 import adapter as ks_adapter
from keystoneauth1 import loading as ks_loading
from oslo_log import log as logging

from vmar_openstack import exception
from vmar_openstack.exception import SourceError
from vmar_openstack import fileutils
from vmar_openstack import fingerprint
from vmar_openstack import glance_io
from vmar_openstack import mapformat
from vmar_openstack.mapsource import base
from vmar_openstack.mapsource import rbd
from vmar_openstack.mapsource import readers
from vmar_openstack import names

LOG = logging.getLogger(__name__)


def fetch_socket(conf):
    """The unix socket of the host's range server (nbdkit)."""
    return os.path.join(conf.vmar_host.host_dir, names.RANGE_SERVER_SOCKET)


def _session_and_adapter(conf):
    """The keystoneauth session of ``[vmar_glance]`` and adapter kwargs."""
    group = 'vmar_glance'
    auth = ks_loading.load_auth_from_conf_options(conf, group)
    sess = ks_loading.load_session_from_conf_options(conf, group, auth=auth)
    g = conf.vmar_glance
    kwargs = {'service_type': g.service_type or 'image'}
    if g.endpoint_override:
        kwargs['endpoint_override'] = g.endpoint_override
    if g.region_name:
        kwargs['region_name'] = g.region_name
    if g.valid_interfaces:
        kwargs['interface'] = g.valid_interfaces[0]
    return sess, kwargs


def client(conf):
    """A python-glanceclient v2 client from ``[vmar_glance]``."""
    sess, kwargs = _session_and_adapter(conf)
    return glance_client.Client('2', session=sess, **kwargs)


class RangeReader:
    """Byte ranges of raw Glance images, under the host's credentials.

    ``GET /v2/images/{id}/file`` with a ``Range`` header; Glance answers
    206 for stores with random access (the file store here). A store that
    answers with the whole image instead is an error, not a download: a
    lazy host never streams a whole image. keystoneauth renews the token.
    """

    def __init__(self, conf):
        sess, kwargs = _session_and_adapter(conf)
        self.adapter = ks_adapter.Adapter(sess, **kwargs)

    def read(self, image_id, offset, length):
        """``length`` bytes of the image from ``offset``.

        :raises SourceError: anything but exactly those bytes.
        """
        last = offset + length - 1
        r = self.adapter.get('/v2/images/%s/file' % image_id, stream=True,
                             raise_exc=False,
                             headers={'Range': 'bytes=%d-%d' % (offset, last)})
        try:
            if r.status_code != 206:
                raise SourceError(
                    'image %s, bytes %d-%d: Glance answered %d, not 206 '
                    '(does its store serve byte ranges?)'
                    % (image_id, offset, last, r.status_code))
            got = r.headers.get('Content-Range', '')
            if not got.startswith('bytes %d-%d/' % (offset, last)):
                raise SourceError('image %s: asked for bytes %d-%d, Glance '
                                  'sent %r' % (image_id, offset, last, got))
            data = r.raw.read(length + 1, decode_content=True)
        finally:
            r.close()
        if len(data) != length:
            raise SourceError('image %s, bytes %d-%d: %d bytes came'
                              % (image_id, offset, last, len(data)))
        return data


class GlanceSource(base.MapSource):

    can_mirror = True
    has_bootsets = True
    has_layouts = True
    has_digest_sums = True

    @property
    def needs_range_server(self):
        """Its base readers are range exports: with lazy mirrors only."""
        return self.conf.vmar_host.base_fetch == 'lazy'

    def __init__(self, conf, glance=None):
        self.conf = conf
        self._glance = glance
        self._ranges = None

    @property
    def ranges(self):
        """The :class:`RangeReader` of this host's credentials."""
        if self._ranges is None:
            self._ranges = RangeReader(self.conf)
        return self._ranges

    @property
    def glance(self):
        if self._glance is None:
            self._glance = client(self.conf)
        return self._glance

    def _owner_ok(self, image):
        return names.published_by(image, self.conf.vmar_glance.map_owner)

    def _published(self, image_id):
        try:
            found = list(self.glance.images.list(filters={
                names.PROP_OF: image_id, 'os_hidden': True,
                'status': 'active'}))
        except glance_exc.ClientException as e:
            raise SourceError('cannot list the maps of %s in Glance: %s'
                              % (image_id, e))
        return [int(i[names.PROP_VERSION]) for i in found
                if self._owner_ok(i) and i.get(names.PROP_OF) == image_id
                and str(i.get(names.PROP_VERSION, '')).isdigit()]

    def current_version(self, image_id):
        """The newest published map version of an image.

        An image that is active but has no map yet (vmar-agent ingests it
        asynchronously) is waited for, up to ``[vmar_glance] map_wait``
        seconds; an image that is not active is not.
        """
        deadline = time.monotonic() + self.conf.vmar_glance.map_wait
        delay = 1.0
        while True:
            versions = self._published(image_id)
            if versions:
                return max(versions)
            if (time.monotonic() + delay > deadline
                    or self._get(image_id).get('status') != 'active'):
                raise SourceError(
                    'image %s has no published VMAR map in Glance (is '
                    'vmar-agent running? its log says why an image was '
                    'not ingested)' % image_id)
            LOG.info('waiting for vmar-agent to publish the map of %s',
                     image_id)
            time.sleep(delay)
            delay = min(delay * 2, 10.0)

    def _get(self, image_id):
        try:
            return self.glance.images.get(image_id)
        except glance_exc.HTTPNotFound:
            raise SourceError('image %s is not in Glance' % image_id)
        except glance_exc.ClientException as e:
            raise SourceError('cannot get image %s from Glance: %s'
                              % (image_id, e))

    def fetch_map(self, image_id, version, dest):
        mid = names.map_image_id(image_id, version)
        img = self._get(mid)
        if (img.get('status') != 'active' or not self._owner_ok(img)
                or img.get(names.PROP_OF) != image_id
                or str(img.get(names.PROP_VERSION)) != str(version)):
            raise SourceError('Glance image %s is not map v%d of %s '
                              'published by vmar-agent' % (mid, version,
                                                           image_id))
        tmp = glance_io.download(
            self.glance, dict(img, os_hash_algo='sha256',
                              os_hash_value=img.get(names.PROP_SHA256)),
            os.path.dirname(dest))
        try:
            try:
                bmap = mapformat.read(tmp)
            except exception.MapFormatError as e:
                raise SourceError('map v%d of %s is invalid: %s'
                                  % (version, image_id, e))
            if bmap.image_id != image_id or bmap.map_version != version:
                raise SourceError('Glance image %s holds map v%d of %s'
                                  % (mid, bmap.map_version, bmap.image_id))
            os.chmod(tmp, 0o444)
            os.rename(tmp, dest)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def fetch_digests(self, image_id, dest):
        """The digest list vmar-agent published for an image, at dest.

        It outlives the image while other maps read blocks of it (their
        images hold them); whether the image itself can be read range by
        range is :meth:`base_reader`'s question.

        :raises SourceError: none usable (the host then copies the whole
            base): not published, or not the agent's.
        """
        self._fetch_file(names.digests_image_id(image_id), image_id,
                         names.PROP_DIGESTS_SHA256, 'digest list', dest)

    def fetch_bootset(self, image_id, dest):
        """The boot working set vmar-agent published for an image, at dest.

        The one recorded from a boot if there is one, else the one found
        in the image's file systems.

        :raises SourceError: none published, or not the agent's.
        """
        try:
            self._fetch_file(names.bootset_image_id(image_id, 'recorded'),
                             image_id, names.PROP_BOOTSET_SHA256,
                             'recorded boot working set', dest)
        except SourceError:
            self._fetch_file(names.bootset_image_id(image_id), image_id,
                             names.PROP_BOOTSET_SHA256, 'boot working set',
                             dest)

    def fetch_layout(self, image_id, dest):
        """The block layout vmar-agent published for an image, at dest.

        :raises SourceError: none published, or not the agent's.
        """
        self._fetch_file(names.layout_image_id(image_id), image_id,
                         names.PROP_LAYOUT_SHA256, 'block layout', dest)

    def digests_sha256(self, image_id):
        """The SHA-256 vmar-agent published of an image's digest list.

        :raises SourceError: none published, or not the agent's.
        """
        return self._published_file(names.digests_image_id(image_id),
                                    image_id, names.PROP_DIGESTS_SHA256,
                                    'digest list')[1]

    def _published_file(self, did, image_id, sha_prop, what):
        """(image, SHA-256) of a hidden file image of vmar-agent's."""
        dig = self._get(did)
        sha = dig.get(sha_prop)
        if (dig.get('status') != 'active' or not self._owner_ok(dig)
                or dig.get(names.PROP_OF) != image_id or not sha):
            raise SourceError('Glance image %s is not the %s of %s '
                              'published by vmar-agent'
                              % (did, what, image_id))
        return dig, sha

    def _fetch_file(self, did, image_id, sha_prop, what, dest):
        """A hidden file image of vmar-agent's, checked, at ``dest``."""
        dig, sha = self._published_file(did, image_id, sha_prop, what)
        tmp = glance_io.download(
            self.glance, dict(dig, os_hash_algo='sha256', os_hash_value=sha),
            os.path.dirname(dest))
        os.rename(tmp, dest)

    def base_reader(self, image_id, size):
        """The QEMU node a base mirror fetches missing blocks from.

        The host's range server (nbdkit with :mod:`.nbdkit_glance`, run by
        ``vmar-export serve``) exports the stored bytes of each Glance
        image: read through Glance (:func:`fetch_export`), or straight
        from the RBD snapshot Glance keeps of it when ``[vmar_rbd]
        ceph_conf`` is set and the image is in that cluster
        (:func:`.rbd.fetch_export`). A raw image is read as it is; a
        qcow2 image through QEMU's qcow2 driver on top, once its header
        (read as one range) passed
        :func:`~vmar_openstack.fingerprint.inspect_header`. Either way
        the node must yield ``size`` bytes, the map's.

        :raises SourceError: the image cannot be read range by range.
        """
        img = self._get(image_id)
        fmt = img.get('disk_format')
        if (img.get('status') != 'active'
                or fmt not in fingerprint.LAZY_FORMATS):
            raise SourceError('image %s is %s and %s in Glance; lazy mirrors '
                              'read active %s images' % (
                                  image_id, img.get('status'), fmt,
                                  ' or '.join(fingerprint.LAZY_FORMATS)))
        stored = int(img.get('size') or 0)
        loc = self._rbd_location(img)
        if loc is None:
            export = names.glance_fetch_export(image_id, stored)
        else:
            export = rbd.fetch_export(loc, stored)
        node = readers.RangeExport(fetch_socket(self.conf), export)
        if fmt == 'raw':
            vsize = stored
        else:
            n = min(fingerprint.HEADER_BYTES, stored)
            if loc is None:
                head = self.ranges.read(image_id, 0, n)
            else:
                head = self._read_export(export, n)
            try:
                vsize = fingerprint.inspect_header(head, fmt,
                                                   'image %s' % image_id)
            except exception.ImageRejected as e:
                raise SourceError(str(e))
            node = readers.Qcow2(node)
        if vsize != size:
            raise SourceError('image %s holds %d bytes of disk in Glance, '
                              'the map says %d' % (image_id, vsize, size))
        return node

    def _rbd_location(self, img):
        """Where to read ``img`` in Ceph, or None (through Glance).

        The image's RBD location, if ``[vmar_rbd] ceph_conf`` is set and
        the location's cluster is the host's (when the host's file names
        its fsid; any other cluster's data would fail the digest check).
        """
        ceph_conf = self.conf.vmar_rbd.ceph_conf
        if not ceph_conf:
            return None
        loc = rbd.image_location(img)
        if loc is None:
            LOG.info('image %s has no RBD location in Glance (is '
                     'show_image_direct_url on?): reading it through Glance',
                     img.get('id'))
            return None
        fsid = rbd.conf_fsid(ceph_conf)
        if fsid and fsid != loc.fsid:
            LOG.info('image %s is in Ceph cluster %s, the host reads %s: '
                     'reading it through Glance', img.get('id'), loc.fsid,
                     fsid)
            return None
        return loc

    def _read_export(self, export, length):
        """The first ``length`` bytes of a range server export."""
        uri = 'nbd+unix:///%s?socket=%s' % (
            urllib.parse.quote(export), fetch_socket(self.conf))
        host_dir = self.conf.vmar_host.host_dir
        with tempfile.TemporaryDirectory(dir=host_dir) as d:
            out = os.path.join(d, 'head')
            r = subprocess.run(
                [self.conf.vmar_host.qemu_img, 'dd', '-f', 'raw', '-O', 'raw',
                 'bs=%d' % length, 'count=1', 'if=' + uri, 'of=' + out],
                capture_output=True, text=True)
            if r.returncode:
                raise SourceError('cannot read the header of %s: %s'
                                  % (export, r.stderr.strip()))
            with open(out, 'rb') as f:
                return f.read()

    def range_server_command(self):
        """(argv, socket, env) of the range server ``vmar-export serve`` runs.

        nbdkit's python plugin runs in the system's Python (Debian's
        libpython). It is given this environment's site directory to import
        vmar and keystoneauth from, and the service's configuration files.
        Its PATH is the system's: embedded Python finds its standard
        library from the first ``python3`` on PATH, and a virtualenv's
        would be another build's.
        """
        plugin = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                              'nbdkit_glance.py')
        cmd = [self.conf.vmar_host.nbdkit, '--foreground',
               '--exit-with-parent',
               '--unix', fetch_socket(self.conf), '--threads', '16',
               '--filter=retry-request', 'python', plugin,
               'site=%s' % sysconfig.get_paths()['purelib'],
               'retry-request-retries=%d' % self.conf.vmar_host.fetch_retries,
               'retry-request-delay=1']
        cmd += ['config-file=%s' % f for f in self.conf.config_file or ()]
        env = dict(os.environ, PATH='/usr/sbin:/usr/bin:/sbin:/bin')
        env.pop('PYTHONHOME', None)
        return cmd, fetch_socket(self.conf), env

    def fetch_base(self, image_id, dest):
        img = self._get(image_id)
        if img.get('status') != 'active':
            raise SourceError('image %s is %s in Glance, not active'
                              % (image_id, img.get('status')))
        work = os.path.dirname(dest)
        tmp = glance_io.download(self.glance, img, work)
        try:
            fmt = img.get('disk_format') or 'raw'
            try:
                with fingerprint.checked_raw_view(
                        tmp, fmt, self.conf.vmar_host.qemu_img, work_dir=work,
                        expected_size=img.get('size')) as raw:
                    if raw.path == tmp:
                        os.chmod(tmp, 0o444)
                        os.rename(tmp, dest)
                        fileutils.fsync_dir(work)
                    else:
                        fileutils.copy_readonly(raw.path, dest)
            except exception.ImageRejected as e:
                raise SourceError('image %s rejected: %s' % (image_id, e))
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
