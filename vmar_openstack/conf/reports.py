"""``[vmar_reports]``: the reports of compute hosts to ``vmar-agent``.

Both ends read it: the export daemon sends its reports (holdings, boot
working sets) on the topic, and vmar-agent listens on it. Hosts that find
their peers through vmar-agent (``[vmar_peers] discover``) ask it on
``holders_topic`` (oslo.messaging RPC, the same bus).
"""

from oslo_config import cfg

GROUP = cfg.OptGroup(
    'vmar_reports', title='VMAR host reports',
    help='The notifications compute hosts send vmar-agent.')

ALL_OPTS = [
    cfg.StrOpt('report_topic', default='vmar_host_reports',
               deprecated_group='vmar',
               help='Notification topic, on the control exchange, of the '
                    'reports of compute hosts: vmar-export serve sends '
                    'them, vmar-agent listens.\n\nPossible values: a topic '
                    'name, the same on both sides.\n\n'
                    'Related options: [vmar_host] report_interval.'),
    cfg.StrOpt('holders_topic', default='vmar_holders',
               help='RPC topic on which vmar-agent answers which hosts '
                    'hold the blocks of a base, from their reports, for '
                    'hosts that read from their peers.\n\nPossible values: '
                    'a topic name, the same on both sides.\n\n'
                    'Related options: [vmar_peers] discover.'),
]
