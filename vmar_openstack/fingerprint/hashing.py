"""Hashing an image's raw content in fixed-size blocks on every core.

The native hasher (``_blockhash``, OpenSSL from C, threads) when it is
built, hashlib in processes otherwise. Holes are skipped, zero blocks get
all-zero digest rows.
"""

import concurrent.futures
import errno
import functools
import hashlib
import mmap
import os

import numpy as np
from oslo_log import log as logging

from vmar_openstack import exception
from vmar_openstack.exception import ImageRejected
from vmar_openstack.fingerprint.digests import DIGEST_SIZES
from vmar_openstack.fingerprint.digests import Fingerprints
from vmar_openstack.fingerprint.digests import OPENSSL_NAMES
from vmar_openstack.fingerprint import safety

try:
    from vmar_openstack.fingerprint import _blockhash
except ImportError:  # not built: no compiler or libssl-dev at install time
    _blockhash = None

LOG = logging.getLogger(__name__)

CHUNK = 32 << 20        # bytes per job given to a worker, at most
MIN_CHUNK = 4 << 20     # and at least (smaller images: 4 jobs per worker)
READ_BUF = 1 << 20      # bytes per read: stays in the CPU cache while hashed


def data_ranges(fd, size):
    """Yield (start, end) of the data regions of a file (SEEK_DATA/HOLE)."""
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError:  # ENXIO: only a hole is left
            return
        end = os.lseek(fd, start, os.SEEK_HOLE)
        yield start, min(end, size)
        pos = end


def _read_blocks(fd, start, end, block_size):
    """Yield (first block row, block count, buffer view) for [start, end).

    Reads through one reusable buffer; bytes past the end of the file (the
    partial last block, or a virtual size beyond it) read as zeros.
    """
    buf = bytearray(min(READ_BUF, end - start + block_size))
    mv = memoryview(buf)
    row = start // block_size
    pos = start
    while pos < end:
        want = min(len(buf), end - pos)
        nb = (want + block_size - 1) // block_size
        got = os.preadv(fd, [mv[:want]], pos)
        if got < nb * block_size:
            mv[got:nb * block_size] = bytes(nb * block_size - got)
        yield row, nb, mv[:nb * block_size]
        row += nb
        pos += want


def _hash_range(path, start, end, block_size, algorithm):
    """Process worker (hashlib): digests of blocks [start, end)."""
    new = getattr(hashlib, algorithm)
    dsize = DIGEST_SIZES[algorithm]
    first = start // block_size
    out = np.zeros(((end - start + block_size - 1) // block_size, dsize),
                   dtype=np.uint8)
    with open(path, 'rb', buffering=0) as f:
        for row, nb, mv in _read_blocks(f.fileno(), start, end, block_size):
            arr = np.frombuffer(mv, dtype=np.uint64).reshape(nb, -1)
            nonzero = np.flatnonzero(arr.any(axis=1))
            if not len(nonzero):
                continue
            offsets = (nonzero * block_size).tolist()
            digests = b''.join([new(mv[o:o + block_size]).digest()
                                for o in offsets])
            out[nonzero + (row - first)] = np.frombuffer(
                digests, np.uint8).reshape(-1, dsize)
    return start, out.tobytes()


def _native_range(path, start, end, block_size, algorithm, out):
    """Thread worker: hash blocks [start, end) into the rows of ``out``.

    Whole blocks inside the file are hashed straight from a memory map of
    it (no copy out of the page cache); the partial last block and any
    blocks past the end of the file are read into a zero-padded buffer.
    Hashing releases the GIL, so one thread per core works in parallel;
    digests land in the caller's array without a copy.
    """
    flat = memoryview(out.reshape(-1))
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        mapped_end = max(start, min(end, size - size % block_size))
        if mapped_end > start:
            try:
                _hash_mapped(fd, start, mapped_end, block_size, algorithm,
                             flat)
            except OSError as e:
                if e.errno != errno.EFAULT:
                    raise
                raise ImageRejected('%s changed while it was being read '
                                    '(truncated)' % path)
        _hash_read(fd, mapped_end, end, block_size, algorithm, flat)
    finally:
        os.close(fd)
    return end - start


def _hash_mapped(fd, start, end, block_size, algorithm, flat):
    dsize = DIGEST_SIZES[algorithm]
    row = start // block_size
    try:
        m = mmap.mmap(fd, end - start, flags=mmap.MAP_SHARED,
                      prot=mmap.PROT_READ, offset=start)
    except (OSError, ValueError):    # a file system without mmap
        _hash_read(fd, start, end, block_size, algorithm, flat)
        return
    try:
        m.madvise(mmap.MADV_SEQUENTIAL)
        _blockhash.hash_blocks(OPENSSL_NAMES[algorithm], block_size, m,
                               flat[row * dsize:(row + (end - start)
                                                 // block_size) * dsize])
    finally:
        m.close()


def _hash_read(fd, start, end, block_size, algorithm, flat):
    """Hash [start, end) through a buffer (see :func:`_read_blocks`)."""
    name = OPENSSL_NAMES[algorithm]
    dsize = DIGEST_SIZES[algorithm]
    for row, nb, mv in _read_blocks(fd, start, end, block_size):
        _blockhash.hash_blocks(name, block_size, mv,
                               flat[row * dsize:(row + nb) * dsize])


@functools.lru_cache(maxsize=None)
def _warn_no_native():
    LOG.warning('the native block hasher is not built (no C compiler, '
                'Python headers or libssl-dev when vmar-openstack was '
                'installed); hashing with hashlib, at about half the speed')


def _identity(st):
    """What changes when a file is written to, truncated or replaced."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def hash_file(path, virtual_size, block_size=4096, algorithm='sha256',
              workers=None, progress=None, native=None, on_chunk=None):
    """Fingerprint the raw file ``path`` (``virtual_size`` bytes).

    Holes are skipped without reading them. Work is split into aligned
    chunks hashed by ``workers`` threads (native hasher) or processes
    (hashlib fallback). ``progress(nbytes)`` is called as chunks finish.
    A file written to, truncated or replaced meanwhile is rejected
    (:class:`ImageRejected`): its digests would describe no content. (A
    write within the file system's timestamp tick, a few ms, of the one
    before it goes unseen unless it changes the size.)
    ``native``: force (True) or forbid (False) the native hasher; by
    default it is used when built. ``on_chunk(rows)``, if given, is called
    in the calling thread with the digest rows of each chunk as it
    finishes (a view; zero rows are zero blocks), while other chunks are
    still being hashed.
    """
    if algorithm not in DIGEST_SIZES:
        raise ValueError('unknown hash algorithm %r' % algorithm)
    if native is None:
        native = _blockhash is not None
        if not native:
            _warn_no_native()
    elif native and _blockhash is None:
        raise exception.NativeHasherMissing()
    dsize = DIGEST_SIZES[algorithm]
    n_blocks = (virtual_size + block_size - 1) // block_size
    digests = np.zeros((n_blocks, dsize), dtype=np.uint8)
    jobs = []
    workers = workers or os.cpu_count() or 1
    # chunks small enough that a small image still gives every worker
    # several, so that on_chunk work overlaps hashing
    step = min(CHUNK, max(MIN_CHUNK, virtual_size // (4 * workers)))
    step -= step % block_size
    with open(path, 'rb') as f:
        before = _identity(os.fstat(f.fileno()))
        for start, end in data_ranges(f.fileno(), virtual_size):
            start -= start % block_size
            end = min(-(-end // block_size) * block_size,
                      n_blocks * block_size)
            for s in range(start, end, step):
                jobs.append((s, min(s + step, end)))
    total = sum(e - s for s, e in jobs)
    if native:
        with concurrent.futures.ThreadPoolExecutor(workers) as ex:
            futures = [ex.submit(_native_range, path, s, e, block_size,
                                 algorithm, digests) for s, e in jobs]
            spans = dict(zip(futures, jobs))
            for fu in concurrent.futures.as_completed(futures):
                done = fu.result()
                if progress:
                    progress(done)
                if on_chunk:
                    lo, hi = spans[fu]
                    on_chunk(digests[lo // block_size:-(-hi // block_size)])
    elif workers == 1 or len(jobs) <= 1:
        results = (_hash_range(path, s, e, block_size, algorithm)
                   for s, e in jobs)
        _collect(results, digests, block_size, dsize, progress, on_chunk)
    else:
        with concurrent.futures.ProcessPoolExecutor(workers) as ex:
            futures = [ex.submit(_hash_range, path, s, e, block_size,
                                 algorithm) for s, e in jobs]
            _collect((fu.result() for fu in
                      concurrent.futures.as_completed(futures)),
                     digests, block_size, dsize, progress, on_chunk)
    if _identity(os.stat(path)) != before:
        raise ImageRejected('%s changed while it was being read' % path)
    LOG.debug('hashed %d data bytes of %s in %d chunks (%s)', total, path,
              len(jobs), 'native' if native else 'hashlib')
    return Fingerprints(algorithm, block_size, virtual_size, digests)


def _collect(results, digests, block_size, dsize, progress, on_chunk):
    flat = digests.reshape(-1)
    for start, raw in results:
        first = start // block_size
        flat[first * dsize:first * dsize + len(raw)] = np.frombuffer(
            raw, dtype=np.uint8)
        if progress:
            progress(len(raw) // dsize * block_size)
        if on_chunk:
            on_chunk(digests[first:first + len(raw) // dsize])


def fingerprint_image(path, fmt, block_size=4096, algorithm='sha256',
                      workers=None, qemu_img='qemu-img', work_dir=None,
                      expected_size=None, max_virtual_size=None,
                      progress=None):
    """Inspect, then fingerprint, an image file of a pinned format."""
    with safety.checked_raw_view(
            path, fmt, qemu_img=qemu_img, work_dir=work_dir,
            expected_size=expected_size,
            max_virtual_size=max_virtual_size) as raw:
        return hash_file(raw.path, raw.virtual_size, block_size, algorithm,
                         workers, progress)
