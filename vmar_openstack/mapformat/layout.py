"""Block layouts: what each block of an image is, from its file systems.

The library writes one per image at ingest
(:mod:`vmar_openstack.fingerprint.classify`); vmar-agent publishes it next
to the image's maps and boot working set; hosts read it for the blocks
worth keeping warm. Every block of the image is of one kind (:data:`KINDS`):
file-system metadata of some kind, file data (with the file's path),
free, or unknown (not in a file system this reads). The file is JSON,
specified in ``doc/source/reference/mirror-format.rst`` ("Block layout"), the
only specification.
"""

import collections
import dataclasses
import json

import numpy as np

from vmar_openstack import exception
from vmar_openstack.mapformat import jsonfile

FORMAT = 'vmar-layout'
VERSION = 1
# every kind a block can be, in the order that settles a block holding
# more than one (a 4 KiB block of a file system with 1 KiB blocks, or one
# across a partition's edge): a later kind wins
KINDS = (
    'unknown',          # no file system read here, or not reached
    'free',             # free in its file system
    'data',             # a regular file's data
    # file-system metadata
    'partition-table',  # MBR, GPT header and entries (and GPT's backup)
    'superblock',       # superblocks and their backups
    'group-header',     # ext group descriptors, reserved GDT; XFS AG
                        # headers in blocks of their own
    'allocation',       # ext block and inode bitmaps; XFS free-space,
                        # inode, reverse-map and refcount btrees
    'inode-table',      # ext inode tables; XFS inode chunks
    'journal',          # ext journal; XFS log
    'directory',        # directory blocks
    'file-map',         # ext extent-tree and indirect blocks; XFS bmap
                        # btree blocks
    'xattr',            # extended attribute blocks
    'symlink',          # symlink targets too long for the inode
    'quota',            # quota files
    'fs-other',         # other metadata (XFS realtime summary, ...)
)
CODE = {k: i for i, k in enumerate(KINDS)}
DATA = CODE['data']
METADATA = KINDS[CODE['partition-table']:]
# a layout is at most this large: a path table of ~500,000 files
MAX_FILE_SIZE = 64 << 20


@dataclasses.dataclass(frozen=True)
class Volume:
    offset: int
    length: int
    type: str           # blkid's TYPE, '' when none was found
    classified: bool


@dataclasses.dataclass(frozen=True)
class Layout:
    image_id: str
    virtual_size: int
    block_size: int
    volumes: tuple      # (Volume, ...)
    files: tuple        # (path, ...): the files data runs name
    runs: tuple         # ((first block, blocks, kind, file or -1), ...)

    @property
    def n_blocks(self):
        return -(-self.virtual_size // self.block_size)

    def counts(self):
        """``{kind: blocks}`` over the whole image, every kind present."""
        out = collections.Counter({k: 0 for k in KINDS})
        for _f, n, kind, _file in self.runs:
            out[kind] += n
        return dict(out)

    def extents(self, kinds):
        """Sorted ``(first, blocks)`` runs of the blocks of ``kinds``."""
        want, out = set(kinds), []
        for first, n, kind, _file in self.runs:
            if kind not in want:
                continue
            if out and out[-1][0] + out[-1][1] == first:
                out[-1][1] += n
            else:
                out.append([first, n])
        return [tuple(e) for e in out]

    def kind_codes(self):
        """One ``uint8`` per block: its kind's index in :data:`KINDS`."""
        codes = np.zeros(self.n_blocks, dtype=np.uint8)
        for first, n, kind, _file in self.runs:
            codes[first:first + n] = CODE[kind]
        return codes

    def file_blocks(self):
        """``{path: blocks}`` of the files data runs name."""
        out = collections.Counter()
        for _f, n, _kind, file in self.runs:
            if file >= 0:
                out[self.files[file]] += n
        return dict(out)


def from_arrays(image_id, virtual_size, block_size, volumes, files, codes,
                file_of):
    """The :class:`Layout` of per-block arrays.

    ``codes`` holds each block's kind index, ``file_of`` the index in
    ``files`` of a data block's file (-1: none; ignored elsewhere).
    """
    codes = np.asarray(codes, dtype=np.uint8)
    file_of = np.where(codes == DATA, np.asarray(file_of, dtype=np.int64),
                       -1)
    n = len(codes)
    if not n:
        return Layout(image_id, virtual_size, block_size, tuple(volumes),
                      tuple(files), ())
    change = np.flatnonzero((codes[1:] != codes[:-1]) |
                            (file_of[1:] != file_of[:-1])) + 1
    starts = np.concatenate(([0], change))
    ends = np.concatenate((change, [n]))
    runs = tuple((int(s), int(e - s), KINDS[codes[s]], int(file_of[s]))
                 for s, e in zip(starts, ends))
    return Layout(image_id, virtual_size, block_size, tuple(volumes),
                  tuple(files), runs)


def encode(layout):
    """The file's bytes, after checking ``layout`` as :func:`decode` does."""
    kinds = sorted({r[2] for r in layout.runs}, key=CODE.get)
    index = {k: i for i, k in enumerate(kinds)}
    data = json.dumps({
        'format': FORMAT, 'version': VERSION,
        'image_id': layout.image_id, 'virtual_size': layout.virtual_size,
        'block_size': layout.block_size,
        'volumes': [dataclasses.asdict(v) for v in layout.volumes],
        'kinds': kinds, 'files': list(layout.files),
        'runs': [[f, n, index[k], file] for f, n, k, file in layout.runs]},
        separators=(',', ':')).encode()
    decode(data, layout.image_id)
    return data


def _error(image_id, detail):
    return exception.LayoutFormatError(image_id=image_id, detail=detail)


def for_image(data, parent_id, image_id, size):
    """The parent's layout file ``data`` as ``image_id``'s (a snapshot).

    Blocks past the parent's size are unknown. Nothing else is looked at
    again: the parent's file was checked when it was written.
    """
    same = jsonfile.renamed_same_size(data, parent_id, image_id, FORMAT,
                                      VERSION, MAX_FILE_SIZE, _error)
    if same is not None and same[1] == size:
        return same[0]
    raw, old, bs = jsonfile.renamed(data, parent_id, image_id, size, FORMAT,
                                    VERSION, MAX_FILE_SIZE, _error)
    start, grown = -(-old // bs), -(-size // bs) - -(-old // bs)
    if grown > 0:
        if 'unknown' not in raw['kinds']:
            raw['kinds'].append('unknown')
        raw['runs'].append([start, grown, raw['kinds'].index('unknown'),
                            -1])
    return jsonfile.dump(raw)


def decode(data, image_id):
    """The :class:`Layout` in ``data``, which must describe ``image_id``.

    :raises LayoutFormatError: anything out of place.
    """
    raw, size, bs = jsonfile.parse(data, image_id, FORMAT, VERSION,
                                   MAX_FILE_SIZE, _error)
    try:
        kinds = [str(k) for k in raw['kinds']]
        files = tuple(raw['files'])
        volumes = tuple(Volume(int(v['offset']), int(v['length']),
                               str(v['type']), bool(v['classified']))
                        for v in raw['volumes'])
        runs = tuple((int(f), int(n), int(k), int(file))
                     for f, n, k, file in raw['runs'])
    except (ValueError, KeyError, TypeError) as e:
        raise _error(image_id, 'malformed: %s' % e)
    unknown = [k for k in kinds if k not in CODE]
    if unknown or len(set(kinds)) != len(kinds):
        raise _error(image_id, 'kinds %r' % (kinds,))
    if not all(isinstance(p, str) for p in files):
        raise _error(image_id, 'a file name is not a string')
    for v in volumes:
        if v.offset < 0 or v.length <= 0 or v.offset + v.length > size:
            raise _error(image_id, 'volume (%d, %d) outside the image'
                         % (v.offset, v.length))
    n_blocks, end, out = -(-size // bs), 0, []
    for first, n, k, file in runs:
        if first != end or n < 1 or not 0 <= k < len(kinds):
            raise _error(image_id, 'run (%d, %d) not where the last ended '
                         '(%d), empty, or of no kind' % (first, n, end))
        if file != -1 and (kinds[k] != 'data' or not 0 <= file < len(files)):
            raise _error(image_id, 'run (%d, %d) names file %d'
                         % (first, n, file))
        end = first + n
        out.append((first, n, kinds[k], file))
    if end != n_blocks:
        raise _error(image_id, 'runs cover %d of the image\'s %d blocks'
                     % (end, n_blocks))
    return Layout(image_id, size, bs, volumes, files, tuple(out))


def read(path, image_id):
    with open(path, 'rb') as f:
        return decode(f.read(MAX_FILE_SIZE + 1), image_id)
