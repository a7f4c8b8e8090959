"""Real host memory pressure, for as long as it runs (test scaffolding).

A child process takes ``nbytes`` of anonymous memory and touches every
page of it, so that the host's MemAvailable falls by that much; killing
it gives the memory back. The user path (tools/cloud_scenario.py,
``guest_auto``) uses it to take the host under the export daemon's
watermark ([vmar_guest_cache] min_available_mb).

It is not a thrashing reader in a memory cgroup: on this machine
(cgroup v1 memory controller, kernel 6.18) reclaim inside a v1 memory
cgroup never shows in /proc/pressure/memory (measured: a reader
re-reading a file 1.05 to 4 times its group's limit for 20 s left the
"some" total unchanged), and only global reclaim would.
"""

import subprocess
import sys

from vmar_openstack.host.guests import channels as guests

PAGE = 4096

_CHILD = r'''
import mmap, sys
n = int(sys.argv[1])
m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for off in range(0, n, %d):
    m[off] = 1
sys.stdout.write('touched\n')
sys.stdout.flush()
sys.stdin.read()
''' % PAGE


def mem_available():
    """MemAvailable of /proc/meminfo, in bytes, as the daemon reads it."""
    return guests.read_meminfo()


class MemoryHog:
    """Hold ``nbytes`` of touched anonymous memory while in the block."""

    def __init__(self, nbytes):
        self.nbytes = nbytes
        self.proc = None

    def __enter__(self):
        self.proc = subprocess.Popen(
            [sys.executable, '-c', _CHILD, str(self.nbytes)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if self.proc.stdout.readline().strip() != 'touched':
            self.__exit__()
            raise RuntimeError('the memory hog of %d bytes failed'
                               % self.nbytes)
        return self

    def __exit__(self, *exc):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait()
            self.proc.stdin.close()
            self.proc.stdout.close()
