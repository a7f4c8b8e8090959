"""The per-process cache of first-occurrence tables (:mod:`.blocks`)."""

import collections
import threading


class LRU:
    """A small per-process cache of FirstOccurrence tables.

    The key is the image's content checksum, and an image's digest list
    never changes without its checksum changing, so an entry can never be
    stale, whoever else writes to the database. Thread-safe: an ingest
    builds its map in a thread of its own (see ``ingest.ahead``).
    """

    def __init__(self, max_bytes):
        self.max_bytes = max_bytes
        self.items = collections.OrderedDict()
        self.size = 0
        self.lock = threading.Lock()

    @staticmethod
    def _cost(item):
        return item.digests.nbytes + item.keys.nbytes + item.blocks.nbytes

    def get(self, key):
        with self.lock:
            item = self.items.get(key)
            if item is not None:
                self.items.move_to_end(key)
            return item

    def put(self, key, item):
        with self.lock:
            old = self.items.pop(key, None)
            if old is not None:
                self.size -= self._cost(old)
            self.items[key] = item
            self.size += self._cost(item)
            while self.size > self.max_bytes and len(self.items) > 1:
                _k, old = self.items.popitem(last=False)
                self.size -= self._cost(old)


FIRST_OCCURRENCES = LRU(512 << 20)


def clear_cache():
    with FIRST_OCCURRENCES.lock:
        FIRST_OCCURRENCES.items.clear()
        FIRST_OCCURRENCES.size = 0
