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
"""

from oslo_log import log as logging
from taskflow.patterns import linear_flow as lf
from taskflow import task

from vmar_openstack import conf as vmar_conf
from vmar_openstack import exception
from vmar_openstack import ingest

LOG = logging.getLogger(__name__)
CONF = vmar_conf.CONF


class _Mapgen(task.Task):

    default_provides = 'vmar_mapgen_result'

    def __init__(self, task_id, task_type, image_id, action_wrapper,
                 image_repo):
        self.task_id = task_id
        self.image_id = image_id
        self.action_wrapper = action_wrapper
        self.image_repo = image_repo
        super().__init__(name='%s-VmarMapgen-%s' % (task_type, task_id))

    def execute(self, file_path):
        path = file_path[len('file://'):] if file_path.startswith(
            'file://') else file_path
        image = self.image_repo.get(self.image_id)
        with self.action_wrapper as action:
            fmt = action.image_disk_format or 'raw'
        try:
            out = ingest.Library(CONF).add(
                self.image_id, path, disk_format=fmt, owner=image.owner,
                visibility=image.visibility, keep_base=False)
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


def get_flow(**kwargs):
    """The ``glance.image_import.plugins`` entry point."""
    return lf.Flow(kwargs['task_type']).add(_Mapgen(
        kwargs['task_id'], kwargs['task_type'], kwargs['image_id'],
        kwargs['action_wrapper'], kwargs['image_repo']))
