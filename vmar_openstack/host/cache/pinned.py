"""A run of a file held in the page cache in 4 KiB pages, locked.

What :mod:`vmar_openstack.host.cache.warm` keeps of a base: the pages of one
run of its blocks, mapped read-only and locked (``mlock(2)``). They are
the page cache's own, shared with every QEMU that reads the file.

The kernel locks a page only when it is a 4 KiB folio, or a large one
that lies wholly inside the locked range. ``read(2)`` and the read-around
of a page fault cache a file in folios of up to 2 MiB, so a run of
metadata blocks usually sits in folios that stick out of it: mapped with
``MAP_LOCKED`` they were mapped but not locked (``Mlocked`` in
``/proc/meminfo`` did not move), and reclaim took them like any other
page. So the mapping is hinted ``MADV_RANDOM`` first (a fault then reads
one 4 KiB page, no read-around); if any page of the run is cached already,
it is mapped (``MADV_POPULATE_READ``) and paged out (``MADV_PAGEOUT``),
which splits the large folios the run cuts and lets the run's own pages
go; ``mlock`` then faults them back one page each. The rest of those
folios stays cached for the guests. (``MADV_PAGEOUT`` acts on a file's
pages for its owner, a process that may write it, or ``CAP_SYS_ADMIN``:
the daemon writes the host's bases.)

Python's :mod:`mmap` neither locks a mapping after the fact nor gives its
address, so this goes through the C library (:mod:`ctypes`).
"""

import ctypes
import errno
import mmap
import os

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                       ctypes.c_int, ctypes.c_int, ctypes.c_long)
for _f in (_libc.munmap, _libc.mlock):
    _f.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t,
                          ctypes.POINTER(ctypes.c_ubyte))

_MAP_FAILED = ctypes.c_void_p(-1).value
# asm-generic/mman-common.h (x86-64 and arm64, the hosts this runs on)
MADV_RANDOM = 1
MADV_PAGEOUT = 21           # Linux 5.4
MADV_POPULATE_READ = 22     # Linux 5.14
PAGE = mmap.PAGESIZE


def _error(call):
    err = ctypes.get_errno()
    return OSError(err, '%s: %s' % (call, os.strerror(err)))


class Pinned:
    """``length`` bytes of ``fd`` from ``offset`` (a page's), locked.

    Raises OSError when the run ends past the file's last page, or cannot
    be mapped or locked (``EAGAIN`` or ``ENOMEM`` past ``RLIMIT_MEMLOCK``);
    nothing stays mapped then.
    """

    def __init__(self, fd, offset, length):
        end = os.fstat(fd).st_size
        if offset + length > end + (-end % PAGE):
            raise OSError(errno.EINVAL, 'the run %d+%d ends past the file, '
                          'of %d bytes' % (offset, length, end))
        addr = _libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED,
                          fd, offset)
        if addr in (None, _MAP_FAILED):
            raise _error('mmap')
        self.addr, self.length = addr, length
        try:
            # the hints are best effort: without them the run is still
            # locked, in whatever folios hold it
            _libc.madvise(addr, length, MADV_RANDOM)
            if self._any_cached():
                _libc.madvise(addr, length, MADV_POPULATE_READ)
                _libc.madvise(addr, length, MADV_PAGEOUT)
            if _libc.mlock(addr, length) != 0:
                raise _error('mlock')
        except BaseException:
            self.close()
            raise

    def _any_cached(self):
        vec = (ctypes.c_ubyte * (-(-self.length // PAGE)))()
        if _libc.mincore(self.addr, self.length, vec) != 0:
            return True         # unknown: treat as cached
        return any(b & 1 for b in vec)

    def close(self):
        """Unmap the run (which unlocks it); again is a no-op."""
        if self.addr is not None:
            _libc.munmap(self.addr, self.length)
            self.addr = None
