"""The ``vmar`` weigher: prefer hosts that already hold the image.

A vmar server's boot reads its image's canonical blocks; a host whose
mirrors or whole bases already hold them fetches nothing from the store and
finds them in its page cache. The weight of a host is the share of the
image's canonical blocks it holds (0 to 1, :meth:`HostReports.shares`),
times ``[vmar_scheduler] weight_multiplier`` (or the host aggregate's
``vmar_weight_multiplier``). Servers of ordinary flavors, and images the
database does not know, weigh 0 everywhere: the other weighers decide.

Enable it in nova-scheduler's nova.conf::

    [filter_scheduler]
    weight_classes = nova.scheduler.weights.all_weighers,
        vmar_openstack.nova_scheduler.weigher.VmarWeigher

    [vmar_database]
    connection = <the cluster database vmar-agent writes>
"""

from nova.scheduler import utils
from nova.scheduler import weights
from oslo_log import log as logging
from oslo_utils import strutils

from vmar_openstack import conf as vmar_conf
from vmar_openstack.db import hosts as db_hosts
from vmar_openstack import names

CONF = vmar_conf.CONF
LOG = logging.getLogger(__name__)


def image_of(spec):
    """The image id a vmar server of request ``spec`` boots, or None."""
    flavor = getattr(spec, 'flavor', None)
    specs = getattr(flavor, 'extra_specs', None) or {}
    if not strutils.bool_from_string(specs.get(names.SPEC_ENABLED, 'false')):
        return None
    image = getattr(spec, 'image', None)
    if image is None or not image.obj_attr_is_set('id'):
        return None     # boot from volume: no image on the host
    return image.id


class VmarWeigher(weights.BaseHostWeigher):
    # shares are absolute: a host holding 10 % of the image stays at 0.1
    # when no host holds more (no min-max stretching)
    minval = 0.0
    maxval = 1.0

    def __init__(self):
        self._shares = {}

    def weight_multiplier(self, host_state):
        return utils.get_weight_multiplier(
            host_state, 'vmar_weight_multiplier',
            CONF.vmar_scheduler.weight_multiplier)

    def weigh_objects(self, weighed_obj_list, weight_properties):
        """Look the image's holders up once, then weigh every host."""
        self._shares = self._lookup(weight_properties)
        return super().weigh_objects(weighed_obj_list, weight_properties)

    def _lookup(self, spec):
        image_id = image_of(spec)
        if image_id is None:
            return {}
        try:
            shares = db_hosts.HostReports(CONF).shares(image_id)
        except Exception as e:      # the database away: do not fail boots
            LOG.warning('vmar weigher: the hosts holding image %s are '
                        'unknown, weighing every host 0: %s', image_id, e)
            return {}
        LOG.debug('vmar weigher: image %s held by %s', image_id, shares)
        return shares

    def _weigh_object(self, host_state, weight_properties):
        return self._shares.get(host_state.host, 0.0)
