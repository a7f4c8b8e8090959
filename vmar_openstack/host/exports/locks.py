"""The export daemon's own locks, one process's threads among themselves.

The daemon is the one process that changes a host's exports
(:mod:`vmar_openstack.hostapi`), so its locks are in memory: no lock file
is left in ``host_dir``, and none is taken across processes.

* :class:`Keyed`: one mutex per key (an image whose base is being fetched);
* :class:`Holds`: per key, shared holds that an exclusive *claim* may not
  break (an export being prepared keeps the files it will read; a prune
  deletes only what nobody holds, and holds wait while it does).

A key's entry goes when nobody uses it, so the tables stay the size of
what is under way, not of every image the host has seen.
"""

import contextlib
import threading


class Keyed:
    """One mutex per key."""

    def __init__(self):
        self._mutex = threading.Lock()
        self._locks = {}        # key -> [lock, users]

    @contextlib.contextmanager
    def __call__(self, key):
        with self._mutex:
            entry = self._locks.setdefault(key, [threading.Lock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._mutex:
                entry[1] -= 1
                if not entry[1]:
                    del self._locks[key]


class Holds:
    """Per key: shared holds, and claims that need no hold."""

    def __init__(self):
        self._cond = threading.Condition()
        self._held = {}         # key -> number of holds
        self._claimed = set()

    def hold(self, key, stack):
        """Hold ``key`` until ``stack`` closes; waits while it is claimed."""
        with self._cond:
            self._cond.wait_for(lambda: key not in self._claimed)
            self._held[key] = self._held.get(key, 0) + 1
        stack.callback(self._unhold, key)

    def _unhold(self, key):
        with self._cond:
            self._held[key] -= 1
            if not self._held[key]:
                del self._held[key]
            self._cond.notify_all()

    @contextlib.contextmanager
    def claimed(self, key):
        """Whether the caller may have ``key`` to itself now.

        True, exclusively until the block ends, unless ``key`` is held
        (or claimed): then False at once.
        """
        with self._cond:
            mine = key not in self._held and key not in self._claimed
            if mine:
                self._claimed.add(key)
        try:
            yield mine
        finally:
            if mine:
                with self._cond:
                    self._claimed.discard(key)
                    self._cond.notify_all()
