"""``[vmar_guest_cache]``: the export daemon's side of guest-private caching.

The daemon (``vmar-export serve``) talks to the guest component of every
server whose flavor asks for guest-private caching (``private``) or leaves
it to the host (``auto``), over a virtio-serial channel per server, and
decides the mode of the ``auto`` ones from the host's memory pressure
(:mod:`vmar_openstack.host.guests.channels`; doc/source/admin/guest.rst).

The thresholds are mutable: a SIGHUP to ``vmar-export serve`` takes their
new values without a restart.
"""

from oslo_config import cfg

GROUP = cfg.OptGroup(
    'vmar_guest_cache', title='VMAR guest-private caching on the host',
    help='The channels to the guests of vmar:guest_cache=private and auto '
         'servers, and when the host turns auto servers guest-private.')

ALL_OPTS = [
    cfg.StrOpt('channel_dir', default='/run/vmar/guests',
               help='Directory of the guests\' channel sockets, one per '
                    'server, which QEMU creates (libvirt <channel '
                    'type=\'unix\'>). The daemon creates it, owned by '
                    '[vmar_host] export_socket_group (the group QEMU runs '
                    'as), mode 2770; nova-compute learns it from the '
                    'daemon.\n\nPossible values: a directory on a tmpfs.'
                    '\n\nRelated options: [vmar_host] export_socket_group.'),
    cfg.IntOpt('interval', default=5, min=0,
               help='Seconds between two looks at the host\'s memory '
                    'pressure and the guests\' channels.\n\n'
                    'Possible values: seconds; 0 turns the channels and '
                    'the auto policy off (auto servers keep their cache, '
                    'private ones still drop base data).'),
    cfg.StrOpt('pressure_file', default='/proc/pressure/memory',
               help='The PSI file whose "some avg10" is the memory '
                    'pressure.\n\nPossible values: /proc/pressure/memory '
                    '(the whole host); with cgroup v2, the memory.pressure '
                    'of the slice the guests run in (machine.slice).\n\n'
                    'Related options: pressure_high, pressure_low.'),
    cfg.FloatOpt('pressure_high', mutable=True, default=10.0, min=0.0,
                 max=100.0,
                 help='Auto servers go guest-private once the memory '
                      'pressure (percent of the last 10 s in which some '
                      'task waited for memory) reaches this.\n\n'
                      'Possible values: a percentage; 0 makes every auto '
                      'server guest-private at once.\n\n'
                      'Related options: pressure_low, min_available_mb.'),
    cfg.FloatOpt('pressure_low', mutable=True, default=1.0, min=0.0,
                 max=100.0,
                 help='Auto servers leave guest-private once the pressure '
                      'stayed below this for calm_seconds (and available '
                      'memory above min_available_mb).\n\n'
                      'Possible values: a percentage, at most '
                      'pressure_high.\n\nRelated options: pressure_high, '
                      'calm_seconds.'),
    cfg.IntOpt('min_available_mb', mutable=True, default=0, min=0,
               help='Auto servers also go guest-private while the host\'s '
                    'MemAvailable is under this many MiB, the watermark '
                    'that acts before reclaim stalls anyone.\n\n'
                    'Possible values: MiB; 0, pressure alone decides.\n\n'
                    'Related options: pressure_high.'),
    cfg.FloatOpt('guest_refault_mb', mutable=True, default=1.0, min=0.0,
                 help='An auto server also goes guest-private while its '
                      'own page cache is too small for what it reads: when '
                      'its guest reads again this many MiB a second of '
                      'file pages it had just reclaimed (workingset '
                      'refaults, which vmar-guest reports). Its overlay is '
                      'O_DIRECT, so such a guest reads its misses from the '
                      'disk; dropping base data leaves its memory to its '
                      'private data. It returns to its own caching once the '
                      'base data it read over calm_seconds would fit in its '
                      'free memory.\n\nPossible values: MiB a second; 0, '
                      'the host\'s pressure alone decides.\n\n'
                      'Related options: calm_seconds.'),
    cfg.IntOpt('calm_seconds', mutable=True, default=120, min=0,
               help='How long the pressure must stay low before auto '
                    'servers leave guest-private: a guest that flips back '
                    'fills its cache with base data again, which is what '
                    'caused the pressure.\n\nPossible values: seconds.\n\n'
                    'Related options: pressure_low.'),
]
