"""The snapshot delta: the blocks a server changed, against its image.

Specified in ``doc/source/reference/mirror-format.rst`` ("Snapshot delta"). A
compute host writes one (:mod:`vmar_openstack.nova_imagebackend.delta`)
and stages it in Glance; the import plugin
(:mod:`vmar_openstack.glance_hooks.assemble`) checks it and builds the
whole image from the parent's stored bytes.

Layout, all integers little-endian::

    header     128 bytes: magic "VMARDLTA", version, block size, virtual
               size, the parent's size, id and map version, the number of
               data blocks and of zero blocks
    data index n_data u64 block numbers, strictly increasing
    digests    n_data SHA-256 digests, one per data block, in index order
    zero index n_zero u64 block numbers, strictly increasing, none in the
               data index: blocks the parent holds data in that are now
               zero
    index sum  SHA-256 of everything above
    data       n_data blocks of block_size bytes, in index order (the
               last block of a disk whose size is not a multiple of the
               block size is zero-padded)

Every other block of the disk is the parent's (zero past the parent's
size). Nothing is trusted that is not checked: :func:`read_index` checks
the structure, the index sum and the file's exact length;
:meth:`Delta.block` checks each data block against its digest.
"""

import dataclasses
import hashlib
import os
import struct
import uuid

import numpy as np

from vmar_openstack import exception

MAGIC = b'VMARDLTA'
VERSION = 1
HEADER_SIZE = 128
DIGEST_SIZE = 32
ALGORITHM = 'sha256'
MIN_BLOCK, MAX_BLOCK = 512, 65536
# magic, version, block size, virtual size, parent size, parent id,
# parent map version, data blocks, zero blocks
_HEADER = struct.Struct('<8sIIQQ16sIQQ')


def _error(what, detail):
    return exception.DeltaFormatError(what=what, detail=detail)


def is_delta(path):
    """Whether the file at ``path`` starts with the delta's magic."""
    with open(path, 'rb') as f:
        return f.read(len(MAGIC)) == MAGIC


@dataclasses.dataclass(frozen=True)
class Header:
    block_size: int
    virtual_size: int
    parent_id: str
    parent_size: int
    parent_map_version: int

    @property
    def n_blocks(self):
        return -(-self.virtual_size // self.block_size)

    @property
    def parent_blocks(self):
        return -(-self.parent_size // self.block_size)


@dataclasses.dataclass
class Delta:
    """A checked delta's header and index; its data read on demand."""

    header: Header
    data_blocks: np.ndarray     # uint64, increasing
    digests: np.ndarray         # (n_data, 32) uint8
    zero_blocks: np.ndarray     # uint64, increasing
    data_offset: int            # of the first data block in the file
    path: str = ''

    @property
    def n_data(self):
        return len(self.data_blocks)

    def block(self, f, i):
        """Data block ``i`` (index order) read from ``f``, checked."""
        bs = self.header.block_size
        f.seek(self.data_offset + i * bs)
        data = f.read(bs)
        if len(data) != bs:
            raise _error(self.path, 'data block %d is cut short' % i)
        if hashlib.sha256(data).digest() != self.digests[i].tobytes():
            raise _error(self.path, 'block %d (data block %d) does not '
                         'match its digest' % (self.data_blocks[i], i))
        return data


def encode_index(header, data_blocks, digests, zero_blocks):
    """The bytes of a delta before its data (header to index sum)."""
    data_blocks = np.asarray(data_blocks, '<u8')
    zero_blocks = np.asarray(zero_blocks, '<u8')
    digests = np.ascontiguousarray(digests, np.uint8).reshape(-1, DIGEST_SIZE)
    _check_index(header, data_blocks, digests, zero_blocks, '<new delta>')
    head = _HEADER.pack(
        MAGIC, VERSION, header.block_size, header.virtual_size,
        header.parent_size, uuid.UUID(header.parent_id).bytes,
        header.parent_map_version, len(data_blocks), len(zero_blocks))
    body = (head.ljust(HEADER_SIZE, b'\0') + data_blocks.tobytes()
            + digests.tobytes() + zero_blocks.tobytes())
    return body + hashlib.sha256(body).digest()


def _check_index(header, data, digests, zero, what):
    bs = header.block_size
    if not (MIN_BLOCK <= bs <= MAX_BLOCK and bs & (bs - 1) == 0):
        raise _error(what, 'block size %d' % bs)
    if header.virtual_size <= 0 or header.virtual_size % 512:
        raise _error(what, 'virtual size %d' % header.virtual_size)
    if header.parent_size <= 0 or header.parent_size > header.virtual_size:
        raise _error(what, 'parent size %d for a disk of %d bytes'
                     % (header.parent_size, header.virtual_size))
    if len(digests) != len(data):
        raise _error(what, '%d digests for %d data blocks'
                     % (len(digests), len(data)))
    n = header.n_blocks
    for name, idx in (('data', data), ('zero', zero)):
        if len(idx) and (idx[-1] >= n or (idx[1:] <= idx[:-1]).any()):
            raise _error(what, 'the %s index is not increasing block '
                         'numbers below %d' % (name, n))
    if len(data) and len(zero) and len(np.intersect1d(data, zero)):
        raise _error(what, 'a block is both data and zero')


def read_index(path, max_virtual_size=None):
    """The :class:`Delta` of the file at ``path``, structure checked.

    :raises DeltaFormatError: the file breaks the specification.
    """
    with open(path, 'rb') as f:
        head = f.read(HEADER_SIZE)
        if len(head) < HEADER_SIZE:
            raise _error(path, 'shorter than its header')
        (magic, version, bs, vsize, psize, parent, pver, n_data,
         n_zero) = _HEADER.unpack_from(head)
        if magic != MAGIC:
            raise _error(path, 'not a VMAR snapshot delta')
        if version != VERSION:
            raise _error(path, 'version %d, not %d' % (version, VERSION))
        hdr = Header(bs, vsize, str(uuid.UUID(bytes=parent)), psize, pver)
        if max_virtual_size and vsize > max_virtual_size:
            raise _error(path, 'a disk of %d bytes, over the limit of %d'
                         % (vsize, max_virtual_size))
        n = -(-vsize // bs) if bs else 0
        if n_data > n or n_zero > n:
            raise _error(path, '%d data and %d zero blocks in a disk of %d '
                         'blocks' % (n_data, n_zero, n))
        index_len = n_data * (8 + DIGEST_SIZE) + n_zero * 8
        rest = f.read(index_len + DIGEST_SIZE)
        size = os.fstat(f.fileno()).st_size
    if len(rest) != index_len + DIGEST_SIZE:
        raise _error(path, 'its index is cut short')
    if hashlib.sha256(head + rest[:index_len]).digest() != rest[index_len:]:
        raise _error(path, 'its index does not match its checksum')
    data = np.frombuffer(rest, '<u8', n_data)
    digests = np.frombuffer(rest, np.uint8, n_data * DIGEST_SIZE,
                            n_data * 8).reshape(-1, DIGEST_SIZE)
    zero = np.frombuffer(rest, '<u8', n_zero,
                         n_data * (8 + DIGEST_SIZE))
    _check_index(hdr, data, digests, zero, path)
    offset = HEADER_SIZE + index_len + DIGEST_SIZE
    if size != offset + n_data * bs:
        raise _error(path, '%d bytes, not %d for %d data blocks'
                     % (size, offset + n_data * bs, n_data))
    return Delta(hdr, data, digests, zero, offset, path)
