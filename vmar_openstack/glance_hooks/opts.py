"""Sample configuration of glance-api for vmar (oslo-config-generator).

The options below are Glance's own (and oslo.messaging's), shown with the
values vmar needs; they are not registered by vmar. The generated samples
are ``etc/glance/glance-api.conf.sample`` and
``etc/glance/glance-image-import.conf.sample``.
"""

from oslo_config import cfg

from vmar_openstack.conf import database
from vmar_openstack.conf import glance_import
from vmar_openstack.conf import vmar


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
    return [
        ('image_import_opts', [cfg.ListOpt(
            'image_import_plugins', default=['vmar_mapgen'],
            help='Glance option. Add vmar_mapgen to the plugins you use.')]),
        (vmar.GROUP, vmar.ALL_OPTS),
        (glance_import.GROUP, glance_import.ALL_OPTS),
        (database.GROUP, database.ALL_OPTS),
    ]
