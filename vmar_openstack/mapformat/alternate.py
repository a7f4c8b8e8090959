"""Alternate maps: a base's blocks read from an image that holds them.

A map of image M sends each shared block of M to the one canonical place
of its content, block Y of base A. M's own bytes hold the same content at
M's block X. Inverted, M's map says where A's blocks can be read other
than from A: :func:`alternate` writes that as a map of A (same format,
``doc/source/reference/map-format.rst``) whose one target is M. A host whose
copy of A is incomplete reads A's missing blocks through it when A's own data
is gone (an image deleted in Glance takes its data along); the blocks are
checked against A's digests either way.
"""

import numpy as np

from vmar_openstack.mapformat import codec


def block_pairs(bmap, t):
    """(base block, image block) of every block the map reads from ``t``."""
    ext = bmap.extents[bmap.extents['target'] == t]
    lengths = ext['length'].astype(np.int64)
    first = np.cumsum(lengths) - lengths
    step = np.arange(int(lengths.sum())) - np.repeat(first, lengths)
    base = np.repeat(ext['target_block'].astype(np.int64), lengths) + step
    image = np.repeat(ext['src'].astype(np.int64), lengths) + step
    return base, image


def _tail(size, block_size):
    return size - (-(-size // block_size) - 1) * block_size


def alternate(bmap, base_id):
    """The encoded alternate map of ``base_id`` from ``bmap``'s image.

    None if ``bmap`` reads no block of ``base_id``. Where several blocks of
    the image hold one base block, the first is used. A partial last block
    of the image only stands in for the base's equally partial last block
    (the format's rule for partial blocks).
    """
    found = [i for i, t in enumerate(bmap.targets)
             if t.image_id == base_id and not t.is_self]
    if not found:
        return None
    target = bmap.targets[found[0]]
    bs = bmap.block_size
    base, image = block_pairs(bmap, found[0])
    img_tail = _tail(bmap.virtual_size, bs)
    if img_tail != bs:
        last_ok = (_tail(target.size, bs) == img_tail
                   and base == -(-target.size // bs) - 1)
        keep = (image != bmap.n_blocks - 1) | last_ok
        base, image = base[keep], image[keep]
    base, first = np.unique(base, return_index=True)
    image = image[first]
    if not len(base):
        return None
    # runs where both sides step by one block
    breaks = np.flatnonzero((np.diff(base) != 1) | (np.diff(image) != 1)) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [len(base)]))
    ext = np.zeros(len(starts), dtype=codec.EXTENT_DTYPE)
    ext['src'] = base[starts]
    ext['length'] = ends - starts
    ext['target_block'] = image[starts]
    ext['target'] = 0
    return codec.encode(base_id, target.size, bs, bmap.map_version,
                        [codec.Target(bmap.image_id, bmap.virtual_size)],
                        ext)
