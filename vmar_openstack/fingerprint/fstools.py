"""The well-kept tools that read an image's file systems, run safely.

What :mod:`.introspect` (the blocks a boot reads) and :mod:`.classify`
(what every block is) learn of an image comes from these tools, run on
the image file without mounting it: ``sfdisk`` for the partition table,
``blkid`` for file system types, ``dumpe2fs`` and ``debugfs`` for
ext2/3/4, ``xfs_db`` for XFS. The image is untrusted: every tool runs
with a time limit and read-only, and a tool that fails or times out
yields nothing (the caller knows less), never an exception.
"""

import json
import re
import subprocess
import tempfile

from oslo_log import log as logging

LOG = logging.getLogger(__name__)

TIMEOUT = 60
EXT = ('ext2', 'ext3', 'ext4')


def run(cmd, timeout=TIMEOUT, **kw):
    """``subprocess.run`` with text output captured and a time limit."""
    return subprocess.run(cmd, capture_output=True, text=True,
                          timeout=timeout, check=False, **kw)


def partition_table(path):
    """``sfdisk --json``'s partition table of ``path``, or None."""
    try:
        r = run(['sfdisk', '--json', path])
        return json.loads(r.stdout)['partitiontable'] if r.returncode \
            == 0 else None
    except (subprocess.TimeoutExpired, ValueError, KeyError, TypeError,
            OSError):
        return None


def volumes(path, size, table=None):
    """``(offset, length)`` of each partition, or of the whole disk.

    ``table`` is :func:`partition_table`'s answer when the caller has it.
    """
    parts = table if table is not None else partition_table(path)
    if not parts:
        return [(0, size)]
    out = []
    try:
        sector = int(parts.get('sectorsize', 512))
        for p in parts.get('partitions', ()):
            off, length = int(p['start']) * sector, int(p['size']) * sector
            if 0 <= off < size and length > 0:
                out.append((off, min(length, size - off)))
    except (ValueError, KeyError, TypeError, AttributeError):
        return [(0, size)]
    return out or [(0, size)]


def fs_type(path, offset):
    """``blkid``'s TYPE of what is at ``offset`` (None: nothing known)."""
    try:
        r = run(['blkid', '--probe', '--offset', str(offset), '--output',
                 'export', path])
    except (subprocess.TimeoutExpired, OSError):
        return None
    for line in r.stdout.splitlines():
        if line.startswith('TYPE='):
            return line[5:]
    return None


def device(path, offset):
    """How e2fsprogs name a file system at ``offset`` of ``path``."""
    return '%s?offset=%d' % (path, offset) if offset else path


def dumpe2fs(path, offset):
    """``dumpe2fs``'s text of the ext file system at ``offset`` ('' if none).

    The superblock, then each group's metadata and free blocks.
    """
    dev = device(path, offset)
    try:
        r = run(['dumpe2fs', dev])
    except (subprocess.TimeoutExpired, OSError) as e:
        LOG.warning('dumpe2fs on %s: %s', dev, e)
        return ''
    if r.returncode != 0:
        LOG.warning('dumpe2fs on %s failed: %s', dev,
                    r.stderr.strip()[-300:])
        return ''
    return r.stdout


class Debugfs:
    """Batches of ``debugfs`` commands on one ext file system (read-only)."""

    def __init__(self, path, offset, timeout=TIMEOUT):
        self.device = device(path, offset)
        self.timeout = timeout

    def run(self, commands):
        """Output of each command, in order (missing ones: '')."""
        if not commands:
            return []
        # the output goes to a file: tens of MB through a pipe cost more
        # in the reader's polling than debugfs takes to write them
        with tempfile.NamedTemporaryFile('w', suffix='.debugfs') as f, \
                tempfile.TemporaryFile('w+', errors='replace') as out:
            f.write(''.join(c + '\n' for c in commands))
            f.flush()
            try:
                subprocess.run(['debugfs', '-f', f.name, self.device],
                               stdout=out, stderr=subprocess.DEVNULL,
                               timeout=self.timeout, check=False)
            except (subprocess.TimeoutExpired, OSError) as e:
                LOG.warning('debugfs on %s: %s', self.device, e)
                return [''] * len(commands)
            out.seek(0)
            text = out.read()
        # each command's output follows its echo, "debugfs: <command>"
        outs, cur = [], None
        for line in text.splitlines():
            if line.startswith('debugfs: '):
                cur = []
                outs.append(cur)
            elif cur is not None:
                cur.append(line)
        outs = ['\n'.join(o) for o in outs]
        return (outs + [''] * len(commands))[:len(commands)]


def ls_entries(text):
    """``(name, inode, mode)`` of ``debugfs ls -p`` output, no . and .."""
    for line in text.splitlines():
        f = line.split('/')
        if len(f) >= 7 and f[5] not in ('.', '..', ''):
            try:
                yield f[5], int(f[1]), int(f[2], 8)
            except ValueError:
                continue


# (logical[-logical][[u]]):physical[-physical], or (ETBn|IND|DIND|TIND):n
_EXTENT = re.compile(r'\((ETB\d+|IND|DIND|TIND|\d+(?:-\d+)?(?:\[u\])?)\):'
                     r'(\d+)(?:-(\d+))?')


# " level/max  entry/entries  logical - logical  physical[ - physical]
# length [flags]"
_EX_LINE = re.compile(r'^\s*(\d+)/\s*(\d+)\s+\d+/\s*\d+\s+\d+\s*-\s*\d+\s+'
                      r'(\d+)(?:\s*-\s*(\d+))?\s+\d+', re.M)


def ex_extents(text):
    """``(kind, first, last)`` of the blocks in ``debugfs ex`` output.

    As :func:`stat_extents`: an index entry (a level above the leaves)
    names an extent-tree block, ``'map'``; a leaf, the inode's own blocks,
    ``'data'``. Nothing when the inode does not use extents (debugfs says
    so on stderr): ask ``stat`` then.
    """
    for m in _EX_LINE.finditer(text):
        level, depth = int(m.group(1)), int(m.group(2))
        first = int(m.group(3))
        if level < depth:
            yield 'map', first, first
        else:
            yield 'data', first, int(m.group(4) or first)


def stat_extents(text):
    """``(kind, first, last)`` of the blocks in ``debugfs stat`` output.

    ``kind`` is ``'map'`` for extent-tree and indirect blocks, ``'data'``
    for the inode's own blocks; ``first`` and ``last`` are file system
    block numbers. Nothing for inline data or a fast symlink.
    """
    at = max(text.find('\nEXTENTS:'), text.find('\nBLOCKS:'))
    if at < 0:
        return
    for m in _EXTENT.finditer(text, at):
        first = int(m.group(2))
        last = int(m.group(3)) if m.group(3) else first
        yield ('map' if m.group(1)[0] in 'EIDT' else 'data'), first, last
