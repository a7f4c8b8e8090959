"""``[vmar]``: the image library.

Read where images are ingested: ``vmar-manage``, ``vmar-agent`` and the
Glance import plugin. Compute hosts have groups of their own
(:mod:`.host`, :mod:`.compute`).
"""

import os

from oslo_config import cfg

GROUP = cfg.OptGroup(
    'vmar', title='VMAR options',
    help='The image library: block fingerprinting, deduplication scope '
         'and map storage. Read by vmar-manage, vmar-agent and the Glance '
         'import plugin.')

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
                    'doc/source/reference/mirror-format.rst): hosts that '
                    'fill base mirrors on demand check every fetched block '
                    'against '
                    'it. Written for hash_algorithm sha256 only. The '
                    'boot working set of each image (<image id>.vboot), '
                    'which hosts prefetch, is written next to it.'),
    cfg.StrOpt('digest_object_dir', default='$state_dir/digest-lists',
               help='Directory of the library\'s digest lists: one object '
                    'per list, named by its SHA-256 '
                    '(doc/source/reference/design.rst, "Digest lists"), '
                    'which the database names but does '
                    'not hold. Every process that changes or reads the '
                    'library (vmar-agent, vmar-manage, glance-api\'s import '
                    'plugin) must see the same directory.\n\nPossible '
                    'values: a directory; for agents on several hosts '
                    'sharing one MariaDB or PostgreSQL library, one they '
                    'all mount.\n\nRelated options: digest_cache_mb, '
                    'state_dir.'),
    cfg.IntOpt('digest_cache_mb', default=256, min=0,
               help='MiB of digest lists a process keeps once read (an '
                    'image\'s own and those of the images its map reads, '
                    'about 8 MiB per GiB of image data). Lists never '
                    'change, so a cached one is never stale.\n\nPossible '
                    'values: MiB; 0 reads every list from its object each '
                    'time.\n\nRelated options: digest_object_dir.'),
    cfg.IntOpt('content_log_seconds', default=3600, min=0,
               help='Seconds the library keeps, for each change of its '
                    'clusters, what the change was (for an add, filters '
                    'of the keys it inserted or moved: 2 bytes per key). An '
                    'ingest looks its blocks up in a snapshot while it '
                    'hashes; if adds committed meanwhile, it reads what '
                    'they changed here, and looks up again only its '
                    'blocks they touched, outside the library lock. An '
                    'ingest whose snapshot is older than this looks every '
                    'block up again.\n\nPossible values: seconds, longer '
                    'than the hashing of the largest image; 0 keeps '
                    'nothing (every stale snapshot is looked up '
                    'again).\n\nRelated options: [vmar_database] '
                    'lock_timeout.'),
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
    cfg.IntOpt('rewrite_at_once', default=64, min=0,
               help='Maps of other images a change of one image (delete, '
                    'new content, owner or visibility) rewrites once it '
                    'committed, before it returns: built in a read '
                    'snapshot and installed in a short locked '
                    'transaction, so that ingests do not wait for the '
                    'builds. The others are left pending and '
                    'vmar-agent rewrites them in the background, '
                    '[vmar_agent] pending_maps_per_minute at a time; until '
                    'then they keep reading what they read (a deleted '
                    'image\'s blocks are filled from the images that hold '
                    'them, see doc/source/admin/export.rst). The image '
                    'canonical for blocks every image holds is read by '
                    'every map of '
                    'the library.\n\nPossible values: 0 (every map waits '
                    'for the agent) or more. The maps read by running '
                    'servers go first.\n\nRelated options: '
                    'rewrite_seconds, [vmar_agent] '
                    'pending_maps_per_minute.'),
    cfg.FloatOpt('rewrite_seconds', default=1.0, min=0,
                 help='Seconds a change of one image spends, at most, '
                      'writing maps: its own, in its transaction, then '
                      'those of other images, after its commit and outside '
                      'the library lock. It stops after the first map '
                      'built past this long, and the maps it did not '
                      'reach are left pending as those past '
                      'rewrite_at_once are. A map\'s build takes seconds '
                      'per GiB of its image\'s data '
                      '(doc/source/admin/scale.rst).\n\nPossible values: '
                      'seconds; 0: a delete rewrites one other map at '
                      'most, and another change none past the changed '
                      'image\'s own.'
                      '\n\nRelated options: rewrite_at_once, '
                      '[vmar_agent] pending_maps_per_minute.'),
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

ALL_OPTS = library_opts
