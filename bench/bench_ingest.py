#!/usr/bin/env python3
"""Ingest benchmarks of the core issue, with same-run baselines.

Prints, each as a ratio against a baseline measured in the same run:

1. hashing: the fingerprint stage on a fully allocated image (page cache
   hot) against 2 x single-core ``openssl speed -evp sha256 -bytes 4096``.
   Goal >= 0.8.
2. ingest: end-to-end ``Library.add`` (hash + cluster update + map write,
   SQLite) of a fully allocated image with 50 % new blocks, against the
   hashing rate of item 1. Goal >= 0.5.
3. scale: adding the 200th image of a synthetic library against adding the
   10th, at equal image size. Goal <= 1.2.

Usage: bench_ingest.py [--size-gib 4] [--scale-images 200]
       [--scale-mib 64] [--scale-model files|blocks ...] [--skip-scale]
       [--skip-ingest] [--workdir DIR] [--json OUT]
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

import numpy as np
from oslo_config import cfg
import sqlalchemy as sa

from vmar_openstack import conf as vmar_conf
from vmar_openstack.db import migration
from vmar_openstack.db import session as db_session
from vmar_openstack import fingerprint
from vmar_openstack import ingest

BS = 4096


def openssl_single_core_mb_s(seconds=3):
    out = subprocess.run(
        ['openssl', 'speed', '-evp', 'sha256', '-bytes', '4096',
         '-seconds', str(seconds)], capture_output=True, text=True,
        check=True).stdout
    line = [x for x in out.splitlines() if x.startswith('sha256')][-1]
    kb = float(re.findall(r'([\d.]+)k', line)[-1])
    return kb * 1000 / 1e6   # openssl's "k" is 1000 bytes


def make_conf(state):
    conf = cfg.ConfigOpts()
    vmar_conf.register_opts(conf)
    conf([], project='vmar', default_config_files=[])
    conf.set_override('state_dir', state, group='vmar')
    conf.set_override('connection', 'sqlite:///%s/vmar.sqlite' % state,
                      group='vmar_database')
    migration.upgrade('head', conf=conf)
    return conf


def write_blocks(path, seeds, chunk_blocks=8192):
    """Write blocks whose content is a function of an integer seed."""
    with open(path, 'wb') as f:
        for i in range(0, len(seeds), chunk_blocks):
            part = np.asarray(seeds[i:i + chunk_blocks], dtype=np.uint64)
            words = BS // 8
            base = part[:, None] * np.uint64(0x9E3779B97F4A7C15)
            idx = np.arange(words, dtype=np.uint64)[None, :]
            x = base + idx * np.uint64(0xBF58476D1CE4E5B9)
            x ^= x >> np.uint64(31)
            x *= np.uint64(0x94D049BB133111EB)
            x ^= x >> np.uint64(29)
            f.write(x.astype('<u8').tobytes())


def settle(*paths):
    """Page cache hot and written back.

    No writeback of the test images runs during a measurement.
    """
    for p in paths:
        warm(p)
    os.sync()


def warm(path):
    with open(path, 'rb') as f:
        while f.read(64 << 20):
            pass


def bench_hash_and_ingest(workdir, size_gib, layout):
    """Image B of ``size_gib`` with 50 % new blocks, after image A.

    layout ``interleaved``: A is as large as B and every other block of B
    is new, so the one cluster of A splits in half (the worst case: every
    shared fingerprint row moves). ``appended``: A is half of B and B is A
    followed by new blocks, as when packages are added to an image (whole
    clusters change membership, which costs one row per cluster).
    """
    n = int(size_gib * (1 << 30)) // BS
    a = os.path.join(workdir, 'a.raw')
    b = os.path.join(workdir, 'b.raw')
    seeds_b = np.arange(1, n + 1)
    if layout == 'interleaved':
        write_blocks(a, np.arange(1, n + 1))
        seeds_b[1::2] += 10 ** 9
    else:
        write_blocks(a, np.arange(1, n // 2 + 1))
        seeds_b[n // 2:] += 10 ** 9
    write_blocks(b, seeds_b)
    settle(a, b)
    size = n * BS
    best = None
    for _ in range(3):
        t = time.perf_counter()
        fingerprint.hash_file(b, size, workers=os.cpu_count())
        dt = time.perf_counter() - t
        best = dt if best is None else min(best, dt)
    hash_mb_s = size / best / 1e6

    state = os.path.join(workdir, 'state-' + layout)
    conf = make_conf(state)
    lib = ingest.Library(conf)
    lib.add(str(uuid.uuid4()), a, keep_base=False, visibility='public')
    settle(b)
    t = time.perf_counter()
    out = lib.add(str(uuid.uuid4()), b, keep_base=False,
                  visibility='public')
    ingest_s = time.perf_counter() - t
    return {'image_bytes': size, 'hash_s': best, 'hash_mb_s': hash_mb_s,
            'ingest_s': ingest_s, 'ingest_mb_s': size / ingest_s / 1e6,
            'shared_fraction': out.shared_fraction}


def _files(rnd, n_blocks, mean_len=8):
    """Split ``n_blocks`` into "files": (start, length) runs of blocks."""
    lengths = rnd.geometric(1.0 / mean_len, size=n_blocks)
    ends = np.cumsum(lengths)
    ends = ends[ends < n_blocks]
    starts = np.concatenate([[0], ends])
    return starts, np.diff(np.append(starts, n_blocks))


def _base_changes(rnd, base, model, files, hot):
    """Base blocks image ``i`` replaces with content of its own.

    ``blocks``: 2 % of the base blocks, uniformly at random (each image cuts
    the shared base at its own random places: by the 200th image nearly
    every base block is in a cluster of its own). ``files``: whole files,
    as when an image rewrites its own /etc, package database and caches:
    each of ``hot`` files (configuration and state files most images
    rewrite) with probability 1/2, plus 4 files chosen uniformly; about 2 %
    of the base too.
    """
    if model == 'blocks':
        return rnd.integers(0, base, size=base // 50)
    starts, lengths = files
    chosen = list(hot[rnd.random(len(hot)) < 0.5])
    chosen += list(rnd.choice(len(starts), size=4, replace=False))
    return np.concatenate([np.arange(starts[f], starts[f] + lengths[f])
                           for f in chosen])


def bench_scale(workdir, n_images, mib, model='files'):
    """A synthetic library shaped like a distribution's images.

    Every image is a "base system" (the first 40 % of a shared pool, with
    about 2 % of it replaced by content of its own, see
    :func:`_base_changes`), then a selection of "packages": contiguous runs
    taken from a shared pool of package files, then its own data, then free
    space (zero blocks). Images differ in which packages they hold.
    Returns the add times and the clusters in the library at the end.
    """
    state = os.path.join(workdir, 'scale-state-' + model)
    conf = make_conf(state)
    lib = ingest.Library(conf)
    n = mib * (1 << 20) // BS
    rnd = np.random.default_rng(42)
    base = int(n * 0.4)
    files = _files(rnd, base)
    hot = rnd.choice(len(files[0]), size=24, replace=False)
    pkg_len = max(1, n // 64)
    n_pkgs = 200                      # package pool
    times = []
    path = os.path.join(workdir, 'scale.raw')
    for i in range(n_images):
        parts = [np.arange(1, base + 1)]
        parts[0][_base_changes(rnd, base, model, files, hot)] += (
            10 ** 10 + i)
        chosen = rnd.choice(n_pkgs, size=int(n * 0.3) // pkg_len,
                            replace=False)
        for p in chosen:
            start = 10 ** 6 + int(p) * pkg_len
            parts.append(np.arange(start, start + pkg_len))
        used = sum(len(x) for x in parts)
        own = int(n * 0.1)
        parts.append(10 ** 9 + i * n + np.arange(own))
        parts.append(np.zeros(n - used - own, dtype=np.int64))
        write_blocks(path, np.concatenate(parts))
        settle(path)
        t = time.perf_counter()
        lib.add(str(uuid.uuid4()), path, keep_base=False,
                visibility='public' if i % 3 else 'private',
                owner='p%d' % (i % 5))
        times.append(time.perf_counter() - t)
    with db_session.reader(conf) as s:
        clusters = s.execute(sa.text(
            'SELECT COUNT(*) FROM vmar_clusters')).scalar()
    w = 5
    t10 = statistics.median(times[9 - w // 2:9 + w // 2 + 1])
    tlast = statistics.median(times[-w:])
    # means over ten adds: they include the adds that merge the small
    # fingerprint tier (vmar_openstack.db.bulk), which medians leave out
    m10 = statistics.mean(times[5:15])
    mlast = statistics.mean(times[-10:])
    return {'model': model, 'images': n_images, 'image_mib': mib,
            'clusters': clusters,
            'add_10th_s': times[9], 'add_last_s': times[-1],
            'median_around_10th_s': t10, 'median_last5_s': tlast,
            'ratio_single': times[-1] / times[9],
            'ratio_median': tlast / t10, 'mean_6_to_15_s': m10,
            'mean_last10_s': mlast, 'ratio_mean': mlast / m10,
            'times': times}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--size-gib', type=float, default=4)
    p.add_argument('--scale-images', type=int, default=200)
    p.add_argument('--scale-mib', type=int, default=64)
    p.add_argument('--workdir')
    p.add_argument('--json')
    p.add_argument('--skip-scale', dest='scale_model', action='store_const',
                   const=[])
    p.add_argument('--skip-ingest', action='store_true')
    p.add_argument('--scale-model', action='append',
                   choices=('files', 'blocks'),
                   help='how images change the shared base (see '
                   '_base_changes); repeat for both (default: both)')
    args = p.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix='vmar-bench-')
    os.makedirs(workdir, exist_ok=True)
    try:
        ossl = openssl_single_core_mb_s()
        res = {'openssl_sha256_4k_single_core_mb_s': ossl,
               'cpus': os.cpu_count()}
        print('openssl sha256 4 KiB, one core : %8.0f MB/s' % ossl)
        if args.scale_model is None:
            args.scale_model = ['files', 'blocks']
        for layout in (() if args.skip_ingest else
                       ('interleaved', 'appended')):
            r = bench_hash_and_ingest(workdir, args.size_gib, layout)
            r['hash_ratio'] = r['hash_mb_s'] / (2 * ossl)
            r['ingest_ratio'] = r['ingest_mb_s'] / r['hash_mb_s']
            res[layout] = r
            print('hashing stage (%d workers)     : %8.0f MB/s  ratio to 2 '
                  'x openssl = %.2f (goal >= 0.80)'
                  % (os.cpu_count(), r['hash_mb_s'], r['hash_ratio']))
            print('ingest %.1f GiB %-11s    : %8.0f MB/s  ratio to '
                  'hashing = %.2f (goal >= 0.50); %.0f%% shared'
                  % (args.size_gib, layout, r['ingest_mb_s'],
                     r['ingest_ratio'], 100 * r['shared_fraction']))
        for model in args.scale_model:
            sc = bench_scale(workdir, args.scale_images, args.scale_mib,
                             model)
            res['scale-' + model] = sc
            print('scale (%s), %d x %d MiB, %d clusters: add #10 %.3f s, '
                  'add #%d %.3f s, ratio %.2f (median of 5: %.2f, mean '
                  'of 10: %.2f) (goal <= 1.20)'
                  % (model, sc['images'], sc['image_mib'], sc['clusters'],
                     sc['add_10th_s'], sc['images'], sc['add_last_s'],
                     sc['ratio_single'], sc['ratio_median'],
                     sc['ratio_mean']))
        if args.json:
            with open(args.json, 'w') as f:
                json.dump(res, f, indent=2)
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
