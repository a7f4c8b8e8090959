#!/usr/bin/env python3
"""Block layouts of the Debian library: shares, time, and the boot set.

Three figures of issue 36, each against a baseline of the same run:

* **classified shares**: of each library image's blocks, how many are
  file-system metadata (by kind), file data, free and unknown, and how
  many of those are not zero (what a host stores and caches);
* **ingest time**: ``Library.add`` of every library image into a fresh
  SQLite library, with the block layout against without it
  (``classify.classify`` returning an empty layout at once: the boot
  set is still read beside the hashing, which the ingest of before did
  after it, so the baseline is faster than before), alternating,
  ``--repeat`` times. Goal: at most 1.2 x;
* **the boot working set against a boot** (``--boots``): each image booted
  for real (TCG) behind nbdkit's ``log`` filter, as ``bench_boot.py``
  records its traces; the introspected set of the library (what a cold
  host prefetches before any boot is recorded) against the blocks the
  boot read: covered (read and in the set) and over-fetched (in the set,
  not read). A host prefetching the set and fetching the rest on demand
  fetches ``read + over`` blocks: the ratio to ``read`` is the figure
  (goal: at most 1.15). The kinds of what a boot reads are given too.

Usage::

    python3 bench/bench_layout.py [--repeat 3] [--boots] [--images A,B]
        [--no-ingest] [--json OUT]
"""

import argparse
import collections
import json
import os
import sys
import tempfile
import time
import uuid

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))

import bench_boot  # noqa: E402
import bench_ingest  # noqa: E402

from tools.vmarenv import qemu_env  # noqa: E402
from vmar_openstack.fingerprint import classify  # noqa: E402
from vmar_openstack.fingerprint import introspect  # noqa: E402
from vmar_openstack import ingest  # noqa: E402
from vmar_openstack.mapformat import layout  # noqa: E402

BS = 4096
NS = uuid.UUID('6f1d8a52-3c47-5b9e-a0d1-7e2c4b8f9a13')


def image_id(name):
    return str(uuid.uuid5(NS, name))


def nonzero_blocks(path, size):
    """Bool per block: not all zero."""
    out = np.zeros(-(-size // BS), dtype=bool)
    with open(path, 'rb') as f:
        for i in range(0, len(out), 4096):
            chunk = np.frombuffer(f.read(4096 * BS), dtype=np.uint8)
            n = -(-len(chunk) // BS)
            chunk = np.pad(chunk, (0, n * BS - len(chunk)))
            out[i:i + n] = chunk.reshape(n, BS).any(axis=1)
    return out


def shares(images):
    """Classified shares and classification time of each image."""
    out = {}
    for name, path in images.items():
        size = os.path.getsize(path)
        t0 = time.monotonic()
        lay = classify.classify(path, size, BS, image_id(name))
        secs = time.monotonic() - t0
        codes = lay.kind_codes()
        stored = nonzero_blocks(path, size)
        kinds = {}
        for kind, n in lay.counts().items():
            if n:
                mask = codes == layout.CODE[kind]
                kinds[kind] = {'blocks': n,
                               'stored': int((mask & stored).sum())}
        meta = [k for k in kinds if k in layout.METADATA]
        out[name] = {
            'seconds': secs, 'blocks': lay.n_blocks,
            'files': len(lay.files), 'kinds': kinds,
            'metadata_blocks': sum(kinds[k]['blocks'] for k in meta),
            'metadata_stored': sum(kinds[k]['stored'] for k in meta),
            'layout_bytes': len(layout.encode(lay))}
        print('%-11s %5.2f s  metadata %6d blocks (%5.1f MiB stored)  data '
              '%6d  free %6d  unknown %6d  files %5d' % (
                  name, secs, out[name]['metadata_blocks'],
                  out[name]['metadata_stored'] * BS / 2.0 ** 20,
                  kinds.get('data', {}).get('blocks', 0),
                  kinds.get('free', {}).get('blocks', 0),
                  kinds.get('unknown', {}).get('blocks', 0),
                  len(lay.files)), flush=True)
    return out


def _library(tmp):
    return ingest.Library(bench_ingest.make_conf(tempfile.mkdtemp(dir=tmp)))


def ingest_times(images, repeat, tmp):
    """Seconds per image of ``Library.add``, with and without layouts."""
    real = classify.classify

    def unclassified(path, size, block_size, image_id):
        n = -(-size // block_size)
        return layout.from_arrays(image_id, size, block_size, (), (),
                                  np.zeros(n, dtype=np.uint8),
                                  np.full(n, -1))
    out = {'with': collections.defaultdict(list),
           'without': collections.defaultdict(list)}
    for r in range(repeat):
        order = ('without', 'with') if r % 2 == 0 else ('with', 'without')
        for how in order:
            classify.classify = real if how == 'with' else unclassified
            lib = _library(tmp)
            for name, path in images.items():
                t0 = time.monotonic()
                lib.add(image_id(name), path, visibility='public')
                out[how][name].append(time.monotonic() - t0)
    classify.classify = real
    total = {how: sum(min(v) for v in out[how].values()) for how in out}
    ratio = total['with'] / total['without']
    for name in images:
        print('%-11s add %.2f s without a layout, %.2f s with (best of %d)'
              % (name, min(out['without'][name]), min(out['with'][name]),
                 repeat))
    print('ingest of the library: %.1f s without, %.1f s with: %.3f x '
          '(goal <= 1.2)' % (total['without'], total['with'], ratio))
    return {'per_image': {h: dict(v) for h, v in out.items()},
            'total': total, 'ratio': ratio}


def boot_sets(images, tmp, timeout):
    """The introspected set against the blocks a real boot reads."""
    out = {}
    for name, path in images.items():
        size = os.path.getsize(path)
        trace = bench_boot.record_trace(name, path, tmp, timeout)
        read = set(bench_boot.trace_blocks(trace).tolist())
        stored = nonzero_blocks(path, size)
        read = {b for b in read if b < len(stored) and stored[b]}
        lay = classify.classify(path, size, BS, image_id(name))
        guess = {b for b in introspect.with_skeleton(
            introspect.boot_blocks(path, size, BS), lay) if stored[b]}
        before = {b for b in introspect.boot_blocks(path, size, BS, False)
                  if stored[b]}
        codes = lay.kind_codes()
        kinds = collections.Counter(layout.KINDS[codes[b]] for b in read)
        covered, over = len(read & guess), len(guess - read)
        # where the over-fetch is: by file (data) or by kind
        file_of = np.full(lay.n_blocks, -1, dtype=np.int64)
        for first, n, _kind, file in lay.runs:
            file_of[first:first + n] = file
        by_file = collections.Counter()
        for b in guess - read:
            f = int(file_of[b])
            by_file[lay.files[f] if f >= 0 else
                    '<%s>' % layout.KINDS[codes[b]]] += 1
        missed = collections.Counter(layout.KINDS[codes[b]]
                                     for b in read - guess)
        out[name] = {'read': len(read), 'set': len(guess),
                     'covered': covered, 'over': over,
                     'fetch_ratio': (len(read) + over) / len(read),
                     'before': {'set': len(before),
                                'covered': len(read & before),
                                'over': len(before - read)},
                     'missed_kinds': dict(missed),
                     'read_kinds': dict(kinds), 'booted': trace['booted'],
                     'over_by_file': dict(by_file.most_common(40))}
        print('%-11s boot read %5d blocks (%d metadata); introspected set '
              '%5d: covers %5.1f %%, over-fetches %5d -> %.3f x the read '
              '(goal <= 1.15)' % (
                  name, len(read), sum(n for k, n in kinds.items()
                                       if k in layout.METADATA),
                  len(guess), 100.0 * covered / len(read), over,
                  out[name]['fetch_ratio']), flush=True)
        print('    metadata the boot read: %d, in the set %d (the set '
              'without metadata: %d); set without metadata: covers %.1f %%, '
              '%.3f x' % (
                  sum(n for k, n in kinds.items() if k in layout.METADATA),
                  sum(n for k, n in kinds.items() if k in layout.METADATA)
                  - sum(n for k, n in missed.items()
                        if k in layout.METADATA),
                  len({b for b in read & before
                       if layout.KINDS[codes[b]] in layout.METADATA}),
                  100.0 * len(read & before) / len(read),
                  (len(read) + len(before - read)) / len(read)))
        for what, n in by_file.most_common(8):
            print('    over-fetched: %5d blocks of %s' % (n, what))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--repeat', type=int, default=3)
    p.add_argument('--boots', action='store_true',
                   help='also boot each image for real (TCG, ~1 min each)')
    p.add_argument('--boot-timeout', type=int, default=600)
    p.add_argument('--images', help='comma-separated library images '
                   '(default: all)')
    p.add_argument('--no-ingest', action='store_true',
                   help='skip the ingest timing')
    p.add_argument('--json', help='write the figures here')
    args = p.parse_args()
    images = qemu_env.image_library()
    if args.images:
        images = {n: images[n] for n in args.images.split(',')}
    with tempfile.TemporaryDirectory(prefix='bench-layout-') as tmp:
        print('== classified shares and time', flush=True)
        res = {'shares': shares(images)}
        if not args.no_ingest:
            print('== ingest time, with and without the block layout',
                  flush=True)
            res['ingest'] = ingest_times(images, args.repeat, tmp)
        if args.boots:
            print('== the introspected boot set against real boots',
                  flush=True)
            res['boots'] = boot_sets(images, tmp, args.boot_timeout)
    res['machine'] = {'nproc': os.cpu_count(), 'uname': os.uname().release}
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(res, f, indent=1)


if __name__ == '__main__':
    main()
