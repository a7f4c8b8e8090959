"""Boot working sets: the blocks of an image that its boot reads.

The library writes one per image at ingest, found by introspecting the image's
file systems (:mod:`vmar_openstack.fingerprint.introspect`); vmar-agent
publishes it next to the image's maps; a host that adds the first export
of an image prefetches it into its mirrors
(:mod:`vmar_openstack.host.cache.prefetch`). The file is JSON, specified in
``doc/source/reference/mirror-format.rst`` ("Boot working set"), the only
specification.
"""

import dataclasses
import json

from vmar_openstack import exception
from vmar_openstack.mapformat import jsonfile

FORMAT = 'vmar-bootset'
VERSION = 1
SOURCES = ('introspected', 'recorded')
# a set larger than this is not one: 1 MiB of JSON is ~60,000 extents
MAX_FILE_SIZE = 1 << 20


@dataclasses.dataclass(frozen=True)
class Bootset:
    image_id: str
    virtual_size: int
    block_size: int
    source: str
    extents: tuple          # ((first block, blocks), ...)

    @property
    def n_blocks(self):
        return sum(n for _f, n in self.extents)

    def byte_ranges(self, gap=0, limit=None):
        """Sorted ``(offset, length)`` byte ranges covering the extents.

        Extents up to ``gap`` bytes apart are merged into one range, and
        a range is at most ``limit`` bytes (None: no limit). Ranges end at
        the image's end.
        """
        bs, out = self.block_size, []
        for first, n in self.extents:
            start, end = first * bs, min((first + n) * bs, self.virtual_size)
            if out and start - (out[-1][0] + out[-1][1]) <= gap:
                start = out.pop()[0]
            out.append((start, end - start))
        if limit:
            out = [(off + i, min(limit, length - i))
                   for off, length in out for i in range(0, length, limit)]
        return out


def merge(blocks):
    """Sorted runs ``[(first, count)]`` of an iterable of block numbers."""
    runs = []
    for b in sorted(set(blocks)):
        if runs and runs[-1][0] + runs[-1][1] == b:
            runs[-1][1] += 1
        else:
            runs.append([b, 1])
    return [tuple(r) for r in runs]


def encode(bootset):
    """The file's bytes, after checking ``bootset`` as :func:`decode` does."""
    data = json.dumps({
        'format': FORMAT, 'version': VERSION,
        'image_id': bootset.image_id, 'virtual_size': bootset.virtual_size,
        'block_size': bootset.block_size, 'source': bootset.source,
        'extents': [list(e) for e in bootset.extents]},
        separators=(',', ':')).encode()
    decode(data, bootset.image_id)
    return data


def _error(image_id, detail):
    return exception.BootsetFormatError(image_id=image_id, detail=detail)


def for_image(data, parent_id, image_id, size):
    """The parent's boot set file ``data`` as ``image_id``'s (a snapshot)."""
    same = jsonfile.renamed_same_size(data, parent_id, image_id, FORMAT,
                                      VERSION, MAX_FILE_SIZE, _error)
    if same is not None and same[1] == size:
        return same[0]
    raw, _old, _bs = jsonfile.renamed(data, parent_id, image_id, size,
                                      FORMAT, VERSION, MAX_FILE_SIZE, _error)
    return jsonfile.dump(raw)


def decode(data, image_id):
    """The :class:`Bootset` in ``data``, which must describe ``image_id``.

    :raises BootsetFormatError: anything out of place.
    """
    raw, size, bs = jsonfile.parse(data, image_id, FORMAT, VERSION,
                                   MAX_FILE_SIZE, _error)
    try:
        source = raw['source']
        extents = tuple((int(f), int(n)) for f, n in raw['extents'])
    except (ValueError, KeyError, TypeError) as e:
        raise _error(image_id, 'malformed: %s' % e)
    if source not in SOURCES:
        raise _error(image_id, 'source %r' % (source,))
    n_blocks, end = -(-size // bs), -1
    for first, n in extents:
        if n < 1 or first <= end or first + n > n_blocks:
            raise _error(image_id, 'extent (%d, %d) out of order, empty or '
                         'past the image\'s %d blocks'
                         % (first, n, n_blocks))
        end = first + n
    return Bootset(image_id, size, bs, source, extents)


def read(path, image_id):
    with open(path, 'rb') as f:
        return decode(f.read(MAX_FILE_SIZE + 1), image_id)
