"""``[vmar_host]``: a compute host's export daemon, ``vmar-export serve``.

Read from the daemon's own configuration file
(``etc/vmar/vmar-export.conf.sample``), together with ``[vmar_reports]``,
``[vmar_glance]`` or ``[vmar_rbd]`` (where the host's maps and bases come
from) and ``[vmar_metrics]``. ``vmar-nova-compute`` reads none of them:
it asks the daemon (``[vmar_compute]``). The options were in ``[vmar]``
before; a file that still has them there is read, with a warning.
"""

import socket

from oslo_config import cfg

GROUP = cfg.OptGroup(
    'vmar_host', title='VMAR compute host daemon',
    help='vmar-export serve: the one process that changes a compute '
         'host\'s exports, maps, mirrors and bases, and runs the patched '
         'qemu-storage-daemon.')

_OLD = 'vmar'


def _opt(cls, name, **kwargs):
    """An option of the group, read from ``[vmar]`` too (its old home)."""
    kwargs.setdefault('deprecated_group', _OLD)
    return cls(name, **kwargs)


daemon_opts = [
    _opt(cfg.StrOpt, 'host_dir', default='/var/lib/vmar/host',
         help='vmar-owned directory holding the maps, digest lists, '
              'mirrors and base files the host exports, and the export '
              'record. Keep it outside Nova\'s instances/_base directory.'
              '\n\nPossible values: a directory, on a file system with '
              'room for mirror_cache_gb and the bases copied whole.\n\n'
              'Related options: mirror_cache_gb, map_source_dir.'),
    _opt(cfg.StrOpt, 'export_socket', default='/run/vmar/nbd.sock',
         help='Unix socket on which the daemon serves one NBD export per '
              'holder of an image\'s map version. Instances\' overlays name '
              'it in their backing URI, so changing it strands running '
              'instances.\n\nPossible values: a path.\n\n'
              'Related options: export_socket_group, api_socket.'),
    _opt(cfg.StrOpt, 'export_socket_group',
         help='Group that owns the NBD socket (mode 0660): the group QEMU '
              'runs as.\n\nPossible values: a group name; unset, root\'s '
              'group.\n\nRelated options: export_socket, '
              'api_socket_group.'),
    cfg.StrOpt('api_socket',
               sample_default='<directory of export_socket>/api.sock',
               help='Unix socket of the host API, where vmar-export '
                    'add/remove/release/list/status and vmar-nova-compute '
                    'ask the daemon.\n\nPossible values: a path; unset, '
                    'api.sock in the directory of export_socket.\n\n'
                    'Related options: [vmar_compute] api_socket (the same '
                    'path, as nova-compute sees it), api_socket_group.'),
    cfg.StrOpt('api_socket_group',
               help='Group that owns the host API socket (mode 0660): the '
                    'user vmar-nova-compute runs as must be in it, or be '
                    'root. Callers outside it, and not root, are refused. '
                    'A member can export any image of the host, so never '
                    'give it the group QEMU runs as.\n\n'
                    'Possible values: a group name; unset, root alone may '
                    'call the API.\n\n'
                    'Related options: api_socket, export_socket_group.'),
    _opt(cfg.StrOpt, 'qemu_storage_daemon', default='qemu-storage-daemon',
         help='The patched qemu-storage-daemon with the vmar drivers, as '
              'built by qemu/build.sh (its prefix/bin).\n\n'
              'Possible values: a path, or a name on PATH.'),
    _opt(cfg.StrOpt, 'qemu_img', default='qemu-img',
         help='qemu-img the daemon inspects and converts fetched bases '
              'with (map_source=glance, images not in raw format).\n\n'
              'Possible values: a path, or a name on PATH.'),
    _opt(cfg.StrOpt, 'base_aio', default='io_uring',
         choices=['threads', 'native', 'io_uring'],
         help='How the daemon reads base files: a thread pool, Linux AIO '
              '(O_DIRECT exports only; buffered ones use threads) or '
              'io_uring.'),
    _opt(cfg.IntOpt, 'read_gather_gap', default=0, min=0, max=32768,
         help='Runs of one read that lie at most this many bytes apart in '
              'one base file are read with one read. Above 0 the bytes in '
              'between are read too, and they are blocks that maps serve '
              'from elsewhere: faster sequential reads for a less '
              'deduplicated host cache.\n\nPossible values: 0 to 32768.'),
    _opt(cfg.HostDomainOpt, 'host', default=socket.gethostname(),
         sample_default='<current hostname>',
         help='Name of this compute host in its reports to vmar-agent.\n\n'
              'Possible values: nova-compute\'s [DEFAULT] host, where that '
              'is not the hostname.\n\nRelated options: report_interval.'),
    _opt(cfg.IntOpt, 'report_interval', default=60, min=0,
         help='Seconds between reports of the host\'s exports to '
              'vmar-agent (oslo.messaging notifications), which removes old '
              'map versions only once no host holds them.\n\n'
              'Possible values: seconds; 0, or no transport_url, sends no '
              'reports.\n\nRelated options: report_change_delay, '
              '[vmar_reports] report_topic.'),
    cfg.FloatOpt('report_change_delay', default=1.0, min=0,
                 help='Seconds after an export is added or removed before '
                      'the host reports its exports, rather than at the '
                      'next report_interval. The scheduler\'s vmar weigher '
                      'places the next servers of a burst by what hosts '
                      'reported: with only periodic reports, a burst is '
                      'placed as if no host held its image until the next '
                      'report. Changes within this delay go in one report, '
                      'so a host sends at most one report per delay; the '
                      'periodic report comes report_interval after the '
                      'last one.\n\nPossible values: seconds; 0 reports '
                      'changes only at the next report_interval.\n\n'
                      'Related options: report_interval.'),
    cfg.PortOpt('metrics_port', default=0,
                deprecated_name='export_port',
                deprecated_group='vmar_metrics',
                help='Port of the daemon\'s Prometheus /metrics.\n\n'
                     'Possible values: a port; 0, no endpoint.\n\n'
                     'Related options: [vmar_metrics] bind_host.'),
    cfg.IntOpt('warm_metadata_mb', default=128, min=0,
               help='MiB of the file-system metadata of the bases the host '
                    'serves (host_cache=base exports) that the daemon keeps '
                    'locked in the page cache: superblocks, descriptors, '
                    'bitmaps, inode tables, directories, extent trees, as '
                    'each image\'s block layout (published by vmar-agent) '
                    'names them; blocks shared by more images first. Idle '
                    'reclaim and memory pressure then leave them, so every '
                    'guest\'s find, du, package manager and service start '
                    'finds them in memory. A lazy mirror\'s blocks are '
                    'locked once present. The daemon needs RLIMIT_MEMLOCK '
                    'for it (LimitMEMLOCK= of its unit) unless it runs as '
                    'root. The pages are memory of their own, beside the '
                    'page cache the host keeps for data: about 8-11 MiB '
                    'an image for images built apart, far less for images '
                    'derived from one another.\n\nPossible values: MiB; '
                    '0 keeps nothing (and costs nothing).\n\nRelated '
                    'options: warm_interval.'),
    cfg.IntOpt('warm_interval', default=30, min=1,
               help='Seconds between passes that re-plan the metadata kept '
                    'warm (exports added or removed re-plan at once; a '
                    'pass locks what lazy mirrors fetched since).\n\n'
                    'Related options: warm_metadata_mb.'),
]

source_opts = [
    _opt(cfg.StrOpt, 'map_source', default='dir', choices=[
        ('dir', 'Copy maps and bases from map_source_dir.'),
        ('glance', 'Download maps (hidden images published by vmar-agent) '
                   'and bases from Glance, with [vmar_glance] credentials; '
                   'bases in Glance\'s RBD store are read from Ceph with '
                   '[vmar_rbd] credentials.')],
         help='Where the host gets maps and base files.\n\n'
              'Related options: map_source_dir, [vmar_glance], '
              '[vmar_rbd], base_fetch.'),
    _opt(cfg.StrOpt, 'map_source_dir', default='/var/lib/vmar',
         help='map_source=dir: a library directory with maps/ and bases/ '
              '(the library\'s [vmar] state_dir), local or shared.\n\n'
              'Related options: map_source, host_dir (never the same '
              'directory).'),
    _opt(cfg.StrOpt, 'base_fetch', default='lazy', choices=[
        ('full', 'Copy a whole base before the first export that reads '
                 'it.'),
        ('lazy', 'Keep a sparse mirror of each base, filled on demand with '
                 'the blocks reads need, each verified against the '
                 'library\'s digest list (doc/source/admin/export.rst). Other '
                 'formats than raw and qcow2, and exports with '
                 'host_cache=none, copy whole bases.')],
         help='How the host gets the base files its exports read.\n\n'
              'Related options: mirror_cache_gb, prefetch, fill.'),
    _opt(cfg.IntOpt, 'mirror_readahead', default=0, min=0, max=16777216,
         help='base_fetch=lazy: bytes of missing blocks fetched after a '
              'missing run that ends a read. With the prefetch of boot '
              'working sets, read-ahead bought no time and cost bytes '
              '(bench/RESULTS.md, bench_coldhost.py).\n\n'
              'Possible values: 0 to 16777216.'),
    _opt(cfg.StrOpt, 'nbdkit', default='nbdkit',
         help='base_fetch=lazy with map_source=glance: the nbdkit binary '
              '(with its python plugin) the daemon runs to read byte ranges '
              'of Glance images.\n\nPossible values: a path, or a name on '
              'PATH.'),
    _opt(cfg.IntOpt, 'fetch_retries', default=3, min=0,
         help='base_fetch=lazy with map_source=glance: times a failed range '
              'read from Glance is tried again (1 s apart) before the read '
              'fails and the guest pauses; vmar-nova-compute resumes it, '
              'which tries again.'),
    _opt(cfg.IntOpt, 'mirror_cache_gb', default=20, min=0,
         help='base_fetch=lazy: GiB of disk the mirrors may fill before '
              'mirrors no export reads are evicted, least recently used '
              'first. Mirrors that exports read are never evicted.\n\n'
              'Possible values: GiB; 0 deletes a mirror as soon as no '
              'export reads it.'),
    _opt(cfg.BoolOpt, 'prefetch', default=True,
         help='base_fetch=lazy: when the first export of an image is '
              'added, read the image\'s boot working set (published by '
              'vmar-agent) into the mirrors in large sorted reads.\n\n'
              'Related options: prefetch_gap, prefetch_request, '
              'bootset_record_window.'),
    _opt(cfg.IntOpt, 'bootset_record_window', default=120, min=0,
         max=3600,
         help='base_fetch=lazy: when an image has no recorded boot working '
              'set yet, record the blocks its new exports read during this '
              'many seconds after their first read, and report them to '
              'vmar-agent, which publishes the first as the image\'s set.\n\n'
              'Possible values: seconds; 0 never records.'),
    _opt(cfg.IntOpt, 'prefetch_gap', default=0, min=0, max=16777216,
         help='Prefetch: runs of canonical blocks of one base up to this '
              'many bytes apart are read with one request (the gap is '
              'fetched too).'),
    _opt(cfg.IntOpt, 'prefetch_request', default=4194304, min=65536,
         max=67108864,
         help='Prefetch: largest read, in bytes.'),
    _opt(cfg.BoolOpt, 'fill', default=True,
         help='base_fetch=lazy: fill_delay seconds after the first export '
              'of an image is added, read every block its map reads into '
              'the mirrors, in the background, at most fill_rate: from then '
              'on its servers need the store no more than stock Nova\'s '
              'servers need Glance.\n\n'
              'Related options: fill_delay, fill_rate.'),
    _opt(cfg.IntOpt, 'fill_delay', default=600, min=0,
         help='Fill: seconds after an image\'s first export is added '
              'before its fill starts (boots read first, and short-lived '
              'servers cost no fill).'),
    _opt(cfg.IntOpt, 'fill_rate', default=20, min=0,
         help='Fill: MB/s at most, per fill; one fill runs at a time.\n\n'
              'Possible values: MB/s; 0, no limit.'),
]

ALL_OPTS = daemon_opts + source_opts
