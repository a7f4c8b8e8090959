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
* every block of the parent's stream against the parent's digests in the
  library (``parent_rows``): a zero row must be a zero block, any other
  the block's SHA-256. These are the digests the snapshot's library entry
  takes for the blocks the delta leaves alone
  (:meth:`~vmar_openstack.ingest.Library.add_delta`), so the entry
  describes exactly the bytes written here.
"""

import dataclasses
import hashlib
import os
import subprocess

import numpy as np

from vmar_openstack import exception
from vmar_openstack import fileutils

# blocks per write window
WINDOW_BLOCKS = 256


@dataclasses.dataclass
class Assembled:
    path: str
    size: int
    data_bytes: int        # non-zero bytes written


class _Writer:
    """Writes windows of blocks, sparse, checking the parent's."""

    def __init__(self, f, delta, df, parent_rows):
        self.f, self.delta, self.df = f, delta, df
        self.rows = parent_rows
        self.parent_zero = ~parent_rows.any(axis=1)
        self.bs = delta.header.block_size
        self.size = delta.header.virtual_size
        self.data_bytes = 0

    def window(self, first, buf, parent=True):
        """Write blocks ``first``.. of the result.

        ``buf``: the parent's blocks there (``parent``), else zeros; a
        bytearray of whole blocks, changed here.
        """
        bs, d = self.bs, self.delta
        k = len(buf) // bs
        end = first + k
        rows = np.frombuffer(buf, np.uint64).reshape(k, bs // 8)
        if parent:
            self._check_parent(first, buf, rows.any(axis=1))
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
        for b0, b1 in _runs(rows.any(axis=1)):
            self.f.seek(at + b0 * bs)
            self.f.write(view[b0 * bs:b1 * bs])
            self.data_bytes += min(b1 * bs, len(view)) - b0 * bs

    def _check_parent(self, first, buf, nonzero):
        bs = self.bs
        zero = self.parent_zero[first:first + len(nonzero)]
        bad = np.flatnonzero(zero & nonzero)
        for j in np.flatnonzero(~zero).tolist():
            if hashlib.sha256(buf[j * bs:(j + 1) * bs]).digest() != \
                    self.rows[first + j].tobytes():
                bad = np.append(bad, j)
        if len(bad):
            raise exception.SnapshotError(
                image_id=self.delta.header.parent_id, reason='its stored '
                'block %d is not what the library hashed of it: the '
                'parent\'s data changed in its store'
                % (first + int(bad.min())))


def d_past(blocks, first):
    """The block numbers of ``blocks`` from ``first`` on."""
    return blocks[np.searchsorted(blocks, first):]


def _runs(mask):
    """``(start, end)`` of the runs of True in a bool array."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.view(np.int8),
                                                   [0]))))
    return zip(edges[::2].tolist(), edges[1::2].tolist())


def stored_file(image_id, raw, fmt, qemu_img, algo):
    """The file Glance stores of image ``image_id``: ``raw`` as ``fmt``.

    qcow2 (Nova's default snapshot format) holds the disk's data without
    its holes, as Nova's own route uploads it; ``qemu-img compare``
    checks the conversion. Returns (path, ``algo`` hex digest of the
    file): what Glance's ``os_hash_value`` must be once it stored it.
    """
    path = raw
    if fmt == 'qcow2':
        path = raw + '.qcow2'
        for cmd in ([qemu_img, 'convert', '-f', 'raw', '-O', 'qcow2', raw,
                     path],
                    [qemu_img, 'compare', '-q', '-f', 'raw', '-F', 'qcow2',
                     raw, path]):
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode:
                fileutils.unlink(path)
                raise exception.SnapshotError(
                    image_id=image_id, reason='%s failed: %s' % (
                        ' '.join(cmd[:2]), (r.stdout + r.stderr).strip()))
    elif fmt != 'raw':
        raise exception.SnapshotError(
            image_id=image_id,
            reason='snapshots are raw or qcow2, not %s' % fmt)
    h = hashlib.new(algo)
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(1 << 22), b''):
            h.update(chunk)
    return path, h.hexdigest()


def assemble(delta, parent_rows, chunks, out_path):
    """Write the whole image of ``delta`` to ``out_path``.

    ``parent_rows``: the parent's digests in the library (``(n, 32)``
    uint8, SHA-256); ``chunks``: an iterator of the parent's stored bytes.
    Returns :class:`Assembled`. On failure nothing is left at
    ``out_path``.

    :raises DeltaFormatError: a data block does not match its digest.
    :raises SnapshotError: the parent's stored bytes are not the ones its
        digests describe.
    """
    hdr = delta.header
    bs = hdr.block_size
    if len(parent_rows) != hdr.parent_blocks:
        raise exception.SnapshotError(
            image_id=hdr.parent_id, reason='the library holds %d blocks of '
            'it, the delta was made on %d' % (len(parent_rows),
                                              hdr.parent_blocks))
    # a process killed meanwhile leaves "<out_path>.tmp-*": named after the
    # image, Glance's staging cleaner knows whose it is
    with fileutils.atomic_file(
            out_path, prefix=os.path.basename(out_path) + '.tmp-') as f, \
            open(delta.path, 'rb') as df:
        f.truncate(hdr.virtual_size)
        w = _Writer(f, delta, df, parent_rows)
        win = WINDOW_BLOCKS * bs
        pending, block, got = bytearray(), 0, 0
        for chunk in chunks:
            got += len(chunk)
            if got > hdr.parent_size:
                break
            pending += chunk
            while len(pending) >= win:
                w.window(block, pending[:win])
                del pending[:win]
                block += WINDOW_BLOCKS
        if got != hdr.parent_size:
            raise exception.SnapshotError(
                image_id=hdr.parent_id, reason='its store gave %s bytes, '
                'not %d' % ('more' if got > hdr.parent_size else got,
                            hdr.parent_size))
        if pending:
            pending += bytes(-len(pending) % bs)
            w.window(block, pending)
            block += len(pending) // bs
        # past the parent: only where the delta has blocks (the rest of
        # the file is a hole)
        past = np.concatenate((d_past(delta.data_blocks, block),
                               d_past(delta.zero_blocks, block)))
        for first in np.unique(past // WINDOW_BLOCKS).tolist():
            first *= WINDOW_BLOCKS
            k = min(WINDOW_BLOCKS, hdr.n_blocks - first)
            w.window(first, bytearray(k * bs), parent=False)
        f.truncate(hdr.virtual_size)
    return Assembled(out_path, hdr.virtual_size, w.data_bytes)
