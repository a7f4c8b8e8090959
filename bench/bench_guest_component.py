#!/usr/bin/env python3
"""What vmar-guest costs: per open (fanotify) and per file (walk).

On this machine's kernel (a guest runs the same code on its own), in a
scratch directory of the root filesystem holding --files small files:

1. open + read + close of every file, hot cache, without vmar-guest and
   then with it running (--mode private, tracking every file, a grace
   period longer than the run so nothing is dropped): the ratio is what
   each open costs the guest's programs, the component's CPU time and
   system calls per event (an open or a close) what it costs itself;
2. the same reads with every file dropped at its close (--grace 0, what
   a guest does): the component's CPU time and system calls per file,
   drops included (the reads come from the disk then, so their times
   say nothing of the component);
3. one walk (--once) over the same files: CPU time and system calls per
   file, the cost of the start-up and --rescan walks.

Usage: bench_guest_component.py [--files 20000] [--rounds 5] [--json OUT]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from vmar_openstack.guest import status as guest_status
from vmar_openstack.guest import userdata


def read_all(paths):
    t = time.perf_counter()
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        os.read(fd, 65536)
        os.close(fd)
    return time.perf_counter() - t


def status(path):
    deadline = time.monotonic() + 30
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise RuntimeError('vmar-guest wrote no status')
        time.sleep(0.1)
    return guest_status.read(path)


def watch(binary, data, work, boot, paths, rounds, grace):
    """Run vmar-guest over ``rounds`` reads of ``paths``.

    Returns the reads' times and vmar-guest's counters over them.
    """
    st_path = os.path.join(work, 'status-%s' % grace)
    proc = subprocess.Popen(
        # this machine's kernel, not a guest's: leave its page reporting
        # order alone
        [binary, '--mode', 'private', '--reporting-order', '-1',
         '--root', data, '--grace', grace,
         '--hold', '36000', '--linger', '36000', '--interval', '1',
         '--status', st_path, '--boot-time', str(boot)],
        stdout=subprocess.DEVNULL)
    try:
        st0 = status(st_path)
        times = [read_all(paths) for _ in range(rounds)]
        # every event read and offered: the counters of a later pass
        time.sleep(2.5)
        st1 = status(st_path)
    finally:
        proc.terminate()
        proc.wait()
    return times, {k: st1[k] - st0[k] for k in st1}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--files', type=int, default=20000)
    p.add_argument('--rounds', type=int, default=5)
    p.add_argument('--json')
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix='vmar-bench-guest-', dir='/var/tmp')
    try:
        binary = os.path.join(work, 'vmar-guest')
        with open(binary, 'wb') as f:
            f.write(userdata.build())
        os.chmod(binary, 0o755)
        data = os.path.join(work, 'data')
        os.mkdir(data)
        paths = []
        for i in range(args.files):
            paths.append(os.path.join(data, '%06d' % i))
            with open(paths[-1], 'wb') as f:
                f.write(os.urandom(4096))
        boot = int(time.time()) + 2     # the files are "before boot"
        read_all(paths)
        without = [read_all(paths) for _ in range(args.rounds)]
        # tracking only: a grace far past the run, so nothing is dropped
        tracking = watch(binary, data, work, boot, paths, args.rounds,
                         '36000')
        # and dropping each file at its close, as in a guest
        dropping = watch(binary, data, work, boot, paths, args.rounds, '0')
        walk_st = os.path.join(work, 'walk-status')
        read_all(paths)                 # cached, so the walk drops them
        subprocess.run([binary, '--mode', 'private',
                        '--reporting-order', '-1', '--root', data,
                        '--once', '--grace', '0', '--status', walk_st,
                        '--boot-time', str(boot)], check=True,
                       stdout=subprocess.DEVNULL)
        walk = status(walk_st)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    opens = args.files * args.rounds
    with_, counted = tracking
    events = counted['events']
    cpu = guest_status.cpu_seconds(counted)
    _, dropped = dropping
    res = {
        'files': args.files, 'rounds': args.rounds,
        'open_read_us_without': statistics.median(without) / args.files * 1e6,
        'open_read_us_with': statistics.median(with_) / args.files * 1e6,
        'events': events, 'opens': opens,
        'cpu_us_per_event': cpu / events * 1e6 if events else None,
        'syscalls_per_event': counted['syscalls'] / events if events
        else None,
        'cpu_us_per_opened_file': cpu / opens * 1e6,
        'drop_cpu_us_per_file': guest_status.cpu_seconds(dropped)
        / opens * 1e6,
        'drop_syscalls_per_file': dropped['syscalls'] / opens,
        'close_drops': dropped['close_drops'],
        'walk_files': walk['walked_files'],
        'walk_cpu_us_per_file': guest_status.cpu_seconds(walk)
        / walk['walked_files'] * 1e6,
        'walk_syscalls_per_file': walk['syscalls'] / walk['walked_files'],
        'walk_dropped_bytes': walk['dropped_bytes'],
    }
    res['open_ratio'] = res['open_read_us_with'] / res['open_read_us_without']
    print('open+read+close of a 4 KiB file, hot: %.2f us without, %.2f us '
          'with vmar-guest tracking: ratio %.3f' % (
              res['open_read_us_without'], res['open_read_us_with'],
              res['open_ratio']))
    print('vmar-guest per fanotify event: %.2f us CPU, %.2f system calls '
          '(%d events, opens and closes, for %d files opened): %.2f us per '
          'file' % (res['cpu_us_per_event'] or 0,
                    res['syscalls_per_event'] or 0, events, opens,
                    res['cpu_us_per_opened_file']))
    print('dropping each file at its close: %.2f us CPU and %.2f system '
          'calls per file opened (%d drops)' % (
              res['drop_cpu_us_per_file'], res['drop_syscalls_per_file'],
              res['close_drops']))
    print('walk: %d files, %.2f us CPU and %.2f system calls per file; '
          'dropped %d bytes' % (res['walk_files'],
                                res['walk_cpu_us_per_file'],
                                res['walk_syscalls_per_file'],
                                res['walk_dropped_bytes']))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == '__main__':
    sys.exit(main())
