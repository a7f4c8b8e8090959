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

import threading
import time

from nova.scheduler import utils
from nova.scheduler import weights
from oslo_log import log as logging

from vmar_openstack import conf as vmar_conf
from vmar_openstack.db import hosts as db_hosts
from vmar_openstack.db import session as db_session
from vmar_openstack.nova_imagebackend import extra_specs

CONF = vmar_conf.CONF
LOG = logging.getLogger(__name__)

# after a failed lookup, weigh every host 0 for this long without asking
# the database again: an unreachable database must not slow every request
BACKOFF_SECONDS = 60


def image_of(spec):
    """The image id a vmar server of request ``spec`` boots, or None.

    None for ordinary flavors and boots from volume (the volume, not the
    image, is the disk; Nova still names the image in the request).
    """
    if not (spec.obj_attr_is_set('flavor') and spec.obj_attr_is_set('image')):
        return None
    if not extra_specs.enabled(spec.flavor):
        return None
    if spec.obj_attr_is_set('is_bfv') and spec.is_bfv:
        return None
    if not spec.image.obj_attr_is_set('id'):
        return None
    return spec.image.id


class VmarWeigher(weights.BaseHostWeigher):
    # shares are absolute: a host holding 10 % of the image stays at 0.1
    # when no host holds more (no min-max stretching)
    minval = 0.0
    maxval = 1.0

    def __init__(self):
        # Nova makes one weigher per scheduler and may weigh requests in
        # several threads at once: no per-request state on the object
        self._lock = threading.Lock()
        self._failed_until = 0.0
        # the configured multiplier, read once per request: Nova asks for
        # each host's, a thousand configuration lookups a request
        self._multiplier = CONF.vmar_scheduler.weight_multiplier
        if not db_session.configured(CONF):
            LOG.error('vmar weigher: [vmar_database] connection is not set '
                      'in nova-scheduler\'s configuration; every host '
                      'weighs 0')

    def weight_multiplier(self, host_state):
        return utils.get_weight_multiplier(
            host_state, 'vmar_weight_multiplier', self._multiplier)

    def weigh_objects(self, weighed_obj_list, weight_properties):
        """Look the image's holders up once, then weigh every host."""
        self._multiplier = CONF.vmar_scheduler.weight_multiplier
        shares = self.shares(weight_properties)
        return [shares.get(o.obj.host, 0.0) for o in weighed_obj_list]

    def _weigh_object(self, host_state, weight_properties):
        return self.shares(weight_properties).get(host_state.host, 0.0)

    def shares(self, spec):
        """``{host: share}`` of the image of request ``spec``."""
        try:
            image_id = image_of(spec)
        except Exception as e:      # an odd request must not fail boots
            LOG.warning('vmar weigher: cannot tell the image of the '
                        'request, weighing every host 0: %s', e)
            return {}
        if image_id is None or not db_session.configured(CONF):
            return {}
        with self._lock:
            if time.monotonic() < self._failed_until:
                return {}
        try:
            shares = db_hosts.HostReports(CONF).shares(image_id)
        except Exception as e:      # the database away: do not fail boots
            with self._lock:
                self._failed_until = time.monotonic() + BACKOFF_SECONDS
            LOG.warning('vmar weigher: the hosts holding image %s are '
                        'unknown, weighing every host 0 for %d s: %s',
                        image_id, BACKOFF_SECONDS, e)
            return {}
        LOG.debug('vmar weigher: image %s held by %d hosts', image_id,
                  len(shares))
        return {h: min(1.0, max(0.0, v)) for h, v in shares.items()}
