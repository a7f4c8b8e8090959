"""A snapshot's delta, made from the top layer of a vmar disk.

A vmar root disk is a qcow2 overlay on its image's VMAR view. What the
server changed is in the overlay's own clusters; of those, a block the
guest wrote back unchanged (or that copy-on-write brought along with a
written neighbour: a cluster is 64 KiB) is its image's still. So a block
goes into the delta (:mod:`vmar_openstack.mapformat.delta`) when the top
layer holds it and its SHA-256 is not the image's, from the image's digest
list (the one lazy mirrors check against): no base block is read.

:func:`write` reads the top layer without its backing (``qemu-img map``
of the overlay opened with ``backing: null``, then the clusters straight
from the file at the offsets the map gives), so it runs on a disk whose
backing the host could not serve.
"""

import dataclasses
import hashlib
import json
import os
import subprocess

import numpy as np

from vmar_openstack import exception
from vmar_openstack import fileutils
from vmar_openstack.mapformat import delta as delta_format

ZERO_DIGEST = bytes(delta_format.DIGEST_SIZE)
# blocks read and hashed per read of the overlay
_CHUNK_BLOCKS = 256


@dataclasses.dataclass
class Made:
    """What :func:`write` put in a delta."""

    path: str
    top_blocks: int         # blocks the top layer holds
    data_blocks: int        # of those, sent: their content changed
    zero_blocks: int        # now zero where the image had data
    size: int               # bytes of the delta file

    @property
    def unchanged_blocks(self):
        return self.top_blocks - self.data_blocks - self.zero_blocks


def top_extents(overlay, qemu_img='qemu-img'):
    """``qemu-img map`` of the overlay's own layer: its present extents.

    Each is a dict with ``start``, ``length``, ``data`` and ``zero``, and
    ``offset`` (in the overlay file) for data.
    """
    spec = json.dumps({'driver': 'qcow2', 'backing': None,
                       'file': {'driver': 'file', 'filename': overlay}})
    r = subprocess.run([qemu_img, 'map', '--output=json', 'json:' + spec],
                       capture_output=True, text=True)
    if r.returncode:
        raise exception.SnapshotError(
            image_id=os.path.basename(overlay),
            reason='qemu-img map of the overlay failed: %s'
            % r.stderr.strip())
    return [e for e in json.loads(r.stdout) if e.get('present', e['data'])]


def _blocks(extents, bs, n_blocks):
    """(first block, block count, extent) of each extent, in blocks."""
    for e in extents:
        if e['start'] % bs or (e['length'] % bs
                               and e['start'] + e['length'] < n_blocks * bs):
            # qcow2 clusters are at least 512 bytes; 4 KiB blocks need
            # clusters of 4 KiB or more (qemu-img create's default: 64)
            raise exception.SnapshotError(
                image_id='?', reason='the overlay holds %d bytes at %d: '
                'not whole %d-byte blocks' % (e['length'], e['start'], bs))
        first = e['start'] // bs
        yield first, min(-(-e['length'] // bs), n_blocks - first), e


def write(overlay, out_path, header, parent_digests, qemu_img='qemu-img'):
    """Write the delta of ``overlay`` against its image to ``out_path``.

    ``header``: the :class:`~vmar_openstack.mapformat.delta.Header`
    (parent, sizes); ``parent_digests``: the parent's digest rows
    (``(n, 32)`` uint8, a zero row for a zero block). Returns
    :class:`Made`. Nothing is left at ``out_path`` on failure.
    """
    bs = header.block_size
    n = header.n_blocks
    parent = np.ascontiguousarray(parent_digests, np.uint8)
    if len(parent) != header.parent_blocks:
        raise exception.SnapshotError(
            image_id=header.parent_id, reason='its digest list has %d '
            'blocks, the image %d' % (len(parent), header.parent_blocks))
    parent_zero = ~parent.any(axis=1)
    zero_block = bytes(bs)
    extents = top_extents(overlay, qemu_img)
    data_idx, digests, data_at, zero_idx, top = [], [], [], [], 0
    with open(overlay, 'rb') as f:
        for first, count, e in _blocks(extents, bs, n):
            top += count
            if not e['data']:
                # zero in the top layer: sent where the image had data
                idx = np.arange(first, first + count)
                was = idx < len(parent)
                zero_idx.extend(idx[was][~parent_zero[idx[was]]].tolist())
                continue
            if 'offset' not in e:
                raise exception.SnapshotError(
                    image_id=header.parent_id, reason='the overlay holds '
                    'compressed or external data at %d' % e['start'])
            for b0 in range(0, count, _CHUNK_BLOCKS):
                k = min(_CHUNK_BLOCKS, count - b0)
                f.seek(e['offset'] + b0 * bs)
                buf = f.read(k * bs).ljust(k * bs, b'\0')
                for j in range(k):
                    b = first + b0 + j
                    blk = buf[j * bs:(j + 1) * bs]
                    had = parent[b].tobytes() if b < len(parent) \
                        else ZERO_DIGEST
                    if blk == zero_block:
                        if had != ZERO_DIGEST:
                            zero_idx.append(b)
                        continue
                    d = hashlib.sha256(blk).digest()
                    if d == had:
                        continue
                    data_idx.append(b)
                    digests.append(d)
                    data_at.append(e['offset'] + (b0 + j) * bs)
    zero_idx.sort()
    index = delta_format.encode_index(
        header, np.array(data_idx, np.uint64),
        np.frombuffer(b''.join(digests), np.uint8).reshape(-1, 32),
        np.array(zero_idx, np.uint64))
    with open(overlay, 'rb') as src, fileutils.atomic_file(out_path) as out:
        out.write(index)
        for at in data_at:
            src.seek(at)
            out.write(src.read(bs).ljust(bs, b'\0'))
    return Made(out_path, top, len(data_idx), len(zero_idx),
                os.path.getsize(out_path))
