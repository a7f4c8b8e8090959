"""An image's shareable blocks, by fingerprint key and by full digest."""

import numpy as np

from vmar_openstack import fingerprint
from vmar_openstack.fingerprint import keys as fp_keys


class BlockIndex:
    """An image's shareable blocks and their fingerprint keys, sorted.

    ``keys`` are the distinct keys, sorted; ``first[i]`` indexes (in
    ``blocks``) the first block with ``keys[i]``; ``inverse`` gives each
    block's key index; ``order`` sorts the blocks by (key, block).
    """

    def __init__(self, image, digests):
        mask = fp_keys.shareable_mask(digests, image.virtual_size,
                                      image.block_size)
        self.space_key = image.space_key
        self.blocks = np.flatnonzero(mask)
        self.block_keys = fp_keys.block_keys(digests,
                                             image.space_key)[self.blocks]
        self.keys, self.first, self.inverse, self.order = (
            fp_keys.unique_first(self.block_keys, with_order=True))


class FirstOccurrence:
    """Find the first block of an image holding a given full digest."""

    def __init__(self, image, digests, index=None):
        if index is None or index.space_key != 0:
            index = BlockIndex(image, digests)
            keys = fp_keys.block_keys(digests, 0)[index.blocks]
            order = fp_keys.stable_order(keys)
        else:   # keys of space 0 are the digest prefixes themselves
            keys, order = index.block_keys, index.order
        self.keys = keys[order]
        self.blocks = index.blocks[order]
        self.digests = digests

    def find(self, qdigests):
        """Return (found mask, block numbers) for rows of ``qdigests``."""
        qkeys = fp_keys.block_keys(qdigests, 0)
        pos = np.searchsorted(self.keys, qkeys, side='left')
        found = np.zeros(len(qkeys), dtype=bool)
        blocks = np.zeros(len(qkeys), dtype=np.int64)
        n = len(self.keys)
        pending = np.flatnonzero(pos < n)
        while len(pending):
            p = pos[pending]
            same_key = self.keys[p] == qkeys[pending]
            pending, p = pending[same_key], p[same_key]
            cand = self.blocks[p]
            equal = fingerprint.rows_equal(
                fingerprint.take_rows(self.digests, cand),
                fingerprint.take_rows(qdigests, pending))
            found[pending[equal]] = True
            blocks[pending[equal]] = cand[equal]
            # a key collision: look at the next entry with the same key
            pending = pending[~equal]
            pos[pending] += 1
            pending = pending[pos[pending] < n]
        return found, blocks
