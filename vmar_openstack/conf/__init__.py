"""Configuration options of vmar-openstack, and nothing else.

Every option lives here, in two groups: ``[vmar]`` for the library and the
hosts, ``[vmar_database]`` for the cluster database. :func:`list_opts` is the
``oslo.config.opts`` entry point used by ``oslo-config-generator``.
"""

import os

from keystoneauth1 import loading as ks_loading
from oslo_config import cfg

CONF = cfg.CONF

vmar_group = cfg.OptGroup(
    'vmar', title='VMAR options',
    help='Block fingerprinting, deduplication scope and map storage.')

database_group = cfg.OptGroup(
    'vmar_database', title='VMAR cluster database',
    help='Where the VMAR cluster tables live.')

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


vmar_opts = [
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
    # compute host: the export service
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
    cfg.StrOpt('map_source', default='dir', choices=[
        ('dir', 'Copy maps and bases from map_source_dir.'),
        ('glance', 'Download maps (hidden images published by vmar-agent) '
                   'and bases from Glance, with [vmar_glance] credentials.')],
               help='Where a compute host gets maps and base files.'),
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

database_opts = [
    cfg.StrOpt('connection', secret=True,
               default='sqlite:///$vmar.state_dir/vmar.sqlite',
               help='SQLAlchemy URL of the cluster database, for example '
                    'sqlite:////var/lib/vmar/vmar.sqlite, '
                    'mysql+pymysql://vmar:secret@db/vmar or '
                    'postgresql+psycopg2://vmar:secret@db/vmar.'),
    cfg.IntOpt('lock_timeout', default=600, min=1,
               help='Seconds a mutation waits for the library lock held by '
                    'another ingest before it fails.'),
    cfg.BoolOpt('connection_debug', default=False,
                help='Log every SQL statement.'),
]


glance_group = cfg.OptGroup(
    'vmar_glance', title='VMAR access to Glance',
    help='How vmar-agent and compute hosts reach Glance (keystoneauth '
         'session, auth and adapter options).')

glance_opts = [
    cfg.StrOpt('map_owner',
               help='Project that owns the map images vmar-agent publishes '
                    '(the agent\'s project). Hosts ignore map images owned by '
                    'anyone else. Unset: the project of these credentials, '
                    'as Glance reports it.'),
    cfg.IntOpt('chunk_size', default=4 * 1024 * 1024, min=65536,
               help='Bytes per read when streaming images from Glance.'),
    cfg.IntOpt('map_wait', default=300, min=0,
               help='Compute hosts: seconds to wait for vmar-agent to '
                    'publish the map of an image that is active in Glance '
                    'but has none yet (a snapshot just taken by shelve, '
                    'an image just uploaded) before the boot fails.'),
]

agent_group = cfg.OptGroup(
    'vmar_agent', title='vmar-agent',
    help='The Glance notification agent.')

agent_opts = [
    cfg.StrOpt('exchange', default='glance',
               help='Exchange Glance notifications are sent to.'),
    cfg.ListOpt('topics', default=['notifications'],
                help='Notification topics to listen on.'),
    cfg.StrOpt('pool', default='vmar-agent',
               help='Listener pool: every agent of the pool shares one queue, '
                    'so no other consumer (ceilometer) loses messages.'),
    cfg.IntOpt('max_attempts', default=5, min=1,
               help='Attempts at an image before it is recorded as failed '
                    'and not retried.'),
    cfg.StrOpt('local_store_dir',
               help='The directory of a Glance file store on this host '
                    '([fs] filesystem_store_datadir). Images found there, '
                    'with the size Glance reports, are ingested in place '
                    'instead of downloaded.'),
    cfg.IntOpt('resync_interval', default=300, min=0,
               help='Seconds between comparisons of the library with '
                    'Glance\'s active images, which ingest what a lost '
                    'notification missed and remove what is gone. 0: never.'),
    cfg.IntOpt('shutdown_timeout', default=10, min=0,
               help='Seconds to let the notification in hand finish on '
                    'SIGTERM. An unfinished one is redelivered later.'),
    cfg.FloatOpt('retry_delay', default=2.0, min=0,
                 help='Seconds before the first retry; doubled each time.'),
]


def _glance_ks_opts():
    return (ks_loading.get_session_conf_options()
            + ks_loading.get_auth_common_conf_options()
            + ks_loading.get_auth_plugin_conf_options('password')
            + ks_loading.get_adapter_conf_options(include_deprecated=False))


def register_opts(conf=CONF):
    """Register the options on ``conf``.

    Each ConfigOpts gets its own OptGroup objects: an OptGroup holds the
    per-option state (overrides included), so sharing one between two
    ConfigOpts would leak overrides from one into the other.
    """
    for group, opts in ((vmar_group, vmar_opts + import_opts),
                        (database_group, database_opts),
                        (glance_group, glance_opts),
                        (agent_group, agent_opts)):
        conf.register_group(cfg.OptGroup(group.name, title=group.title,
                                         help=group.help))
        conf.register_opts(opts, group=group.name)
    ks_loading.register_session_conf_options(conf, glance_group.name)
    ks_loading.register_auth_conf_options(conf, glance_group.name)
    ks_loading.register_adapter_conf_options(conf, glance_group.name,
                                             include_deprecated=False)
    conf.set_default('service_type', 'image', group=glance_group.name)
    # no Glance call may hang an agent (which may hold the library lock)
    conf.set_default('timeout', 120, group=glance_group.name)


def list_opts():
    """Return the options for oslo-config-generator."""
    return [(vmar_group, vmar_opts + import_opts),
            (database_group, database_opts),
            (glance_group, glance_opts + _glance_ks_opts()),
            (agent_group, agent_opts)]


register_opts()
