"""The digest list and present file of base mirrors (mirror-format.rst)."""

import os
import uuid

import fixtures
import numpy as np
import testtools

from vmar_openstack import exception
from vmar_openstack import fingerprint
from vmar_openstack.mapformat import mirror


class TestMirrorFormat(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.image_id = str(uuid.uuid4())
        rng = np.random.default_rng(1)
        self.digests = rng.integers(0, 256, (5, 32), dtype=np.uint8)
        self.digests[2] = 0
        self.fps = fingerprint.Fingerprints('sha256', 4096, 4 * 4096 + 100,
                                            self.digests)

    def write(self, data):
        path = os.path.join(self.tmp, 'd')
        with open(path, 'wb') as f:
            f.write(data)
        return path

    def test_digest_list_round_trip(self):
        data = mirror.digests_bytes(self.image_id, self.fps)
        self.assertEqual(64 + 5 * 32, len(data))
        self.assertEqual(b'VMARDGST', data[:8])
        hdr, rows = mirror.read_digests(self.write(data))
        self.assertEqual(mirror.Header(self.image_id, 4 * 4096 + 100, 4096),
                         hdr)
        self.assertEqual(5, hdr.n_blocks)
        np.testing.assert_array_equal(self.digests, rows)

    def test_digest_list_refuses_other_algorithms(self):
        fps = fingerprint.Fingerprints('sha1', 4096, 4096,
                                       np.zeros((1, 20), np.uint8))
        self.assertRaises(exception.MirrorFormatError, mirror.digests_bytes,
                          self.image_id, fps)

    def test_bad_digest_lists(self):
        good = mirror.digests_bytes(self.image_id, self.fps)
        for bad, why in ((good[:-1], 'bytes, not'),
                         (b'VMARPRES' + good[8:], 'not a VMARDGST file'),
                         (good[:8] + b'\2' + good[9:], 'version 2'),
                         (good[:12] + b'\0\x03\0\0' + good[16:],
                          'block size 768'),
                         (good[:20], 'shorter than its header')):
            e = self.assertRaises(exception.MirrorFormatError,
                                  mirror.read_digests, self.write(bad))
            self.assertIn(why, str(e))

    def test_present_file(self):
        hdr = mirror.Header(self.image_id, 20 * 4096, 4096)
        path = os.path.join(self.tmp, 'p')
        mirror.create_present(path, hdr)
        self.assertEqual(4096 + 3, os.path.getsize(path))
        got, bits = mirror.read_present(path)
        self.assertEqual(hdr, got)
        self.assertEqual(20, len(bits))
        self.assertFalse(bits.any())
        # bit b % 8 of byte b // 8, as the driver sets them
        with open(path, 'r+b') as f:
            f.seek(4096 + 2)
            f.write(b'\x08')
        self.assertEqual([19], np.flatnonzero(mirror.read_present(path)[1])
                         .tolist())
        with open(path, 'ab') as f:
            f.write(b'\0')
        self.assertRaises(exception.MirrorFormatError, mirror.read_present,
                          path)
