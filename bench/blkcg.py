"""A blkio cgroup (v1) that throttles its processes' disk reads.

Seed 003 measured its cache policies over one 7200 RPM disk, where a
host page cache miss costs ten times a hit; this machine's disk is far
faster. The kernel's own throttle (``blkio.throttle.read_bps_device`` and
``read_iops_device``, cgroup v1 here like the memory controller) slows
what reaches the disk and nothing the page cache serves, which is where a
slow disk sits in the stack. Reads are charged to the process that issues
them (QEMU, the export daemon); writeback is not throttled.

The throttle bounds requests and bytes, not seeks. What a request costs
an HDD depends on how large it is, and that is the host's read-ahead
(``vmar_openstack.host.cache.pagecache.readahead`` sets it for a
measurement): this machine's virtio disk advertises 8 MiB, against the
kernel's default of 128 KiB, what seed 003's 2.6.32 host had.
"""

import os

ROOT = '/sys/fs/cgroup/blkio'


def disk_of(path):
    """'major:minor' of the whole disk holding ``path``."""
    dev = os.stat(path).st_dev
    sysdir = os.path.realpath('/sys/dev/block/%d:%d' % (
        os.major(dev), os.minor(dev)))
    if os.path.exists(os.path.join(sysdir, 'partition')):
        sysdir = os.path.dirname(sysdir)
    with open(os.path.join(sysdir, 'dev')) as f:
        return f.read().strip()


class ReadThrottle:
    """A group whose reads of the disks under ``paths`` are throttled.

    To ``iops`` requests and ``bps`` bytes a second per disk (0: that
    bound off).
    """

    LIMITS = ('blkio.throttle.read_iops_device',
              'blkio.throttle.read_bps_device')

    def __init__(self, name, paths, iops, bps):
        self.path = os.path.join(ROOT, name)
        self.disks = sorted({disk_of(p) for p in paths})
        os.makedirs(self.path, exist_ok=True)
        for limit, value in zip(self.LIMITS, (iops, bps)):
            self._write(limit, value)

    def _write(self, name, value):
        for disk in self.disks:
            with open(os.path.join(self.path, name), 'w') as f:
                f.write('%s %d\n' % (disk, value))

    def _reads(self, stat):
        with open(os.path.join(self.path, stat)) as f:
            return sum(int(w[2]) for w in (ln.split() for ln in f)
                       if len(w) == 3 and w[0] in self.disks
                       and w[1] == 'Read')

    def read_bytes(self):
        """Bytes the group's processes have read from its disks so far."""
        return self._reads('blkio.throttle.io_service_bytes')

    def read_requests(self):
        """Read requests the group's processes have sent its disks."""
        return self._reads('blkio.throttle.io_serviced')

    def add(self, pid):
        """Move ``pid`` into the group; its children are born in it."""
        with open(os.path.join(self.path, 'cgroup.procs'), 'w') as f:
            f.write('%d\n' % pid)

    def remove(self):
        """Lift the throttle, leave the group and remove it."""
        for limit in self.LIMITS:
            self._write(limit, 0)
        with open(os.path.join(ROOT, 'cgroup.procs'), 'w') as f:
            f.write('%d\n' % os.getpid())
        try:
            os.rmdir(self.path)
        except OSError:
            pass                        # a process is still in it
