"""The ``vmar`` libvirt image backend: a qcow2 overlay on an NBD export.

The instance's root disk is ``<instance dir>/disk``, a qcow2 file whose
backing file is ``nbd+unix:///<image id>.<map version>?socket=...`` with the
backing format pinned to raw. The overlay names the map version, so it is
the one record of which version an instance reads: a running (or rebooted)
instance keeps the version it booted with, and new instances get the image's
current map.

Nothing is put in Nova's ``_base`` directory: the map and the base files it
references live in the export daemon's ``[vmar_host] host_dir``, which
Nova's image cache manager does not manage, and stay there while an
export reads them.
"""

import os

from nova import exception
from nova.virt.disk import api as disk_api
from nova.virt.image import model as imgmodel
from nova.virt.libvirt import config as vconfig
from nova.virt.libvirt import imagebackend
from nova.virt.libvirt import utils as libvirt_utils
from oslo_concurrency import lockutils
from oslo_concurrency import processutils
from oslo_log import log as logging

from vmar_openstack import conf as vmar_conf
from vmar_openstack import exception as vmar_exception
from vmar_openstack import fingerprint
from vmar_openstack import hostapi
from vmar_openstack import names
from vmar_openstack.nova_imagebackend import extra_specs
from vmar_openstack.nova_imagebackend import guest_cache
from vmar_openstack.nova_imagebackend import snapshot

LOG = logging.getLogger(__name__)
CONF = vmar_conf.CONF

SPEC_ENABLED = names.SPEC_ENABLED
SPEC_HOST_CACHE = names.SPEC_HOST_CACHE
SPEC_GUEST_CACHE = names.SPEC_GUEST_CACHE


_HOST = {}


def host():
    """The host API client of this host's export daemon.

    One per process and ``[vmar_compute]`` setting, so the daemon's NBD
    socket is asked once.
    """
    key = (CONF.vmar_compute.api_socket, CONF.vmar_compute.api_timeout)
    if key not in _HOST:
        _HOST.clear()
        _HOST[key] = hostapi.Client.from_compute_conf(CONF)
    return _HOST[key]


def flavor_policy(flavor):
    """The vmar settings of a flavor, or None for an ordinary flavor."""
    if not extra_specs.enabled(flavor):
        return None
    specs = flavor.extra_specs
    host_cache = specs.get(SPEC_HOST_CACHE, 'base')
    if host_cache not in names.HOST_CACHE:
        # the API validator refuses this; a flavor made before it was
        # installed can still carry it
        raise exception.InvalidInput(
            reason='%s=%s: must be one of %s'
            % (SPEC_HOST_CACHE, host_cache, ', '.join(names.HOST_CACHE)))
    guest = specs.get(SPEC_GUEST_CACHE, guest_cache.DEFAULT)
    if guest not in guest_cache.MODES:
        raise exception.InvalidInput(
            reason='%s=%s: must be one of %s'
            % (SPEC_GUEST_CACHE, guest, ', '.join(guest_cache.MODES)))
    return {'host_cache': host_cache, 'guest_cache': guest}


def instance_policy(instance):
    return flavor_policy(instance.flavor)


def is_root_disk(name):
    return os.path.basename(name) == 'disk'


def parse_backing(uri, socket):
    """What a vmar overlay's backing URI names, or None.

    An :class:`~vmar_openstack.names.ExportName`: image id, map version
    and the holder's key.
    """
    parsed = names.parse_nbd_uri(uri or '')
    if parsed is None or parsed[1] is None or parsed[1] != socket:
        return None
    return names.parse_export(parsed[0])


class VmarDiskConfig(vconfig.LibvirtConfigGuestDisk):
    """A libvirt disk whose cache mode and error policy are fixed.

    ``cache='none'``: the overlay is O_DIRECT; the base data is cached on
    the host once, by the export daemon (host-cache-for-base). Nova applies
    ``[libvirt]disk_cachemodes`` after the backend, so the mode is pinned
    when the XML is written. ``error_policy``/``rerror_policy='stop'``: an
    I/O error (the export daemon restarting, say) pauses the guest instead
    of surfacing EIO inside it.
    """

    CACHE_MODES = ('none', 'directsync')

    def format_dom(self):
        if self.driver_cache not in self.CACHE_MODES:
            LOG.warning('a vmar disk needs cache=none, not %s (from '
                        '[libvirt]disk_cachemodes?): using none',
                        self.driver_cache)
            self.driver_cache = 'none'
        dev = super().format_dom()
        drv = dev.find('driver')
        drv.set('error_policy', 'stop')
        drv.set('rerror_policy', 'stop')
        return dev


class VmarImage(imagebackend.Image):
    """The root disk of an instance whose flavor has ``vmar:enabled``."""

    def __init__(self, instance=None, disk_name=None, path=None,
                 disk_info_mapping=None, exports=None):
        path = path or os.path.join(
            libvirt_utils.get_instance_path(instance), disk_name)
        super().__init__(path, 'file', 'qcow2', is_block_dev=False,
                         disk_info_mapping=disk_info_mapping)
        self.instance = instance
        self._exports = exports
        self.disk_info_path = os.path.join(os.path.dirname(path),
                                           'disk.info')
        self.resolve_driver_format()

    @property
    def exports(self):
        """The host API client of this host's export daemon."""
        return self._exports or host()

    @property
    def policy(self):
        return instance_policy(self.instance) or {'host_cache': 'base'}

    # -- provisioning -----------------------------------------------------

    def pinned(self):
        """(image id, map version) the existing overlay reads, or None."""
        if not os.path.exists(self.path):
            return None
        return self.inspect()[0]

    def inspect(self):
        """((image id, map version), virtual size) of the overlay."""
        info = _qemu_img_info(self.path)
        socket = self.exports.nbd_socket()
        pin = parse_backing(info.get('backing-filename'), socket)
        if pin is None or info.get('backing-filename-format') != 'raw':
            raise exception.InvalidDiskInfo(
                reason='%s is not backed by a vmar export on %s (backing '
                '%r); refusing to touch it'
                % (self.path, socket,
                   info.get('backing-filename')))
        return pin, info['virtual-size']

    def cache(self, fetch_func, filename, size=None, safe=False, *args,
              **kwargs):
        """Make sure the overlay and its export exist.

        Nova's fetch function is never called: nothing is downloaded into
        ``_base``. The map and its bases come from the map source.
        """
        image_id = kwargs.get('image_id') or self.instance.image_ref
        self.create_image(None, None, size, image_id=image_id)

    def create_image(self, prepare_template, base, size, safe=False,
                     *args, **kwargs):
        image_id = kwargs.get('image_id') or self.instance.image_ref
        holder = self.instance.uuid
        host_cache = self.policy['host_cache']

        # one nova-compute process per host: its threads take turns at an
        # instance's overlay; the daemon keeps the exports consistent
        @lockutils.synchronized('vmar-' + holder)
        def _provision():
            if os.path.exists(self.path):
                # a reboot, a host restart, the overlay copied here by a
                # cold migration or resize: the version it booted with,
                # under the name its overlay gives; a resize to a larger
                # flavor grows it, as Nova grows its own disks
                pin, virtual_size = self.inspect()
                self._add(pin.image_id, host_cache, holder,
                          version=pin.version, key=pin.key)
                if size and size > virtual_size:
                    self.resize_image(size)
                return
            exp = self._add(image_id, host_cache, holder,
                            whole=self._deleted_after_spawn(image_id))
            try:
                self._create_overlay(exp, holder, size)
            except Exception:
                self._release(holder)
                raise
        _provision()

    def adopt(self, backing_uri, size):
        """The overlay a live migration copies into, on the destination.

        ``backing_uri`` and ``size`` are the source's overlay's (its
        ``vmar_backing`` in the disk info): the export is added with the
        same map version and key, and the overlay made empty with the same
        header, before the guest's own data is mirrored into it. An
        existing overlay (a hard reboot takes the same path) is kept.
        """
        socket = self.exports.nbd_socket()
        pin = parse_backing(backing_uri, socket)
        if pin is None:
            raise exception.MigrationPreCheckError(
                reason='the vmar overlay of %s reads %r, not an export on '
                'this host\'s %s: the hosts\' [vmar_host] export_socket '
                'differ' % (self.instance.uuid, backing_uri, socket))
        holder = self.instance.uuid

        @lockutils.synchronized('vmar-' + holder)
        def _adopt():
            exp = self._add(pin.image_id, self.policy['host_cache'], holder,
                            version=pin.version, key=pin.key)
            if os.path.exists(self.path):
                return
            uri = exp['uri']
            if uri != backing_uri:
                self._release(holder)
                raise exception.MigrationPreCheckError(
                    reason='the export of %s here would be %r, not the '
                    'source\'s %r' % (holder, uri, backing_uri))
            try:
                create_overlay(self.path, uri, size)
            except Exception:
                self._release(holder)
                raise
            LOG.info('created %s on map v%d of %s for a live migration',
                     self.path, exp['map_version'], exp['image_id'])
        _adopt()

    def _deleted_after_spawn(self, image_id):
        """Whether Nova deletes the image once the server has spawned.

        Unshelve boots the shelved snapshot, then deletes it from Glance:
        the host needs every block of it that only it holds before then
        (a lazy mirror could no longer fill them).
        """
        inst = self.instance
        if not inst.obj_attr_is_set('system_metadata'):
            return False    # never loaded here: the instance is no unshelve
        return (inst.system_metadata or {}).get(
            'shelved_image_id') == image_id

    def _add(self, image_id, host_cache, holder, version=None, key=None,
             whole=False):
        """The export (the host API's ``add`` reply), served on return."""
        try:
            return self.exports.add(image_id, host_cache=host_cache,
                                    holder=holder, version=version, key=key,
                                    whole=whole)
        except vmar_exception.ExportError as e:
            raise exception.ImageUnacceptable(
                image_id=image_id,
                reason='cannot export its VMAR view: %s' % e)

    def _release(self, holder):
        return release(holder, self.exports)

    def uri_of(self, pin):
        return names.nbd_uri(names.export(*pin), self.exports.nbd_socket())

    def _create_overlay(self, exp, holder, size):
        virtual_size = exp['virtual_size']
        if size and size < virtual_size:
            raise exception.FlavorDiskSmallerThanImage(
                flavor_size=size, image_size=virtual_size)
        create_overlay(self.path, exp['uri'], size or virtual_size)
        LOG.info('created %s on map v%d of %s', self.path,
                 exp['map_version'], exp['image_id'])

    # -- the Image API ----------------------------------------------------

    def libvirt_info(self, cache_mode, extra_specs, boot_order=None,
                     disk_unit=None):
        info = super().libvirt_info(cache_mode, extra_specs,
                                    boot_order=boot_order,
                                    disk_unit=disk_unit)
        disk = VmarDiskConfig()
        disk.__dict__.update(info.__dict__)
        disk.driver_cache = 'none'
        return disk

    def resize_image(self, size):
        disk_api.extend(
            imgmodel.LocalFileImage(self.path, imgmodel.FORMAT_QCOW2), size)

    def snapshot_extract(self, target, out_format):
        """A standalone image: the overlay flattened onto its view."""
        self.pinned()
        libvirt_utils.extract_snapshot(self.path, 'qcow2', target,
                                       out_format)

    def direct_snapshot(self, context, snapshot_name, image_format,
                        image_id, base_image_id):
        """The snapshot by its delta (:func:`snapshot.send_delta`).

        Returns no location: the image is active when this returns.
        """
        snapshot.send_delta(self, context, image_id, image_format)
        return None

    def empty_copy(self, dest):
        """An empty overlay at ``dest`` on this disk's pinned export.

        Returns (pin, virtual size) of this disk.
        """
        pin, virtual_size = self.inspect()
        create_overlay(dest, self.uri_of(pin), virtual_size)
        return pin, virtual_size

    @staticmethod
    def is_file_in_instance_path():
        return True

    def get_model(self, connection):
        return imgmodel.LocalFileImage(self.path, imgmodel.FORMAT_QCOW2)


def release(holder, exports=None):
    """Drop every export reference of ``holder`` (a deleted instance)."""
    exports = exports or host()
    try:
        return exports.release(holder)
    except vmar_exception.ExportError as e:
        LOG.warning('could not release the exports of %s: %s; run '
                    '"vmar-export release %s"', holder, e, holder)
        return []


def backing_of(path):
    """The full backing URI of a vmar overlay, or None for another disk.

    Nova's disk info keeps only the base name of a backing file (for a
    vmar overlay, the export socket's); moves need all of it.
    """
    uri = _qemu_img_info(path).get('backing-filename')
    socket = host().nbd_socket()
    return uri if parse_backing(uri, socket) is not None else None


def create_overlay(path, backing_uri, size):
    """A qcow2 file on an NBD export, backing format pinned to raw.

    Made under a temporary name and renamed: never half-written.
    """
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + '.vmar-tmp'
    try:
        processutils.execute(
            CONF.vmar_compute.qemu_img, 'create', '-q', '-f', 'qcow2', '-o',
            'backing_file=%s,backing_fmt=raw' % backing_uri.replace(',', ',,'),
            tmp, str(size))
        os.rename(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _qemu_img_info(path):
    """qemu-img info of a qcow2 overlay, in use by a guest or not."""
    try:
        return fingerprint.qemu_img_info(CONF.vmar_compute.qemu_img, path,
                                         'qcow2', force_share=True)
    except vmar_exception.ImageRejected as e:
        raise exception.InvalidDiskInfo(reason=str(e))
