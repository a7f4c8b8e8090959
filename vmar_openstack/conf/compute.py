"""``[vmar_compute]``: what ``vmar-nova-compute`` reads from nova.conf.

nova-compute holds no Glance or Ceph credentials for vmar and speaks no
QMP: it asks the host's export daemon over the host API
(:mod:`vmar_openstack.hostapi`), which has its own configuration file
(``[vmar_host]``). These options were in ``[vmar]`` before; a nova.conf
that still has them there is read, with a warning.
"""

from oslo_config import cfg

GROUP = cfg.OptGroup(
    'vmar_compute', title='VMAR in nova-compute',
    help='The vmar image backend of vmar-nova-compute: how it reaches the '
         'host\'s export daemon, and what it does on its own.')

ALL_OPTS = [
    cfg.StrOpt('api_socket', default='/run/vmar/api.sock',
               help='Unix socket of the host API of vmar-export serve, '
                    'the one process that changes the host\'s exports. '
                    'nova-compute must be root or in the socket\'s group '
                    '([vmar_host] api_socket_group on the daemon\'s side).'
                    '\n\nPossible values: a path.\n\n'
                    'Related options: [vmar_host] api_socket (the daemon\'s '
                    'side; by default api.sock beside its export_socket).'),
    cfg.IntOpt('api_timeout', default=360, min=1,
               help='Seconds a call of the host API may take, the daemon\'s '
                    'own work included: an add whose map or digest list is '
                    'still on its way waits for it in the daemon, up to the '
                    'daemon\'s [vmar_glance] map_wait. A spawn past it '
                    'fails with the reason.\n\n'
                    'Possible values: seconds, above the daemon\'s '
                    'map_wait.\n\nRelated options: api_socket.'),
    cfg.IntOpt('resume_interval', default=2, min=0,
               deprecated_group='vmar',
               help='Every this many seconds, resume the guests that libvirt '
                    'paused on an I/O error of a vmar disk (the export '
                    'daemon restarted, say) once the daemon serves their '
                    'exports again.\n\nPossible values: seconds; 0, never '
                    '(an operator resumes them).'),
    cfg.StrOpt('qemu_img', default='qemu-img', deprecated_group='vmar',
               help='qemu-img that makes and inspects the instances\' qcow2 '
                    'overlays.\n\nPossible values: a path, or a name on '
                    'PATH.'),
    cfg.BoolOpt('snapshot_delta', default=True,
                help='Snapshots (and shelve) of a vmar server send Glance '
                     'only the blocks the server changed, with the image '
                     'it was booted from: glance-api builds the whole image '
                     '(the vmar_mapgen import plugin, glance-direct). On any '
                     'failure of that route the snapshot falls back to '
                     'Nova\'s own, which uploads the whole disk.\n\n'
                     'Possible values: true (default); false, always Nova\'s '
                     'own route.\n\nRelated options: snapshot_import_timeout; '
                     'glance-api\'s enabled_import_methods must list '
                     'glance-direct and image_import_plugins vmar_mapgen.'),
    cfg.IntOpt('snapshot_import_timeout', default=1800, min=1,
               help='Seconds a snapshot waits for glance-api to build and '
                    'store the image from its delta. Past it the snapshot '
                    'fails (and Nova deletes the image).\n\n'
                    'Possible values: seconds.\n\nRelated options: '
                    'snapshot_delta.'),
    cfg.IntOpt('guest_reporting_order', min=-1, max=10,
               help='The page reporting order vmar-guest sets in '
                    'guest-private and auto servers while they drop base '
                    'data (SMBIOS OEM string vmar:guest_reporting_order): '
                    'free page reporting hands the host free blocks of '
                    '2^order pages. The pages vmar-guest frees are '
                    'scattered 4 KiB pages, so only a low order returns '
                    'them (doc/source/admin/guest.rst has the figures).\n\n'
                    'Possible values: unset, vmar-guest\'s default (0); '
                    '-1, the guest kernel\'s own (9 on x86: whole 2 MiB '
                    'blocks, which keeps the host\'s huge pages whole); '
                    '0 to 10.'),
]
