"""Reading through a parsed map: block lookups and byte ranges.

:func:`iter_ranges` is the reference semantics of a map; :class:`Lookup`
mirrors the lookup of the C driver; :func:`reconstruct` writes the content
a map describes.
"""

import os

import numpy as np

from vmar_openstack import exception


class Lookup:
    """Block lookups through index and filter, counting probes.

    Mirrors the lookup of the C driver so the benchmark can report the
    probe figures the spec defines.
    """

    def __init__(self, bmap):
        self.map = bmap
        self.src = bmap.extents['src'].astype(np.int64)
        self.end = self.src + bmap.extents['length'].astype(np.int64)
        self.last = -1
        self.lookups = 0
        self.probes = 0

    def find(self, block):
        """Return the extent index covering ``block``, or None if zero."""
        self.lookups += 1
        m = self.map
        if self.last >= 0 and self.src[self.last] <= block < self.end[
                self.last]:
            return self.last
        g = block >> m.filter_shift
        if not (m.filter_bits[g >> 3] >> (g & 7)) & 1:
            return None
        first, count = m.index[block >> m.section_shift]
        lo, hi = int(first), int(first) + int(count)
        while lo < hi:
            mid = (lo + hi) // 2
            self.probes += 1
            if self.end[mid] <= block:
                lo = mid + 1
            elif self.src[mid] > block:
                hi = mid
            else:
                self.last = mid
                return mid
        return None


def iter_ranges(bmap):
    """Yield ``(offset, length, target_index, target_offset)`` in bytes.

    The ranges cover ``[0, virtual_size)`` in order; ``target_index`` is None
    for zero ranges. This is the reference semantics of a map.
    """
    bs = bmap.block_size
    pos = 0
    for src, length, tblock, tidx in bmap.extents.tolist():
        start = src * bs
        if start > pos:
            yield pos, start - pos, None, 0
        end = min((src + length) * bs, bmap.virtual_size)
        yield start, end - start, tidx, tblock * bs
        pos = end
    if pos < bmap.virtual_size:
        yield pos, bmap.virtual_size - pos, None, 0


def reconstruct(bmap, target_path, out, chunk=8 << 20):
    """Write the content a map describes to the binary file ``out``.

    :param target_path: function from a target image id to a raw file path.
    Zero ranges are skipped with seek, so ``out`` comes out sparse.
    """
    files = {}
    try:
        for t in bmap.targets:
            f = open(target_path(t.image_id), 'rb')
            files[t.image_id] = f
            size = os.fstat(f.fileno()).st_size
            if size != t.size:
                raise exception.MapFormatError(
                    reason='targets', detail='target %s is %d bytes, the map '
                    'says %d' % (t.image_id, size, t.size))
        for offset, length, tidx, toff in iter_ranges(bmap):
            if tidx is None:
                continue
            f = files[bmap.targets[tidx].image_id]
            out.seek(offset)
            done = 0
            while done < length:
                n = min(chunk, length - done)
                buf = os.pread(f.fileno(), n, toff + done)
                if len(buf) != n:
                    raise IOError('short read from target %s'
                                  % bmap.targets[tidx].image_id)
                out.write(buf)
                done += n
        out.truncate(bmap.virtual_size)
    finally:
        for f in files.values():
            f.close()
