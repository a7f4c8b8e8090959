#!/usr/bin/env python3
"""Guest-private caching under host memory pressure, same-run ratios.

The setting of seed 003's Figure 2 ("functional partitioning"), scaled to
this machine: K guests with little memory (TCG), each booted from its own
image of the library (minbase, python3, nginx: different images whose
kernel modules are the same files), each running the library's test
workload (tools/vmar-test-probe): BASE MiB of base files (kernel modules)
and PRIVATE MiB written after boot, read in a loop, more than the guest's
memory. Every QEMU and the export daemon run in one memory cgroup, whose
limit sets the pressure: the guests' own memory (measured in the first
configuration once their RAM is touched) plus a host cache budget.

Configurations, each booted and measured in the same run:

ON+ON   qcow2 overlay on the raw image, cache=writeback (libvirt
        writeback): host and guest both cache everything
ON+OFF  the same with cache=none (Nova's default without VMAR)
I       VMAR host-cache-for-base: overlay cache=none on the vmar export;
        the export daemon caches base data once for all images
P+I     I with vmar:guest_cache=private: a virtio balloon with free page
        reporting and the SMBIOS OEM string that starts vmar-guest
A       I with vmar:guest_cache=auto: P+I's balloon, the OEM string of
        auto and the guest channel; the export daemon's guest channels
        (vmar_openstack.host.guests.channels, its defaults) decide each guest's
        mode from the host's memory pressure and the guest's own while
        it runs, and each window records the modes they chose

Reports per configuration and budget: read throughput per guest (MB/s,
mean of the guests, from loops that ran wholly inside the measuring
window), the guests' resident memory on the host (RssAnon: what free page
reporting gives back), the cgroup's page cache, what reached the disk in
the window (when it is throttled), the share of the private data the
guests kept cached, and vmar-guest's CPU time; then each figure as a
ratio to ON+ON at the same budget. With --idle, then each configuration's
guests once more, without a limit, for a workload of that many seconds:
the memory they give back once they stop reading (under pressure a
guest's freed pages are refilled at once, so that is where free page
reporting can return any).

The host's memory controller is cgroup v1 here (the machine binds memory
to v1; doc/source/admin/guest.rst), so the limit is memory.limit_in_bytes.

Seed 003's host had one 7200 RPM disk, where a host cache miss costs ten
times a hit; this machine's disk is much faster. --disk-read-iops and
--disk-read-mbps throttle the reads that reach the disk (the kernel's
blkio throttle, bench/blkcg.py; page cache hits are not slowed), for a
disk like the paper's. The throttle bounds requests, not seeks: what a
request costs depends on its size, which the host's read-ahead sets
(8 MiB on this machine's virtio disk, 128 KiB by the kernel's default and
on seed 003's host); --disk-read-ahead-kb sets it for the run
(machine-wide, restored at the end).

Needs root, the patched QEMU (qemu/build.sh) and the image library
(tools/build-image-library.sh). Usage:

    bench_guestcache.py --qemu-prefix DIR --library DIR [--guests 3]
        [--memory 256] [--base 96] [--private 96] [--budgets 512,160,64]
        [--settle 20] [--window 60] [--disk-read-iops N]
        [--disk-read-mbps N] [--disk-read-ahead-kb N]
        [--idle SECONDS [--idle-watch 60]] [--json OUT]
"""

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))
import bench_export  # noqa: E402
import blkcg  # noqa: E402

from vmar_openstack.guest import status as guest_status  # noqa: E402
from vmar_openstack.host.cache import pagecache  # noqa: E402
from vmar_openstack.host.guests import channels as export_guests  # noqa: E402
from vmar_openstack.host import service as host_service  # noqa: E402
from vmar_openstack.host import supervisor  # noqa: E402
from vmar_openstack import ingest  # noqa: E402
from vmar_openstack import names  # noqa: E402

from tools import memcg  # noqa: E402

QEMU = '/usr/bin/qemu-system-x86_64'
QEMU_IMG = '/usr/bin/qemu-img'
CGROUP = 'vmar-bench-guestcache'    # under memcg.ROOT
IMAGES = ('minbase', 'python3', 'nginx', 'postgresql', 'apache2',
          'mariadb')
CONFIGS = ('ON+ON', 'ON+OFF', 'I', 'P+I', 'A')
LOOP = re.compile(r'VMAR-WORKLOAD-LOOP (\d+) (\d+) (\d+)'
                  r'(?: private_cached=(\d+))?')
# vmar-guest's CPU on a loop line; a kernel message printed into the
# middle of the line can garble it, and then the line has none
CPU = re.compile(r'cpu_user_s=(\d+\.\d+) cpu_sys_s=(\d+\.\d+)(?:\s|$)')
LOOP_FIELDS = ('loop', 'bytes', 'ns', 'private_cached', 'guest_cpu_s',
               'dropped_bytes')
END = re.compile(r'VMAR-WORKLOAD-END (\d+) (.*)')
# How a P+I guest returns memory: the candidates of doc/source/admin/guest.rst,
# as (SMBIOS OEM strings for vmar-guest, virtio-balloon-pci options).
# vmar-guest's own default is page reporting order 0.
VARIANTS = {
    'order9': (('vmar:guest_reporting_order=-1',), ''),
    'order0': (('vmar:guest_reporting_order=0',), ''),
    'order3': (('vmar:guest_reporting_order=3',), ''),
    'compact': (('vmar:guest_reporting_order=-1', 'vmar:guest_compact=1'),
                ''),
    'hint': (('vmar:guest_reporting_order=-1',),
             ',free-page-hint=on,iothread=balloon-io'),
}
MARKER = re.compile(r'VMAR-BOOTED ')
MiB = 1 << 20


def rss_anon(pid):
    with open('/proc/%d/status' % pid) as f:
        for line in f:
            if line.startswith('RssAnon:'):
                return int(line.split()[1]) * 1024
    return 0


class Guest:
    """One QEMU (TCG) on a qcow2 overlay, its console in a file."""

    def __init__(self, work, name, backing, cache, private, args, seconds,
                 variant=None, channel=None, oem=None, extra=()):
        """Boot the guest.

        ``oem``: the probe's SMBIOS OEM strings (default: the workload of
        ``seconds``, --base and --private); ``extra``: more QEMU
        arguments.
        """
        self.name = name
        self.console = os.path.join(work, name + '.console')
        self.overlay = os.path.join(work, name + '.qcow2')
        subprocess.run([QEMU_IMG, 'create', '-q', '-f', 'qcow2', '-F', 'raw',
                        '-b', backing, self.overlay], check=True)
        if oem is None:
            oem = ['vmar-test:workload=%d,%d,%d' % (
                seconds, args.base, args.private)]
        cmd = [QEMU, '-machine', 'q35', '-accel', 'tcg,tb-size=64',
               '-m', str(args.memory), '-smp', '1', '-nographic',
               '-monitor', 'none', '-no-reboot',
               '-serial', 'file:%s' % self.console,
               '-drive', 'file=%s,format=qcow2,if=virtio,cache=%s,'
               'rerror=stop,werror=stop' % (self.overlay, cache)]
        for value in oem:
            # QEMU's option syntax doubles a comma inside a value
            cmd += ['-smbios', 'type=11,value=%s' % value.replace(',', ',,')]
        cmd += list(extra)
        if private:
            oem, balloon = VARIANTS[variant or 'order0']
            mode = 'auto' if channel else 'private'
            for value in ('vmar:guest_cache=' + mode,) + oem:
                cmd += ['-smbios', 'type=11,value=%s' % value]
            if 'iothread' in balloon:
                cmd += ['-object', 'iothread,id=balloon-io']
            cmd += ['-device', 'virtio-balloon-pci,free-page-reporting=on'
                    + balloon]
        if channel:
            # as Nova's vmar backend builds an auto server
            cmd += ['-chardev', 'socket,id=vmar,path=%s,server=on,wait=off'
                    % channel, '-device', 'virtio-serial-pci',
                    '-device', 'virtserialport,chardev=vmar,name=%s'
                    % names.GUEST_CHANNEL_PORT]
        self.log = os.path.join(work, name + '.stderr')
        # a console of an earlier run of the same name must not be read
        # before QEMU truncates it
        open(self.console, 'w').close()
        with open(self.log, 'wb') as err:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL,
                                         stderr=err)

    def check(self):
        if self.proc.poll() is not None:
            with open(self.log, errors='replace') as f:
                raise RuntimeError('QEMU of %s exited with %d: %s' % (
                    self.name, self.proc.returncode, f.read()[-2000:]))

    def text(self):
        try:
            with open(self.console, errors='replace') as f:
                return f.read()
        except FileNotFoundError:
            return ''

    def loops(self):
        """The workload's loop lines, as tuples of LOOP_FIELDS."""
        out = []
        for line in self.text().splitlines():
            m = LOOP.match(line)
            if m:
                cpu = CPU.findall(line)
                out.append(tuple(int(x or 0) for x in m.groups()) + (
                    sum(float(x) for x in cpu[0]) if cpu else None,
                    guest_status.parse(line)['dropped_bytes']
                    if cpu else None))
        return out

    def ended(self):
        """Whether the workload printed its end."""
        return 'VMAR-WORKLOAD-END' in self.text()

    def end_status(self):
        """vmar-guest's counters on the workload's end line."""
        m = END.search(self.text())
        return guest_status.parse(m.group(2)) if m else None

    def cpu_seconds(self):
        """CPU time of the guest's QEMU (all its threads) so far."""
        with open('/proc/%d/stat' % self.proc.pid) as f:
            fields = f.read().rsplit(')', 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf(
            'SC_CLK_TCK')

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def wait_for(what, probe, timeout):
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise RuntimeError('timed out after %d s waiting for %s'
                               % (timeout, what))
        time.sleep(1)


def measure_window(guests, seconds, min_loops=2):
    """Per guest: MB/s of the loops that ran wholly in the next window.

    The window is ``seconds`` long, or longer (up to four times) until
    every guest finished ``min_loops`` loops in it: a configuration whose
    loops take longer than the window still gets a figure. Also the
    private data cached after each loop, and vmar-guest's share of the
    guest's CPU over them.
    """
    before = {g.name: len(g.loops()) for g in guests}
    start = time.monotonic()
    time.sleep(seconds)
    while (time.monotonic() - start < 4 * seconds and
           any(len(g.loops()) - before[g.name] - 1 < min_loops
               for g in guests)):
        time.sleep(1)
    out = {}
    for g in guests:
        # loops that started after the window opened: the first loop line
        # after it began ended inside the window but may have started
        # before, so it is left out (and is where the CPU count starts)
        loops = [dict(zip(LOOP_FIELDS, x)) for x in g.loops()]
        new = loops[before[g.name] + 1:]
        nbytes = sum(x['bytes'] for x in new)
        ns = sum(x['ns'] for x in new)
        out[g.name] = {'loops': len(new), 'bytes': nbytes,
                       'MB_s': nbytes / (ns / 1e9) / 1e6 if ns else None,
                       'private_cached': [x['private_cached'] for x in new],
                       'guest_cpu_share': cpu_share(
                           loops[before[g.name]:before[g.name] + 1 + len(
                               new)])}
    return out


def cpu_share(loops):
    """vmar-guest's CPU over the loops after the first, as a share.

    From the first to the last loop line whose counters are whole.
    """
    whole = [i for i, x in enumerate(loops) if x['guest_cpu_s'] is not None]
    if len(whole) < 2:
        return None
    first, last = whole[0], whole[-1]
    ns = sum(x['ns'] for x in loops[first + 1:last + 1])
    return ((loops[last]['guest_cpu_s'] - loops[first]['guest_cpu_s'])
            / (ns / 1e9) if ns else None)


def mean(values):
    """Mean of the values that are not None; None if none is."""
    seen = [v for v in values if v is not None]
    return sum(seen) / len(seen) if seen else None


def private_cached_share(per, args):
    """Mean share of the private file the guests had cached after a loop."""
    seen = [p for g in per.values() for p in g['private_cached']]
    return sum(seen) / len(seen) / (args.private * MiB) if seen else None


def start_guests(config, args, work, images, host_uris, seconds, guests,
                 variant=None):
    """Boot ``config``'s guests into ``guests``; the workload's length."""
    for i, name in enumerate(images[:args.guests]):
        guests.append(new_guest(config, i, name, args, work, host_uris,
                                seconds, variant))


def new_guest(config, i, name, args, work, host_uris, seconds,
              variant=None):
    """Boot guest ``i`` of ``config`` from image ``name``."""
    vmar = config in ('I', 'P+I', 'A')
    backing = host_uris[name] if vmar else args.images[name]
    channel = os.path.join(args.channel_dir, names.guest_channel(
        str(uuid.uuid4()), 'auto')) if config == 'A' else None
    return Guest(work, '%s-%d-%s' % (config.replace('+', ''), i, name),
                 backing, 'writeback' if config == 'ON+ON' else 'none',
                 config in ('P+I', 'A'), args, seconds, variant, channel)


def run_overcommit(config, args, work, images, host_uris, group):
    """How many guests a fixed memory budget holds, one more at a time.

    Guest n boots beside the n - 1 already running (images in turn).
    With n running, each guest's throughput is measured without a limit
    (its unpressured figure, at the same CPU share: TCG guests share two
    cores) and then with the cgroup limited to --overcommit-budget MiB in
    all (the QEMUs, the export daemon and the page cache). The host
    "runs" n guests while every one keeps at least half its unpressured
    figure; a limit the kernel cannot reach (the guests' own memory is
    more) or a guest killed by the OOM killer ends it too.
    """
    guests, steps, fits = [], [], 0
    budget = args.overcommit_budget * MiB
    try:
        for n in range(1, args.overcommit + 1):
            group.set_limit(-1)
            guests.append(new_guest(config, n - 1,
                                    images[(n - 1) % len(images)], args,
                                    work, host_uris, args.seconds))

            def running():
                for g in guests:
                    g.check()
                return len(guests[-1].loops()) >= 1
            wait_for('%s: guest %d\'s workload' % (config, n), running,
                     args.boot_timeout)
            time.sleep(args.settle)
            free = measure_window(guests, args.window)
            step = {'n': n, 'free': free, 'limited': None, 'worst': 0.0}
            try:
                group.set_limit(budget)
            except OSError as e:
                step['unreachable'] = str(e)
            else:
                time.sleep(args.settle)
                step['limited'] = measure_window(guests, args.window)
                dead = [g.name for g in guests if g.proc.poll() is not None]
                step['dead'] = dead
                ratios = [(step['limited'][g.name]['MB_s'] or 0) /
                          free[g.name]['MB_s']
                          for g in guests if free[g.name]['MB_s']]
                step['worst'] = 0.0 if dead or not ratios else min(ratios)
            step['rss_anon'] = sum(rss_anon(g.proc.pid) for g in guests
                                   if g.proc.poll() is None)
            steps.append(step)
            print('  %-6s %d guests in %d MiB: the slowest at %.2f of its '
                  'unpressured figure%s; guests RssAnon %d MiB' % (
                      config, n, args.overcommit_budget, step['worst'],
                      ' (limit not reachable)' if 'unreachable' in step
                      else ' (OOM: %s)' % ', '.join(step['dead'])
                      if step.get('dead') else '',
                      step['rss_anon'] // MiB), flush=True)
            if step['worst'] < 0.5:
                break
            fits = n
        return {'steps': steps, 'fits': fits}
    finally:
        for g in guests:
            g.stop()
        group.set_limit(-1)


def run_config(config, args, work, images, host_uris, anon_ref, group,
               disk):
    guests = []
    try:
        start_guests(config, args, work, images, host_uris, args.seconds,
                     guests)

        def running():
            for g in guests:
                g.check()
            return all(len(g.loops()) >= 1 for g in guests)
        wait_for('%s: the workload on every guest' % config, running,
                 args.boot_timeout)
        time.sleep(args.settle)
        if anon_ref is None:
            # all the cgroup holds but page cache: the QEMUs' and the
            # daemon's own memory and the kernel's for them
            anon_ref = group.other_bytes()
        res = {'budgets': {}}
        for budget in args.budgets:
            limit = anon_ref + budget * MiB
            try:
                group.set_limit(limit)
            except OSError as e:
                # EBUSY: the kernel cannot reclaim down to it, the guests
                # themselves need more
                print('  %-6s budget %4d MiB: limit not reachable (%s)'
                      % (config, budget, e), flush=True)
                res['budgets'][budget] = {'limit': limit, 'MB_s': None,
                                          'unreachable': str(e)}
                continue
            time.sleep(args.settle)
            read0 = (disk.read_bytes(), disk.read_requests()) if disk \
                else None
            per = measure_window(guests, args.window)
            res['budgets'][budget] = {
                'limit': limit,
                'guests': per,
                'MB_s': mean([p['MB_s'] for p in per.values()]),
                'private_cached': private_cached_share(per, args),
                'rss_anon': {g.name: rss_anon(g.proc.pid) for g in guests},
                'cgroup_cache': group.cache_bytes(),
                'failcnt': int(group.read('memory.failcnt')),
                # what reached the (throttled) disk during the window
                'disk_read': disk.read_bytes() - read0[0] if disk else None,
                'disk_requests': (disk.read_requests() - read0[1]
                                  if disk else None)}
            if config == 'A':
                res['budgets'][budget]['modes'] = modes = [
                    (g.mode, g.reason, g.switches)
                    for g in args.channels.snapshot().guests]
                print('  %-6s budget %4d MiB: the guests ran %s' % (
                    config, budget, ', '.join(
                        '%s (%s, %d switches)' % m for m in modes)))
            print('  %-6s budget %4d MiB: %s MB/s per guest, private '
                  'data cached in the guest %s, guests RssAnon %4d MiB, '
                  'cgroup cache %4d MiB, disk reads %s' % (
                      config, budget, _mbs(res['budgets'][budget]['MB_s']),
                      _share(res['budgets'][budget]['private_cached']),
                      sum(res['budgets'][budget]['rss_anon'].values())
                      // MiB,
                      res['budgets'][budget]['cgroup_cache'] // MiB,
                      _disk(res['budgets'][budget])),
                  flush=True)
        group.set_limit(-1)
        return res, anon_ref
    finally:
        for g in guests:
            g.stop()


def run_idle(config, args, work, images, host_uris, variant=None):
    """Memory the guests give back to the host once their workload ends.

    Without a memory limit: each guest runs the workload for --idle
    seconds and stops reading; the guests' RssAnon at its highest while
    they read against where it settles over the next --idle-watch
    seconds is what free page reporting returned. For P+I, what
    vmar-guest dropped in the last loop (memory nothing refills once
    reading stops) is what could come back. The CPU of the guests' QEMUs
    over the run is what the guest's side of it costs (under TCG the
    guest kernel's reporting runs on the vCPU threads).
    """
    guests = []
    try:
        start_guests(config, args, work, images, host_uris, args.idle,
                     guests, variant)
        peak = {g.name: 0 for g in guests}

        def ended():
            for g in guests:
                g.check()
                peak[g.name] = max(peak[g.name], rss_anon(g.proc.pid))
            return all(g.ended() for g in guests)
        wait_for('%s: the workload to end on every guest' % config, ended,
                 args.boot_timeout + args.idle)
        after = {g.name: [] for g in guests}
        for _ in range(max(1, args.idle_watch // 5)):
            time.sleep(5)
            for g in guests:
                after[g.name].append(rss_anon(g.proc.pid))
        loops = {g.name: g.loops() for g in guests}
        ends = {g.name: g.end_status() for g in guests}
        at60 = min(len(a) for a in after.values()) if args.idle_watch < 60 \
            else 60 // 5
        res = {'peak': peak, 'after': after,
               'returned': sum(peak[n] - min(after[n]) for n in peak),
               'returned_60s': sum(peak[n] - after[n][at60 - 1]
                                   for n in peak),
               'returned_at_watch': sum(peak[n] - after[n][-1]
                                        for n in peak),
               'qemu_cpu_s': sum(g.cpu_seconds() for g in guests),
               'MB_s': mean([_loops_mbs(x[1:]) for x in loops.values()]),
               'dropped_last_loop': _dropped_last_loop(loops, ends),
               'guest_mem_free': sum(
                   int(e['mem_free_kb']) * 1024 for e in ends.values()
                   if e) or None,
               'vmar_guest_cpu_s': sum(
                   guest_status.cpu_seconds(e) for e in ends.values()
                   if e) or None,
               'compactions': sum(
                   e['compactions'] for e in ends.values() if e) or None}
        dropped = res['dropped_last_loop']
        print('  %-14s idle: guests RssAnon %d MiB at the peak, %d MiB '
              '%d s after the workload ended: %d MiB returned at 60 s, %d '
              'MiB at most%s; QEMU CPU %.0f s, %s MB/s per guest' % (
                  config + (' ' + variant if variant else ''),
                  sum(peak.values()) // MiB,
                  sum(a[-1] for a in after.values()) // MiB,
                  args.idle_watch, res['returned_60s'] // MiB,
                  res['returned'] // MiB,
                  ' of %d MiB vmar-guest dropped in the last loop (%.0f %% '
                  'at 60 s; guests\' MemFree %d MiB at the end)' % (
                      dropped // MiB, 100 * res['returned_60s'] / dropped,
                      (res['guest_mem_free'] or 0) // MiB)
                  if dropped else '', res['qemu_cpu_s'],
                  _mbs(res['MB_s'])), flush=True)
        return res
    finally:
        for g in guests:
            g.stop()


def _loops_mbs(loops):
    """MB/s over the given loop tuples (LOOP_FIELDS), or None."""
    nbytes = sum(x[1] for x in loops)
    ns = sum(x[2] for x in loops)
    return nbytes / (ns / 1e9) / 1e6 if ns else None


def _dropped_last_loop(loops, ends):
    """Bytes vmar-guest dropped in each guest's last loop, summed.

    From the loop line before the last to the workload's end line; None
    without vmar-guest's counters.
    """
    total = None
    for name, end in ends.items():
        if end is None or len(loops[name]) < 2:
            continue
        before = loops[name][-2][LOOP_FIELDS.index('dropped_bytes')]
        if before is None:
            continue
        total = (total or 0) + end['dropped_bytes'] - before
    return total


def _mbs(x):
    return '     -' if x is None else '%6.2f' % x


def _disk_reads(res):
    """A window's disk reads: (MiB, requests, KiB a request), or None."""
    nbytes, requests = res.get('disk_read'), res.get('disk_requests')
    if nbytes is None:
        return None
    return (nbytes // MiB, requests,
            nbytes // 1024 // requests if requests else 0)


def _disk(res):
    reads = _disk_reads(res)
    return '%d MiB in %d requests (%d KiB each)' % reads if reads else '-'


def _disk_short(res):
    reads = _disk_reads(res)
    return '%d / %d' % (reads[0], reads[2]) if reads else '-'


def _share(x):
    return '-' if x is None else '%.1f %%' % (100 * x)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--qemu-prefix', required=True)
    p.add_argument('--library', default='/var/cache/vmar-openstack/images')
    p.add_argument('--guests', type=int, default=3)
    p.add_argument('--memory', type=int, default=256, help='MiB per guest')
    p.add_argument('--base', type=int, default=96, help='MiB of base files')
    p.add_argument('--private', type=int, default=96,
                   help='MiB of private data per guest')
    p.add_argument('--budgets', default='512,160,64',
                   help='host cache budgets in MiB, low pressure first '
                   '(empty: none, with --idle)')
    p.add_argument('--settle', type=int, default=20)
    p.add_argument('--window', type=int, default=60)
    p.add_argument('--boot-timeout', type=int, default=900)
    p.add_argument('--configs', default=','.join(CONFIGS))
    p.add_argument('--disk-read-iops', type=int, default=0,
                   help='throttle the disk\'s reads to this many a second '
                   '(blkio; 0: not throttled)')
    p.add_argument('--disk-read-mbps', type=int, default=0,
                   help='throttle the disk\'s reads to this many MB/s '
                   '(blkio; 0: not throttled)')
    p.add_argument('--disk-read-ahead-kb', type=int,
                   help='the disk\'s read-ahead during the run (KiB; '
                   'machine-wide, restored at the end; default: as it is)')
    p.add_argument('--idle', type=int, default=0,
                   help='then, per configuration without a memory limit, '
                   'run the workload this many seconds and measure the '
                   'memory the guests give back once it ends (0: not)')
    p.add_argument('--idle-watch', type=int, default=60,
                   help='seconds to watch the guests\' memory after it')
    p.add_argument('--idle-variants', default='order0',
                   help='how P+I guests return memory in the --idle run, '
                   'each measured: %s (order0 is vmar-guest\'s default)'
                   % ', '.join(VARIANTS))
    p.add_argument('--overcommit', type=int, default=0,
                   help='then, per configuration, add guests one at a '
                   'time up to this many and find how many a memory '
                   'budget of --overcommit-budget holds (0: not)')
    p.add_argument('--overcommit-budget', type=int, default=1280,
                   help='MiB for the guests\' QEMUs, the export daemon '
                   'and the page cache in all, for --overcommit')
    p.add_argument('--json')
    args = p.parse_args()
    args.budgets = [int(b) for b in args.budgets.split(',') if b]
    args.idle_variants = [v for v in args.idle_variants.split(',') if v]
    if set(args.idle_variants) - set(VARIANTS):
        p.error('unknown --idle-variants: %s' % ', '.join(
            sorted(set(args.idle_variants) - set(VARIANTS))))
    if not args.budgets and not args.idle and not args.overcommit:
        p.error('nothing to measure: no --budgets, --idle or --overcommit')
    configs = args.configs.split(',')
    if configs[0] != 'ON+ON' and 'ON+ON' in configs:
        p.error('ON+ON goes first: its guests measure the memory reference')
    names = IMAGES[:max(args.guests, min(args.overcommit, len(IMAGES)))]
    args.images = {n: os.path.join(args.library, n + '.raw') for n in names}
    args.seconds = 3600 * 4             # the workload runs until stopped

    work = tempfile.mkdtemp(prefix='vmar-bench-guestcache-')
    args.channel_dir = os.path.join(work, 'guests')
    args.channels = None
    group = memcg.MemoryCgroup(CGROUP)
    group.set_limit(-1)
    group.add(os.getpid())    # children inherit it
    disk = None
    daemon = None
    results = {}
    read_ahead = contextlib.ExitStack()
    try:
        knob = pagecache.readahead_knob(work)
        if args.disk_read_ahead_kb is not None:
            # the flock of the knob: a demo or another bench takes turns
            read_ahead.enter_context(pagecache.readahead(
                knob, args.disk_read_ahead_kb))
        if (args.disk_read_iops or args.disk_read_mbps or
                args.disk_read_ahead_kb is not None):
            disk = blkcg.ReadThrottle(CGROUP, (work, args.library),
                                      args.disk_read_iops,
                                      args.disk_read_mbps * 1000 * 1000)
            disk.add(os.getpid())
        sock = os.path.join(work, 'nbd.sock')
        conf = bench_export.make_conf(os.path.join(work, 'state'),
                                      args.qemu_prefix, sock)
        lib = ingest.Library(conf)
        ids = {}
        for n in names:
            ids[n] = str(uuid.uuid4())
            lib.add(ids[n], args.images[n], visibility='public')
        svc = host_service.ExportService(conf)
        pagecache.drop_all()
        daemon = supervisor.Supervisor(svc).start_daemon()
        svc.restore()
        if 'A' in configs:
            conf.set_override('channel_dir', args.channel_dir,
                              group='vmar_guest_cache')
            args.channels = export_guests.Guests(conf).start()
        uris = {}
        for n in names:
            exp = svc.add(ids[n], holder='bench-' + n)
            uris[n] = svc.uri(exp, 'bench-' + n)
        anon_ref = None
        print('%d guests x %d MiB, base %d MiB, private %d MiB; budgets %s '
              'MiB over the guests\' memory; disk reads %s; read-ahead '
              '%s KiB' % (
                  args.guests, args.memory, args.base, args.private,
                  args.budgets, 'throttled to %d/s and %d MB/s (0: no '
                  'bound)' % (args.disk_read_iops, args.disk_read_mbps)
                  if disk else 'not throttled',
                  pagecache.read_knob(knob)),
              flush=True)
        for config in configs if args.budgets else ():
            pagecache.drop_all()
            results[config], anon_ref = run_config(
                config, args, work, names, uris, anon_ref, group, disk)
        results['anon_ref'] = anon_ref
        for config in configs if args.overcommit else ():
            pagecache.drop_all()
            results.setdefault(config, {'budgets': {}})['overcommit'] = \
                run_overcommit(config, args, work, names, uris, group)
        for config in configs if args.idle else ():
            res = results.setdefault(config, {'budgets': {}})
            for variant in (args.idle_variants if config == 'P+I'
                            else [None]):
                pagecache.drop_all()
                idle = run_idle(config, args, work, names, uris, variant)
                if variant:
                    res.setdefault('idle_variants', {})[variant] = idle
                if variant in (None, 'order0') or 'idle' not in res:
                    res['idle'] = idle
    finally:
        if args.channels is not None:
            args.channels.stop()
        if daemon is not None:
            daemon.kill()
            daemon.wait()
        with contextlib.suppress(OSError):
            group.set_limit(-1)
        if disk is not None:
            disk.remove()
        read_ahead.close()
        shutil.rmtree(work, ignore_errors=True)
    report(results, configs, args)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'args': {k: v for k, v in vars(args).items()},
                       'results': results}, f, indent=1, default=str)
    return 0


def report(results, configs, args):
    print()
    print('throughput per guest, ratio to ON+ON at the same budget:')
    print('%-8s' % 'budget' + ''.join('%18s' % c for c in configs))
    for b in args.budgets:
        ref = results.get('ON+ON', {}).get('budgets', {}).get(b, {}).get(
            'MB_s')
        row = '%-8s' % ('%d MiB' % b)
        for c in configs:
            v = results[c]['budgets'][b]['MB_s']
            row += '%18s' % ('-' if v is None else
                             '%.2f (%.2fx)' % (v, v / ref) if ref else
                             '%.2f' % v)
        print(row)
    print('private data cached in the guests after a loop (mean share):')
    for b in args.budgets:
        print('%-8s' % ('%d MiB' % b) + ''.join(
            '%18s' % _share(results[c]['budgets'][b].get('private_cached'))
            for c in configs))
    print('guests\' RssAnon (MiB, sum) at each budget:')
    for b in args.budgets:
        print('%-8s' % ('%d MiB' % b) + ''.join(
            '%18s' % (sum(results[c]['budgets'][b].get(
                'rss_anon', {}).values()) // MiB) for c in configs))
    if args.disk_read_iops or args.disk_read_mbps or \
            args.disk_read_ahead_kb is not None:
        print('read from the disk in the windows (MiB / KiB a request):')
        for b in args.budgets:
            print('%-8s' % ('%d MiB' % b) + ''.join(
                '%18s' % _disk_short(results[c]['budgets'][b])
                for c in configs))
    if args.idle:
        print('memory the guests gave back once their workload ended '
              '(MiB, sum):')
        print('%-8s' % '' + ''.join(
            '%18s' % (results[c]['idle']['returned'] // MiB)
            for c in configs))
        variants = results.get('P+I', {}).get('idle_variants', {})
        if variants:
            base = variants.get('order9')
            print('P+I: how memory comes back (returned / what vmar-guest '
                  'dropped in the last loop; QEMU CPU and MB/s as a ratio '
                  'to order9):')
            for v, r in variants.items():
                d = r['dropped_last_loop']
                print('  %-8s %5d MiB of %5s MiB (%5s) at 60 s, QEMU CPU '
                      '%6.0f s%s, %s MB/s%s, compactions %s' % (
                          v, r['returned_60s'] // MiB,
                          d // MiB if d else '-',
                          '%.0f %%' % (100 * r['returned_60s'] / d)
                          if d else '-',
                          r['qemu_cpu_s'],
                          ' (%.2fx)' % (r['qemu_cpu_s'] / base['qemu_cpu_s'])
                          if base else '', _mbs(r['MB_s']),
                          ' (%.2fx)' % (r['MB_s'] / base['MB_s'])
                          if base and r['MB_s'] and base['MB_s'] else '',
                          r['compactions'] or 0))
    if args.overcommit:
        print('guests a budget of %d MiB holds, each at half its '
              'unpressured throughput or more:' % args.overcommit_budget)
        for c in configs:
            print('  %-6s %d' % (c, results[c]['overcommit']['fits']))
    if 'A' in results and 'P+I' in results:
        print('A (auto) against P+I (private) at the same budget, and the '
              'modes the guests ran in:')
        for b in args.budgets:
            auto = results['A']['budgets'][b]
            priv = results['P+I']['budgets'][b]['MB_s']
            print('%-8s %s  %s' % (
                '%d MiB' % b, '%.2fx' % (auto['MB_s'] / priv)
                if auto['MB_s'] and priv else '-',
                ', '.join('%s/%s' % (m, r) for m, r, _n in
                          auto.get('modes', ()))))
    if 'P+I' in results:
        print('vmar-guest\'s share of its guest\'s CPU over the measured '
              'loops (P+I; each guest):')
        for b in args.budgets:
            per = results['P+I']['budgets'][b].get('guests', {})
            print('%-8s' % ('%d MiB' % b) + '  ' + ', '.join(
                _share(g['guest_cpu_share']) for g in per.values()))


def _terminate(signum, frame):
    raise KeyboardInterrupt


if __name__ == '__main__':
    signal.signal(signal.SIGTERM, _terminate)
    sys.exit(main())
