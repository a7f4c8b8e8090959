"""The library's digest lists, out of the tables: content-addressed objects.

An image's digest list (one digest per block of its virtual size, in
block order) was kept in ``vmar_image_digests``: 32 bytes per 4 KiB block,
zero blocks included, 8 MiB per GiB of virtual disk and nine tenths of the
database (issue 51). It is now an object of its own, named by the SHA-256
of its bytes; ``vmar_images`` keeps only that SHA-256
(``digests_sha256``) and where the object is (``digests_location``):

``file:<sha256>``
    ``[vmar] digest_object_dir/<first two hex digits>/<sha256>``, written
    whole or not at all (:mod:`vmar_openstack.fileutils`).

An object is written before the locked transaction that records it
(outside the lock), and removed by the map GC (vmar-agent's pass,
``vmar-manage map gc``) once no image has named it for ``min_age``: a
transaction that fails, an image deleted or given new content leaves an
object no image names, never an image whose list is missing. Images of
identical content share one object.

**The object's bytes** (little-endian)::

    0   8  magic  b'VMARDLST'
    8   4  version (1)
    12  4  digest size in bytes
    16  8  blocks
    24  8  blocks that are not zero
    32  ... one bit per block, set for a block that is not zero
            (bit b % 8 of byte b // 8), padded to a byte
    ...     the digests of the blocks that are not zero, in block order

A zero block's digest is all zeros and takes no room: an image of 20 GiB
of virtual disk holding 1.5 GiB of data has a list of 12 MiB, not 160.

Every list read is checked against its SHA-256 and its image's block count
and digest size; a list that fails is :class:`LibraryInconsistent`.
Lists read are kept in a cache of the process's, bounded by ``[vmar]
digest_cache_mb``: an object never changes, so a cached list is never
stale.
"""

import hashlib
import os
import struct
import time

import numpy as np

from vmar_openstack import exception
from vmar_openstack import fileutils
from vmar_openstack import fingerprint
from vmar_openstack import lru

MAGIC = b'VMARDLST'
VERSION = 1
_HEADER = struct.Struct('<8sIIQQ')
FILE_SCHEME = 'file:'


def encode(digests):
    """The object's bytes for an ``(n_blocks, size)`` uint8 digest array."""
    d = np.ascontiguousarray(digests, np.uint8)
    n, size = d.shape
    nonzero = fingerprint.words(d).any(axis=1)
    head = _HEADER.pack(MAGIC, VERSION, size, n, int(nonzero.sum()))
    return b''.join((head, np.packbits(nonzero, bitorder='little').tobytes(),
                     d[nonzero].tobytes()))


def decode(data, what='digest list'):
    """The ``(n_blocks, size)`` uint8 digest array of an object's bytes.

    :raises LibraryInconsistent: the bytes break the format above.
    """
    def bad(detail):
        return exception.LibraryInconsistent(what='%s: %s' % (what, detail))
    if len(data) < _HEADER.size:
        raise bad('shorter than its header')
    magic, version, size, n, n_data = _HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise bad('not a version %d digest list' % VERSION)
    bitmap = -(-n // 8)
    if not size or n_data > n or len(data) != (_HEADER.size + bitmap
                                               + n_data * size):
        raise bad('%d bytes for %d blocks, %d of data, of %d-byte digests'
                  % (len(data), n, n_data, size))
    bits = np.unpackbits(np.frombuffer(data, np.uint8, bitmap, _HEADER.size),
                         count=n, bitorder='little').astype(bool)
    if int(bits.sum()) != n_data:
        raise bad('its bitmap names %d blocks of data, its header %d'
                  % (int(bits.sum()), n_data))
    out = np.zeros((n, size), np.uint8)
    out[bits] = np.frombuffer(data, np.uint8, n_data * size,
                              _HEADER.size + bitmap).reshape(n_data, size)
    return out


# lists by SHA-256; the bound is each caller's [vmar] digest_cache_mb
_CACHE = lru.LRU(0, lambda arr: arr.nbytes)


def clear_cache():
    _CACHE.clear()


def _keep(sha, arr, bound):
    _CACHE.max_bytes = bound
    _CACHE.put(sha, arr)


class DigestLists:
    """The digest list objects of the library ``conf`` configures."""

    def __init__(self, conf):
        self.conf = conf

    @property
    def directory(self):
        return self.conf.vmar.digest_object_dir

    def path(self, sha):
        return os.path.join(self.directory, sha[:2], sha)

    def put(self, digests):
        """Store a digest array; returns ``(sha256, location)``.

        Idempotent: an object already there (the same content) is kept.
        """
        data = encode(digests)
        sha = hashlib.sha256(data).hexdigest()
        path = self.path(sha)
        try:
            # fresh again: the collection of unnamed objects leaves it be
            # (an image about to name it commits well within min_age)
            os.utime(path)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fileutils.write_atomic(path, data, mode=0o444)
        arr = np.array(digests, np.uint8)        # the caller's stays theirs
        arr.flags.writeable = False
        _keep(sha, arr, self._bound())
        return sha, FILE_SCHEME + sha

    def ensure(self, ref, digests):
        """Store the object ``ref`` names again if it is gone.

        In the locked transaction that names it: :meth:`collect` runs
        under the library lock too, and may have removed an object of
        the same content, unnamed for long, after :meth:`put` found it.
        """
        if not os.path.exists(self.path(ref[0])):
            self.put(digests)

    def load(self, image_id, sha, location, n_blocks, digest_size):
        """The digest array of an image, checked (read-only).

        :raises LibraryInconsistent: the object is missing, or is not the
            list its image's row describes.
        """
        arr = _CACHE.get(sha)
        if arr is None:
            what = 'digest list %s of image %s' % (location, image_id)
            data = self._read(location, what)
            if hashlib.sha256(data).hexdigest() != sha:
                raise exception.LibraryInconsistent(
                    what='%s does not have its SHA-256 %s' % (what, sha))
            arr = decode(data, what)
            arr.flags.writeable = False
            _keep(sha, arr, self._bound())
        if arr.shape != (n_blocks, digest_size):
            raise exception.LibraryInconsistent(
                what='digest list of image %s holds %d digests of %d bytes, '
                'its row says %d of %d' % (image_id, arr.shape[0],
                                           arr.shape[1], n_blocks,
                                           digest_size))
        return arr

    def _read(self, location, what):
        if not location.startswith(FILE_SCHEME):
            raise exception.LibraryInconsistent(
                what='%s: no store of this library holds it' % what)
        try:
            with open(self.path(location[len(FILE_SCHEME):]), 'rb') as f:
                return f.read()
        except FileNotFoundError:
            raise exception.LibraryInconsistent(what='%s is missing' % what)

    def collect(self, named, min_age, now=None):
        """Remove the objects no image names, unchanged ``min_age`` s.

        Under the library lock (:meth:`ensure`).

        ``named``: the locations the library's images name. An object is
        written (or touched, :meth:`put`) before the transaction that
        names it commits, so one younger than ``min_age`` may belong to
        an ingest under way. Returns the SHA-256 of those removed.
        """
        now = time.time() if now is None else now
        named = {loc[len(FILE_SCHEME):] for loc in named
                 if loc and loc.startswith(FILE_SCHEME)}
        gone = []
        for sha, path in sorted(self.objects().items()):
            if sha in named:
                continue
            try:
                if now - os.stat(path).st_mtime < min_age:
                    continue
            except FileNotFoundError:
                continue
            fileutils.unlink(path)
            gone.append(sha)
        return gone

    def objects(self):
        """``{sha256: path}`` of every object in the store."""
        out = {}
        try:
            subdirs = os.listdir(self.directory)
        except FileNotFoundError:
            return out
        for sub in subdirs:
            d = os.path.join(self.directory, sub)
            if len(sub) != 2 or not os.path.isdir(d):
                continue
            for name in os.listdir(d):
                if len(name) == 64 and name.startswith(sub):
                    out[name] = os.path.join(d, name)
        return out

    def _bound(self):
        return self.conf.vmar.digest_cache_mb << 20


def digest_size(algorithm):
    return fingerprint.DIGEST_SIZES[algorithm]
