"""The two files of a base mirror: the digest list and the present bitmap.

Specified in ``doc/source/reference/mirror-format.rst``; the QEMU driver
``qemu/block-vmar-mirror.c`` reads both and sets bits in the present file.

* The **digest list** of a base: a 64-byte header, then one SHA-256 per
  block of the base in block order, an all-zero row for a zero block. The
  library publishes it next to the base's maps; a host reads it before it
  serves a block of a mirror it fills on demand.
* The **present file** of a mirror: a 4096-byte header naming the same
  base, then one bit per block (bit ``b % 8`` of byte ``b // 8``), set once
  the block is verified, written and synced in the mirror file.
"""

import dataclasses
import os
import struct
import uuid

import numpy as np

from vmar_openstack import exception
from vmar_openstack import fileutils

DIGESTS_MAGIC = b'VMARDGST'
PRESENT_MAGIC = b'VMARPRES'
VERSION = 1
DIGESTS_HEADER_SIZE = 64
PRESENT_HEADER_SIZE = 4096
ALGORITHM = 'sha256'
DIGEST_SIZE = 32
_HEADER = struct.Struct('<8sIIQ16sI')
MIN_BLOCK, MAX_BLOCK = 512, 65536


@dataclasses.dataclass(frozen=True)
class Header:
    """What both files say of their base."""

    image_id: str
    size: int
    block_size: int

    @property
    def n_blocks(self):
        return -(-self.size // self.block_size)

    def pack(self, magic, digest_size=0):
        return _HEADER.pack(magic, VERSION, self.block_size, self.size,
                            uuid.UUID(self.image_id).bytes, digest_size)


def _error(path, detail):
    return exception.MirrorFormatError(path=path, detail=detail)


def _parse(buf, magic, path):
    if len(buf) < _HEADER.size:
        raise _error(path, 'shorter than its header')
    got_magic, version, bsize, size, image, dsize = _HEADER.unpack_from(buf)
    if got_magic != magic:
        raise _error(path, 'not a %s file' % magic.decode())
    if version != VERSION:
        raise _error(path, 'version %d, not %d' % (version, VERSION))
    if not (MIN_BLOCK <= bsize <= MAX_BLOCK and bsize & (bsize - 1) == 0):
        raise _error(path, 'block size %d' % bsize)
    if not size:
        raise _error(path, 'an empty base')
    return Header(str(uuid.UUID(bytes=image)), size, bsize), dsize


def digests_bytes(image_id, fingerprints):
    """The digest list of a base from its :class:`Fingerprints`."""
    if fingerprints.algorithm != ALGORITHM:
        raise _error(image_id, 'digests are %s; mirrors check %s'
                     % (fingerprints.algorithm, ALGORITHM))
    hdr = Header(image_id, fingerprints.virtual_size, fingerprints.block_size)
    if fingerprints.n_blocks != hdr.n_blocks:
        raise _error(image_id, '%d digests for %d blocks'
                     % (fingerprints.n_blocks, hdr.n_blocks))
    head = hdr.pack(DIGESTS_MAGIC, DIGEST_SIZE).ljust(DIGESTS_HEADER_SIZE,
                                                      b'\0')
    return head + np.ascontiguousarray(fingerprints.digests,
                                       np.uint8).tobytes()


def digests_length(path):
    """The bytes a digest list's header says the file has.

    A copy read through a block layer that rounds sizes up to its sector
    (QEMU's NBD client) is cut to it before it is checked.

    :raises MirrorFormatError: no digest list header.
    """
    with open(path, 'rb') as f:
        hdr, _dsize = _parse(f.read(DIGESTS_HEADER_SIZE), DIGESTS_MAGIC,
                             path)
    return DIGESTS_HEADER_SIZE + hdr.n_blocks * DIGEST_SIZE


def read_digests(path):
    """(:class:`Header`, ``(n_blocks, 32)`` uint8 array) of a digest list.

    :raises MirrorFormatError: the file breaks the specification.
    """
    with open(path, 'rb') as f:
        data = f.read()
    hdr, dsize = _parse(data, DIGESTS_MAGIC, path)
    if dsize != DIGEST_SIZE:
        raise _error(path, '%d-byte digests, not SHA-256' % dsize)
    if len(data) != DIGESTS_HEADER_SIZE + hdr.n_blocks * DIGEST_SIZE:
        raise _error(path, '%d bytes, not %d for %d blocks'
                     % (len(data), DIGESTS_HEADER_SIZE
                        + hdr.n_blocks * DIGEST_SIZE, hdr.n_blocks))
    rows = np.frombuffer(data, np.uint8, offset=DIGESTS_HEADER_SIZE)
    return hdr, rows.reshape(-1, DIGEST_SIZE)


def create_present(path, header):
    """An empty present file for a mirror of ``header``'s base, atomically."""
    head = header.pack(PRESENT_MAGIC).ljust(PRESENT_HEADER_SIZE, b'\0')
    tmp = fileutils.write_temp(path, head)
    try:
        os.truncate(tmp, PRESENT_HEADER_SIZE + -(-header.n_blocks // 8))
        fileutils.install(tmp, path)
    except BaseException:
        fileutils.unlink(tmp)
        raise


def read_present(path):
    """(:class:`Header`, bool array: block present) of a present file."""
    with open(path, 'rb') as f:
        data = f.read()
    hdr, _dsize = _parse(data, PRESENT_MAGIC, path)
    want = PRESENT_HEADER_SIZE + -(-hdr.n_blocks // 8)
    if len(data) != want:
        raise _error(path, '%d bytes, not %d' % (len(data), want))
    bits = np.unpackbits(np.frombuffer(data, np.uint8,
                                       offset=PRESENT_HEADER_SIZE),
                         bitorder='little')
    return hdr, bits[:hdr.n_blocks].astype(bool)
