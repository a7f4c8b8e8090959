"""What every block of an image is, as its file systems say.

Each block of the image is classified (:data:`.layout.KINDS`) as
file-system metadata by kind, file data with the path of its file, free,
or unknown. ext2/3/4 are read with e2fsprogs: ``dumpe2fs`` lists each
group's superblock, descriptors, bitmaps, inode table and free blocks;
``debugfs`` walks the directory tree by inode numbers and lists every
inode's extent tree (``ex``: data, extent-tree blocks), or ``stat``\\ s
it when it has none (ext2/3 block maps, the journal and other special
inodes); ``icheck`` names the owners of blocks in use that no extent
claimed (extended-attribute blocks). XFS is read with ``xfs_db``:
``blockget`` and ``blockuse -n`` name the use (and the file) of every
block. Partition
tables (MBR, GPT) are found with ``sfdisk``; anything else (LVM, NTFS,
FAT, no file system) is left unknown with a log line, never an error.

The image is untrusted: the tools run read-only, with time limits, on
the image file (:mod:`.fstools`); inodes and paths are bounded; a tool
that fails or says something unexpected leaves its volume unknown.
"""

import os
import re
import shutil
import subprocess
import tempfile
import threading
import time

import numpy as np
from oslo_log import log as logging

from vmar_openstack.fingerprint import fstools
from vmar_openstack.mapformat import layout

LOG = logging.getLogger(__name__)

XFS = ('xfs',)
# bounds on what one image may ask of the classifier
MAX_INODES = 4 << 20
MAX_PATH = 4096
MAX_XFS_BLOCKS = 16 << 20       # 64 GiB of 4 KiB blocks: one line each
_BATCH = 20000                  # debugfs commands per run

_C = layout.CODE


class _Marks:
    """Per-block kind codes and file indexes of one image."""

    def __init__(self, size, block_size):
        self.bs = block_size
        self.n = -(-size // block_size)
        self.codes = np.zeros(self.n, dtype=np.uint8)
        self.file_of = np.full(self.n, -1, dtype=np.int64)

    def mark(self, start, end, kind, file=-1):
        """Bytes ``[start, end)`` of the image hold ``kind``.

        A block keeps the latest kind of :data:`.layout.KINDS` that any
        of its bytes hold; a data block the first file that named it.
        """
        s, e = max(0, start // self.bs), min(self.n, -(-end // self.bs))
        if s >= e:
            return
        code = _C[kind]
        np.maximum(self.codes[s:e], code, out=self.codes[s:e])
        if file >= 0:
            span = self.file_of[s:e]
            span[span < 0] = file


class _Files:
    """The path table of a layout: an index per file that has data."""

    def __init__(self):
        self.paths, self.index = [], {}

    def add(self, path):
        i = self.index.get(path)
        if i is None:
            i = self.index[path] = len(self.paths)
            self.paths.append(path)
        return i


def _partition_table(table, size, marks):
    """Mark the blocks the partition table itself holds."""
    if not table:
        return
    try:
        sector = int(table.get('sectorsize', 512))
        marks.mark(0, sector, 'partition-table')
        if table.get('label') == 'gpt':
            first = int(table.get('firstlba', 34))
            last = int(table.get('lastlba', size // sector - 34))
            marks.mark(0, first * sector, 'partition-table')
            marks.mark((last + 1) * sector, size, 'partition-table')
    except (ValueError, TypeError, AttributeError):
        pass


# -- ext2/3/4 ---------------------------------------------------------------

_RANGE = r'(\d+)(?:-(\d+))?'
_GROUP_META = (
    (re.compile(r'superblock at (\d+)()'), 'superblock'),
    (re.compile(r'Group descriptors? at ' + _RANGE), 'group-header'),
    (re.compile(r'Reserved GDT blocks at ' + _RANGE), 'group-header'),
    (re.compile(r'Block bitmap at (\d+)()'), 'allocation'),
    (re.compile(r'Inode bitmap at (\d+)()'), 'allocation'),
    (re.compile(r'Inode table at ' + _RANGE), 'inode-table'),
)
_HEADER_INODES = (
    (re.compile(r'^Journal inode:\s+(\d+)', re.M), 'journal'),
    (re.compile(r'^User quota inode:\s+(\d+)', re.M), 'quota'),
    (re.compile(r'^Group quota inode:\s+(\d+)', re.M), 'quota'),
    (re.compile(r'^Project quota inode:\s+(\d+)', re.M), 'quota'),
)
_ACL = re.compile(r'File ACL: (\d+)')
# icheck: "<block>\t<inode>" (or "<block not found>")
_ICHECK = re.compile(r'^(\d+)\t(\d+)$', re.M)
S_IFMT, S_IFDIR = 0o170000, 0o040000


def _ranges(text, regex):
    for m in regex.finditer(text):
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) else first
        yield first, last


def _ext(path, offset, length, marks, files):
    """Classify the ext file system at ``offset``; False if unreadable."""
    head = fstools.dumpe2fs(path, offset)
    m = re.search(r'^Block size:\s+(\d+)', head, re.M)
    count = re.search(r'^Block count:\s+(\d+)', head, re.M)
    if not m or not count:
        return False
    bsize, n_fs = int(m.group(1)), int(count.group(1))

    def mark(first, last, kind, file=-1):
        if 0 <= first <= last < n_fs:
            marks.mark(offset + first * bsize,
                       min(offset + (last + 1) * bsize, offset + length),
                       kind, file)

    # free blocks first: a later kind wins over them
    for line in head.splitlines():
        line = line.strip()
        if line.startswith('Free blocks: '):
            for first, last in _ranges(line, re.compile(_RANGE)):
                mark(first, last, 'free')
        for regex, kind in _GROUP_META:
            for first, last in _ranges(line, regex):
                mark(first, last, kind)
    special = {7: 'group-header', 5: 'fs-other'}
    for regex, kind in _HEADER_INODES:
        found = regex.search(head)
        if found and int(found.group(1)):
            special[int(found.group(1))] = kind

    fs = fstools.Debugfs(path, offset)
    kinds = {}                  # inode -> (kind, path)
    dirs = [(2, '')]
    kinds[2] = ('directory', '/')
    while dirs:
        below = []
        for at in range(0, len(dirs), _BATCH):
            batch = dirs[at:at + _BATCH]
            outs = fs.run(['ls -p <%d>' % ino for ino, _p in batch])
            for (_ino, parent), text in zip(batch, outs):
                for name, ino, mode in fstools.ls_entries(text):
                    if ino in kinds or len(kinds) >= MAX_INODES:
                        continue
                    p = parent + '/' + name
                    if len(p) > MAX_PATH:
                        continue
                    fmt = mode & S_IFMT
                    kinds[ino] = ({S_IFDIR: 'directory', 0o100000: 'data',
                                   0o120000: 'symlink'}.get(fmt), p)
                    if fmt == S_IFDIR:
                        below.append((ino, p))
        dirs = below
    if len(kinds) >= MAX_INODES:
        LOG.warning('%s at %d: more than %d inodes; the rest stay unknown',
                    path, offset, MAX_INODES)
    # the reached inodes' blocks from their extent trees (``ex``: a sixth
    # of ``stat``'s work); ``stat`` for the special inodes and for those
    # without extents (ext2/3, fast symlinks, inline data)
    todo = [(ino, kind, None) for ino, kind in special.items()]
    reached = [(ino, kind, p) for ino, (kind, p) in kinds.items() if kind]
    for at in range(0, len(reached), _BATCH):
        batch = reached[at:at + _BATCH]
        outs = fs.run(['ex <%d>' % ino for ino, _k, _p in batch])
        for item, text in zip(batch, outs):
            if not _ext_blocks(fstools.ex_extents(text), item[1], item[2],
                               mark, files):
                todo.append(item)
    for at in range(0, len(todo), _BATCH):
        batch = todo[at:at + _BATCH]
        outs = fs.run(['stat <%d>' % ino for ino, _k, _p in batch])
        for (_ino, kind, p), text in zip(batch, outs):
            _ext_inode(text, kind, p, mark, files)
    _ext_xattr(fs, marks, offset, length, bsize, n_fs, mark, kinds)
    return True


def _ext_xattr(fs, marks, offset, length, bsize, n_fs, mark, kinds):
    """Extended-attribute blocks of the reached inodes.

    ``ex`` does not name them: they are the blocks in use that nothing
    claimed yet, and ``icheck`` says whose they are (one pass over the
    inode table, only when there are such blocks: none on the library's
    images).
    """
    bs = marks.bs
    lo, hi = offset // bs, min(marks.n, -(-(offset + length) // bs))
    left = np.flatnonzero(marks.codes[lo:hi] == _C['unknown']) + lo
    if not len(left):
        return
    per = max(1, bs // bsize)
    blocks = sorted({(int(b) * bs - offset) // bsize + i
                     for b in left[:_BATCH // per] for i in range(per)})
    blocks = [b for b in blocks if 0 <= b < n_fs]
    text = fs.run(['icheck ' + ' '.join(map(str, blocks))])[0] if blocks \
        else ''
    for m in _ICHECK.finditer(text):
        b, ino = int(m.group(1)), int(m.group(2))
        if ino in kinds:
            mark(b, b, 'xattr')


def _ext_blocks(extents, kind, path, mark, files):
    """Mark an inode's ``(what, first, last)`` blocks; False if none."""
    file, seen = -1, False
    for what, first, last in extents:
        seen = True
        if what == 'map':
            mark(first, last, 'group-header' if kind == 'group-header'
                 else 'file-map')
            continue
        if kind == 'data' and path and file < 0:
            file = files.add(path)
        mark(first, last, kind, file)
    return seen


def _ext_inode(text, kind, path, mark, files):
    """Mark the blocks of one inode from its ``debugfs stat``."""
    acl = _ACL.search(text)
    if acl and int(acl.group(1)):
        b = int(acl.group(1))
        mark(b, b, 'xattr')
    _ext_blocks(fstools.stat_extents(text), kind, path, mark, files)


# -- XFS --------------------------------------------------------------------

# xfs_db's block types (db/check.c typename[]); others are 'fs-other'
_XFS_KIND = {
    'sb': 'superblock', 'agf': 'group-header', 'agi': 'group-header',
    'agfl': 'group-header', 'freelist': 'allocation',
    'btbno': 'allocation', 'btcnt': 'allocation', 'btino': 'allocation',
    'btfino': 'allocation', 'btrmap': 'allocation',
    'btrefcnt': 'allocation', 'inode': 'inode-table', 'log': 'journal',
    'dir': 'directory', 'btbmapa': 'file-map', 'btbmapd': 'file-map',
    'attr': 'xattr', 'symlink': 'symlink', 'quota': 'quota',
    'data': 'data', 'rtdata': 'data', 'rldata': 'data', 'cowdata': 'data',
    'free1': 'free', 'free2': 'free', 'rtfree': 'free',
    'unknown': 'unknown', 'missing': 'unknown',
}
_BLOCKUSE = re.compile(r'^block \d+ \((\d+)/(\d+)\) type (\w+)'
                       r'(?: inode \d+(?: (.*))?)?$')


def _xfs_sb(dev):
    r = fstools.run(['xfs_db', '-r', '-f', '-c', 'sb 0', '-c',
                     'p blocksize dblocks agcount agblocks agblklog', dev])
    sb = dict(re.findall(r'^(\w+) = (\d+)$', r.stdout, re.M))
    try:
        return {k: int(sb[k]) for k in
                ('blocksize', 'dblocks', 'agcount', 'agblocks', 'agblklog')}
    except KeyError:
        return None


def _extract(path, offset, length, dest):
    """Copy ``length`` bytes at ``offset`` of ``path`` to ``dest``, sparse.

    xfs_db reads a file or a device from its start; a partition is
    copied out, its holes and zero blocks left holes.
    """
    zero = bytes(1 << 20)
    with open(path, 'rb') as src, open(dest, 'wb') as out:
        out.truncate(length)
        pos = offset
        while pos < offset + length:
            try:
                data_at = os.lseek(src.fileno(), pos, os.SEEK_DATA)
            except OSError:
                break                   # no data past pos
            if data_at >= offset + length:
                break
            src.seek(data_at)
            chunk = src.read(min(1 << 20, offset + length - data_at))
            if not chunk:
                break
            if chunk != zero[:len(chunk)]:
                out.seek(data_at - offset)
                out.write(chunk)
            pos = data_at + len(chunk)


def _xfs(path, offset, length, marks, files):
    """Classify the XFS file system at ``offset``; False if unreadable."""
    if not shutil.which('xfs_db'):
        LOG.info('%s at %d: XFS, but xfs_db (xfsprogs) is not installed',
                 path, offset)
        return False
    with tempfile.TemporaryDirectory(prefix='vmar-classify-') as tmp:
        dev = path
        if offset:
            dev = os.path.join(tmp, 'volume')
            try:
                _extract(path, offset, length, dev)
            except OSError as e:
                LOG.warning('%s at %d: copying the XFS volume out: %s',
                            path, offset, e)
                return False
        sb = _xfs_sb(dev)
        if not sb or sb['dblocks'] > MAX_XFS_BLOCKS:
            LOG.warning('%s at %d: XFS superblock unreadable or past %d '
                        'blocks: %s', path, offset, MAX_XFS_BLOCKS, sb)
            return False
        cmd = ['xfs_db', '-r', '-f', '-c', 'blockget -n']
        for ag in range(sb['agcount']):
            n = min(sb['agblocks'], sb['dblocks'] - ag * sb['agblocks'])
            cmd += ['-c', 'fsblock %d' % (ag << sb['agblklog']),
                    '-c', 'blockuse -n -c %d' % n]
        return _xfs_blockuse(cmd + [dev], sb, offset, length, marks, files)


def _xfs_blockuse(cmd, sb, offset, length, marks, files):
    bsize, per_ag = sb['blocksize'], sb['agblocks']
    seen = 0
    run = None                  # [first, last, kind, file]

    def flush():
        if run:
            marks.mark(offset + run[0] * bsize,
                       min(offset + (run[1] + 1) * bsize, offset + length),
                       run[2], run[3])

    with subprocess.Popen(cmd, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True) as p:
        # a hostile image may stall xfs_db: killed, its output ends
        expired = threading.Event()

        def expire():
            expired.set()
            p.kill()
        watchdog = threading.Timer(fstools.TIMEOUT * 5, expire)
        watchdog.start()
        try:
            for line in p.stdout:
                m = _BLOCKUSE.match(line.rstrip('\n'))
                if not m:
                    continue
                seen += 1
                b = int(m.group(1)) * per_ag + int(m.group(2))
                kind = _XFS_KIND.get(m.group(3), 'fs-other')
                name = m.group(4)
                file = (files.add('/' + name.lstrip('/'))
                        if kind == 'data' and name and len(name) < MAX_PATH
                        else -1)
                if run and run[1] + 1 == b and run[2:] == [kind, file]:
                    run[1] = b
                else:
                    flush()
                    run = [b, b, kind, file]
            flush()
        finally:
            watchdog.cancel()
            p.kill()
    if expired.is_set():
        LOG.warning('xfs_db past its time; the rest of the volume at %d '
                    'stays unknown', offset)
    return seen > 0


# -- the image ----------------------------------------------------------------

def classify(path, size, block_size, image_id):
    """The :class:`~vmar_openstack.mapformat.layout.Layout` of an image.

    ``path`` is the image's raw bytes (``size`` of them).
    """
    t0 = time.monotonic()
    marks, files, volumes = _Marks(size, block_size), _Files(), []
    table = fstools.partition_table(path)
    _partition_table(table, size, marks)
    for off, length in fstools.volumes(path, size, table):
        kind = fstools.fs_type(path, off) or ''
        done = False
        if kind in fstools.EXT:
            done = _ext(path, off, length, marks, files)
        elif kind in XFS:
            done = _xfs(path, off, length, marks, files)
        else:
            LOG.info('image %s: the volume at %d (%s) is left unknown: '
                     'only ext2/3/4 and XFS are classified', image_id, off,
                     kind or 'no file system found')
        volumes.append(layout.Volume(off, length, kind, bool(done)))
    out = layout.from_arrays(image_id, size, block_size, volumes,
                             files.paths, marks.codes, marks.file_of)
    LOG.info('image %s: blocks classified in %.1f s: %s', image_id,
             time.monotonic() - t0,
             ', '.join('%s %d' % kv for kv in out.counts().items() if kv[1]))
    return out
