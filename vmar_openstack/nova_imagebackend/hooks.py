"""Plugging the vmar backend into stock Nova's libvirt driver.

Nova has no plugin point for image backends (``Backend.BACKEND`` is a fixed
dict and ``[libvirt]images_type`` has fixed choices), so :func:`register`
wraps a few methods of the stock classes, in the ``vmar-nova-compute``
process only:

* ``Backend.by_name`` / ``Backend.by_libvirt_path``: the root disk of an
  instance whose flavor has ``vmar:enabled=true`` is a :class:`VmarImage`;
  every other disk of every instance keeps the configured backend;
* ``LibvirtDriver.delete_instance_files``: a deleted instance drops its
  reference on its export (the export, and then files nobody reads, go);
* ``LibvirtDriver._live_snapshot``: the delta of a live snapshot gets the
  same pinned NBD backing as the disk, then is flattened onto the view;
* ``LibvirtDriver.init_host``: export references of instances that left
  the host while the service was down are dropped
  (:mod:`~vmar_openstack.nova_imagebackend.reconcile`), and guests that
  paused on an I/O error of their vmar disk are resumed once the export
  is back (:mod:`~vmar_openstack.nova_imagebackend.resume`);
* moves (doc/source/multinode.rst): a cold migration or resize copies
  the overlay, whose header names its export, and the destination adds
  that export (``VmarImage.create_image``); a live migration carries the
  overlay's backing in the source's disk info (``vmar_backing``) and the
  destination adds the same export and an empty overlay with the same
  header before the guest's data is mirrored into it
  (``_create_images_and_backing``); the source drops its references when
  a resize is confirmed (``confirm_migration``), after a live migration
  (``delete_instance_files``), and the destination when a live migration
  rolls back. Evacuation and unshelve boot a new overlay, as Nova does
  with any disk on storage that is not shared. A resize that would turn
  the vmar backend on or off is refused before anything is touched.

Each wrapper only acts for vmar instances and calls the original otherwise.
"""

import functools
import os
import time

from nova.compute import utils as compute_utils
import nova.conf as nova_conf
from nova import exception
from nova.virt.libvirt import driver as libvirt_driver
from nova.virt.libvirt import imagebackend
from nova.virt.libvirt import utils as libvirt_utils
from oslo_log import log as logging
from oslo_serialization import jsonutils

from vmar_openstack import conf as vmar_conf
from vmar_openstack.nova_imagebackend import extra_specs
from vmar_openstack.nova_imagebackend import guest_cache
from vmar_openstack.nova_imagebackend import image as vimage
from vmar_openstack.nova_imagebackend import reconcile
from vmar_openstack.nova_imagebackend import resume

LOG = logging.getLogger(__name__)

_ORIGINALS = {}


def _is_vmar(instance):
    try:
        return vimage.instance_policy(instance) is not None
    except exception.InvalidInput:
        return True


def _wrap(cls, name):
    def decorator(func):
        original = getattr(cls, name)
        _ORIGINALS[(cls, name)] = original

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            return func(original, *args, **kwargs)
        setattr(cls, name, wrapper)
        return func
    return decorator


def register():
    """Install the vmar backend into Nova's libvirt driver (idempotent)."""
    if _ORIGINALS:
        return
    B = imagebackend.Backend
    D = libvirt_driver.LibvirtDriver

    @_wrap(B, 'by_name')
    def by_name(original, self, instance, name, image_type=None,
                disk_info_mapping=None):
        if vimage.is_root_disk(name) and _is_vmar(instance):
            return vimage.VmarImage(instance=instance, disk_name=name,
                                    disk_info_mapping=disk_info_mapping)
        return original(self, instance, name, image_type=image_type,
                        disk_info_mapping=disk_info_mapping)

    @_wrap(B, 'by_libvirt_path')
    def by_libvirt_path(original, self, instance, path, image_type=None):
        if vimage.is_root_disk(path) and _is_vmar(instance):
            return vimage.VmarImage(instance=instance, path=path)
        return original(self, instance, path, image_type=image_type)

    @_wrap(D, 'init_host')
    def init_host(original, self, host):
        result = original(self, host)
        exports = vimage.host()
        reconcile.release_stale(exports, nova_conf.CONF.instances_path,
                                self.list_instance_uuids())
        self._vmar_resumer = resume.start(
            self, exports, vmar_conf.CONF.vmar_compute.resume_interval)
        return result

    @_wrap(D, '_get_guest_config')
    def _get_guest_config(original, self, instance, *args, **kwargs):
        guest = original(self, instance, *args, **kwargs)
        policy = vimage.instance_policy(instance)
        if policy is not None:
            guest_cache.apply(guest, policy, instance)
        return guest

    @_wrap(D, 'delete_instance_files')
    def delete_instance_files(original, self, instance):
        done = original(self, instance)
        if done and _is_vmar(instance):
            vimage.release(instance.uuid)
        return done

    @_wrap(D, '_live_snapshot')
    def _live_snapshot(original, self, context, instance, guest, disk_path,
                       out_path, source_format, image_format, image_meta):
        if not (vimage.is_root_disk(disk_path) and _is_vmar(instance)):
            return original(self, context, instance, guest, disk_path,
                            out_path, source_format, image_format,
                            image_meta)
        return live_snapshot(self, instance, guest, disk_path, out_path,
                             image_format)

    @_wrap(D, 'get_instance_disk_info')
    def get_instance_disk_info(original, self, instance,
                               block_device_info=None):
        # what the source of a block migration sends the destination
        # (Nova's resource periodic reads the private method, not this)
        disks = jsonutils.loads(original(self, instance, block_device_info))
        if not _is_vmar(instance):
            return jsonutils.dumps(disks)
        socket = os.path.basename(vimage.host().nbd_socket())
        for info in disks:
            if (vimage.is_root_disk(info['path'])
                    and info.get('backing_file') == socket):
                # Nova keeps only the backing file's base name; the
                # destination of a live migration needs all of it
                backing = vimage.backing_of(info['path'])
                if backing:
                    info['vmar_backing'] = backing
        return jsonutils.dumps(disks)

    @_wrap(D, '_create_images_and_backing')
    def _create_images_and_backing(original, self, context, instance,
                                   instance_dir, disk_info,
                                   fallback_from_host=None):
        rest = []
        for info in disk_info or []:
            if info.get('vmar_backing') and vimage.is_root_disk(
                    info['path']) and _is_vmar(instance):
                vimage.VmarImage(
                    instance=instance,
                    path=os.path.join(instance_dir, 'disk')).adopt(
                        info['vmar_backing'], info['virt_disk_size'])
            else:
                rest.append(info)
        return original(self, context, instance, instance_dir, rest,
                        fallback_from_host=fallback_from_host)

    @_wrap(D, 'rollback_live_migration_at_destination')
    def rollback_live_migration_at_destination(original, self, context,
                                               instance, *args, **kwargs):
        try:
            return original(self, context, instance, *args, **kwargs)
        finally:
            # Nova removes the instance directory itself, past
            # delete_instance_files; the guest still runs on the source
            if _is_vmar(instance) and instance.host != vmar_conf.CONF.host:
                vimage.release(instance.uuid)

    @_wrap(D, 'migrate_disk_and_power_off')
    def migrate_disk_and_power_off(original, self, context, instance, dest,
                                   flavor, *args, **kwargs):
        reason = extra_specs.switch_refusal(instance.flavor, flavor)
        if reason and not compute_utils.is_volume_backed_instance(
                context, instance):
            raise exception.InstanceFaultRollback(exception.ResizeError(
                reason=reason))
        return original(self, context, instance, dest, flavor, *args,
                        **kwargs)

    @_wrap(D, 'confirm_migration')
    def confirm_migration(original, self, context, migration, instance,
                          network_info):
        result = original(self, context, migration, instance, network_info)
        if (migration.source_compute != migration.dest_compute
                and _is_vmar(instance)):
            # the overlay went with the instance; this host's references
            # on its export go now (a same-host resize keeps them)
            vimage.release(instance.uuid)
        return result

    LOG.info('vmar image backend registered for flavors with %s=true',
             vimage.SPEC_ENABLED)


def unregister():
    """Undo :func:`register` (for tests)."""
    for (cls, name), original in _ORIGINALS.items():
        setattr(cls, name, original)
    _ORIGINALS.clear()


def live_snapshot(driver, instance, guest, disk_path, out_path,
                  image_format):
    """Nova's live snapshot, for a disk whose backing is a vmar export.

    Nova's own creates the delta with ``qemu-img create -b <backing>`` after
    inspecting the backing as a local file, which an NBD URI is not. Here the
    delta gets the disk's pinned backing (format raw), libvirt mirrors the
    disk's own data into it, and the delta is flattened onto the view.
    """
    img = vimage.VmarImage(instance=instance, path=disk_path)
    pin, virtual_size = img.inspect()
    delta = out_path + '.delta'
    vimage.create_overlay(delta, img.uri_of(pin), virtual_size)
    dev = guest.get_block_device(disk_path)
    xml = guest.get_xml_desc(dump_inactive=True, dump_sensitive=True)
    try:
        dev.abort_job()
    except Exception:   # idempotent cleanup of an earlier failure
        pass
    try:
        if guest.has_persistent_configuration():
            driver._delete_guest_configuration(guest, keep_vtpm=True,
                                               keep_nvram=True)
        dev.rebase(delta, copy=True, reuse_ext=True, shallow=True)
        while not dev.is_job_complete():
            time.sleep(0.5)
    finally:
        dev.abort_job()
        driver._host.write_instance_config(xml)
    try:
        libvirt_utils.extract_snapshot(delta, 'qcow2', out_path,
                                       image_format)
    finally:
        os.unlink(delta)
