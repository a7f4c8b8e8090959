"""A whole snapshot image from its parent's stored bytes and a delta.

Run by the import plugin (:mod:`.plugin`) in glance-api on a staged
snapshot delta (:mod:`vmar_openstack.mapformat.delta`). The parent's
stored bytes are streamed once from Glance's store; each block the delta
holds replaces the parent's, each of its zero blocks is zeroed, and blocks
past the parent's size are zero unless the delta holds them. The result
is written sparse beside the staged file, which Glance then imports as the
image's data.

What is checked on the way, so that nothing is taken on trust:

* the delta's structure and index checksum (:func:`delta.read_index`),
  and every data block against its SHA-256 as it is copied;
* the parent's stream against the parent's ``os_hash_value`` (or its MD5
  ``checksum`` when it has none): the blocks not in the delta are the
  bytes the parent's library entry was hashed from;
* the result's own hash, in Glance's algorithm, is returned: once Glance
  has stored the image, its ``os_hash_value`` must be this value
  (vmar-agent compares them before it publishes the snapshot's map).
"""

import dataclasses
import hashlib
import os

import numpy as np

from vmar_openstack import exception
from vmar_openstack import fileutils

# blocks per write window
WINDOW_BLOCKS = 256


@dataclasses.dataclass
class Assembled:
    path: str
    size: int
    hash_algo: str
    hash_value: str
    data_bytes: int        # non-zero bytes written


class _Writer:
    """Writes windows of blocks, sparse, and hashes what it writes."""

    def __init__(self, f, delta, df, algo, size):
        self.f, self.delta, self.df = f, delta, df
        self.h = hashlib.new(algo)
        self.size = size
        self.bs = delta.header.block_size
        self.data_bytes = 0

    def window(self, first, buf):
        """Write blocks ``first``.. of the result.

        ``buf``: the parent's blocks there (or zeros), a bytearray of
        whole blocks, changed here.
        """
        bs, d = self.bs, self.delta
        k = len(buf) // bs
        end = first + k
        lo, hi = np.searchsorted(d.zero_blocks, [first, end])
        for b in d.zero_blocks[lo:hi]:
            j = (int(b) - first) * bs
            buf[j:j + bs] = bytes(bs)
        lo, hi = np.searchsorted(d.data_blocks, [first, end])
        for i in range(lo, hi):
            j = (int(d.data_blocks[i]) - first) * bs
            buf[j:j + bs] = d.block(self.df, i)
        at = first * bs
        view = memoryview(buf)[:max(0, min(len(buf), self.size - at))]
        self.h.update(view)
        rows = np.frombuffer(buf, np.uint64).reshape(k, bs // 8)
        nonzero = rows.any(axis=1)
        for b0, b1 in _runs(nonzero):
            self.f.seek(at + b0 * bs)
            self.f.write(view[b0 * bs:b1 * bs])
            self.data_bytes += min(b1 * bs, len(view)) - b0 * bs


def _runs(mask):
    """``(start, end)`` of the runs of True in a bool array."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.view(np.int8),
                                                   [0]))))
    return zip(edges[::2].tolist(), edges[1::2].tolist())


def _expected_parent_hash(parent):
    """(hashlib name, hex digest) Glance recorded of the parent's bytes."""
    if parent.get('os_hash_algo') and parent.get('os_hash_value'):
        return parent['os_hash_algo'], parent['os_hash_value']
    if parent.get('checksum'):
        return 'md5', parent['checksum']
    raise exception.SnapshotError(
        image_id=parent.get('id'), reason='the parent image has no checksum '
        'to check its stored bytes against')


def assemble(delta, parent, chunks, out_path, algo):
    """Write the whole image of ``delta`` to ``out_path``.

    ``parent``: a dict of the parent's Glance record (``id``, ``size``,
    ``os_hash_algo``, ``os_hash_value``, ``checksum``); ``chunks``: an
    iterator of its stored bytes; ``algo``: the hash of the result
    (Glance's ``hashing_algorithm``). Returns :class:`Assembled`. On
    failure nothing is left at ``out_path``.

    :raises DeltaFormatError: a data block does not match its digest.
    :raises SnapshotError: the parent's stored bytes are not what Glance
        recorded of them.
    """
    hdr = delta.header
    bs = hdr.block_size
    if int(parent.get('size') or 0) != hdr.parent_size:
        raise exception.SnapshotError(
            image_id=parent.get('id'), reason='the delta was made on %d '
            'bytes of parent %s; Glance stores %s' % (
                hdr.parent_size, hdr.parent_id, parent.get('size')))
    palgo, pvalue = _expected_parent_hash(parent)
    ph = hashlib.new(palgo)
    tmp = fileutils.new_temp(out_path)
    try:
        with open(tmp, 'r+b') as f, open(delta.path, 'rb') as df:
            f.truncate(hdr.virtual_size)
            w = _Writer(f, delta, df, algo, hdr.virtual_size)
            win = WINDOW_BLOCKS * bs
            pending, block, got = bytearray(), 0, 0
            for chunk in chunks:
                ph.update(chunk)
                got += len(chunk)
                pending += chunk
                while len(pending) >= win:
                    w.window(block, pending[:win])
                    del pending[:win]
                    block += WINDOW_BLOCKS
            if got != hdr.parent_size:
                raise exception.SnapshotError(
                    image_id=parent.get('id'), reason='its store gave %d '
                    'bytes, not %d' % (got, hdr.parent_size))
            if ph.hexdigest() != pvalue:
                raise exception.SnapshotError(
                    image_id=parent.get('id'), reason='its stored bytes do '
                    'not match its %s in Glance' % palgo)
            if pending:
                pending += bytes(-len(pending) % bs)
                w.window(block, pending)
                block += len(pending) // bs
            while block < hdr.n_blocks:
                k = min(WINDOW_BLOCKS, hdr.n_blocks - block)
                w.window(block, bytearray(k * bs))
                block += k
            f.truncate(hdr.virtual_size)
            f.flush()
            os.fsync(f.fileno())
        fileutils.install(tmp, out_path)
    except BaseException:
        fileutils.unlink(tmp)
        raise
    return Assembled(out_path, hdr.virtual_size, algo, w.h.hexdigest(),
                     w.data_bytes)
