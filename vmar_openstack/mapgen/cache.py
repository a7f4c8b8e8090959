"""The per-process cache of first-occurrence tables (:mod:`.blocks`)."""

from vmar_openstack import lru


def _cost(item):
    return item.digests.nbytes + item.keys.nbytes + item.blocks.nbytes


class LRU(lru.LRU):
    """A small per-process cache of FirstOccurrence tables.

    The key is the image's content checksum, and an image's digest list
    never changes without its checksum changing, so an entry can never be
    stale, whoever else writes to the database. Thread-safe: an ingest
    builds its map in a thread of its own (see ``ingest.ahead``).
    """

    def __init__(self, max_bytes):
        super().__init__(max_bytes, _cost)


FIRST_OCCURRENCES = LRU(512 << 20)


def clear_cache():
    FIRST_OCCURRENCES.clear()
