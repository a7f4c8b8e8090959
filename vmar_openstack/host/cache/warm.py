"""The file-system metadata of the bases a host serves, kept in its memory.

Every guest's ``find``, ``du``, ``ls -R``, package manager and service
start reads its file systems' metadata first: superblocks, group
descriptors, bitmaps, inode tables, directories, extent trees. The images
of a cloud share most of it through their maps, so a host needs one copy
of it in its page cache for all its guests. Idle reclaim (DAMON's pageout,
a memory cgroup's limit, plain memory pressure) would drop it like any
other page; this module keeps it.

Each image's block layout (:mod:`vmar_openstack.mapformat.layout`,
published by vmar-agent) names its metadata blocks. Through the map of
each export that reads bases cached by the host (``host_cache=base``),
those blocks are the canonical blocks of a few base files. The daemon maps
them read-only and locked, in 4 KiB pages (:mod:`.pinned`): their pages
are in the page cache, unevictable, and shared with every QEMU that reads
the same file. Blocks shared by more exported images come first, within
``[vmar_host] warm_metadata_mb``; a lazy mirror's blocks are locked once
present (a guest read them, or a prefetch), never fetched for this. The
journal is left out: a clean file system never reads it. With the budget
0 nothing runs.

Why locking a mapping, not prefetching or cgroup protection, is in
``doc/source/admin/export.rst`` ("Metadata kept warm").
"""

import collections
import dataclasses
import math
import os
import threading
import time

import numpy as np
from oslo_log import log as logging

from vmar_openstack import exception
from vmar_openstack.host.cache import pinned
from vmar_openstack.host.exports import state as export_state
from vmar_openstack import mapformat
from vmar_openstack.mapformat import alternate
from vmar_openstack.mapformat import layout as layout_format
from vmar_openstack.mapformat import mirror as mirror_format
from vmar_openstack import periodic

LOG = logging.getLogger(__name__)

# what a guest reads of its file systems, first to last worth keeping
KINDS = tuple(k for k in layout_format.METADATA if k != 'journal')
# locked mappings at most (vm.max_map_count is 65530 by default)
MAX_RANGES = 16384
# seconds between two fetches of the layout of an image the host lacks
LAYOUT_RETRY = 300


@dataclasses.dataclass
class WarmStatus:
    budget_bytes: int
    wanted_bytes: int           # the metadata of the exports, in all
    locked_bytes: int
    ranges: int
    bases: dict                 # base image id -> locked bytes
    without_layout: list        # exported images the host has none for
    error: str                  # why less is locked than planned, or ''


def _runs(blocks):
    """Sorted ``(first, count)`` runs of a sorted array of blocks."""
    if not len(blocks):
        return []
    cut = np.flatnonzero(np.diff(blocks) != 1) + 1
    starts = np.concatenate(([0], cut))
    ends = np.concatenate((cut, [len(blocks)]))
    return [(int(blocks[s]), int(e - s)) for s, e in zip(starts, ends)]


def base_blocks(files, image_id, version):
    """``{base id: (block size, sorted blocks)}`` of an image's metadata.

    The canonical blocks its map reads the metadata blocks of its layout
    from; None without a layout (or a map) on the host.
    """
    lay = files.layout(image_id)
    if lay is None:
        return None
    try:
        bmap = mapformat.read(files.map_file(image_id, version))
    except (OSError, exception.MapFormatError) as e:
        LOG.warning('warm metadata: map v%d of %s unreadable: %s', version,
                    image_id, e)
        return None
    if (lay.block_size, lay.virtual_size) != (bmap.block_size,
                                              bmap.virtual_size):
        LOG.warning('warm metadata: the layout of %s does not fit its map',
                    image_id)
        return None
    want = np.zeros(bmap.n_blocks, dtype=bool)
    for first, n in lay.extents(KINDS):
        want[first:first + n] = True
    out = {}
    for i, t in enumerate(bmap.targets):
        base, image = alternate.block_pairs(bmap, i)
        out[t.image_id] = (bmap.block_size, np.unique(base[want[image]]))
    return out


def plan(files, exports, budget, cache=None):
    """What to lock: ``({base id: [(offset, length)]}, wanted, missing)``.

    ``files`` is the host's :class:`~.hostdir.HostFiles`; ``exports``
    the records of its exports. ``wanted`` is the bytes of the metadata
    set before the budget; ``missing`` the images without a layout.
    ``cache`` keeps :func:`base_blocks` by (image, map version).
    """
    cache = {} if cache is None else cache
    shared = collections.defaultdict(collections.Counter)  # base -> blocks
    block_size, missing, seen = {}, [], set()
    for exp in exports:
        key = (exp.image_id, exp.map_version)
        if exp.host_cache != 'base' or key in seen:
            continue
        seen.add(key)
        if cache.get(key) is None:
            cache[key] = base_blocks(files, *key)
        if cache[key] is None:
            missing.append(exp.image_id)
            continue
        for base, (bs, blocks) in cache[key].items():
            shared[base].update(blocks.tolist())
            block_size[base] = bs
    for key in set(cache) - seen:
        del cache[key]
    wanted = sum(len(c) * block_size[b] for b, c in shared.items())
    # most shared first, then by base and block: a stable choice
    ranked = sorted(((-n, base, blk) for base, c in shared.items()
                     for blk, n in c.items()))
    chosen = collections.defaultdict(list)
    left = budget
    for _n, base, blk in ranked:
        if left < block_size[base]:
            break
        chosen[base].append(blk)
        left -= block_size[base]
    out = {}
    for base, blocks in chosen.items():
        bs = block_size[base]
        out[base] = [(f * bs, n * bs) for f, n in
                     _runs(np.array(sorted(blocks), dtype=np.int64))]
    return out, wanted, missing


def present_only(files, base, ranges):
    """``ranges`` of a base cut to the blocks the host holds.

    A whole base holds them all; a mirror those its present file marks.
    """
    whole = files.base_file(base)
    mirror = files.mirror(base)
    if whole != mirror.data:
        return whole, ranges
    try:
        hdr, present = mirror_format.read_present(mirror.present)
    except (OSError, exception.MirrorFormatError):
        return whole, []
    bs, out = hdr.block_size, []
    for off, length in ranges:
        first, n = off // bs, length // bs
        have = np.flatnonzero(present[first:first + n]) + first
        out += [(f * bs, c * bs) for f, c in _runs(have)]
    return whole, out


class Warm(periodic.Periodic):
    """The daemon's locked metadata: re-planned every interval."""

    name = 'vmar-warm'

    def __init__(self, conf, files, host_dir):
        c = conf.vmar_host
        super().__init__(c.warm_interval)
        self.budget = c.warm_metadata_mb << 20
        self.files = files
        self.host_dir = host_dir
        self.locked = {}        # (path, offset, length) -> Pinned
        self.cache = {}         # (image, version) -> base_blocks()
        self.asked = {}         # image -> when its layout was last fetched
        self.status = WarmStatus(self.budget, 0, 0, 0, {}, [], '')
        self.lock = threading.Lock()

    def step(self):
        with export_state.State(self.host_dir) as state:
            exports = list(state.exports.values())
        self._fetch_layouts(exports)
        ranges, wanted, missing = plan(self.files, exports, self.budget,
                                       self.cache)
        want, bases = {}, {}
        for base, rs in sorted(ranges.items()):
            path, held = present_only(self.files, base, rs)
            for off, length in held:
                # mappings start on a page
                start = off - off % pinned.PAGE
                want[(path, start, off + length - start)] = base
        if len(want) > MAX_RANGES:
            LOG.warning('warm metadata: %d ranges, locking the first %d',
                        len(want), MAX_RANGES)
            want = dict(list(want.items())[:MAX_RANGES])
        with self.lock:
            error = self._apply(want)
            for key, base in want.items():
                if key in self.locked:
                    bases[base] = bases.get(base, 0) + key[2]
            self.status = WarmStatus(
                self.budget, wanted, sum(k[2] for k in self.locked),
                len(self.locked), bases, sorted(set(missing)), error)

    def _fetch_layouts(self, exports, now=None):
        """Fetch the layouts the host lacks, at most every LAYOUT_RETRY.

        Exports restored after an upgrade, or added while the map source
        had no layout to give, have none: this fetches them from the
        daemon's thread, never from the export's own path.
        """
        now = time.monotonic() if now is None else now
        for image in sorted({e.image_id for e in exports
                             if e.host_cache == 'base'}):
            # (the due time is compared, not now - asked: the difference
            # of two clock readings RETRY apart may round below RETRY)
            if (os.path.exists(self.files.layout_file(image))
                    or now < self.asked.get(image, -math.inf)
                    + LAYOUT_RETRY):
                continue
            self.asked[image] = now
            try:
                self.files.ensure_layout(image)
            except Exception as e:
                LOG.info('warm metadata: no block layout of %s: %s', image,
                         e)

    def _apply(self, want):
        for key in set(self.locked) - set(want):
            self.locked.pop(key).close()
        error = ''
        for key in want:
            if key in self.locked:
                continue
            path, offset, length = key
            try:
                with open(path, 'rb') as f:
                    self.locked[key] = pinned.Pinned(f.fileno(), offset,
                                                     length)
            except OSError as e:
                # ENOMEM, EAGAIN: past RLIMIT_MEMLOCK (LimitMEMLOCK= of
                # the unit)
                error = '%s at %d: %s' % (path, offset, e)
                LOG.warning('warm metadata: cannot lock %d bytes of %s at '
                            '%d: %s; the rest stays unlocked', length, path,
                            offset, e)
                break
        return error

    def snapshot(self):
        with self.lock:
            return dataclasses.replace(self.status, bases=dict(
                self.status.bases), without_layout=list(
                    self.status.without_layout))

    def changed(self):
        """Exports changed: plan again now."""
        self.wake()

    def close(self):
        with self.lock:
            for m in self.locked.values():
                m.close()
            self.locked.clear()


def start(conf, files, host_dir):
    """Start keeping metadata warm, or None when the budget is 0."""
    if not conf.vmar_host.warm_metadata_mb:
        return None
    return Warm(conf, files, host_dir).start()
