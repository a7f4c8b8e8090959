"""``[vmar_metrics]``: where the Prometheus endpoints of the services listen.

Each service's port is in its own group (``[vmar_host] metrics_port``,
``[vmar_agent] metrics_port``); the address they share is here.
"""

from oslo_config import cfg

GROUP = cfg.OptGroup(
    'vmar_metrics', title='VMAR Prometheus metrics',
    help='HTTP endpoints (/metrics, prometheus_client) of vmar-export and '
         'vmar-agent.')

metrics_opts = [
    cfg.HostAddressOpt('bind_host', default='127.0.0.1',
                       help='Address the metrics endpoints listen on. The '
                            'metrics name images: keep them off tenant '
                            'networks.\n\nRelated options: '
                            '[vmar_host] metrics_port, [vmar_agent] '
                            'metrics_port.'),
]

ALL_OPTS = metrics_opts
