"""The Glance image import plugin ``vmar_mapgen``.

Enabled in ``glance-image-import.conf``::

    [image_import_opts]
    image_import_plugins = ['vmar_mapgen']

It runs during ``openstack image create --import`` (glance-direct and
web-download), on the staged data, before Glance writes it to the store:
one flow, one task, which ingests the image (fingerprints, cluster tables,
map) with the ``[vmar]`` and ``[vmar_database]`` options of glance-api's
configuration, and records the outcome in image properties:

=========================== ==================================================
``vmar_map_version``        the image's map version
``vmar_hash_algorithm``     the block hash (``[vmar] hash_algorithm``)
``vmar_shared_fraction``    non-zero blocks found in other images (0..1)
``vmar_mapgen_error``       why mapgen failed (then the others are absent)
=========================== ==================================================

A mapgen failure never corrupts or loses the upload: the task works on a
read-only view of the staged file, and by default the import goes on with
the failure logged and recorded (``vmar-agent`` retries on
``image.activate``). ``[vmar_import] mapgen_failure_fatal = True`` fails
the import instead. The map is published to Glance by ``vmar-agent`` when
it sees the image become active.

A staged **snapshot delta** (:mod:`vmar_openstack.mapformat.delta`, what
a compute host stages for a snapshot of a vmar server) is first built into
the whole image from the parent's stored bytes (:mod:`.assemble`), which
Glance then stores as the image's data; its library entry is its parent's
plus the delta (:meth:`Library.add_delta`), and these properties record
where it came from:

============================ =================================================
``vmar_parent``              the image the server was booted from
``vmar_parent_map_version``  the map version its disk read
``vmar_delta_blocks``        data blocks the delta held
``vmar_delta_zero_blocks``   blocks the delta zeroed
``vmar_stored_hash``         ``<algorithm>:<hex>`` of the file handed to
                             Glance (raw, or qcow2 as Nova's snapshots are by
                             default); vmar-agent compares it with
                             ``os_hash_value`` before it trusts the entry
============================ =================================================

A delta that fails a check, a parent that is gone or whose stored bytes
are not what Glance recorded, or a full staging disk fail the import
(Glance puts the image back to ``queued``) and leave no staged data.
"""

import glob
import os

from oslo_config import cfg
from oslo_log import log as logging
from taskflow.patterns import linear_flow as lf
from taskflow import task

from vmar_openstack import conf as vmar_conf
from vmar_openstack import exception
from vmar_openstack import fileutils
from vmar_openstack.glance_hooks import assemble
from vmar_openstack import ingest
from vmar_openstack.mapformat import delta as delta_format
from vmar_openstack import names

LOG = logging.getLogger(__name__)
CONF = vmar_conf.CONF


def _local(file_path):
    return file_path[len('file://'):] if file_path.startswith(
        'file://') else file_path


class _AssembleDelta(task.Task):
    """A staged snapshot delta becomes the whole image; else nothing."""

    default_provides = ('file_path', 'vmar_delta')

    def __init__(self, task_id, task_type, image_id, action_wrapper,
                 image_repo, stores=()):
        self.image_id = image_id
        self.action_wrapper = action_wrapper
        self.image_repo = image_repo
        self.stores = [s for s in stores if s]
        self.src_path = self.dest_path = None
        super().__init__(name='%s-VmarAssembleDelta-%s' % (task_type,
                                                           task_id))

    def execute(self, file_path):
        path = _local(file_path)
        if not delta_format.is_delta(path):
            return file_path, None
        self.src_path = path
        self._remove_ours()     # of an import of it killed before
        with self.action_wrapper as action:
            fmt = action.image_disk_format
        if fmt not in ('raw', 'qcow2'):
            raise exception.SnapshotError(
                image_id=self.image_id, reason='a snapshot delta is '
                'imported as a raw or qcow2 image, not %s' % fmt)
        d = delta_format.read_index(
            path, max_virtual_size=CONF.vmar.max_virtual_size_gb << 30)
        hdr = d.header
        try:
            rows = ingest.Library(CONF).delta_parent(d)
        except (exception.ImageNotFound, exception.ImageRejected) as e:
            raise exception.SnapshotError(
                image_id=self.image_id, reason='its parent %s has no usable '
                'entry in the VMAR library: %s' % (hdr.parent_id, e))
        try:
            parent = self.image_repo.get(hdr.parent_id)
        except Exception as e:  # glance's NotFound/Forbidden: not ours
            raise exception.SnapshotError(
                image_id=self.image_id, reason='its parent %s cannot be '
                'read (%s): deleted while the snapshot was being made?'
                % (hdr.parent_id, type(e).__name__))
        if parent.status != 'active':
            raise exception.SnapshotError(
                image_id=self.image_id, reason='its parent %s is %s, not '
                'active' % (hdr.parent_id, parent.status))
        self.dest_path = path + '.vmar'
        try:
            out = assemble.assemble(d, rows, parent.get_data(),
                                    self.dest_path)
            stored, digest = assemble.stored_file(
                self.image_id, self.dest_path, fmt, CONF.vmar.qemu_img,
                cfg.CONF.hashing_algorithm)
        except OSError as e:    # a full staging disk, mostly
            raise exception.SnapshotError(
                image_id=self.image_id, reason='building the whole image '
                'beside the staged delta in %s failed: %s'
                % (os.path.dirname(path), e))
        if stored != self.dest_path:
            os.unlink(self.dest_path)
            self.dest_path = stored
        with self.action_wrapper as action:
            action.set_image_attribute(size=os.path.getsize(stored),
                                       virtual_size=out.size)
            action.set_image_extra_properties({
                names.PROP_PARENT: hdr.parent_id,
                'vmar_parent_map_version': str(hdr.parent_map_version),
                'vmar_delta_blocks': str(d.n_data),
                'vmar_delta_zero_blocks': str(len(d.zero_blocks)),
                names.PROP_STORED_HASH: '%s:%s' % (
                    cfg.CONF.hashing_algorithm, digest)})
        os.unlink(path)
        LOG.info('image %s: built from parent %s and a delta of %d blocks '
                 '(%d zeroed): %d bytes, %d of them data', self.image_id,
                 hdr.parent_id, d.n_data, len(d.zero_blocks), out.size,
                 out.data_bytes)
        return 'file://' + stored, (d, rows)

    def revert(self, result=None, **kwargs):
        # the import of a delta failed here or later: the image goes back
        # to queued, its stores to failed (as image_conversion does: the
        # store tasks never ran), and no staged data is left behind
        # The files go first: a client that sees the image queued again
        # finds no staged data of it.
        if self.src_path is None:
            return      # not a delta: nothing of ours to undo
        try:
            self._remove_ours()
            fileutils.unlink(self.src_path)
        finally:
            with self.action_wrapper as action:
                action.set_image_attribute(status='queued')
                if self.stores:
                    action.remove_importing_stores(self.stores)
                    action.add_failed_stores(self.stores)

    def _remove_ours(self):
        """What this task wrote beside the staged delta: "<id>.vmar*"."""
        for path in glob.glob(glob.escape(self.src_path) + '.vmar*'):
            fileutils.unlink(path)


class _Mapgen(task.Task):

    default_provides = 'vmar_mapgen_result'

    def __init__(self, task_id, task_type, image_id, action_wrapper,
                 image_repo):
        self.task_id = task_id
        self.image_id = image_id
        self.action_wrapper = action_wrapper
        self.image_repo = image_repo
        super().__init__(name='%s-VmarMapgen-%s' % (task_type, task_id))

    def execute(self, file_path, vmar_delta=None):
        path = _local(file_path)
        image = self.image_repo.get(self.image_id)
        with self.action_wrapper as action:
            fmt = action.image_disk_format or 'raw'
        try:
            out = self._ingest(path, fmt, image, vmar_delta)
        except exception.ImageExists:
            LOG.info('image %s is already in the VMAR library',
                     self.image_id)
            return None
        except Exception as e:
            LOG.error('VMAR mapgen of image %s failed: %s', self.image_id, e)
            with self.action_wrapper as action:
                action.set_image_extra_properties(
                    {'vmar_mapgen_error': str(e)[:255]})
            if CONF.vmar_import.mapgen_failure_fatal:
                raise
            return None
        props = {'vmar_map_version': str(out.map_version),
                 'vmar_hash_algorithm': CONF.vmar.hash_algorithm,
                 'vmar_shared_fraction': '%.4f' % out.shared_fraction}
        with self.action_wrapper as action:
            action.set_image_extra_properties(props)
        LOG.info('VMAR mapgen of image %s: map v%d, %.1f %% shared',
                 self.image_id, out.map_version, 100 * out.shared_fraction)
        return props

    def _ingest(self, path, fmt, image, delta):
        lib = ingest.Library(CONF)
        if delta is not None:
            try:
                return lib.add_delta(self.image_id, delta[0],
                                     owner=image.owner,
                                     visibility=image.visibility,
                                     parent_rows=delta[1])
            except (exception.ImageNotFound, exception.ImageRejected) as e:
                LOG.warning('image %s: not ingested from its parent (%s); '
                            'hashing it whole', self.image_id, e)
        return lib.add(self.image_id, path, disk_format=fmt,
                       owner=image.owner, visibility=image.visibility,
                       keep_base=False)


def get_flow(**kwargs):
    """The ``glance.image_import.plugins`` entry point."""
    args = (kwargs['task_id'], kwargs['task_type'], kwargs['image_id'],
            kwargs['action_wrapper'], kwargs['image_repo'])
    return lf.Flow(kwargs['task_type']).add(
        _AssembleDelta(*args, stores=kwargs.get('backend') or ()),
        _Mapgen(*args))
