#!/usr/bin/env python3
"""Dedup and map figures on the Debian image library (paper Fig. 9-12).

Ingests the images given on the command line (raw) into a fresh SQLite
library in order, then reports per image: ingest time, data blocks, blocks
redirected to another image, extents, map bytes and MB per GiB, and the mean
lookup probes of the map for a sequential and a random read pattern, as the
map format spec defines them (doc/source/reference/map-format.rst, "Lookup
cost").

Goal: map size <= 0.10 MB per GiB of image. The paper reports about 0.16
MB/GiB and a mean search depth of 0.2.

Usage: bench_library.py [--json OUT] [--state DIR] NAME=PATH...
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import uuid

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_ingest  # noqa: E402

from vmar_openstack import ingest  # noqa: E402
from vmar_openstack import mapformat  # noqa: E402


def probes(bmap, blocks):
    lk = mapformat.Lookup(bmap)
    for b in blocks:
        lk.find(int(b))
    return lk.probes / max(1, lk.lookups)


def sequential_pattern(bmap, request_blocks=32):
    """Each block in order: what a sequential 128 KiB reader asks for."""
    return np.arange(bmap.n_blocks)


def random_pattern(bmap, n=100000, seed=1):
    rnd = np.random.default_rng(seed)
    return rnd.integers(0, bmap.n_blocks, size=min(n, bmap.n_blocks))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--json')
    p.add_argument('--state')
    p.add_argument('images', nargs='+', metavar='NAME=PATH')
    args = p.parse_args()
    state = args.state or tempfile.mkdtemp(prefix='vmar-library-')
    conf = bench_ingest.make_conf(state)
    lib = ingest.Library(conf)
    rows = []
    for spec in args.images:
        name, path = spec.split('=', 1)
        image_id = str(uuid.uuid5(uuid.NAMESPACE_URL, 'vmar-demo/' + name))
        t = time.perf_counter()
        out = lib.add(image_id, path, visibility='public', keep_base=False)
        dt = time.perf_counter() - t
        rows.append({'name': name, 'image_id': image_id,
                     'ingest_s': dt, 'map_version': out.map_version,
                     'allocated_bytes': os.stat(path).st_blocks * 512})
    result = {'images': []}
    for r in rows:
        bmap = mapformat.read(ingest.map_path(conf, r['image_id'],
                                              r['map_version']))
        gib = bmap.virtual_size / float(1 << 30)
        data = bmap.mapped_blocks()
        redirected = 0
        for e in bmap.extents.tolist():
            t = bmap.targets[e[3]]
            if not t.is_self or e[2] != e[0]:
                redirected += e[1]
        r.update({
            'virtual_size': bmap.virtual_size, 'data_blocks': data,
            'redirected_blocks': redirected,
            'redirected_fraction': redirected / data if data else 0.0,
            'extents': len(bmap.extents), 'map_bytes': bmap.file_size,
            'map_mb_per_gib': bmap.file_size / 1e6 / gib,
            'map_mb_per_gib_allocated': bmap.file_size / 1e6 / (
                r['allocated_bytes'] / float(1 << 30)),
            'probes_sequential': probes(bmap, sequential_pattern(bmap)),
            'probes_random': probes(bmap, random_pattern(bmap)),
        })
        result['images'].append(r)
    imgs = result['images']
    total_map = sum(i['map_bytes'] for i in imgs)
    total_gib = sum(i['virtual_size'] for i in imgs) / float(1 << 30)
    result['map_mb_per_gib'] = total_map / 1e6 / total_gib
    result['mean_probes_sequential'] = float(np.mean(
        [i['probes_sequential'] for i in imgs]))
    result['mean_probes_random'] = float(np.mean(
        [i['probes_random'] for i in imgs]))
    hdr = ('image', 'ingest s', 'data blocks', 'redirected', 'extents',
           'map bytes', 'MB/GiB', 'probes seq', 'probes rnd')
    print('%-11s %8s %11s %15s %8s %9s %7s %10s %10s' % hdr)
    for i in imgs:
        print('%-11s %8.2f %11d %8d %5.1f%% %8d %9d %7.3f %10.3f %10.3f'
              % (i['name'], i['ingest_s'], i['data_blocks'],
                 i['redirected_blocks'], 100 * i['redirected_fraction'],
                 i['extents'], i['map_bytes'], i['map_mb_per_gib'],
                 i['probes_sequential'], i['probes_random']))
    print('library: %.3f MB of map per GiB of image (goal <= 0.10; paper '
          '~0.16); mean probes: sequential %.3f, random %.3f (paper 0.2)'
          % (result['map_mb_per_gib'], result['mean_probes_sequential'],
             result['mean_probes_random']))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(result, f, indent=2)
    if not args.state:
        shutil.rmtree(state, ignore_errors=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
