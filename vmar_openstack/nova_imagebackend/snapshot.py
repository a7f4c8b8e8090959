"""Live snapshots of a vmar root disk.

Called by :func:`vmar_openstack.nova_wrappers.live_snapshot` for Nova's
``LibvirtDriver._live_snapshot``.
"""

import os
import time

from nova.virt.libvirt import utils as libvirt_utils

from vmar_openstack.nova_imagebackend import driver as driver_access
from vmar_openstack.nova_imagebackend import image as vimage


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
            driver_access.delete_guest_configuration(driver, guest)
        dev.rebase(delta, copy=True, reuse_ext=True, shallow=True)
        while not dev.is_job_complete():
            time.sleep(0.5)
    finally:
        dev.abort_job()
        driver_access.write_instance_config(driver, xml)
    try:
        libvirt_utils.extract_snapshot(delta, 'qcow2', out_path,
                                       image_format)
    finally:
        os.unlink(delta)
