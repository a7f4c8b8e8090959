"""The filters of the library's change log (fingerprint.keyfilter)."""

import numpy as np
import testtools

from vmar_openstack.fingerprint import keyfilter


class TestKeyFilter(testtools.TestCase):

    def setUp(self):
        super().setUp()
        rnd = np.random.default_rng(51)
        self.keys = rnd.integers(-2 ** 63, 2 ** 63 - 1, 100_000,
                                 dtype=np.int64)
        self.others = rnd.integers(-2 ** 63, 2 ** 63 - 1, 100_000,
                                   dtype=np.int64)

    def test_no_false_negative(self):
        f = keyfilter.KeyFilter.of(self.keys)
        self.assertTrue(f.might_contain(self.keys).all())

    def test_false_positives_as_sized(self):
        f = keyfilter.KeyFilter.of(self.keys)
        fp = f.might_contain(self.others).mean()
        # 16 bits and 11 probes per key: 0.046 % in theory
        self.assertLess(fp, 0.0015)
        self.assertEqual(2 * len(self.keys) + 24, len(f.to_bytes()))

    def test_a_small_filter_keeps_its_rate(self):
        f = keyfilter.KeyFilter.of(self.keys[:3])
        self.assertLess(f.might_contain(self.others).mean(), 0.0015)

    def test_the_bits_are_where_the_format_says(self):
        # probe i of a key is bit (lo + i * hi) mod m: bit b % 8 of byte
        # b // 8 (filters written by one release are read by another)
        keys = np.random.default_rng(7).integers(
            -2 ** 63, 2 ** 63 - 1, 300, dtype=np.int64)
        f = keyfilter.KeyFilter.of(keys)
        want = set()
        for k in keys.tolist():
            u = k % (1 << 64)
            lo, hi = u & 0xFFFFFFFF, (u >> 32) | 1
            want.update((lo + i * hi) % f.n_bits for i in range(f.probes))
        have = {b for b in range(f.n_bits) if f.bits[b // 8] >> (b % 8) & 1}
        self.assertEqual(want, have)

    def test_round_trip(self):
        f = keyfilter.KeyFilter.of(self.keys[:1000])
        g = keyfilter.KeyFilter.from_bytes(f.to_bytes())
        np.testing.assert_array_equal(f.might_contain(self.others),
                                      g.might_contain(self.others))
        self.assertEqual(1000, g.n_keys)

    def test_empty(self):
        f = keyfilter.KeyFilter.of(np.empty(0, np.int64))
        self.assertFalse(f.might_contain(self.others).any())
        self.assertEqual(0, len(f.might_contain(np.empty(0, np.int64))))

    def test_not_a_filter(self):
        data = keyfilter.KeyFilter.of(self.keys[:10]).to_bytes()
        for bad in (b'', data[:10], b'X' + data[1:], data[:-1]):
            self.assertRaises(ValueError, keyfilter.KeyFilter.from_bytes, bad)
