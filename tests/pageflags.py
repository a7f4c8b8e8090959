"""Which pages of a process's mappings of a file the kernel has locked.

``/proc/<pid>/maps`` names the mappings, ``/proc/<pid>/pagemap`` the page
frame of each mapped page and ``/proc/kpageflags`` each frame's flags
(Documentation/admin-guide/mm/pagemap.rst). Both need root (pagemap
hides frame numbers from others); :func:`available` says whether this
process can read them.
"""

import os
import struct

KPF_UNEVICTABLE = 1 << 18
KPF_MLOCKED = 1 << 33
_PRESENT = 1 << 63
_PFN = (1 << 55) - 1
PAGE = os.sysconf('SC_PAGE_SIZE')


def available():
    return os.geteuid() == 0 and os.access('/proc/kpageflags', os.R_OK)


def _mappings(pid, path):
    path = os.path.realpath(path)
    with open('/proc/%s/maps' % pid) as f:
        for line in f:
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[5].rstrip('\n') == path:
                start, end = (int(x, 16) for x in fields[0].split('-'))
                yield start, end


def locked_pages(pid, path):
    """``(mapped pages, of them mlocked)`` of ``pid``'s maps of ``path``."""
    frames = []
    with open('/proc/%s/pagemap' % pid, 'rb') as pm:
        for start, end in _mappings(pid, path):
            pm.seek(start // PAGE * 8)
            n = (end - start) // PAGE
            for e in struct.unpack('<%dQ' % n, pm.read(8 * n)):
                if e & _PRESENT:
                    frames.append(e & _PFN)
    locked = 0
    with open('/proc/kpageflags', 'rb') as kf:
        for pfn in frames:
            kf.seek(pfn * 8)
            flags, = struct.unpack('<Q', kf.read(8))
            locked += bool(flags & KPF_MLOCKED)
    return len(frames), locked
