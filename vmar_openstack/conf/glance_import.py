"""``[vmar_import]``: the Glance import plugin ``vmar_mapgen`` alone.

Read in glance-api, from glance-image-import.conf, beside the library's
``[vmar]`` and ``[vmar_database]``.
"""

from oslo_config import cfg

GROUP = cfg.OptGroup(
    'vmar_import', title='VMAR Glance import plugin',
    help='The vmar_mapgen import plugin of glance-api.')

ALL_OPTS = [
    cfg.BoolOpt('mapgen_failure_fatal', default=False,
                deprecated_group='vmar',
                help='Fail the import when mapgen fails.\n\n'
                     'Possible values: false (default), the import '
                     'succeeds, the failure is logged and recorded in the '
                     'image property vmar_mapgen_error, and vmar-agent '
                     'retries it; true, the import fails.'),
]
