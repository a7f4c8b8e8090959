"""The map file's bytes: writer and validating parser.

Implements ``doc/source/reference/map-format.rst``: :func:`encode` turns
extents into bytes, :func:`decode` turns bytes back into a validated
:class:`BlockMap` or raises :class:`~vmar_openstack.exception.MapFormatError`
naming the first broken rule.
"""

import dataclasses
import struct
import uuid
import zlib

import numpy as np

from vmar_openstack import exception

MAGIC = b'VMARMAP\0'
FORMAT_VERSION = 1
HEADER_SIZE = 128
TARGET_SIZE = 32
EXTENT_SIZE = 16
INDEX_ENTRY_SIZE = 8
MIN_BLOCK_SIZE = 4096
MAX_BLOCK_SIZE = 2 * 1024 * 1024
MAX_TARGETS = 65536
TARGET_FLAG_SELF = 1

_HEADER = struct.Struct('<8sIIII QQ16s IIIIII QQQQQ II')
assert _HEADER.size == HEADER_SIZE

EXTENT_DTYPE = np.dtype([('src', '<u4'), ('length', '<u4'),
                         ('target_block', '<u4'), ('target', '<u4')])
INDEX_DTYPE = np.dtype([('first', '<u4'), ('count', '<u4')])


@dataclasses.dataclass(frozen=True)
class Target:
    image_id: str
    size: int
    is_self: bool = False


@dataclasses.dataclass
class BlockMap:
    """A parsed, validated map."""

    image_id: str
    virtual_size: int
    block_size: int
    map_version: int
    targets: list
    extents: np.ndarray          # EXTENT_DTYPE, sorted by src
    section_shift: int
    index: np.ndarray            # INDEX_DTYPE
    filter_shift: int
    filter_bits: np.ndarray      # uint8, LSB first
    file_size: int

    @property
    def n_blocks(self):
        return _ceil_div(self.virtual_size, self.block_size)

    def mapped_blocks(self):
        return int(self.extents['length'].sum(dtype=np.uint64))


def target_blocks(targets, extents):
    """``[(target image id, blocks the extents read from it)]``.

    In the order of ``targets``; a target the extents never read has 0.
    """
    counts = np.bincount(extents['target'].astype(np.int64),
                         weights=extents['length'].astype(np.float64),
                         minlength=len(targets))
    return [(t.image_id, int(c)) for t, c in zip(targets, counts)]


def _ceil_div(a, b):
    return -(-a // b)


def _align8(n):
    return (n + 7) & ~7


def _n_blocks(size, block_size):
    return _ceil_div(size, block_size)


def _choose_shift(n_units, budget):
    """Smallest shift with ceil(n_units / 2**shift) <= budget."""
    shift = 0
    while shift < 31 and _ceil_div(n_units, 1 << shift) > budget:
        shift += 1
    return shift


def build_index(extents, n_blocks, section_shift):
    """Section index of the spec, computed from sorted extents."""
    n_sections = max(1, _ceil_div(n_blocks, 1 << section_shift))
    starts = np.arange(n_sections, dtype=np.uint64) << np.uint64(
        section_shift)
    ends = np.minimum(starts + np.uint64(1 << section_shift),
                      np.uint64(n_blocks))
    src = extents['src'].astype(np.uint64)
    src_end = src + extents['length'].astype(np.uint64)
    # first extent that ends after the section start
    first = np.searchsorted(src_end, starts, side='right')
    # extents that start before the section end
    upto = np.searchsorted(src, ends, side='left')
    count = np.maximum(upto.astype(np.int64) - first.astype(np.int64), 0)
    index = np.zeros(n_sections, dtype=INDEX_DTYPE)
    index['first'] = first
    index['count'] = count
    return index


def build_filter(extents, n_blocks, filter_shift):
    """Occupancy bitmap of the spec, computed from extents."""
    n_granules = max(1, _ceil_div(n_blocks, 1 << filter_shift))
    diff = np.zeros(n_granules + 1, dtype=np.int64)
    src = extents['src'].astype(np.int64)
    last = src + extents['length'].astype(np.int64) - 1
    ok = (last >= src) & (last < n_blocks)
    np.add.at(diff, src[ok] >> filter_shift, 1)
    np.add.at(diff, (last[ok] >> filter_shift) + 1, -1)
    occupied = np.cumsum(diff[:-1]) > 0
    return np.packbits(occupied, bitorder='little')


def _layout(n_targets, n_extents, n_sections, filter_bytes):
    targets_off = HEADER_SIZE
    extents_off = targets_off + TARGET_SIZE * n_targets
    index_off = extents_off + EXTENT_SIZE * n_extents
    filter_off = index_off + INDEX_ENTRY_SIZE * n_sections
    file_size = _align8(filter_off + filter_bytes)
    return targets_off, extents_off, index_off, filter_off, file_size


def encode(image_id, virtual_size, block_size, map_version, targets,
           extents):
    """Serialise a map; returns bytes.

    :param targets: list of :class:`Target`.
    :param extents: array of EXTENT_DTYPE sorted by ``src``.
    """
    extents = np.ascontiguousarray(extents, dtype=EXTENT_DTYPE)
    n_blocks = _n_blocks(virtual_size, block_size)
    n_extents = len(extents)
    section_shift = _choose_shift(n_blocks, max(1, n_extents))
    index = build_index(extents, n_blocks, section_shift)
    filter_shift = _choose_shift(_ceil_div(n_blocks, 8), max(8, 2 * n_extents))
    filt = build_filter(extents, n_blocks, filter_shift)
    offs = _layout(len(targets), n_extents, len(index), len(filt))
    targets_off, extents_off, index_off, filter_off, file_size = offs

    body = bytearray(file_size - HEADER_SIZE)
    pos = 0
    for t in targets:
        struct.pack_into('<16sQII', body, pos, uuid.UUID(t.image_id).bytes,
                         t.size, TARGET_FLAG_SELF if t.is_self else 0, 0)
        pos += TARGET_SIZE
    for arr in (extents, index, filt):
        raw = arr.tobytes()
        body[pos:pos + len(raw)] = raw
        pos += len(raw)
    body_crc = zlib.crc32(body)
    header = bytearray(_HEADER.pack(
        MAGIC, FORMAT_VERSION, HEADER_SIZE, block_size, 0, virtual_size,
        map_version, uuid.UUID(image_id).bytes, len(targets), n_extents,
        section_shift, len(index), filter_shift, len(filt), targets_off,
        extents_off, index_off, filter_off, file_size, body_crc, 0))
    struct.pack_into('<I', header, 124, zlib.crc32(header[:124]))
    return bytes(header) + bytes(body)


def _fail(reason, message, *args):
    raise exception.MapFormatError(
        reason=reason, detail=message % args if args else message)


def decode(data):
    """Parse and fully validate a map. Returns :class:`BlockMap`.

    :raises vmar_openstack.exception.MapFormatError: naming the first
        broken rule.
    """
    data = memoryview(data).cast('B')
    if len(data) < HEADER_SIZE:
        _fail('header', 'file is %d bytes, shorter than the header',
              len(data))
    (magic, version, header_size, block_size, flags, virtual_size,
     map_version, image_id, n_targets, n_extents, section_shift, n_sections,
     filter_shift, filter_bytes, targets_off, extents_off, index_off,
     filter_off, file_size, body_crc, header_crc) = _HEADER.unpack_from(data)
    if magic != MAGIC:
        _fail('magic', 'bad magic %r', bytes(magic))
    if version != FORMAT_VERSION:
        _fail('version', 'unsupported format version %d', version)
    if zlib.crc32(data[:124]) != header_crc:
        _fail('crc', 'header checksum mismatch')
    if header_size != HEADER_SIZE:
        _fail('header', 'header_size %d is not %d', header_size, HEADER_SIZE)
    if flags:
        _fail('header', 'unknown flags 0x%x', flags)
    if (block_size < MIN_BLOCK_SIZE or block_size > MAX_BLOCK_SIZE
            or block_size & (block_size - 1)):
        _fail('header', 'block_size %d is not a power of two in [%d, %d]',
              block_size, MIN_BLOCK_SIZE, MAX_BLOCK_SIZE)
    if virtual_size == 0:
        _fail('header', 'virtual_size is 0')
    n_blocks = _n_blocks(virtual_size, block_size)
    if n_blocks >= 1 << 32:
        _fail('header', 'virtual_size %d needs %d blocks, too many',
              virtual_size, n_blocks)
    if map_version == 0:
        _fail('header', 'map_version is 0')
    if not 1 <= n_targets <= MAX_TARGETS:
        _fail('header', 'n_targets %d out of range', n_targets)
    if section_shift > 31 or filter_shift > 31:
        _fail('header', 'section_shift %d or filter_shift %d above 31',
              section_shift, filter_shift)
    if n_sections != max(1, _ceil_div(n_blocks, 1 << section_shift)):
        _fail('index', 'n_sections %d does not match the block count',
              n_sections)
    n_granules = max(1, _ceil_div(n_blocks, 1 << filter_shift))
    if filter_bytes != _ceil_div(n_granules, 8):
        _fail('filter', 'filter_bytes %d does not match the block count',
              filter_bytes)
    expect = _layout(n_targets, n_extents, n_sections, filter_bytes)
    if (targets_off, extents_off, index_off, filter_off,
            file_size) != expect:
        _fail('bounds', 'section offsets %r differ from the layout %r',
              (targets_off, extents_off, index_off, filter_off, file_size),
              expect)
    if file_size != len(data):
        _fail('bounds', 'file_size %d but the file has %d bytes', file_size,
              len(data))
    if zlib.crc32(data[HEADER_SIZE:file_size]) != body_crc:
        _fail('crc', 'body checksum mismatch')
    if any(data[filter_off + filter_bytes:file_size]):
        _fail('bounds', 'non-zero padding after the filter')

    src_id = str(uuid.UUID(bytes=bytes(image_id)))
    targets = []
    seen = set()
    n_self = 0
    for i in range(n_targets):
        tid, size, tflags, reserved = struct.unpack_from(
            '<16sQII', data, targets_off + i * TARGET_SIZE)
        tid = str(uuid.UUID(bytes=tid))
        if tflags & ~TARGET_FLAG_SELF or reserved:
            _fail('targets', 'target %d has unknown flags', i)
        if size == 0:
            _fail('targets', 'target %d has size 0', i)
        if tid in seen:
            _fail('targets', 'target %s listed twice', tid)
        seen.add(tid)
        is_self = bool(tflags & TARGET_FLAG_SELF)
        if is_self:
            n_self += 1
            if tid != src_id or size != virtual_size:
                _fail('targets', 'self target %d does not match the header',
                      i)
        targets.append(Target(tid, size, is_self))
    if n_self > 1:
        _fail('targets', 'more than one self target')

    extents = np.frombuffer(data, dtype=EXTENT_DTYPE, count=n_extents,
                            offset=extents_off)
    _check_extents(extents, n_blocks, virtual_size, block_size, targets)
    index = np.frombuffer(data, dtype=INDEX_DTYPE, count=n_sections,
                          offset=index_off)
    if not np.array_equal(index, build_index(extents, n_blocks,
                                             section_shift)):
        _fail('index', 'section index does not match the extents')
    filt = np.frombuffer(data, dtype=np.uint8, count=filter_bytes,
                         offset=filter_off)
    if not np.array_equal(filt, build_filter(extents, n_blocks,
                                             filter_shift)):
        _fail('filter', 'occupancy filter does not match the extents')
    return BlockMap(src_id, virtual_size, block_size, map_version, targets,
                    extents.copy(), section_shift, index.copy(),
                    filter_shift, filt.copy(), file_size)


def _check_extents(extents, n_blocks, virtual_size, block_size, targets):
    if not len(extents):
        return
    src = extents['src'].astype(np.int64)
    length = extents['length'].astype(np.int64)
    tblock = extents['target_block'].astype(np.int64)
    tidx = extents['target'].astype(np.int64)
    if (length == 0).any():
        _fail('extents', 'extent %d has length 0',
              int(np.argmax(length == 0)))
    end = src + length
    if (end > n_blocks).any():
        _fail('extents', 'extent %d ends past the virtual size',
              int(np.argmax(end > n_blocks)))
    bad = end[:-1] > src[1:]
    if bad.any():
        _fail('extents', 'extents %d and %d are unsorted or overlap',
              int(np.argmax(bad)), int(np.argmax(bad)) + 1)
    if (tidx >= len(targets)).any():
        _fail('extents', 'extent %d names target %d of %d',
              int(np.argmax(tidx >= len(targets))),
              int(tidx.max()), len(targets))
    sizes = np.array([t.size for t in targets], dtype=np.int64)
    tsize = sizes[tidx]
    tblocks = -(-tsize // block_size)
    tend = tblock + length
    if (tend > tblocks).any():
        i = int(np.argmax(tend > tblocks))
        _fail('extents', 'extent %d reads past the end of target %s', i,
              targets[int(tidx[i])].image_id)
    # Partial last block of a target: only the source's equally long
    # partial last block may map onto it.
    src_tail = virtual_size - (n_blocks - 1) * block_size
    t_tail = tsize - (tblocks - 1) * block_size
    touches = (tend == tblocks) & (t_tail != block_size)
    ok = (end == n_blocks) & (t_tail == src_tail)
    if (touches & ~ok).any():
        i = int(np.argmax(touches & ~ok))
        _fail('extents', 'extent %d maps onto the partial last block of '
              'target %s from a different position', i,
              targets[int(tidx[i])].image_id)


def read(path):
    """Read and validate the map at ``path``."""
    with open(path, 'rb') as f:
        return decode(f.read())
