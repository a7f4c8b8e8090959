"""The Prometheus endpoint of a service (``prometheus_client``).

Each service builds its own registry
(:mod:`vmar_openstack.host.observe.metrics`,
:mod:`vmar_openstack.glance_hooks.metrics`) and serves it on its port of
``[vmar_metrics]``.
"""

from oslo_log import log as logging
import prometheus_client

from vmar_openstack import exception

LOG = logging.getLogger(__name__)


class MetricsError(exception.VmarException):
    message = 'cannot serve metrics on %(host)s:%(port)d: %(reason)s'


def serve(conf, port, registry):
    """Serve ``registry`` at ``http://<bind_host>:<port>/metrics``.

    Nothing when ``port`` is 0. A port that cannot be bound is an error:
    a monitored service must not run unmonitored by surprise.
    """
    if not port:
        return None
    host = conf.vmar_metrics.bind_host
    try:
        server = prometheus_client.start_http_server(port, addr=host,
                                                     registry=registry)
    except OSError as e:
        raise MetricsError(host=host, port=port, reason=e.strerror or e)
    LOG.info('metrics on http://%s:%d/metrics', host, port)
    return server
