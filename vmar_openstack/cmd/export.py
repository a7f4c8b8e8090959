"""``vmar-export``: the per-host NBD export service of VMAR views.

Sub-commands: ``serve`` (run and supervise the patched
qemu-storage-daemon), ``add UUID``, ``remove UUID`` and ``list``.
"""

import sys

from oslo_log import log as logging

from vmar_openstack import cmd
from vmar_openstack import conf as vmar_conf
from vmar_openstack import export

CONF = vmar_conf.CONF
LOG = logging.getLogger(__name__)


def _service():
    return export.ExportService(CONF)


def serve():
    _service().serve()


def add():
    a = CONF.category
    exp = _service().add(a.id, host_cache=a.host_cache, holder=a.holder)
    print('exported %s (map v%d, host_cache=%s) on %s'
          % (exp.image_id, exp.map_version, exp.host_cache,
             CONF.vmar.export_socket))


def remove():
    a = CONF.category
    left = _service().remove(a.id, holder=a.holder)
    if left is None:
        print('removed export %s' % a.id)
    else:
        print('export %s kept for %s' % (a.id, ', '.join(left.holders)))


def list_exports():
    exports, live = _service().list()
    print('%-36s  %3s  %-10s  %-6s  %s'
          % ('image', 'map', 'host_cache', 'state', 'holders'))
    for image_id, exp in sorted(exports.items()):
        state = 'down' if live is None else (
            'up' if image_id in live else 'MISSING')
        print('%-36s  %3d  %-10s  %-6s  %s'
              % (image_id, exp.map_version, exp.host_cache, state,
                 ','.join(exp.holders)))


def add_command_parsers(subparsers):
    subparsers.add_parser('serve', help='run the export daemon'
                          ).set_defaults(func=serve)
    p = subparsers.add_parser('add', help='export an image')
    p.add_argument('id')
    p.add_argument('--host-cache', default='base',
                   choices=export.HOST_CACHE)
    p.add_argument('--holder', default='cli',
                   help='who holds this reference (e.g. an instance uuid)')
    p.set_defaults(func=add)
    p = subparsers.add_parser('remove', help='drop a reference to an export')
    p.add_argument('id')
    p.add_argument('--holder', default='cli')
    p.set_defaults(func=remove)
    subparsers.add_parser('list', help='list exports'
                          ).set_defaults(func=list_exports)


def main(argv=None):
    return cmd.run(CONF, 'vmar-export', add_command_parsers,
                   (export.ExportError, ValueError, OSError), argv)


if __name__ == '__main__':
    sys.exit(main())
