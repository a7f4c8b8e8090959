#!/usr/bin/env python3
"""Regenerate the map-format test vectors in this directory.

Usage: python tests/vectors/generate.py

Writes, for each vector NAME: NAME.vmap, NAME.json and, for valid vectors,
NAME.expected (the raw content the map describes). Target images live in
bases/<uuid>. The content is derived from fixed seeds, so running this twice
gives identical files. Both the Python reader (tests/unit/test_mapformat.py)
and the C reader (qemu/) are checked against these files.
"""

import hashlib
import json
import os
import struct
import sys
import zlib

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', '..'))
from vmar_openstack import mapformat  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BS = 4096
A = '0a000000-0000-4000-8000-00000000000a'
B = '0b000000-0000-4000-8000-00000000000b'
C = '0c000000-0000-4000-8000-00000000000c'
SRC = '05000000-0000-4000-8000-000000000005'


def block(seed, size=BS):
    out = bytearray()
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(b'%d/%d' % (seed, counter)).digest()
        counter += 1
    return bytes(out[:size])


def image(seeds, tail=None):
    data = b''.join(bytes(BS) if s is None else block(s) for s in seeds)
    if tail is not None:
        data += block(tail)[:1000]
    return data


BASES = {
    A: image(list(range(100, 116))),                    # 16 blocks
    B: image([200, None, 201, 202, 203, 204, None, 205]),
    C: image([300, 301, 302], tail=303),                # 3 blocks + 1000 B
}


def ext(*rows):
    arr = np.zeros(len(rows), dtype=mapformat.EXTENT_DTYPE)
    for i, r in enumerate(rows):
        arr[i] = r
    return arr


def content(vsize, targets, extents):
    out = bytearray(vsize)
    for src, length, tblock, tidx in extents.tolist():
        data = BASES[targets[tidx].image_id]
        start, end = src * BS, min((src + length) * BS, vsize)
        out[start:end] = data[tblock * BS:tblock * BS + (end - start)]
    return bytes(out)


def t(image_id, is_self=False, size=None):
    return mapformat.Target(image_id, size or len(BASES[image_id]), is_self)


def recrc(data):
    data = bytearray(data)
    struct.pack_into('<I', data, 120, zlib.crc32(data[128:]))
    struct.pack_into('<I', data, 124, zlib.crc32(data[:124]))
    return bytes(data)


def valid_vectors():
    yield 'two-targets', 12 * BS, [t(A), t(B)], ext(
        (0, 4, 2, 0), (5, 3, 2, 1), (9, 2, 14, 0))
    yield 'single-block', BS, [t(A)], ext((0, 1, 7, 0))
    yield 'all-zero', 64 * BS, [t(A)], ext()
    yield 'zero-start-end', 40 * BS, [t(A), t(B)], ext(
        (10, 1, 0, 1), (11, 5, 3, 0), (16, 1, 7, 1), (20, 10, 5, 0))
    # C's content is 3 blocks + a 1000-byte tail; source = same layout
    yield 'partial-tail', 3 * BS + 1000, [t(C)], ext((0, 4, 0, 0))
    yield 'many-extents', 300 * BS, [t(A), t(B)], ext(*[
        (i * 3, 1 + i % 2, i % 16 if i % 2 == 0 else 2, i % 2)
        for i in range(100) if (i % 16 if i % 2 == 0 else 2) + 1 + i % 2
        <= (16 if i % 2 == 0 else 8)])


def encode(name, vsize, targets, extents, version=1):
    return mapformat.encode(SRC, vsize, BS, version, targets, extents)


def invalid_vectors():
    good = encode('x', 12 * BS, [t(A), t(B)],
                  ext((0, 4, 2, 0), (5, 3, 2, 1), (9, 2, 14, 0)))
    bad = bytearray(good)
    bad[0:8] = b'VMARMAX\0'
    yield 'bad-magic', bytes(bad), 'magic'
    bad = bytearray(good)
    struct.pack_into('<I', bad, 8, 2)
    yield 'bad-version', recrc(bad), 'version'
    bad = bytearray(good)
    bad[20] ^= 1
    yield 'bad-header-crc', bytes(bad), 'crc'
    bad = bytearray(good)
    bad[-9] ^= 0xff
    yield 'bad-body-crc', bytes(bad), 'crc'
    yield 'truncated', good[:-8], 'bounds'
    yield 'short-header', good[:100], 'header'
    bad = bytearray(good)
    struct.pack_into('<I', bad, 16, 6000)
    yield 'bad-block-size', recrc(bad), 'header'
    bad = bytearray(good)
    struct.pack_into('<Q', bad, 24, 0)
    yield 'zero-virtual-size', recrc(bad), 'header'
    bad = bytearray(good)
    struct.pack_into('<I', bad, 60, 4)   # n_extents too big for the file
    yield 'extent-count-overflow', recrc(bad), 'bounds'
    bad = bytearray(good)
    struct.pack_into('<Q', bad, 88, 120)
    yield 'bad-offset', recrc(bad), 'bounds'
    yield 'overlapping-extents', encode('x', 12 * BS, [t(A)], ext(
        (0, 4, 0, 0), (3, 2, 8, 0))), 'extents'
    yield 'unsorted-extents', encode('x', 12 * BS, [t(A)], ext(
        (5, 2, 0, 0), (0, 2, 8, 0))), 'extents'
    yield 'extent-past-end', encode('x', 12 * BS, [t(A)], ext(
        (10, 4, 0, 0))), 'extents'
    yield 'zero-length-extent', encode('x', 12 * BS, [t(A)], ext(
        (1, 0, 0, 0))), 'extents'
    yield 'bad-target-index', encode('x', 12 * BS, [t(A)], ext(
        (0, 2, 0, 1))), 'extents'
    yield 'target-overrun', encode('x', 12 * BS, [t(B)], ext(
        (0, 4, 6, 0))), 'extents'
    yield 'partial-tail-misuse', encode('x', 12 * BS, [t(C)], ext(
        (0, 4, 0, 0))), 'extents'
    yield 'duplicate-target', encode('x', 12 * BS, [t(A), t(A)], ext(
        (0, 1, 0, 0))), 'targets'
    yield 'self-target-mismatch', encode('x', 12 * BS, [t(A, True)], ext(
        (0, 1, 0, 0))), 'targets'
    bad = bytearray(good)
    # index starts after header, 2 targets and 3 extents
    off = 128 + 2 * 32 + 3 * 16
    struct.pack_into('<I', bad, off + 4, 7)
    yield 'bad-index', recrc(bad), 'index'
    bad = bytearray(good)
    off = struct.unpack_from('<Q', bad, 104)[0]
    bad[off] ^= 0x01
    yield 'bad-filter', recrc(bad), 'filter'


def main():
    os.makedirs(os.path.join(HERE, 'bases'), exist_ok=True)
    for image_id, data in BASES.items():
        with open(os.path.join(HERE, 'bases', image_id), 'wb') as f:
            f.write(data)
    index = {}
    for name, vsize, targets, extents in valid_vectors():
        data = encode(name, vsize, targets, extents)
        with open(os.path.join(HERE, name + '.vmap'), 'wb') as f:
            f.write(data)
        with open(os.path.join(HERE, name + '.expected'), 'wb') as f:
            f.write(content(vsize, targets, extents))
        meta = {'valid': True, 'image_id': SRC, 'virtual_size': vsize,
                'block_size': BS, 'map_version': 1,
                'targets': [{'image_id': x.image_id, 'size': x.size,
                             'self': x.is_self} for x in targets],
                'extents': extents.tolist(),
                'expected': name + '.expected', 'base_dir': 'bases'}
        index[name] = meta
    for name, data, reason in invalid_vectors():
        with open(os.path.join(HERE, name + '.vmap'), 'wb') as f:
            f.write(data)
        index[name] = {'valid': False, 'reason': reason}
    for name, meta in index.items():
        with open(os.path.join(HERE, name + '.json'), 'w') as f:
            json.dump(meta, f, indent=1, sort_keys=True)
            f.write('\n')
    print('%d vectors written to %s' % (len(index), HERE))


if __name__ == '__main__':
    main()
