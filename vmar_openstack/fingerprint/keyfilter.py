"""A compact filter of fingerprint keys: a Bloom filter, no false negatives.

The library's change log (:mod:`vmar_openstack.db.content_log`) keeps one
per add, of the keys the add inserted, so that an ingest whose snapshot
went stale finds which of its not-found keys another add inserted since
without probing the fingerprint table for each: it tests them against
the filters (numpy, outside SQL) and looks up only the keys that test
positive (the keys really inserted, and about one in two thousand others).

Fingerprint keys are prefixes of cryptographic digests, uniform over 64
bits, so the filter hashes nothing again: probe ``i`` of a key is
``(lo + i * hi) mod m`` (double hashing, Kirsch and Mitzenmacher), with
``lo`` and ``hi`` the key's two 32-bit halves.

Serialised form (little-endian): ``b'VMARKF1\\0'``, the number of bits
``m`` (u64), the number of probes (u32), the number of keys (u32), then
``ceil(m / 8)`` bytes of bits.
"""

import struct

import numpy as np

MAGIC = b'VMARKF1\0'
_HEADER = struct.Struct('<8sQII')
# 16 bits (2 bytes) and 11 probes per key: about 0.05 % false positives,
# so a test of 80,000 keys against a filter gives about 40 to look up
BITS_PER_KEY = 16
PROBES = 11
# a filter of a few keys keeps its rate of false positives
MIN_BITS = 4096


class KeyFilter:
    """The keys of one set, tested for membership with no false negative."""

    def __init__(self, bits, n_bits, probes, n_keys):
        self.bits = bits            # uint8 array of ceil(n_bits / 8)
        self.n_bits = n_bits
        self.probes = probes
        self.n_keys = n_keys

    @classmethod
    def of(cls, keys, bits_per_key=BITS_PER_KEY, probes=PROBES):
        """The filter of the int64 ``keys`` (any order, repeats allowed)."""
        keys = np.asarray(keys, dtype=np.int64)
        n_bits = max(MIN_BITS, bits_per_key * len(keys))
        # one bool per bit, then packed: bit b is bit b % 8 of byte b // 8
        flags = np.zeros(n_bits, dtype=bool)
        flags[_positions(keys, n_bits, probes)] = True
        bits = np.packbits(flags, bitorder='little')
        return cls(bits, n_bits, probes, len(keys))

    def might_contain(self, keys):
        """A bool array: False where a key of ``keys`` is surely absent."""
        keys = np.asarray(keys, dtype=np.int64)
        if not len(keys):
            return np.zeros(0, dtype=bool)
        pos = _positions(keys, self.n_bits, self.probes)
        hit = (self.bits[pos >> 3] >> (pos & 7).astype(np.uint8)) & 1
        return hit.reshape(self.probes, len(keys)).all(axis=0)

    def to_bytes(self):
        return _HEADER.pack(MAGIC, self.n_bits, self.probes,
                            self.n_keys) + self.bits.tobytes()

    @classmethod
    def from_bytes(cls, data):
        """The filter :meth:`to_bytes` wrote; ValueError if it is not one."""
        if len(data) < _HEADER.size:
            raise ValueError('key filter: %d bytes, shorter than its header'
                             % len(data))
        magic, n_bits, probes, n_keys = _HEADER.unpack_from(data)
        body = len(data) - _HEADER.size
        if magic != MAGIC or not probes or body != (n_bits + 7) // 8:
            raise ValueError('key filter: not a VMARKF1 filter of %d bits '
                             '(%d bytes of bits)' % (n_bits, body))
        bits = np.frombuffer(data, dtype=np.uint8, offset=_HEADER.size)
        return cls(bits, n_bits, probes, n_keys)


def _positions(keys, n_bits, probes):
    """Bit positions, ``probes`` rows of ``len(keys)``, as one int64 array."""
    u = keys.view(np.uint64)
    lo = u & np.uint64(0xFFFFFFFF)
    hi = (u >> np.uint64(32)) | np.uint64(1)
    i = np.arange(probes, dtype=np.uint64)[:, None]
    return ((lo + i * hi) % np.uint64(n_bits)).astype(np.int64).reshape(-1)
