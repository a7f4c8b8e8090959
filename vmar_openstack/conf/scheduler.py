"""``[vmar_scheduler]``: the scheduler's ``vmar`` weigher (nova-scheduler).

Read from nova.conf by nova-scheduler once ``[filter_scheduler]
weight_classes`` names
``vmar_openstack.nova_scheduler.weigher.VmarWeigher``; the weigher reads
the hosts' reports from the cluster database (``[vmar_database]
connection``), see doc/source/admin/scheduling.rst.
"""

from oslo_config import cfg

GROUP = cfg.OptGroup(
    'vmar_scheduler', title='VMAR scheduler weigher',
    help='Placing vmar servers on the hosts that already hold most of '
         'their image.')

scheduler_opts = [
    cfg.FloatOpt('weight_multiplier', default=5.0,
                 help='Multiplier of the vmar weigher: a host\'s weight is '
                      'the share of the image\'s canonical blocks it holds '
                      '(0 to 1) times this. The default outweighs Nova\'s '
                      'spreading weighers (RAM, CPU and disk, 1.0 each), '
                      'so a vmar server goes where its image is, unless '
                      'the hosts hold about as much of it. 0 turns the '
                      'weigher off; an aggregate overrides it with its '
                      '``vmar_weight_multiplier`` metadata.'),
]

ALL_OPTS = scheduler_opts
