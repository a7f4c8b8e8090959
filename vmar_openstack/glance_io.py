"""Streaming Glance image data to files, checked: both sides use it.

vmar-agent downloads the images it ingests (:mod:`vmar_openstack.glance_hooks`)
and a compute host downloads the maps, digest lists and bases it copies
(:mod:`vmar_openstack.mapsource.glance`); both stream through here.
"""

from concurrent import futures
import hashlib
import os
import tempfile

from glanceclient import exc as glance_exc
from oslo_log import log as logging

from vmar_openstack.exception import SourceError

LOG = logging.getLogger(__name__)


def stream_to(data, dest_dir, hasher_names=('sha256',), durable=True):
    """Write an iterable of chunks to a temporary file in ``dest_dir``.

    All-zero chunks become holes (images are mostly sparse, and ingest
    skips holes). ``durable``: fsync before returning (a file that is
    renamed into place); a scratch file need not be. Returns
    (path, {name: hexdigest}); the caller owns the file.
    """
    os.makedirs(dest_dir, exist_ok=True)
    hashers = {n: hashlib.new(n) for n in hasher_names if n}

    def _update(chunk):
        for h in hashers.values():
            h.update(chunk)     # releases the GIL: overlaps the download
    fd, tmp = tempfile.mkstemp(prefix='.fetch-%d-' % os.getpid(),
                               dir=dest_dir)
    pool = futures.ThreadPoolExecutor(1)
    pending = None
    try:
        with os.fdopen(fd, 'wb') as f:
            for chunk in _rechunk(data):
                if pending is not None:
                    pending.result()
                if hashers:
                    pending = pool.submit(_update, chunk)
                if chunk.count(0) == len(chunk):
                    f.seek(len(chunk), os.SEEK_CUR)
                else:
                    f.write(chunk)
            f.truncate()
            f.flush()
            if durable:
                os.fsync(f.fileno())
            if pending is not None:
                pending.result()
    except BaseException:
        os.unlink(tmp)
        raise
    finally:
        pool.shutdown()
    return tmp, {n: h.hexdigest() for n, h in hashers.items()}


def download(glance, meta, dest_dir, durable=True):
    """Stream the data of Glance image ``meta`` to a temporary file.

    Checked against Glance's ``os_hash_value`` (hashed as it streams), or
    by glanceclient's md5 check for an image that has none. Returns the
    path; the caller owns the file.
    """
    image_id, algo = meta['id'], meta.get('os_hash_algo')
    try:
        data = glance.images.data(image_id, do_checksum=not algo)
        tmp, sums = stream_to(data, dest_dir, (algo,) if algo else (),
                              durable)
    except glance_exc.ClientException as e:
        raise SourceError('cannot download image %s from Glance: %s'
                          % (image_id, e))
    if algo and sums[algo] != meta.get('os_hash_value'):
        os.unlink(tmp)
        raise SourceError('image %s: %s %s, Glance says %s'
                          % (image_id, algo, sums[algo],
                             meta.get('os_hash_value')))
    return tmp


def _rechunk(data, size=4 << 20):
    """Chunks of ``size`` bytes from an iterable of small ones."""
    parts, n = [], 0
    for chunk in data:
        parts.append(chunk)
        n += len(chunk)
        if n >= size:
            yield b''.join(parts)
            parts, n = [], 0
    if parts:
        yield b''.join(parts)


def remove_stale(directory):
    """Remove partial downloads of processes that died."""
    for name in os.listdir(directory) if os.path.isdir(directory) else ():
        parts = name.split('-')
        if (name.startswith('.fetch-') and len(parts) > 2
                and parts[1].isdigit()
                and not os.path.exists('/proc/%s' % parts[1])):
            LOG.info('removing partial download %s', name)
            os.unlink(os.path.join(directory, name))
