"""``[vmar_metrics]``: the Prometheus endpoints of the services."""

from oslo_config import cfg

GROUP = cfg.OptGroup(
    'vmar_metrics', title='VMAR Prometheus metrics',
    help='HTTP endpoints (/metrics, prometheus_client) of vmar-export and '
         'vmar-agent.')

metrics_opts = [
    cfg.HostAddressOpt('bind_host', default='127.0.0.1',
                       help='Address the metrics endpoints listen on. The '
                            'metrics name images: keep them off tenant '
                            'networks.'),
    cfg.PortOpt('export_port', default=0,
                help='Port of vmar-export\'s /metrics. 0: no endpoint.'),
    cfg.PortOpt('agent_port', default=0,
                help='Port of vmar-agent\'s /metrics. 0: no endpoint.'),
]

ALL_OPTS = metrics_opts
