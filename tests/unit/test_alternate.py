"""Alternate maps: a base's blocks read back from an image's own bytes."""

import os
import random
import tempfile

import numpy as np
import testtools

from vmar_openstack import mapformat
from vmar_openstack.mapformat import alternate

A = '00000000-0000-4000-8000-00000000000a'
M = '00000000-0000-4000-8000-00000000000b'
BS = 4096


def _map(rnd, m_size, a_size):
    """A random map of M reading from A (and from itself)."""
    n, a_blocks = -(-m_size // BS), -(-a_size // BS)
    # A's partial last block is only read by M's equally partial one
    a_whole = a_blocks - (1 if a_size % BS else 0)
    rows, pos = [], 0
    while pos < n:
        length = min(rnd.randint(1, 8), n - pos)
        kind = rnd.random()
        if kind < 0.2:
            pass                                   # zero
        elif kind < 0.4 or a_whole < length:
            rows.append((pos, length, pos, 1))      # itself
        else:
            rows.append((pos, length, rnd.randint(0, a_whole - length), 0))
        pos += length
    if (a_size % BS and a_size % BS == m_size % BS and rows
            and rows[-1][0] + rows[-1][1] == n and n <= a_blocks):
        src, length, _tb, _t = rows[-1]
        rows[-1] = (src, length, a_blocks - length, 0)
    ext = np.array(rows, dtype=mapformat.EXTENT_DTYPE)
    return mapformat.decode(mapformat.encode(
        M, m_size, BS, 3, [mapformat.Target(A, a_size),
                           mapformat.Target(M, m_size, True)], ext))


def _content(bmap, files):
    """The bytes ``bmap`` describes, its targets read from ``files``."""
    with tempfile.TemporaryFile() as out:
        mapformat.reconstruct(bmap, files.get, out)
        out.seek(0)
        return out.read()


class TestAlternate(testtools.TestCase):

    def test_alternate_reads_each_base_block_from_the_image(self):
        tmp = self.useFixture(__import__('fixtures').TempDir()).path
        for seed in range(40):
            rnd = random.Random(seed)
            a_size = rnd.randint(1, 64) * BS - rnd.choice((0, 0, 100))
            m_size = rnd.randint(1, 96) * BS - rnd.choice((0, 0, 100))
            bmap = _map(rnd, m_size, a_size)
            a_bytes = rnd.randbytes(a_size)
            own = rnd.randbytes(m_size)
            files = {A: os.path.join(tmp, 'a'), M: os.path.join(tmp, 'own')}
            for key, data in ((A, a_bytes), (M, own)):
                with open(files[key], 'wb') as f:
                    f.write(data)
            m_bytes = _content(bmap, files)
            data = alternate.alternate(bmap, A)
            used = {int(tb) + i for _s, length, tb, t in
                    bmap.extents.tolist() if t == 0
                    for i in range(length)}
            if data is None:
                self.assertEqual(set(), used, seed)
                continue
            alt = mapformat.decode(data)
            self.assertEqual((A, a_size, [M], [m_size]),
                             (alt.image_id, alt.virtual_size,
                              [t.image_id for t in alt.targets],
                              [t.size for t in alt.targets]))
            with open(files[M], 'wb') as f:
                f.write(m_bytes)
            got = _content(alt, files)
            covered = {int(s) + i for s, length, _tb, _t in
                       alt.extents.tolist() for i in range(length)}
            # every block M reads from A is there, bar M's partial last
            # block standing in for a whole one
            self.assertLessEqual(len(used - covered), 1, seed)
            for b in covered:
                self.assertEqual(a_bytes[b * BS:(b + 1) * BS],
                                 got[b * BS:(b + 1) * BS], (seed, b))
            # fewer extents than blocks: runs are coalesced
            self.assertLessEqual(len(alt.extents), len(covered))

    def test_no_alternate_of_an_image_itself_or_of_a_stranger(self):
        bmap = _map(random.Random(1), 40 * BS, 40 * BS)
        self.assertIsNone(alternate.alternate(bmap, M))
        self.assertIsNone(alternate.alternate(
            bmap, '00000000-0000-4000-8000-00000000000c'))
