"""A memory cgroup (v1) that bounds the host page cache of its processes.

The benchmarks cap the memory the host has for base data. This machine
binds the memory controller to cgroup v1 (``/sys/fs/cgroup/memory``; the
unified hierarchy has no memory controller here), so the cap is
``memory.limit_in_bytes``, which counts a group's anonymous memory and
kernel memory as well as its page cache. :class:`MemoryCgroup` reads and
writes one group; :class:`CacheBudget` keeps the group's limit at a page
cache budget plus whatever else the group holds at the moment, so that
the budget bounds page cache only, however many processes join.
"""

import os
import threading

ROOT = '/sys/fs/cgroup/memory'


class MemoryCgroup:
    """One memory cgroup (v1) under :data:`ROOT`, made if missing."""

    def __init__(self, name):
        self.path = os.path.join(ROOT, name)
        os.makedirs(self.path, exist_ok=True)

    def write(self, name, value):
        with open(os.path.join(self.path, name), 'w') as f:
            f.write('%s\n' % value)

    def read(self, name):
        with open(os.path.join(self.path, name)) as f:
            return f.read()

    def stat(self):
        """memory.stat as {key: int}."""
        return {k: int(v) for k, v in
                (ln.split() for ln in self.read('memory.stat').splitlines())}

    def cache_bytes(self):
        st = self.stat()
        return st.get('total_cache', st.get('cache', 0))

    def other_bytes(self):
        """All the group is charged for but page cache (anon, kernel)."""
        return int(self.read('memory.usage_in_bytes')) - self.cache_bytes()

    def set_limit(self, limit):
        """Set memory.limit_in_bytes (-1: none).

        OSError (EBUSY) if the kernel cannot reclaim down to it.
        """
        self.write('memory.limit_in_bytes', limit)

    def add(self, pid):
        """Move ``pid`` into the group; a process already gone is not."""
        try:
            self.write('cgroup.procs', pid)
        except ProcessLookupError:
            pass

    def empty(self):
        """Lift the limit and reclaim the page cache charged to the group."""
        self.set_limit(-1)
        self.write('memory.force_empty', 0)

    def remove(self):
        """Lift the limit and remove the group (once its tasks are gone)."""
        if os.path.isdir(self.path):
            self.set_limit(-1)
            try:
                os.rmdir(self.path)
            except OSError:
                pass


class CacheBudget:
    """Keep ``group``'s limit at ``budget`` bytes of page cache.

    Every ``interval`` seconds the limit becomes the budget plus the
    group's other memory (:meth:`MemoryCgroup.other_bytes`): processes
    that join or grow take no page cache budget, and the kernel reclaims
    page cache beyond it. Between two updates the cache may be off the
    budget by what the processes grew (below) or freed (above) in one
    interval; a process that grows by more than the cache it can take
    waits for the next update (the group's OOM killer is off).
    """

    def __init__(self, group, budget, interval=0.1):
        self.group, self.budget, self.interval = group, budget, interval
        # a process that outgrows the limit before the next update waits
        # for it instead of being killed
        group.write('memory.oom_control', 1)
        self._stop = threading.Event()
        self._update()
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def _update(self):
        try:
            self.group.set_limit(self.budget + self.group.other_bytes())
        except OSError:
            pass        # EBUSY: the processes grew meanwhile; next round

    def _follow(self):
        while not self._stop.wait(self.interval):
            self._update()

    def stop(self):
        """Stop following and lift the limit."""
        self._stop.set()
        self._thread.join()
        self.group.set_limit(-1)
        self.group.write('memory.oom_control', 0)
