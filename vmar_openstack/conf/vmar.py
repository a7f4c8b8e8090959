"""``[vmar]``: the image library, and the export service of compute hosts.

``library_opts`` are read where images are ingested (``vmar-manage``,
``vmar-agent``, the Glance import plugin), ``host_opts`` on compute hosts
(``vmar-export``, ``vmar-nova-compute``), ``import_opts`` by the Glance
import plugin only.
"""

import os
import socket

from oslo_config import cfg

GROUP = cfg.OptGroup(
    'vmar', title='VMAR options',
    help='Block fingerprinting, deduplication scope and map storage.')

HASH_ALGORITHMS = ('sha256', 'sha512', 'sha1', 'blake2b')
DEDUP_SCOPES = ('project', 'public', 'global')


def _power_of_two(value):
    return value > 0 and value & (value - 1) == 0


class BlockSize(cfg.types.Integer):
    """A power of two between 4 KiB and 2 MiB."""

    def __init__(self):
        super().__init__(min=4096, max=2 * 1024 * 1024,
                         type_name='power-of-two integer')

    def __call__(self, value):
        value = super().__call__(value)
        if not _power_of_two(value):
            raise ValueError('block size %d is not a power of two' % value)
        return value


library_opts = [
    cfg.StrOpt('state_dir', default='/var/lib/vmar',
               help='Directory for VMAR state: the embedded database, maps '
                    'and base files unless configured elsewhere.'),
    cfg.StrOpt('map_dir', default='$state_dir/maps',
               help='Directory where block maps are written. Maps are '
                    'immutable files named <image id>.<version>.vmap.'),
    cfg.StrOpt('base_dir', default='$state_dir/bases',
               help='Directory holding the raw content of each ingested '
                    'image, named by image id. Maps point into these '
                    'files.'),
    cfg.StrOpt('digest_dir', default='$state_dir/digests',
               help='Directory where the digest list of each base in '
                    'base_dir is written (<image id>.vdig, '
                    'doc/source/mirror-format.rst): hosts that fill base '
                    'mirrors on demand check every fetched block against '
                    'it. Written for hash_algorithm sha256 only. The '
                    'boot working set of each image (<image id>.vboot), '
                    'which hosts prefetch, is written next to it.'),
    cfg.StrOpt('work_dir', default='$state_dir/tmp',
               help='Scratch directory for converting non-raw images to raw '
                    'before hashing. Needs room for the virtual size of the '
                    'largest image (sparse).'),
    cfg.Opt('block_size', type=BlockSize(), default=4096,
            help='Fingerprint block size in bytes for newly ingested images; '
                 'a power of two from 4096 to 2097152. Recorded per image; '
                 'images of different block sizes never share blocks.'),
    cfg.StrOpt('hash_algorithm', default='sha256', choices=HASH_ALGORITHMS,
               help='Fingerprint hash for newly ingested images. Recorded '
                    'per image; images hashed differently never share '
                    'blocks.'),
    cfg.StrOpt('dedup_scope', default='project', choices=[
        ('project', 'An image may redirect reads to public images and to '
                    'images of its own owner.'),
        ('public', 'An image may redirect reads to public images and to '
                   'itself only.'),
        ('global', 'An image may redirect reads to any image. Reads of one '
                   'tenant may then be served from another tenant\'s '
                   'private image.')],
               help='Which images a map may point into.'),
    cfg.IntOpt('hash_workers', default=os.cpu_count() or 1, min=1,
               sample_default='<number of CPUs>',
               help='Threads (native hasher) or processes (hashlib '
                    'fallback) that hash an image in parallel.'),
    cfg.StrOpt('qemu_img', default='qemu-img',
               help='qemu-img binary used to inspect and convert non-raw '
                    'images.'),
    cfg.IntOpt('max_virtual_size_gb', default=2048, min=1,
               help='Largest virtual size accepted for an image, in GiB.'),
]

host_opts = [
    cfg.StrOpt('host_dir', default='$state_dir/host',
               help='vmar-owned directory on a compute host holding the maps '
                    'and base files it exports, and the export state. Keep '
                    'it outside Nova\'s instances/_base directory.'),
    cfg.StrOpt('export_socket', default='/run/vmar/nbd.sock',
               help='Unix socket on which vmar-export serves one NBD export '
                    'per image, named by image id.'),
    cfg.StrOpt('export_socket_group',
               help='Group that owns the export socket (mode 0660), for '
                    'example the group QEMU runs as. Unset: root\'s group.'),
    cfg.StrOpt('api_socket',
               sample_default='<directory of export_socket>/api.sock',
               help='Unix socket of the host API of vmar-export serve, '
                    'the one process that changes the host\'s exports: '
                    'vmar-export add/remove/release/list/status and '
                    'vmar-nova-compute call it.\n\n'
                    'Possible values: a path; unset, api.sock in the '
                    'directory of export_socket.\n\n'
                    'Related options: export_socket, api_socket_group, '
                    'api_timeout.'),
    cfg.StrOpt('api_socket_group',
               help='Group that owns the host API socket (mode 0660): '
                    'the user vmar-nova-compute runs as must be in it, or '
                    'be root. Callers outside it, and not root, are '
                    'refused. A member can export any image of the host, '
                    'so never give it the group QEMU runs as.\n\n'
                    'Possible values: a group name; unset, root alone may '
                    'call the API.\n\n'
                    'Related options: api_socket, export_socket_group.'),
    cfg.IntOpt('api_timeout', default=360, min=1,
               help='Seconds a call of the host API may take, the '
                    'daemon\'s own work included: an add whose map or '
                    'digest list is still on its way waits for it in the '
                    'daemon, up to [vmar_glance] map_wait there.\n\n'
                    'Possible values: seconds; keep it above the daemon\'s '
                    'map_wait.\n\n'
                    'Related options: api_socket.'),
    cfg.StrOpt('qemu_storage_daemon', default='qemu-storage-daemon',
               help='The patched qemu-storage-daemon with the vmar driver, '
                    'as built by qemu/build.sh (its prefix/bin).'),
    cfg.StrOpt('base_aio', default='io_uring',
               choices=['threads', 'native', 'io_uring'],
               help='How the export daemon reads base files: a thread pool, '
                    'Linux AIO (O_DIRECT only) or io_uring.'),
    cfg.IntOpt('read_gather_gap', default=0, min=0, max=32768,
               help='Runs of one read that lie at most this many bytes '
                    'apart in one base file are read with one read. Above 0 '
                    'the bytes in between are read too, and they are blocks '
                    'that maps serve from elsewhere: faster sequential reads '
                    'for a less deduplicated host cache.'),
    cfg.IntOpt('resume_interval', default=2, min=0,
               help='vmar-nova-compute: every this many seconds, resume '
                    'the guests that libvirt paused on an I/O error of a '
                    'vmar disk (its export daemon died, say) once their '
                    'exports are served again. 0: never; an operator '
                    'resumes them.'),
    cfg.HostDomainOpt('host', default=socket.gethostname(),
                      sample_default='<current hostname>',
                      help='Name of this compute host in its reports to '
                           'vmar-agent. Set it to nova-compute\'s [DEFAULT] '
                           'host where that is not the hostname.'),
    cfg.IntOpt('report_interval', default=60, min=0,
               help='vmar-export serve: seconds between reports of the '
                    'host\'s exports to vmar-agent (oslo.messaging '
                    'notifications on report_topic), which '
                    'removes old map versions only once no host holds '
                    'them. 0, or no transport_url: no reports.'),
    cfg.StrOpt('report_topic', default='vmar_host_reports',
               help='Notification topic, on the control exchange, of the '
                    'reports of compute hosts (vmar-export sends them, '
                    'vmar-agent listens).'),
    cfg.StrOpt('map_source', default='dir', choices=[
        ('dir', 'Copy maps and bases from map_source_dir.'),
        ('glance', 'Download maps (hidden images published by vmar-agent) '
                   'and bases from Glance, with [vmar_glance] credentials.')],
               help='Where a compute host gets maps and base files.'),
    cfg.StrOpt('base_fetch', default='lazy', choices=[
        ('full', 'Copy a whole base before the first export that reads '
                 'it (the behaviour before lazy mirrors).'),
        ('lazy', 'Keep a sparse mirror of each base, filled on demand '
                 'with the blocks reads need, each verified against the '
                 'library\'s digest list (doc/source/export.rst). '
                 'map_source=dir reads the library\'s bases; '
                 'map_source=glance reads byte ranges of raw and qcow2 '
                 'Glance images through nbdkit. Other formats, and '
                 'exports with host_cache=none, copy whole bases.')],
               help='How a compute host gets the base files its exports '
                    'read.'),
    cfg.IntOpt('mirror_readahead', default=0, min=0, max=16777216,
               help='base_fetch=lazy: bytes of missing blocks fetched '
                    'after a missing run that ends a read. With the '
                    'prefetch of boot working sets, read-ahead bought no '
                    'time and cost bytes (bench/RESULTS.md, '
                    'bench_coldhost.py).'),
    cfg.StrOpt('nbdkit', default='nbdkit',
               help='base_fetch=lazy with map_source=glance: the nbdkit '
                    'binary (Debian\'s, with its python plugin) that '
                    'vmar-export serve runs to read byte ranges of Glance '
                    'images.'),
    cfg.IntOpt('fetch_retries', default=3, min=0,
               help='base_fetch=lazy with map_source=glance: times a failed '
                    'range read from Glance is tried again (1 s apart, '
                    'nbdkit\'s retry-request filter) before the read fails '
                    'and the guest pauses; vmar-nova-compute resumes it, '
                    'which tries again.'),
    cfg.IntOpt('mirror_cache_gb', default=20, min=0,
               help='base_fetch=lazy: GiB of disk the mirrors of a host may '
                    'fill before mirrors no export reads are evicted, least '
                    'recently used first (a later export of their images '
                    'then fetches again). Mirrors that exports read are '
                    'never evicted. 0: delete a mirror as soon as no export '
                    'reads it.'),
    cfg.BoolOpt('prefetch', default=True,
                help='base_fetch=lazy: when the first export of an image '
                     'is added, vmar-export serve reads the image\'s boot '
                     'working set (published by vmar-agent) into the '
                     'mirrors in large sorted reads, beside the guest\'s '
                     'own reads.'),
    cfg.IntOpt('bootset_record_window', default=120, min=0, max=3600,
               help='base_fetch=lazy: when an image has no recorded boot '
                    'working set yet, the host records the blocks its new '
                    'exports read during this many seconds after their '
                    'first read, and reports them to vmar-agent (with the '
                    'export reports, report_interval), which publishes the '
                    'first as the image\'s set. 0: never record.'),
    cfg.IntOpt('prefetch_gap', default=0, min=0, max=16777216,
               help='Prefetch: runs of canonical blocks of one base up to '
                    'this many bytes apart are read with one request (the '
                    'gap is fetched too; zero blocks in it cost nothing). '
                    'The reads are pipelined 16 deep, so merging saves '
                    'little time and costs bytes (bench/RESULTS.md).'),
    cfg.IntOpt('prefetch_request', default=4194304, min=65536,
               max=67108864,
               help='Prefetch: largest read, in bytes.'),
    cfg.BoolOpt('fill', default=True,
                help='base_fetch=lazy: fill_delay seconds after the first '
                     'export of an image is added, vmar-export serve reads '
                     'every block its map reads into the mirrors, in the '
                     'background, at most fill_rate: from then on its '
                     'servers need the store no more than stock Nova\'s '
                     'servers need Glance, and the image can be deleted '
                     'from Glance under them (its own blocks go with it). '
                     'Off: a block no guest read yet is fetched when one '
                     'does, for as long as the export lives.'),
    cfg.IntOpt('fill_delay', default=600, min=0,
               help='Fill: seconds after an image\'s first export is added '
                    'before its fill starts (boots read first, and '
                    'short-lived servers cost no fill).'),
    cfg.IntOpt('fill_rate', default=20, min=0,
               help='Fill: MB/s at most, per fill (QEMU\'s throttle '
                    'filter); one fill runs at a time. 0: no limit.'),
    cfg.StrOpt('map_source_dir', default='$state_dir',
               help='For map_source=dir: a library directory with maps/ and '
                    'bases/ subdirectories (a library\'s state_dir).'),
]


import_opts = [
    cfg.BoolOpt('mapgen_failure_fatal', default=False,
                help='Glance import plugin: fail the import when mapgen '
                     'fails. By default the import succeeds, the failure is '
                     'logged and recorded in the image property '
                     'vmar_mapgen_error, and vmar-agent retries it.'),
]

ALL_OPTS = library_opts + host_opts + import_opts
