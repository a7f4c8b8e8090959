"""bench/REPORT.md and its plots from bench_boot.py's rounds.

``python bench/report_boot.py bench/report/rounds.json [OUT [REPORT]]``
writes the report again from kept rounds; bench_boot.py calls
:func:`write` at its end. Figures in the spirit of the VMAR paper's
Figures 13-15: boot time, store traffic and host page cache against the
number of servers, their arrival rate and the host memory for base data,
mean over rounds with the rounds' standard deviation as error bars.
"""

import collections
import datetime
import json
import os
import platform
import sys

import numpy as np

LABELS = {
    'stock': 'stock Nova (download, cache=none)',
    'stock-ondemand': 'stock on-demand (remote backing)',
    'stock-writeback': 'stock writeback',
    'vmar-full': 'VMAR, full bases',
    'vmar-lazy': 'VMAR lazy',
    'vmar-lazy-pf': 'VMAR lazy + prefetch',
}
REPORT = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      'REPORT.md')
# the paper's claims (Section 6): boot time -39..55 %, traffic and cache
# -63..70 % against its baseline (on-demand reads from storage)
PAPER = {'time': (0.45, 0.61), 'bytes': (0.30, 0.37)}


def machine():
    """What the run ran on."""
    cpu = ''
    try:
        with open('/proc/cpuinfo') as f:
            cpu = next((ln.split(':', 1)[1].strip() for ln in f
                        if ln.startswith('model name')), '')
    except OSError:
        pass
    with open('/proc/meminfo') as f:
        mem = int(f.readline().split()[1]) * 1024
    return {'date': datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec='seconds'), 'kernel': platform.release(), 'cpu': cpu,
        'cpus': os.cpu_count(), 'memory_bytes': mem}


def _points(rounds):
    """{(n, rate, memory): {config: [round results]}}."""
    out = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in rounds:
        out[(r['servers'], r['rate'], r['memory'])][r['config']].append(r)
    return out


def _mem(m):
    return 'none' if m is None else '%d MiB' % (m >> 20)


def _stat(rows, key):
    vals = np.array([r[key] for r in rows], dtype=float)
    return float(vals.mean()), float(vals.std())


def sweeps(results):
    """The three sweeps: (title, axis label, [(x, point)])."""
    pts = list(_points(results['rounds']))
    ns = sorted({p[0] for p in pts})
    rates = sorted({p[1] for p in pts})
    mems = [p[2] for p in pts]
    top_n, top_rate = max(ns), max(rates)
    top_mem = mems[0]
    mem_levels = list(dict.fromkeys(m for m in mems))
    return [
        ('servers', 'servers booted', [(n, (n, top_rate, top_mem))
                                       for n in ns
                                       if (n, top_rate, top_mem) in pts]),
        ('rate', 'arrivals per second', [(r, (top_n, r, top_mem))
                                         for r in rates
                                         if (top_n, r, top_mem) in pts]),
        ('memory', 'host memory for base data (MiB; 0: no limit)',
         [(0 if m is None else m >> 20, (top_n, top_rate, m))
          for m in mem_levels if (top_n, top_rate, m) in pts]),
    ]


def plot(results, out):
    """One PNG per sweep: time, store bytes and cache; their paths."""
    import matplotlib
    matplotlib.use('Agg')
    from matplotlib import pyplot as plt
    pts = _points(results['rounds'])
    paths = []
    for key, xlabel, xs in sweeps(results):
        if len(xs) < 2:
            continue
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
        for ax, (metric, ylabel, scale) in zip(axes, (
                ('mean_s', 'mean seconds to VMAR-BOOTED', 1),
                ('store_bytes', 'MB read from the store', 1e6),
                ('peak_cache_bytes', 'peak MB of base data cached', 1e6))):
            for config in LABELS:
                rows = [(x, pts[p].get(config)) for x, p in xs]
                rows = [(x, r) for x, r in rows if r]
                if not rows:
                    continue
                stats = [_stat(r, metric) for _x, r in rows]
                ax.errorbar([x for x, _r in rows],
                            [m / scale for m, _s in stats],
                            yerr=[s / scale for _m, s in stats],
                            marker='o', capsize=3, label=LABELS[config])
            if metric != 'mean_s':
                limit = [np.mean([r['limit_bytes'] for c in pts[p].values()
                                  for r in c]) / scale for _x, p in xs]
                ax.plot([x for x, _p in xs], limit, 'k--',
                        label='unique blocks touched')
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(out, 'boot-%s.png' % key)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def _table(pts, point):
    rows = pts[point]
    limit = np.mean([r['limit_bytes'] for c in rows.values() for r in c])
    lines = ['| config | mean s | p95 s | storage wait s | store MB | × limit '
             '| peak cache MB | × limit | CPU s |',
             '|---|---|---|---|---|---|---|---|---|']
    for config in LABELS:
        if config not in rows:
            continue
        rr = rows[config]
        mean, sd = _stat(rr, 'mean_s')
        p95, _ = _stat(rr, 'p95_s')
        sb, _ = _stat(rr, 'store_bytes')
        pc, _ = _stat(rr, 'peak_cache_bytes')
        cpu, _ = _stat(rr, 'cpu_s')
        wait, _ = _stat(rr, 'mean_wait_s')
        lines.append('| %s | %.1f ± %.1f | %.1f | %.1f | %.1f | %.2f | %.1f '
                     '| %.2f | %.1f |' % (
                         LABELS[config], mean, sd, p95, wait, sb / 1e6,
                         sb / limit, pc / 1e6, pc / limit, cpu))
    lines.append('')
    lines.append('Unique-blocks-touched limit: %.1f MB. Storage wait: the '
                 'mean time beyond the recorded boot of each server\'s '
                 'image (its guest\'s own time under TCG).' % (limit / 1e6))
    return lines


def _ratio(pts, point, a, b, key='mean_s'):
    rows = pts[point]
    if a not in rows or b not in rows:
        return None
    return _stat(rows[a], key)[0] / _stat(rows[b], key)[0]


def goals(results):
    """The issue's goals at the highest arrival rate: [(text, met)]."""
    pts = _points(results['rounds'])
    _k, _l, xs = sweeps(results)[1]
    point = xs[-1][1] if xs else next(iter(pts))
    rows = pts[point]
    out = []
    t = _ratio(pts, point, 'vmar-lazy-pf', 'stock-ondemand')
    if t is not None:
        w = _ratio(pts, point, 'vmar-lazy-pf', 'stock-ondemand',
                   'mean_wait_s')
        out.append(('VMAR lazy + prefetch boots in %.2f × the time of stock '
                    'on-demand (goal ≤ 0.45); its storage wait is %.2f × '
                    'stock on-demand\'s' % (t, w), t <= 0.45))
    if 'vmar-lazy-pf' in rows:
        rr = rows['vmar-lazy-pf']
        limit = np.mean([r['limit_bytes'] for r in rr])
        b = _stat(rr, 'store_bytes')[0] / limit
        c = _stat(rr, 'peak_cache_bytes')[0] / limit
        out.append(('VMAR lazy + prefetch reads %.2f × the unique-blocks '
                    'limit from the store (goal ≤ 1.10)' % b, b <= 1.10))
        out.append(('and holds %.2f × that limit in the host page cache '
                    '(goal ≤ 1.10)' % c, c <= 1.10))
    return point, out


def write(results, out, report=None):
    """The report (default bench/REPORT.md), the plots into ``out``."""
    report = report or REPORT
    pts = _points(results['rounds'])
    figures = plot(results, out)
    m = results['machine']
    rounds = sorted({r['round'] for r in results['rounds']})
    lines = ['# The VMAR paper\'s experiment on this machine', '',
             'Generated by `bench/bench_boot.py` (`bench/report_boot.py`); '
             'the raw rounds are in `%s/rounds.json`.' % out, '',
             '## Setup', '',
             '- Machine: %s, %d CPUs, %.1f GiB, kernel %s; run %s.' % (
                 m['cpu'], m['cpus'], m['memory_bytes'] / 2 ** 30,
                 m['kernel'], m['date']),
             '- Command: `%s`.' % ' '.join(results['argv']),
             '- Store: nbdkit `file` behind `rate=%s` bits/s and '
             '`delay-read=%s`; %d round(s).' % (
                 results['store']['rate'], results['store']['delay'],
                 len(rounds)),
             '- Images: %s. Traces from real TCG boots:' % ', '.join(
                 results['images']), '']
    for name, t in results['traces'].items():
        lines.append('  - %s: %d reads, VMAR-BOOTED %.1f s after QEMU '
                     'started' % (name, t['reads'], t['booted']))
    lines.append('')
    if results.get('validation'):
        lines += ['## Replay against real boots', '',
                  '| config | real boots s | replayed s | difference |',
                  '|---|---|---|---|']
        for config, row in results['validation'].items():
            real, rep = np.mean(row['real']), np.mean(row['replay'])
            lines.append('| %s | %.1f | %.1f | %+.0f %% |' % (
                LABELS.get(config, config), real, rep,
                (rep - real) / real * 100))
        lines.append('')
    point, met = goals(results)
    lines += ['## Goals (n=%d, %g arrivals/s, memory %s)' % (
        point[0], point[1], _mem(point[2])), '']
    lines += ['- %s: **%s**' % (text, 'met' if ok else 'missed')
              for text, ok in met]
    lines.append('')
    titles = {'servers': 'Against the number of servers (Figure 13)',
              'rate': 'Against the arrival rate (Figure 14)',
              'memory': 'Against host memory for base data (Figure 15)'}
    for key, _xl, xs in sweeps(results):
        if not xs:
            continue
        lines += ['## %s' % titles[key], '']
        png = os.path.join(out, 'boot-%s.png' % key)
        if png in figures:
            lines += ['![%s](%s)' % (key, os.path.relpath(
                os.path.abspath(png), os.path.dirname(
                    os.path.abspath(report)))), '']
        for x, p in xs:
            lines += ['### n=%d, %g arrivals/s, memory %s' % (
                p[0], p[1], _mem(p[2])), '']
            lines += _table(pts, p)
            lines.append('')
        lines += [paragraph(key, pts, xs), '']
    with open(report, 'w') as f:
        f.write('\n'.join(lines) + '\n')
    return report


def paragraph(key, pts, xs):
    """What a sweep shows, against the paper's numbers."""
    t = [(x, _ratio(pts, p, 'vmar-lazy-pf', 'stock-ondemand'))
         for x, p in xs]
    b = [(x, _ratio(pts, p, 'vmar-lazy-pf', 'stock-ondemand',
                    'store_bytes')) for x, p in xs]
    t = [(x, r) for x, r in t if r is not None]
    b = [(x, r) for x, r in b if r is not None]
    if not t:
        return ''
    return ('VMAR lazy with prefetch against stock on-demand, boot time: %s; '
            'bytes from the store: %s. The paper reports boot times 39-55 %% '
            'shorter (%.2f-%.2f ×) and 63-70 %% less traffic (%.2f-%.2f ×) '
            'than its on-demand baseline.' % (
                ', '.join('%.2f × at %s' % (r, x) for x, r in t),
                ', '.join('%.2f × at %s' % (r, x) for x, r in b),
                PAPER['time'][0], PAPER['time'][1], PAPER['bytes'][0],
                PAPER['bytes'][1]))


if __name__ == '__main__':
    with open(sys.argv[1]) as f:
        kept = json.load(f)
    print(write(kept, sys.argv[2] if len(sys.argv) > 2
                else os.path.dirname(sys.argv[1]),
                sys.argv[3] if len(sys.argv) > 3 else None))
