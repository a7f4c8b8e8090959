"""``[vmar_rbd]``: compute hosts reading bases straight from Ceph RBD.

With Glance on Ceph (glance_store's ``rbd`` store, ``show_image_direct_url
= True`` in glance-api.conf) a lazy host reads the blocks its mirrors miss
from the RBD snapshot Glance keeps of each image, with a Ceph user of its
own, instead of through glance-api (doc/source/admin/export.rst, "Glance on
Ceph").
"""

from oslo_config import cfg

GROUP = cfg.OptGroup(
    'vmar_rbd', title='VMAR reads from Ceph RBD',
    help='base_fetch=lazy with map_source=glance: read the blocks of images '
         'Glance stores in Ceph RBD straight from the cluster.')

rbd_opts = [
    cfg.StrOpt('ceph_conf',
               help='The host\'s Ceph configuration file (monitors, and '
                    'the keyring of ``user``). Unset: every block comes '
                    'through Glance\'s image data API.'),
    cfg.StrOpt('user', default='vmar',
               help='Ceph user (without ``client.``) the host reads with. '
                    'It needs no more than ``mon \'profile rbd\' osd '
                    '\'profile rbd-read-only pool=<Glance\'s pool>\'``.'),
    cfg.IntOpt('connect_timeout', default=10, min=1,
               help='Seconds to reach the monitors (librados '
                    '``client_mount_timeout``) before a read fails.'),
    cfg.IntOpt('op_timeout', default=30, min=1,
               help='Seconds an OSD or monitor request may take (librados '
                    '``rados_osd_op_timeout``, ``rados_mon_op_timeout``) '
                    'before the read fails and the guest pauses: without '
                    'a timeout a read waits as long as the cluster is '
                    'down, and the guest\'s own I/O timeouts fire.'),
]

ALL_OPTS = rbd_opts
