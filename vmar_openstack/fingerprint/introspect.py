"""The blocks an image's boot will read, found in its file systems.

Before any boot of an image has been recorded, its boot working set is
guessed from what a Linux boot reads: the kernel and initramfs (a small
FAT or ext boot partition whole, or ``/boot/vmlinuz*`` and
``/boot/initrd*`` of the root), then systemd, the services it starts
early, the libraries they load (``DT_NEEDED`` and ``RUNPATH``, closed
transitively) and the unit files and configuration it reads. Every tool
is a well-kept one run on the image file without mounting it
(:mod:`.fstools`), and ``readelf`` for ELF dependencies. The image is
untrusted: every tool runs with a time limit, file counts and sizes are
bounded, and anything unexpected yields fewer blocks, never an error.
"""

import os
import re
import subprocess
import tempfile

from vmar_openstack.fingerprint import fstools

# a boot partition read whole: an ESP or /boot, not a root file system
MAX_BOOT_PARTITION = 512 << 20
MAX_FILES = 4096
MAX_ELF_SIZE = 64 << 20
_MAX_ROUNDS = 8

# what a systemd boot runs and reads early, where Debian, Ubuntu and
# Fedora put it (missing ones are skipped)
START_FILES = (
    '/sbin/init', '/vmlinuz', '/initrd.img',
    '/usr/lib/systemd/systemd-executor', '/usr/lib/systemd/systemd-fsck',
    '/usr/lib/systemd/systemd-remount-fs', '/usr/bin/kmod',
    '/usr/bin/mount', '/usr/bin/login', '/usr/bin/bash', '/usr/bin/sh',
    '/etc/ld.so.cache', '/etc/fstab', '/etc/passwd', '/etc/group',
    '/etc/shadow', '/etc/nsswitch.conf', '/etc/os-release',
    '/usr/lib/os-release', '/etc/machine-id', '/etc/hostname',
    '/etc/locale.conf', '/etc/default/locale', '/etc/login.defs',
)
# directories whose files (and those of their *.wants/, *.d/ children)
# are all read early
START_DIRS = ('/boot', '/usr/lib/systemd/system', '/etc/systemd/system',
              '/etc/systemd', '/usr/lib/udev/rules.d', '/etc/udev/rules.d',
              '/etc/pam.d', '/etc/security', '/usr/lib/tmpfiles.d',
              '/usr/lib/sysctl.d', '/usr/lib/modules-load.d')
# the programs the enabled units start (their Exec*= lines) are read too:
# the units linked from the *.wants/ and *.requires/ directories above
_EXEC = re.compile(r'^Exec(?:Start|StartPre|StartPost|Condition)=\s*'
                   r'[-@:+!]*(\S+)', re.M)
_EXEC_PATH = ('/usr/bin', '/usr/sbin', '/bin', '/sbin')
# the path conditions a unit is skipped by (not the triggering "|" ones)
_CONDITION = re.compile(r'^Condition(PathExists|PathIsDirectory)='
                        r'(!?)(/\S*)\s*$', re.M)
LIBRARY_DIRS = ('/usr/lib/x86_64-linux-gnu', '/lib/x86_64-linux-gnu',
                '/usr/lib64', '/lib64', '/usr/lib', '/lib')
_LDSO = '/lib64/ld-linux-x86-64.so.2'


_STAT_TYPE = re.compile(r'Type: (\w+)')
_STAT_SIZE = re.compile(r'Size: (\d+)\s*$', re.M)
_LINK = re.compile(r'Fast link dest: "(.*)"')


def _parse_stat(text):
    """(type, size, fast link target) of ``debugfs stat`` output."""
    t = _STAT_TYPE.search(text)
    size = _STAT_SIZE.search(text)
    link = _LINK.search(text)
    return (t.group(1) if t else None, int(size.group(1)) if size else 0,
            link.group(1) if link else None)


def _join(directory, target):
    if target.startswith('/'):
        return os.path.normpath(target)
    return os.path.normpath(os.path.join(directory, target))


def _needed(path):
    """(NEEDED names, RUNPATH dirs) of an ELF file; empty if not ELF."""
    try:
        r = fstools.run(['readelf', '-d', '-W', path])
    except (subprocess.TimeoutExpired, OSError):
        return [], []
    needed = re.findall(r'\(NEEDED\)\s+Shared library: \[([^]]+)\]',
                        r.stdout)
    runpath = []
    for m in re.findall(r'\((?:RUNPATH|RPATH)\)\s+Library r\w*path: '
                        r'\[([^]]+)\]', r.stdout):
        runpath += [d for d in m.split(':') if d.startswith('/')]
    return needed, runpath


def ext_files(path, offset, metadata=True):
    """File system blocks of the boot files of an ext file system.

    Returns ``(block size, [block numbers])``, relative to the file
    system's start. With ``metadata``, the metadata a boot reads to
    reach them too (:func:`_ext_metadata`).
    """
    fs = fstools.Debugfs(path, offset)
    head = fs.run(['stats -h'])[0]
    m = re.search(r'Block size:\s+(\d+)', head)
    if not m:
        return 0, []
    bsize = int(m.group(1))
    # directories: their listing, then their files and one level below
    wanted = list(START_FILES)
    dirs = list(START_DIRS)
    enabled = set()             # unit links of the targets, and their files
    for depth in range(2):
        listings = fs.run(['ls -p ' + d for d in dirs])
        below = []
        for d, text in zip(dirs, listings):
            for name, _ino, mode in fstools.ls_entries(text):
                if '"' in name or '\n' in name:
                    continue            # would not survive a command line
                p = os.path.join(d, name)
                if mode & 0o170000 == 0o040000:
                    if depth == 0 and (name.endswith('.wants')
                                       or name.endswith('.d')
                                       or name.endswith('.requires')):
                        below.append(p)
                else:
                    wanted.append(p)
                    if d.endswith(('.wants', '.requires')):
                        enabled.add(p)
        dirs = below
    files, seen, elf_seen = set(), set(), set()
    found = set()               # every path that exists: files, symlinks
    meta = set()                # extent-tree blocks of the files
    with tempfile.TemporaryDirectory(prefix='vmar-introspect-') as tmp:
        for _round in range(_MAX_ROUNDS):
            todo = [p for p in dict.fromkeys(wanted) if p not in seen]
            todo = todo[:max(0, MAX_FILES - len(seen))]
            if not todo:
                break
            seen.update(todo)
            wanted = []
            elves = []
            for p, text in zip(todo, fs.run(['stat "%s"' % p
                                             for p in todo])):
                kind, size, link = _parse_stat(text)
                if kind:
                    found.add(p)
                    meta.update(b for k, b, _l in fstools.stat_extents(text)
                                if k == 'map')
                if kind == 'symlink' and link:
                    wanted.append(_join(os.path.dirname(p), link))
                    if p in enabled:
                        enabled.add(wanted[-1])
                elif kind == 'regular':
                    files.add(p)
                    if 0 < size <= MAX_ELF_SIZE and p not in elf_seen:
                        elves.append(p)
            # ELF dependencies, next round
            dumped = []
            for i, p in enumerate(elves):
                elf_seen.add(p)
                dumped.append((p, os.path.join(tmp, str(i))))
            fs.run(['dump "%s" %s' % pd for pd in dumped])
            units = []
            for p, local in dumped:
                if not os.path.exists(local):
                    continue
                with open(local, 'rb') as f:
                    is_elf = f.read(4) == b'\x7fELF'
                if not is_elf and p in enabled:
                    units.append(_unit(local))
                if is_elf:
                    needed, runpath = _needed(local)
                    if needed:
                        wanted.append(_LDSO)
                    for lib in needed:
                        wanted += [os.path.join(d, lib) for d in
                                   runpath + list(LIBRARY_DIRS)]
                os.unlink(local)
            wanted += _programs_that_run(fs, units)
    blocks = []
    for text in fs.run(['blocks "%s"' % p for p in sorted(files)]):
        blocks += [int(b) for b in text.split() if b.isdigit()]
    if metadata:
        meta |= _ext_metadata(path, offset, fs, found)
    return bsize, blocks + sorted(meta)


# the metadata kinds a boot reads most blocks of, whole (of a layout)
SKELETON = ('partition-table', 'superblock', 'group-header', 'allocation',
            'inode-table', 'file-map', 'xattr')
_GROUP0 = re.compile(r'Primary superblock at (\d+), Group descriptors at '
                     r'(\d+)-(\d+)')
_BITMAP = re.compile(r'(?:Block|Inode) bitmap at (\d+)')
_IMAP = re.compile(r'located at block (\d+)')


def _ext_metadata(path, offset, fs, found):
    """The metadata a boot reads to reach the files ``found``.

    The superblock and the primary group descriptors, the bitmaps (read
    as the boot writes), the journal's superblock (read at mount), the
    directories on the way to every file, and the inode-table blocks of
    those files and directories.
    """
    out = set()
    stats = fstools.dumpe2fs(path, offset)
    m = _GROUP0.search(stats)
    if m:
        out.update(range(int(m.group(1)), int(m.group(3)) + 1))
    out.update(int(b) for b in _BITMAP.findall(stats))
    journal = fs.run(['stat <8>'])[0]
    first = [b for k, b, _l in fstools.stat_extents(journal) if k == 'data']
    if first:
        out.add(min(first))
    dirs = {'/'}
    for p in found:
        while p not in ('/', ''):
            p = os.path.dirname(p)
            dirs.add(p)
    dirs = sorted(dirs)
    for text in fs.run(['stat "%s"' % d for d in dirs]):
        for _k, first, last in fstools.stat_extents(text):
            out.update(range(first, last + 1))
    for text in fs.run(['imap "%s"' % p for p in dirs + sorted(found)]):
        m = _IMAP.search(text)
        if m:
            out.add(int(m.group(1)))
    return out


def _unit(path):
    """``(programs, path conditions)`` of a unit file.

    The programs its Exec*= lines start (candidate paths); its
    ``ConditionPathExists=``-like lines as ``(kind, '!' or '', path)``,
    not the triggering ``|`` ones.
    """
    try:
        with open(path, errors='replace') as f:
            text = f.read(1 << 16)
    except OSError:
        return [], []
    programs = []
    for prog in _EXEC.findall(text):
        if prog.startswith('/'):
            programs.append(os.path.normpath(prog))
        elif '/' not in prog and '$' not in prog:
            programs += [os.path.join(d, prog) for d in _EXEC_PATH]
    conds = [c for c in _CONDITION.findall(text)
             if '"' not in c[2] and '\n' not in c[2]]
    return programs, conds


def _programs_that_run(fs, units):
    """The programs of the ``units`` whose path conditions hold.

    One ``debugfs`` run answers every condition of the batch: a unit
    with a false one is skipped at boot (Debian's getty-static.service
    where logind is).
    """
    paths = sorted({c for _p, conds in units for _k, _n, c in conds})
    kinds = dict(zip(paths, (_parse_stat(out)[0] for out in
                             fs.run(['stat "%s"' % c for c in paths]))))
    out = []
    for programs, conds in units:
        if all((kinds[c] is not None if kind == 'PathExists'
                else kinds[c] == 'directory') != bool(neg)
               for kind, neg, c in conds):
            out += programs
    return out


def boot_blocks(path, size, block_size, metadata=True):
    """Image blocks (of ``block_size``) the boot reads, as far as known.

    ``metadata=False`` leaves out the file-system metadata on the way to
    the boot files (the set of before, for ``bench/bench_layout.py``'s
    baseline). :func:`with_skeleton` adds the rest of the metadata a
    boot reads from the image's block layout.
    """
    out = set()
    for off, length in fstools.volumes(path, size):
        kind = fstools.fs_type(path, off)
        if kind == 'vfat' and length <= MAX_BOOT_PARTITION:
            out.update(range(off // block_size,
                             -(-(off + length) // block_size)))
        elif kind in fstools.EXT:
            bsize, blocks = ext_files(path, off, metadata)
            for b in blocks:
                start = off + b * bsize
                out.update(range(start // block_size,
                                 -(-(start + bsize) // block_size)))
    n_blocks = -(-size // block_size)
    return sorted(b for b in out if b < n_blocks)


def with_skeleton(blocks, layout):
    """``blocks`` and every block of the layout's :data:`SKELETON` kinds.

    A boot of a library image reads 57-71 % of the inode-table blocks in
    use and 121 of the 125 group-header blocks (``bench/bench_layout.py``):
    a set of the inodes on the boot files' way held a sixth of them.
    Zero blocks among them cost a host nothing.
    """
    out = set(blocks)
    for first, n in layout.extents(SKELETON):
        out.update(range(first, first + n))
    return sorted(out)
