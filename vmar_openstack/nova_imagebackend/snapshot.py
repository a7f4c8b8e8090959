"""Snapshots of a vmar root disk.

Two routes, both giving a standalone image in Nova's snapshot format
(qcow2 by default; raw with ``[libvirt] snapshot_image_format = raw``):

* :func:`send_delta`, Nova's *direct snapshot* of the disk
  (``VmarImage.direct_snapshot``): only the blocks the server changed go
  to Glance, as a snapshot delta (:mod:`.delta`) staged with
  ``glance-direct`` and imported; glance-api builds the whole image from
  the parent's stored bytes (the ``vmar_mapgen`` import plugin). Any
  failure of it makes Nova fall back to its own route.
* :func:`live_snapshot`, Nova's own route for a running guest
  (``LibvirtDriver._live_snapshot``, wrapped): the disk's top layer is
  copied and flattened onto the view, and Nova uploads the whole disk.

Either way a running guest's top layer is read from a point-in-time copy
(:func:`copy_top`): a block job mirrors the overlay's own clusters into
a new overlay with the same pinned backing, and the job is cancelled once
it is in sync (Nova's own live snapshot does the same).
"""

import contextlib
import os
import tempfile
import time

from nova import exception
from nova.image import glance
from nova.virt.libvirt import utils as libvirt_utils
from oslo_log import log as logging

from vmar_openstack import conf as vmar_conf
from vmar_openstack import exception as vmar_exception
from vmar_openstack.mapformat import delta as delta_format
from vmar_openstack.mapformat import mirror as mirror_format
from vmar_openstack.nova_imagebackend import delta as disk_delta
from vmar_openstack.nova_imagebackend import driver as driver_access

LOG = logging.getLogger(__name__)
CONF = vmar_conf.CONF
# Glance's import states while the delta is being built and stored
IMPORTING = ('uploading', 'importing')
POLL = 0.5
# what glance-api builds from a delta
FORMATS = ('qcow2', 'raw')


def copy_top(driver, guest, disk_path, img, dest):
    """Copy the running disk's own layer to a new overlay at ``dest``.

    Returns the pin (export name) and the virtual size of the disk.
    """
    pin, virtual_size = img.empty_copy(dest)
    dev = guest.get_block_device(disk_path)
    xml = guest.get_xml_desc(dump_inactive=True, dump_sensitive=True)
    try:
        dev.abort_job()
    except Exception:   # idempotent cleanup of an earlier failure
        pass
    try:
        if guest.has_persistent_configuration():
            driver_access.delete_guest_configuration(driver, guest)
        dev.rebase(dest, copy=True, reuse_ext=True, shallow=True)
        while not dev.is_job_complete():
            time.sleep(0.5)
    finally:
        dev.abort_job()
        driver_access.write_instance_config(driver, xml)
    return pin, virtual_size


def live_snapshot(driver, img, guest, disk_path, out_path, image_format):
    """Nova's live snapshot of a vmar disk, flattened to ``image_format``.

    Nova's own creates the copy with ``qemu-img create -b <backing>``
    after inspecting the backing as a local file, which an NBD URI is not.
    """
    top = out_path + '.delta'
    copy_top(driver, guest, disk_path, img, top)
    try:
        libvirt_utils.extract_snapshot(top, 'qcow2', out_path,
                                       image_format)
    finally:
        os.unlink(top)


@contextlib.contextmanager
def _point_in_time(img, workdir):
    """The path of the disk's own layer, as of now: a copy if it runs."""
    driver = driver_access.current()
    guest = driver_access.guest(driver, img.instance) if driver else None
    if guest is None or not guest.is_active():
        # shut off, or suspended by Nova for a cold snapshot: the file
        # is quiescent
        yield img.path
        return
    top = os.path.join(workdir, 'top.qcow2')
    try:
        copy_top(driver, guest, img.path, img, top)
        yield top
    finally:
        if os.path.exists(top):
            os.unlink(top)


def send_delta(img, context, image_id, image_format):
    """Snapshot ``img`` into Glance image ``image_id`` by its delta.

    ``image_format``: Nova's (``[libvirt] snapshot_image_format``, by
    default the disk's: qcow2); glance-api builds raw or qcow2.

    Returns once the image is active. Raises ``NotImplementedError`` when
    the route is off, ``ImageUnacceptable`` when it failed in a way Nova's
    own route can still serve (Nova falls back to it), and SnapshotError
    when the image is past saving (Nova fails the snapshot and deletes it).
    """
    if not CONF.vmar_compute.snapshot_delta:
        raise NotImplementedError('[vmar_compute] snapshot_delta is off')
    if image_format not in FORMATS:
        raise NotImplementedError('snapshots by delta are %s, not %s'
                                  % (' or '.join(FORMATS), image_format))
    os.makedirs(CONF.libvirt.snapshots_directory, exist_ok=True)
    client = glance.GlanceClientWrapper()
    with tempfile.TemporaryDirectory(
            dir=CONF.libvirt.snapshots_directory) as work:
        # QEMU opens the copy of a running disk's top layer in it (as in
        # Nova's live snapshot's directory)
        os.chmod(work, 0o701)
        try:
            made = _make_delta(img, work)
        except Exception as e:
            # a block job libvirt refused, a daemon without the digest
            # list, ...: Nova's own route may still work
            LOG.warning('snapshot %s: no delta of the disk (%s); Nova\'s '
                        'own route follows', image_id, e,
                        instance=img.instance)
            raise exception.ImageUnacceptable(
                image_id=image_id, reason='no delta of the disk: %s' % e)
        LOG.info('snapshot %s: delta of %d blocks (%d zeroed, %d of the '
                 'disk\'s own blocks unchanged), %d bytes',
                 image_id, made.data_blocks, made.zero_blocks,
                 made.unchanged_blocks, made.size, instance=img.instance)
        try:
            client.call(context, 2, 'update', kwargs={
                'image_id': image_id, 'disk_format': image_format,
                'container_format': 'bare'})
            with open(made.path, 'rb') as f:
                client.call(context, 2, 'stage', args=(image_id, f,
                                                       made.size))
            client.call(context, 2, 'image_import', args=(image_id,),
                        kwargs={'method': 'glance-direct'})
        except exception.ImageNotFound:
            raise
        except Exception as e:
            raise exception.ImageUnacceptable(
                image_id=image_id, reason='staging its delta failed: %s' % e)
    _wait_active(client, context, image_id)


def _make_delta(img, work):
    # the overlay names its pin and size, the same for a copy of it
    pin, virtual_size = img.inspect()
    hdr, rows = mirror_format.read_digests(
        img.exports.digests(pin.image_id, pin.version))
    with _point_in_time(img, work) as top:
        header = delta_format.Header(
            hdr.block_size, virtual_size, pin.image_id, hdr.size,
            pin.version)
        return disk_delta.write(top, os.path.join(work, 'delta'), header,
                                rows, CONF.vmar_compute.qemu_img)


def _wait_active(client, context, image_id):
    deadline = time.monotonic() + CONF.vmar_compute.snapshot_import_timeout
    while True:
        image = client.call(context, 2, 'get', args=(image_id,))
        status = image.get('status')
        if status == 'active':
            return
        if status not in IMPORTING:
            failed = image.get('os_glance_failed_import') or ''
            raise exception.ImageUnacceptable(
                image_id=image_id, reason='glance-api did not build it from '
                'its delta (status %s%s); see glance-api\'s log' % (
                    status, ', failed stores %s' % failed if failed else ''))
        if time.monotonic() > deadline:
            raise vmar_exception.SnapshotError(
                image_id=image_id, reason='not active %d s after its delta '
                'was imported (status %s)' % (
                    CONF.vmar_compute.snapshot_import_timeout, status))
        time.sleep(POLL)
