"""The Python map reader against the shared test vectors, and fuzzed."""

import glob
import hashlib
import json
import os
import random
import struct
import tempfile
import zlib

import numpy as np
import testtools

from tests import base
from vmar_openstack import exception
from vmar_openstack import mapformat


def _vectors():
    for path in sorted(glob.glob(os.path.join(base.VECTORS, '*.json'))):
        with open(path) as f:
            yield path[:-5], json.load(f)


class TestVectors(testtools.TestCase):

    def test_there_are_valid_and_invalid_vectors(self):
        kinds = [meta['valid'] for _name, meta in _vectors()]
        self.assertGreaterEqual(kinds.count(True), 5)
        self.assertGreaterEqual(kinds.count(False), 15)

    def test_every_vector(self):
        for name, meta in _vectors():
            with open(name + '.vmap', 'rb') as f:
                data = f.read()
            if not meta['valid']:
                e = self.assertRaises(exception.MapFormatError,
                                      mapformat.decode, data)
                self.assertEqual(meta['reason'], e.reason, name)
                continue
            m = mapformat.decode(data)
            self.assertEqual(meta['extents'],
                             [list(e) for e in m.extents.tolist()], name)
            self.assertEqual(meta['virtual_size'], m.virtual_size)
            self.assertEqual(meta['targets'], [
                {'image_id': t.image_id, 'size': t.size, 'self': t.is_self}
                for t in m.targets])
            bases = os.path.join(base.VECTORS, meta['base_dir'])
            with tempfile.TemporaryFile() as out:
                mapformat.reconstruct(m, lambda t: os.path.join(bases, t),
                                      out)
                out.seek(0)
                got = hashlib.sha256(out.read()).hexdigest()
            with open(os.path.join(base.VECTORS, meta['expected']),
                      'rb') as f:
                self.assertEqual(hashlib.sha256(f.read()).hexdigest(), got,
                                 name)

    def test_vectors_are_what_the_generator_writes(self):
        # the writer is deterministic: re-encoding a valid vector's content
        # gives the committed bytes
        for name, meta in _vectors():
            if not meta['valid']:
                continue
            ext = np.array([tuple(e) for e in meta['extents']],
                           dtype=mapformat.EXTENT_DTYPE)
            data = mapformat.encode(
                meta['image_id'], meta['virtual_size'], meta['block_size'],
                meta['map_version'],
                [mapformat.Target(t['image_id'], t['size'], t['self'])
                 for t in meta['targets']], ext)
            with open(name + '.vmap', 'rb') as f:
                self.assertEqual(f.read(), data, name)


class TestRoundTripAndFuzz(testtools.TestCase):

    def _random_map(self, rnd):
        n_blocks = rnd.randint(1, 5000)
        bs = 4096
        targets = [mapformat.Target('%08x-0000-4000-8000-000000000000' % i,
                                    rnd.randint(1, 4000) * bs)
                   for i in range(rnd.randint(1, 4))]
        rows, pos = [], 0
        while pos < n_blocks and len(rows) < 400:
            pos += rnd.randint(0, 30)
            length = rnd.randint(1, 40)
            if pos + length > n_blocks:
                break
            ti = rnd.randrange(len(targets))
            tblocks = targets[ti].size // bs
            if length > tblocks:
                continue
            rows.append((pos, length, rnd.randint(0, tblocks - length), ti))
            pos += length
        ext = np.array(rows, dtype=mapformat.EXTENT_DTYPE)
        return n_blocks * bs, targets, ext

    def test_round_trip_and_lookup(self):
        rnd = random.Random(5)
        for _ in range(60):
            vsize, targets, ext = self._random_map(rnd)
            data = mapformat.encode('00000000-0000-4000-8000-0000000000aa',
                                    vsize, 4096, 3, targets, ext)
            m = mapformat.decode(data)
            self.assertEqual(ext.tolist(), m.extents.tolist())
            lk = mapformat.Lookup(m)
            covered = {}
            for i, (src, length, _tb, _ti) in enumerate(ext.tolist()):
                for b in range(src, src + length):
                    covered[b] = i
            for b in rnd.sample(range(m.n_blocks), min(300, m.n_blocks)):
                self.assertEqual(covered.get(b), lk.find(b))
            # about one probe per lookup at most, thanks to the index
            self.assertLessEqual(lk.probes / max(1, lk.lookups), 2.0)

    def test_random_corruption_is_a_clean_error(self):
        rnd = random.Random(9)
        for _ in range(40):
            vsize, targets, ext = self._random_map(rnd)
            good = mapformat.encode('00000000-0000-4000-8000-0000000000aa',
                                    vsize, 4096, 1, targets, ext)
            for _ in range(25):
                bad = bytearray(good)
                for _ in range(rnd.randint(1, 4)):
                    bad[rnd.randrange(len(bad))] = rnd.randrange(256)
                if rnd.random() < 0.5:
                    # keep the checksums right so structure checks run
                    struct.pack_into('<I', bad, 120, zlib.crc32(
                        bad[128:]))
                    struct.pack_into('<I', bad, 124, zlib.crc32(
                        bad[:124]))
                if rnd.random() < 0.2:
                    bad = bad[:rnd.randrange(len(bad))]
                try:
                    m = mapformat.decode(bytes(bad))
                except exception.MapFormatError:
                    continue
                # accepted: it must still be a consistent map
                mapformat.build_index(m.extents, m.n_blocks, m.section_shift)


class TestAtomicWrite(base.LibraryTestCase):

    def test_failed_write_leaves_nothing(self):
        path = os.path.join(self.tmp, 'maps', 'x.vmap')

        class Boom(Exception):
            pass

        def fail(fd):
            raise Boom()
        self.patch(os, 'fsync', fail)
        self.assertRaises(Boom, mapformat.write_atomic, path, b'data')
        self.assertEqual([], os.listdir(os.path.dirname(path)))

    def test_write_replaces_whole_file(self):
        path = os.path.join(self.tmp, 'maps', 'x.vmap')
        mapformat.write_atomic(path, b'a' * 100)
        mapformat.write_atomic(path, b'b' * 10)
        with open(path, 'rb') as f:
            self.assertEqual(b'b' * 10, f.read())
