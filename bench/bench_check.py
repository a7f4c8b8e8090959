#!/usr/bin/env python3
"""vmar-manage check on a library of real-size images: time and memory.

Builds a library of ``--images`` images of :class:`bench_scale.Cloud`'s
stream (real size at ``--scale 1``: 1-5 GiB of data each, twice that of
virtual disk) from synthetic digests, on SQLite, with this tree's code;
then runs ``check.check`` of this tree and, with ``--baseline REV``, of
the code of git revision REV (a worktree) on the same library, each in a
process of its own, and prints each one's seconds, peak RSS and problems
found, and this tree's over REV's.

Usage: bench_check.py [--images N] [--bases N] [--scale S]
       [--baseline REV] [--workdir DIR] [--json OUT]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(TOP, 'bench')

RUN_CHECK = '''
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
import bench_lock
from vmar_openstack.ingest import check
conf = bench_lock.library_conf(sys.argv[2])
t = time.perf_counter()
problems, warnings = check.check(conf)
print(json.dumps({'s': time.perf_counter() - t, 'problems': problems,
                  'warnings': len(warnings), 'max_rss_bytes':
                  resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
'''


def build(args, state):
    sys.path.insert(0, TOP)
    sys.path.insert(1, BENCH)
    import bench_lock
    import bench_scale
    from tools.vmarenv import glance_env
    from vmar_openstack.db import migration
    from vmar_openstack import ingest
    conf_file = os.path.join(state, 'vmar.conf')
    glance_env.write_conf(conf_file, {
        'vmar': {'state_dir': state},
        'vmar_database': {'connection': 'sqlite:///%s/vmar.sqlite' % state}})
    conf = bench_lock.library_conf(conf_file)
    migration.upgrade('head', conf=conf)
    lib = ingest.Library(conf)
    cloud = bench_scale.Cloud(args.bases, 0.5, args.scale)
    gib = 0.0
    for i in range(args.images):
        kind, seeds = cloud.next()
        lib.add_fingerprints(bench_lock.image_uuid(i),
                             bench_lock.fingerprints_of(seeds),
                             owner='p%d' % (i % 7),
                             visibility='public' if kind != 'snapshot'
                             else 'private')
        gib += len(seeds) * bench_lock.BS / 2 ** 30
    return conf_file, gib


def run_check(code, conf_file):
    # the code's own ingest.check, with this tree's bench helpers
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([code, BENCH]))
    r = subprocess.run([sys.executable, '-c', RUN_CHECK, code, conf_file],
                       capture_output=True, text=True, env=env)
    if r.returncode:
        raise SystemExit('check of %s failed: %s' % (code, r.stderr[-3000:]))
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--images', type=int, default=40)
    p.add_argument('--bases', type=int, default=12)
    p.add_argument('--scale', type=float, default=1.0,
                   help='divide image sizes by this (1: real size)')
    p.add_argument('--baseline', metavar='REV')
    p.add_argument('--workdir')
    p.add_argument('--json')
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix='bench-check-', dir=args.workdir)
    results = {}
    try:
        state = os.path.join(work, 'library')
        os.makedirs(state)
        conf_file, gib = build(args, state)
        if args.baseline:
            tree = os.path.join(work, 'baseline-tree')
            subprocess.run(['git', '-C', TOP, 'worktree', 'add', '--detach',
                            '-q', tree, args.baseline], check=True)
            try:
                results['baseline'] = run_check(tree, conf_file)
            finally:
                subprocess.run(['git', '-C', TOP, 'worktree', 'remove',
                                '--force', tree], check=False)
        results['new'] = run_check(TOP, conf_file)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print('library: %d images, %.1f GiB of data (scale %g)' % (
        args.images, gib, args.scale))
    for name, r in results.items():
        print('%s: %.1f s, peak RSS %.0f MB, %d problems, %d warnings' % (
            name, r['s'], r['max_rss_bytes'] / 1e6, len(r['problems']),
            r['warnings']))
    if len(results) == 2:
        b, n = results['baseline'], results['new']
        print('new / baseline: time %.3f, peak RSS %.3f' % (
            n['s'] / b['s'], n['max_rss_bytes'] / b['max_rss_bytes']))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'args': vars(args), 'data_gib': gib,
                       'results': results}, f, indent=1)


if __name__ == '__main__':
    main()
