"""The host page cache and the read-ahead of a file's disk.

What the demo, the benchmarks and the tests measure about a base file, in
one place: how many of its bytes are cached (util-linux ``fincore``), how
to empty the cache of it, and which ``read_ahead_kb`` knob decides how much
the kernel reads around each miss.
"""

import contextlib
import fcntl
import json
import os
import stat
import subprocess


def resident_bytes(paths):
    """``{path: bytes of it in the page cache}`` (util-linux ``fincore``)."""
    paths = list(paths)
    if not paths:
        return {}
    out = subprocess.run(
        ['fincore', '--bytes', '--json', '--output', 'RES,FILE'] + paths,
        capture_output=True, text=True, check=True).stdout
    rows = json.loads(out)['fincore']
    return {p: int(r['res']) for p, r in zip(paths, rows)}


def evict(path):
    """Drop ``path``'s pages from the page cache (written back first)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def evict_all(paths):
    """Drop each of ``paths``' pages from the page cache (``evict``).

    What a measurement on a shared machine does before reading: it empties
    the cache of the files it measures and leaves everyone else's pages
    alone (a test beside it may be counting its own).
    """
    for path in paths:
        evict(path)


def evict_tree(*roots):
    """``evict_all`` of every regular file under ``roots``.

    A bench's own library and work directories: its host starts cold, and
    the machine's other pages stay.
    """
    for root in roots:
        for dirpath, _dirs, files in os.walk(root):
            for name in files:
                path = os.path.join(dirpath, name)
                try:
                    if stat.S_ISREG(os.lstat(path).st_mode):
                        evict(path)
                except FileNotFoundError:
                    pass        # removed since the walk listed it


def drop_all():
    """Empty the whole machine's page cache (``sync; echo 3 > drop_caches``).

    For a benchmark that has the machine to itself and wants every file
    cold, the QEMU binaries and the guests' images included. Never from a
    test or the demo: they share the machine with other measurements.
    Needs root, and a kernel that lets this process write the knob.
    """
    os.sync()
    with open('/proc/sys/vm/drop_caches', 'w') as f:
        f.write('3\n')


def readahead_knob(path):
    """The ``read_ahead_kb`` file of the disk holding ``path``, or None."""
    dev = os.stat(path).st_dev
    sysdir = '/sys/dev/block/%d:%d' % (os.major(dev), os.minor(dev))
    for queue in (os.path.join(sysdir, 'queue'),          # a whole disk
                  os.path.join(sysdir, '..', 'queue')):   # a partition
        knob = os.path.join(queue, 'read_ahead_kb')
        if os.path.exists(knob):
            return knob
    return None


def read_knob(knob):
    """The read-ahead in KiB a ``read_ahead_kb`` file holds."""
    with open(knob) as f:
        return int(f.read())


def write_knob(knob, kb):
    with open(knob, 'w') as f:
        f.write(str(kb))


@contextlib.contextmanager
def knob_held(knob):
    """Hold the disk's read-ahead knob for ourselves (an exclusive flock).

    Whoever changes the read-ahead for a measurement holds it, so two
    concurrent measurements (a demo and a benchmark, say) take turns
    instead of putting back each other's settings.
    """
    with open(knob) as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


@contextlib.contextmanager
def readahead(knob, kb):
    """The disk's read-ahead at ``kb`` KiB; the old value put back after."""
    with knob_held(knob):
        old = read_knob(knob)
        write_knob(knob, kb)
        try:
            yield old
        finally:
            write_knob(knob, old)
