"""VMAR block maps and vmar-mirror files for the iotests of the drivers.

A small writer of the formats the vmar and vmar-mirror drivers read
(vmar-openstack's doc/source/map-format.rst and mirror-format.rst),
independent of vmar-openstack's own writer so that the two check each
other.

"""
# SPDX-License-Identifier: GPL-2.0-or-later

import hashlib
import struct
import zlib

HEADER = struct.Struct("<8sIIIIQQ16sIIIIIIQQQQQII")
assert HEADER.size == 128


def ceil_div(a, b):
    return -(-a // b)


def smallest_shift(n_blocks, max_units, per_byte):
    for s in range(31):
        units = ceil_div(n_blocks, 1 << s)
        if per_byte > 1:
            units = ceil_div(units, per_byte)
        if units <= max_units:
            return s
    return 31


def build_map(block_size, virtual_size, image_id, targets, extents,
              map_version=1, tweak=None):
    """targets: [(uuid bytes, size, flags)], extents: [(src, len, tb, t)]."""
    n_blocks = ceil_div(virtual_size, block_size)
    n_ext = len(extents)
    ss = smallest_shift(n_blocks, max(1, n_ext), 1)
    n_sections = ceil_div(n_blocks, 1 << ss)
    fs = smallest_shift(n_blocks, max(8, 2 * n_ext), 8)
    n_granules = ceil_div(n_blocks, 1 << fs)
    filter_bytes = ceil_div(n_granules, 8)

    sections = []
    for k in range(n_sections):
        start, end = k << ss, (k + 1) << ss
        first = next((i for i, e in enumerate(extents)
                      if e[0] + e[1] > start), n_ext)
        count = sum(1 for e in extents if e[0] < end and e[0] + e[1] > start)
        sections.append((first, count))
    filt = bytearray(filter_bytes)
    for src, length, _, _ in extents:
        for g in range(src >> fs, ((src + length - 1) >> fs) + 1):
            filt[g >> 3] |= 1 << (g & 7)

    f = dict(section_shift=ss, n_sections=n_sections, filter_shift=fs,
             filter_bytes=filter_bytes, n_targets=len(targets),
             n_extents=n_ext, version=1, header_size=128,
             block_size=block_size, flags=0, virtual_size=virtual_size,
             map_version=map_version)
    body = bytearray()
    body += b"".join(struct.pack("<16sQII", t[0], t[1], t[2], 0)
                     for t in targets)
    body += b"".join(struct.pack("<IIII", *e) for e in extents)
    body += b"".join(struct.pack("<II", *s) for s in sections)
    body += filt
    body += bytes(-len(body) % 8)
    if tweak:
        tweak(f, body)
    targets_off = 128
    extents_off = targets_off + 32 * f["n_targets"]
    index_off = extents_off + 16 * f["n_extents"]
    filter_off = index_off + 8 * f["n_sections"]
    file_size = filter_off + f["filter_bytes"]
    file_size += -file_size % 8
    f.update(targets_off=targets_off, extents_off=extents_off,
             index_off=index_off, filter_off=filter_off, file_size=file_size)
    if tweak:
        tweak(f, None)
    body_crc = f.get("body_crc", zlib.crc32(bytes(body)))
    hdr = HEADER.pack(b"VMARMAP\0", f["version"], f["header_size"],
                      f["block_size"], f["flags"], f["virtual_size"],
                      f["map_version"], image_id, f["n_targets"],
                      f["n_extents"], f["section_shift"], f["n_sections"],
                      f["filter_shift"], f["filter_bytes"], f["targets_off"],
                      f["extents_off"], f["index_off"], f["filter_off"],
                      f["file_size"], body_crc, 0)
    header_crc = f.get("header_crc", zlib.crc32(hdr[:124]))
    return hdr[:124] + struct.pack("<I", header_crc) + bytes(body)


MIRROR_HEADER = struct.Struct("<8sIIQ16sI")
DIGEST_SIZE = 32


def _mirror_header(magic, block_size, size, image_id, pad):
    hdr = MIRROR_HEADER.pack(magic, 1, block_size, size, image_id,
                             DIGEST_SIZE)
    return hdr + bytes(pad - len(hdr))


def digest_list(data, block_size, image_id):
    """The digest list of base @data.

    A SHA-256 per block, zeros for a zero block; the partial last block
    is hashed zero-padded.
    """
    out = bytearray(_mirror_header(b"VMARDGST", block_size, len(data),
                                   image_id, 64))
    for off in range(0, len(data), block_size):
        blk = data[off:off + block_size].ljust(block_size, b"\0")
        if blk.count(0) == block_size:
            out += bytes(DIGEST_SIZE)
        else:
            out += hashlib.sha256(blk).digest()
    return bytes(out)


def present_file(size, block_size, image_id):
    """An empty present-block bitmap for a base of @size bytes."""
    n_blocks = ceil_div(size, block_size)
    return _mirror_header(b"VMARPRES", block_size, size, image_id,
                          4096) + bytes(ceil_div(n_blocks, 8))
