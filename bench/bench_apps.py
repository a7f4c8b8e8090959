#!/usr/bin/env python3
"""Application loading: the VMAR paper's Figures 16-18, replayed.

N servers of the library's application images (postgresql, mariadb,
nginx, apache2) arrive as a Poisson process on one host whose image store
is remote and throttled, as in ``bench_boot.py`` (same store, same host
stacks, same cold start). Each server boots and then starts its
application; the figure is the application's loading: the time from the
start of its service to the answer to its first request (a query, an HTTP
GET).

Each image is first run for real (TCG) behind nbdkit's ``log`` filter with
the SMBIOS OEM string ``vmar-test:app=1``: its application then does not
start at boot; after ``VMAR-BOOTED`` the test probe makes what the first
start needs (PostgreSQL's cluster), prints ``VMAR-APP-START``, starts the
service and prints ``VMAR-APP <service> <ns>`` at its first answer
(tools/vmar-test-probe). The trace is cut at ``VMAR-APP-START``: a server
replays what came before it with one ``qemu-io`` on its overlay (the boot,
and the first start's preparation), then the application's reads with a
second one on the same overlay, whose time is the server's application
loading. ``wait`` is that time beyond the recorded run's own (what the
storage cost; the think times of the trace are TCG's).

Configurations (``bench_boot.py``): ``stock`` (Nova's ``_base``, one
download per image), ``stock-ondemand`` (overlays on the remote image:
the paper's baseline), ``vmar-lazy-pf`` (lazy mirrors, the recorded boot
working set prefetched), and optionally the others. A host records the
set over ``[vmar_host] bootset_record_window`` seconds (120) from an
export's first read, so the set holds the application's loading when it
starts within them, as it does here; ``--record-window`` changes that.

Usage: bench_apps.py --qemu-prefix DIR [--images postgresql,...]
       [--servers 12] [--arrivals 1] [--rounds 2] [--configs ...]
       [--memory none|SIZE] [--record-window S] [--validate]
       [--out DIR]

Writes DIR/rounds.json and prints the figures with their ratios against
``stock-ondemand`` and ``stock`` measured in the same run.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))

import bench_boot  # noqa: E402
import bench_coldhost  # noqa: E402
import report_boot  # noqa: E402

from tools import boot_image  # noqa: E402
from tools.vmarenv import qemu_env  # noqa: E402
from vmar_openstack.host.cache import pagecache  # noqa: E402

APPS = ('postgresql', 'mariadb', 'nginx', 'apache2')
CONFIGS = ('stock', 'stock-ondemand', 'vmar-lazy-pf')
OEM = 'vmar-test:app=1'
START_RE = r'VMAR-APP-START (\S+)'
END_RE = r'VMAR-APP(-ERROR)? (\S+) (\S+)[^\n]*'


def record(name, path, work, timeout):
    """A real run of ``name`` to its application's first answer.

    Returns bench_boot's trace plus ``app_start`` and ``app_ready``
    (seconds from QEMU's start, as the host saw the probe's lines) and
    ``app_guest_s`` (the probe's own measure).
    """
    trace = bench_boot.record_trace(name, path, work, timeout, oem=[OEM],
                                    until=[START_RE, END_RE])
    (_line, start), (line, ready) = trace['until']
    m = re.match(END_RE, line)
    if m.group(1):
        raise RuntimeError('%s: the application did not answer: %s'
                           % (name, line))
    trace.update(app_start=start, app_ready=ready,
                 app_guest_s=int(m.group(3)) / 1e9, service=m.group(2))
    return trace


def split(trace):
    """(before the application's start, the application) as traces."""
    at = trace['app_start']
    before = [r for r in trace['reads'] if r[0] < at]
    app = [[s - at, off, n, e - at]
           for s, off, n, e in trace['reads'] if s >= at]
    return ({'reads': before, 'booted': at},
            {'reads': app, 'booted': trace['app_ready'] - at})


def recorded_part(trace, window):
    """The reads a host records as the image's boot working set.

    Those of the first ``window`` seconds after the first read
    (``[vmar_host] bootset_record_window``): the boot's, and the
    application's when it starts within them.
    """
    first = trace['reads'][0][0]
    return {'reads': [r for r in trace['reads'] if r[0] < first + window],
            'booted': trace['booted']}


def run_point(config, args, work, lib_root, ids, parts, seed):
    """``args.servers`` servers of ``config``; the point's figures."""
    n = args.servers
    times, images = bench_boot.arrivals(seed, n, args.arrivals, ids)
    pagecache.evict_tree(lib_root, work)     # the host starts cold
    cgroup = bench_boot.Cgroup(args.memory)
    host = bench_boot.Host(config, args, work, lib_root, cgroup)
    qemu_io = os.path.join(args.qemu_prefix, 'bin', 'qemu-io')
    results, errors = [None] * n, []

    def server(k):
        name, image_id = images[k]
        before, app = parts[name]
        start = t0 + times[k]
        time.sleep(max(0.0, start - time.monotonic()))
        overlay = os.path.join(work, 'vm%d.qcow2' % k)
        try:
            cpu = bench_boot.boot_server(host, image_id, 'vm%d' % k, before,
                                         overlay, qemu_io)
            t_app = time.monotonic()
            cpu += bench_boot.replay(host, image_id, app, overlay, qemu_io)
            end = time.monotonic()
            results[k] = {'image': name, 'arrival': float(times[k]),
                          'boot_s': t_app - start, 'app_s': end - t_app,
                          'app_wait_s': end - t_app - app['booted'],
                          'cpu': cpu}
        except Exception as e:      # recorded, the point fails
            errors.append('server %d (%s): %s' % (k, name, e))

    t0 = time.monotonic()
    cpu_daemons, store_bytes = bench_boot.run_servers(config, n, server,
                                                      host, cgroup, errors)
    app = [r['app_s'] for r in results]
    return {'config': config, 'servers': n, 'arrivals': args.arrivals,
            'memory': args.memory, 'seed': seed, 'runs': results,
            'mean_app_s': float(np.mean(app)),
            'p95_app_s': float(np.percentile(app, 95)),
            'mean_app_wait_s': float(np.mean([r['app_wait_s']
                                              for r in results])),
            'mean_boot_s': float(np.mean([r['boot_s'] for r in results])),
            'store_bytes': store_bytes,
            'cpu_s': cpu_daemons + sum(r['cpu'] for r in results)}


def validate(args, work, lib_root, ids, parts, configs):
    """Real TCG runs against their replays, one server per image.

    For each configuration, on a cold host each time, the servers start
    at once: real guests (application loading as the host saw the
    probe's lines), then the replays. Returns {config: {'real': {image:
    s}, 'replay': {image: s}}}. The real guests share the machine's CPUs,
    which the recorded runs had alone: their computing takes longer.
    """
    qemu_io = os.path.join(args.qemu_prefix, 'bin', 'qemu-io')
    out = {}
    for config in configs:
        row = {}
        for kind in ('real', 'replay'):
            cwork = os.path.join(work, 'validate-%s-%s' % (config, kind))
            os.makedirs(cwork)
            pagecache.evict_tree(lib_root, cwork)
            cgroup = bench_boot.Cgroup(None)
            host = bench_boot.Host(config, args, cwork, lib_root, cgroup)
            secs, errors = {}, []

            def one(k, kind=kind, cwork=cwork, host=host, secs=secs,
                    errors=errors):
                name, image_id = ids[k]
                overlay = os.path.join(cwork, 'vm%d.qcow2' % k)
                try:
                    if kind == 'replay':
                        before, app = parts[name]
                        bench_boot.boot_server(host, image_id, 'vm%d' % k,
                                               before, overlay, qemu_io)
                        t = time.monotonic()
                        bench_boot.replay(host, image_id, app, overlay,
                                          qemu_io)
                        secs[name] = time.monotonic() - t
                        return
                    subprocess.run(
                        ['qemu-img', 'create', '-q', '-f', 'qcow2', '-b',
                         host.backing(image_id, 'vm%d' % k), '-F', 'raw',
                         overlay], check=True)
                    b = boot_image.boot(
                        overlay, os.path.join(cwork, 'vm%d.log' % k),
                        timeout=args.timeout, fmt='qcow2', cache=host.cache,
                        oem=[OEM], until=[START_RE, END_RE])
                    (_m, start), (end, ready) = b['until']
                    if end.group(1):
                        raise RuntimeError(end.group(0))
                    secs[name] = ready - start
                except Exception as e:      # recorded, the check fails
                    errors.append('%s %s %s: %s' % (config, kind, name, e))

            bench_boot.run_servers(config, len(ids), one, host, cgroup,
                                   errors)
            row[kind] = secs
            shutil.rmtree(cwork, ignore_errors=True)
        out[config] = row
        print('  validate %-16s %s' % (config, '; '.join(
            '%s real %.2f s replay %.2f s' % (n, row['real'][n],
                                              row['replay'][n])
            for n, _i in ids)), flush=True)
    return out


def summary(results):
    """Per configuration over the rounds, and the ratios; text lines."""
    by = {}
    for r in results['rounds']:
        by.setdefault(r['config'], []).append(r)
    mean = {c: {k: float(np.mean([r[k] for r in rs]))
                for k in ('mean_app_s', 'p95_app_s', 'mean_app_wait_s',
                          'mean_boot_s', 'store_bytes')}
            for c, rs in by.items()}
    per_image = {c: {} for c in by}
    for c, rs in by.items():
        for r in rs:
            for run in r['runs']:
                per_image[c].setdefault(run['image'], []).append(
                    run['app_s'])
    lines = ['%-16s %9s %9s %10s %9s %9s' % (
        'config', 'app mean', 'app p95', 'app wait', 'boot', 'store MB')]
    for c, m in mean.items():
        lines.append('%-16s %8.2fs %8.2fs %9.2fs %8.1fs %9.1f' % (
            c, m['mean_app_s'], m['p95_app_s'], m['mean_app_wait_s'],
            m['mean_boot_s'], m['store_bytes'] / 1e6))
    lines.append('per image, mean application loading (s): ' + '; '.join(
        '%s %s' % (c, ' '.join('%s %.2f' % (i, np.mean(v))
                               for i, v in sorted(per_image[c].items())))
        for c in per_image))
    ratios = {}
    for c in mean:
        for base in ('stock-ondemand', 'stock'):
            if c != base and base in mean and not c.startswith('stock'):
                ratios['%s/%s' % (c, base)] = {
                    'app': mean[c]['mean_app_s'] / mean[base]['mean_app_s'],
                    'wait': (mean[c]['mean_app_wait_s']
                             / mean[base]['mean_app_wait_s']
                             if mean[base]['mean_app_wait_s'] > 0
                             else None)}
    for k, v in ratios.items():
        lines.append('%s: application loading %.3f x, its storage wait %s'
                     % (k, v['app'], 'n/a' if v['wait'] is None
                        else '%.3f x' % v['wait']))
    results['summary'] = {'mean': mean, 'ratios': ratios}
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--qemu-prefix', required=True)
    p.add_argument('--images', default=','.join(APPS))
    p.add_argument('--servers', type=int, default=12)
    p.add_argument('--arrivals', type=float, default=1.0,
                   help='servers arriving per second (Poisson)')
    p.add_argument('--memory', default='none',
                   help='page cache budget of the host\'s base readers '
                        '(bench_boot.py --memory), or none')
    p.add_argument('--rounds', type=int, default=2)
    p.add_argument('--configs', default=','.join(CONFIGS))
    p.add_argument('--rate', default='800M', help='store: nbdkit rate=')
    p.add_argument('--delay', default='2ms', help='store: nbdkit delay-read=')
    p.add_argument('--record-window', type=int,
                   help='seconds of a run recorded as the image\'s boot '
                        'working set (default: [vmar_host] '
                        'bootset_record_window\'s default); 0 or less: '
                        'none; a few seconds: the boot only')
    p.add_argument('--timeout', type=int, default=900)
    p.add_argument('--validate', action='store_true',
                   help='first, per configuration, real TCG runs of one '
                        'server per image against their replays')
    p.add_argument('--out', default='bench/report-apps')
    args = p.parse_args()
    args.memory = (None if args.memory == 'none'
                   else bench_boot._bytes(args.memory))
    configs = args.configs.split(',')
    names = args.images.split(',')
    library = qemu_env.image_library()
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix='vmar-apps-', dir='/var/tmp')
    try:
        lib_root, ids = bench_boot.build_library(args.qemu_prefix, work,
                                                 library, names)
        window = args.record_window
        if window is None:
            # the option's own default, not bench_export's override
            conf = bench_coldhost.make_conf(os.path.join(work, 'defaults'),
                                            args.qemu_prefix, '/nonexistent',
                                            0)
            conf.clear_override('bootset_record_window', group='vmar_host')
            window = conf.vmar_host.bootset_record_window
        print('== traces (real TCG runs behind nbdkit\'s log filter); '
              'recorded sets: the first %d s' % window, flush=True)
        traces, parts = {}, {}
        for name, image_id in ids:
            traces[name] = t = record(name, library[name], work,
                                      args.timeout)
            bench_boot.write_recorded_set(
                lib_root, image_id, bench_boot.library_map(lib_root,
                                                           image_id),
                recorded_part(t, window))
            parts[name] = before, app = split(t)
            print('  %-11s booted %.1f s, %s started at %.1f s, answered '
                  'after %.2f s (guest: %.2f s); %d reads before, %d '
                  '(%.1f MB) in the loading' % (
                      name, t['booted'], t['service'], t['app_start'],
                      app['booted'], t['app_guest_s'],
                      len(before['reads']), len(app['reads']),
                      sum(r[2] for r in app['reads']) / 1e6), flush=True)
        results = {'machine': report_boot.machine(), 'argv': sys.argv,
                   'store': {'rate': args.rate, 'delay': args.delay},
                   'images': names, 'record_window': window,
                   'traces': {n: {k: v for k, v in t.items()
                                  if k not in ('reads', 'until')}
                              for n, t in traces.items()},
                   'rounds': []}
        if args.validate:
            print('== validation: a real run and a replay per image and '
                  'configuration', flush=True)
            results['validation'] = validate(args, work, lib_root, ids,
                                             parts, configs)
        for rnd in range(args.rounds):
            for config in configs:
                cwork = os.path.join(work, 'r%d-%s' % (rnd, config))
                os.makedirs(cwork)
                res = run_point(config, args, cwork, lib_root, ids, parts,
                                seed=rnd)
                res['round'] = rnd
                results['rounds'].append(res)
                shutil.rmtree(cwork, ignore_errors=True)
                print('  round %d %-16s application mean %6.2f s p95 %6.2f '
                      's wait %6.2f s; boot mean %6.1f s; store %6.1f MB'
                      % (rnd, config, res['mean_app_s'], res['p95_app_s'],
                         res['mean_app_wait_s'], res['mean_boot_s'],
                         res['store_bytes'] / 1e6), flush=True)
                with open(os.path.join(args.out, 'rounds.json'), 'w') as f:
                    json.dump(results, f, indent=1)
        print('\n'.join(summary(results)))
        with open(os.path.join(args.out, 'rounds.json'), 'w') as f:
            json.dump(results, f, indent=1)
    finally:
        bench_boot.Cgroup.remove()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == '__main__':
    main()
