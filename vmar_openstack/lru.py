"""A per-process cache, least recently used out past a bound in bytes.

For items that never go stale because their key is their content's hash
(an image's first-occurrence table, a digest list). Thread-safe.
"""

import collections
import threading


class LRU:
    """Items by key, within ``max_bytes`` as ``cost(item)`` counts them.

    The newest item stays even alone over the bound; with a bound of 0
    nothing is kept.
    """

    def __init__(self, max_bytes, cost):
        self.max_bytes = max_bytes
        self._cost = cost
        self.items = collections.OrderedDict()
        self.size = 0
        self.lock = threading.Lock()

    def get(self, key):
        with self.lock:
            item = self.items.get(key)
            if item is not None:
                self.items.move_to_end(key)
            return item

    def put(self, key, item):
        if self.max_bytes <= 0:
            return
        with self.lock:
            old = self.items.pop(key, None)
            if old is not None:
                self.size -= self._cost(old)
            self.items[key] = item
            self.size += self._cost(item)
            while self.size > self.max_bytes and len(self.items) > 1:
                _k, old = self.items.popitem(last=False)
                self.size -= self._cost(old)

    def clear(self):
        with self.lock:
            self.items.clear()
            self.size = 0
