"""Sample configuration of glance-api for vmar (oslo-config-generator).

The options below are Glance's own (and oslo.messaging's), shown with the
values vmar needs; they are not registered by vmar. The generated samples
are ``etc/glance/glance-api.conf.sample`` and
``etc/glance/glance-image-import.conf.sample``.
"""

from oslo_config import cfg

from vmar_openstack.conf import database
from vmar_openstack.conf import vmar

PLUGIN_VMAR_OPTS = ('state_dir', 'map_dir', 'work_dir', 'block_size',
                    'hash_algorithm', 'dedup_scope', 'hash_workers',
                    'qemu_img', 'max_virtual_size_gb',
                    'mapgen_failure_fatal')


def list_api_opts():
    return [
        ('DEFAULT', [cfg.ListOpt(
            'enabled_import_methods',
            default=['glance-direct', 'web-download'],
            help='Glance option. The import methods that run the '
                 'vmar_mapgen plugin.')]),
        ('oslo_messaging_notifications', [cfg.MultiStrOpt(
            'driver', default=['messagingv2'],
            help='oslo.messaging option. vmar-agent needs Glance\'s '
                 'notifications: without messagingv2 plain uploads '
                 '(openstack image create --file) are never ingested.')]),
    ]


def list_import_opts():
    plugin = [o for o in vmar.ALL_OPTS if o.name in PLUGIN_VMAR_OPTS]
    return [
        ('image_import_opts', [cfg.ListOpt(
            'image_import_plugins', default=['vmar_mapgen'],
            help='Glance option. Add vmar_mapgen to the plugins you use.')]),
        (vmar.GROUP, plugin),
        (database.GROUP, database.ALL_OPTS),
    ]
