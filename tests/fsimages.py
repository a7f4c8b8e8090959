"""Small disk images built with the real tools, for the file-system readers.

Nothing is mounted: ``mke2fs -d`` and ``mkfs.xfs -p`` fill a file system
from a directory, ``sfdisk`` writes partition tables, and a file system is
copied into its partition.
"""

import os
import shutil
import stat
import subprocess

MiB = 1 << 20


def need(*tools):
    missing = [t for t in tools if not shutil.which(t)]
    if missing:
        raise AssertionError('missing tools (bindep.txt): %s' % missing)


def mkfs_ext(path, root, offset=0, size=64 * MiB, kind='ext4',
             options=()):
    """An ext file system of ``root``'s files at ``offset`` of ``path``."""
    with open(path, 'ab') as f:
        f.truncate(max(os.path.getsize(path), offset + size))
    subprocess.run(['mke2fs', '-q', '-F', '-t', kind, '-b', '4096',
                    '-E', 'offset=%d' % offset, '-d', root, *options, path,
                    '%dk' % (size >> 10)], check=True, capture_output=True)


def _proto(root, out):
    for name in sorted(os.listdir(root)):
        p = os.path.join(root, name)
        st = os.lstat(p)
        perm = '%03o' % (st.st_mode & 0o777)
        if stat.S_ISDIR(st.st_mode):
            out.append('%s d--%s 0 0' % (name, perm))
            _proto(p, out)
            out.append('$')
        elif stat.S_ISLNK(st.st_mode):
            out.append('%s l--%s 0 0 %s' % (name, perm, os.readlink(p)))
        else:
            out.append('%s ---%s 0 0 %s' % (name, perm, p))


def mkfs_xfs(path, root, offset=0, size=320 * MiB):
    """An XFS file system of ``root``'s files at ``offset`` of ``path``.

    mkfs.xfs fills it from a prototype file (mkfs.xfs(8), ``-p``).
    """
    lines = ['/dev/null', '0 0', 'd--755 0 0']
    _proto(root, lines)
    lines.append('$')
    proto = path + '.proto'
    with open(proto, 'w') as f:
        f.write('\n'.join(lines) + '\n')
    fs = path + '.xfs' if offset else path
    with open(fs, 'ab') as f:
        f.truncate(max(os.path.getsize(fs), size))
    subprocess.run(['mkfs.xfs', '-q', '-f', '-p', proto, fs], check=True,
                   capture_output=True)
    os.unlink(proto)
    if offset:
        place(path, offset, fs)
        os.unlink(fs)


def place(path, offset, src):
    """Copy the file ``src`` into ``path`` at ``offset``."""
    with open(src, 'rb') as s, open(path, 'r+b') as d:
        d.seek(offset)
        shutil.copyfileobj(s, d, 4 * MiB)


def partition(path, size, script):
    """A disk of ``size`` bytes with ``sfdisk``'s ``script`` table."""
    with open(path, 'wb') as f:
        f.truncate(size)
    subprocess.run(['sfdisk', '-q', path], check=True, text=True,
                   capture_output=True, input=script)
