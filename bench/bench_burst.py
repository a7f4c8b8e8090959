#!/usr/bin/env python3
"""A burst of servers of new images on three hosts, peers on and off.

Issue 34's burst figure. ``tools/cloud.sh up --computes 3``; each run
uploads 3 new images (16 MiB every image shares, 8 MiB of its own, in a
64 MiB disk: 40 MiB of unique data) and creates 9 servers at once, 3 per
image, each image's in a server group with the ``anti-affinity`` policy,
so that every image has a server on every host. Each guest (the test
guest, TCG) reads its whole disk once and prints its checksum.

``--images debian``: the images are minbase, python3 and nginx of the
Debian image library (1 GiB each, uploaded anew for each run), the time is
to their ``VMAR-BOOTED`` (doc/source/reference/images.rst), and the unique
data is not known beforehand: the peers run's bytes are set against a third of
the store run's, what one host of three fetched (the same images on each,
boot working sets prefetched).

Two runs in the same minutes, in alternating order over ``--rounds``:

* ``peers``: as the cloud is set up (``[vmar_peers] discover``, a peer
  server on each host, the lead of a burst, doc/source/admin/peers.rst);
* ``store``: the same with ``[vmar_peers] fetch = false`` on every host
  (its vmar-export restarted with that file after the host's own), the
  baseline.

Figures, for each run:

* **bytes from the store**: the image data glance-api served the hosts'
  lazy mirrors (its uWSGI access log), against the unique data the
  guests read (goal: <= 1.1 x with peers, against about 3 x without);
* **time to the checksum**: ``server create`` to the guest's checksum on
  its console, mean and max (goal: with peers <= without);
* what each host read from peers, and waited for at a lead.

Throttles (``--store-mbit``, ``--link-mbit``): tc ``tbf`` on the cloud's
bridge (what the control plane, glance-api among it, sends the hosts: the
store) and on both ends of each host's veth (the host's link). This
kernel has no ``sch_netem``: the store's latency (``--store-delay-ms``)
is nbdkit's ``delay`` filter on each host's range server, the nbdkit
that reads Glance for the host's mirrors (``[vmar_host] nbdkit`` pointed,
for both runs, at a script that adds the filter to that nbdkit only).

Usage: bench/bench_burst.py [--state-dir DIR] [--rounds N] [--json FILE]
       [--store-mbit 800] [--link-mbit 1000] [--images test|debian]
       [--store-first] [--store-delay-ms N]
(root; the cloud must be up with three compute hosts)
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TOP)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_weigher  # noqa: E402

from tools.cloud import config  # noqa: E402
from tools.cloud import stack  # noqa: E402
from tools.vmarenv import qemu_env  # noqa: E402

MIB = bench_weigher.MIB
IMAGES = 3
PER_IMAGE = 3
# 16 MiB every image shares, 8 MiB of each image's own
UNIQUE_BYTES = (16 + IMAGES * 8) * MIB
FLAVOR = bench_weigher.FLAVOR
DEBIAN = ('minbase', 'python3', 'nginx')
DEBIAN_FLAVOR = 'vmar.burst'
BOOTED = re.compile(r'VMAR-BOOTED ')
#: the processes whose CPU a run counts, by what their command line holds
CPU_KINDS = {
    'peer_server': ('nbdkit_peer.py',),
    'peer_fetcher': ('nbdkit_peers.py',),
    'range_server': ('nbdkit_glance.py',),
    'storage_daemon': ('qemu-storage-daemon',),
    'guests': ('qemu-system',),
    'glance_api': ('glance-api',),
}


def make_images(work, tag):
    """Three raw images: the shared part, then their own part."""
    shared = bench_weigher.blocks('os-' + tag, 16)
    paths = []
    for i in range(IMAGES):
        path = os.path.join(work, 'burst-%s-%d.raw' % (tag, i))
        with open(path, 'wb') as f:
            f.write(shared + bench_weigher.blocks('own-%d-%s' % (i, tag), 8))
            f.truncate(bench_weigher.IMAGE_SIZE)
        paths.append(path)
    return paths


def _tc(netns, *args):
    cmd = ['tc'] + list(args)
    if netns:
        cmd = ['ip', 'netns', 'exec', netns] + cmd
    subprocess.run(cmd, check=True, capture_output=True, text=True)


class Burst(bench_weigher.Bench):

    def __init__(self, state_dir, echo=print, debian=False):
        super().__init__(state_dir, 0.0, echo)
        self.debian = debian
        self.work = self.cloud.path('bench-burst')
        os.makedirs(self.work, exist_ok=True)

    def store_delay(self, ms):
        """Every run's range servers read Glance behind nbdkit's delay."""
        if not ms:
            self.extra_conf = []
            return
        script = os.path.join(self.work, 'nbdkit-store-delay')
        with open(script, 'w') as f:
            f.write('#!/bin/sh\n'
                    '# bench_burst.py: the range server (the store) behind\n'
                    '# nbdkit\'s delay filter; any other nbdkit as it is\n'
                    'for a in "$@"; do\n'
                    '    case $a in\n'
                    '        */nbdkit_glance.py) exec %(n)s --filter=delay '
                    '"$@" delay-read=%(ms)dms ;;\n'
                    '    esac\n'
                    'done\n'
                    'exec %(n)s "$@"\n' % {'n': shutil.which('nbdkit'),
                                           'ms': ms})
        os.chmod(script, 0o755)
        conf = os.path.join(self.work, 'store-delay.conf')
        with open(conf, 'w') as f:
            f.write('# bench_burst.py: the store\'s latency\n'
                    '[vmar_host]\nnbdkit = %s\n' % script)
        self.extra_conf = [conf]

    def setup(self):
        super().setup()
        c = self.conn
        # what an earlier run that stopped half way left
        stale = [x for x in c.compute.servers() if x.name.startswith('b-')]
        for x in stale:
            c.compute.delete_server(x)
        for x in stale:
            c.compute.wait_for_delete(x, wait=300)
        for g in c.compute.server_groups():
            if g.name.startswith('burst-'):
                c.compute.delete_server_group(g)
        for img in c.image.images():
            if img.name.startswith('burst-'):
                c.image.delete_image(img)
        if self.debian and not self.conn.compute.find_flavor(DEBIAN_FLAVOR):
            f = self.conn.compute.create_flavor(
                name=DEBIAN_FLAVOR, ram=512, vcpus=1, disk=2)
            self.conn.compute.create_flavor_extra_specs(
                f, {'vmar:enabled': 'true'})
        # the cloud may predate this tree's schema and agent
        subprocess.run([self.cloud.bin('vmar-manage'), '--config-file',
                        self.cloud.etc('vmar', 'vmar.conf'), 'db', 'sync'],
                       check=True, capture_output=True)
        for svc in stack.services(self.cloud):
            if svc.name == 'vmar-agent':
                svc.stop()
                svc.start()
        self.weigher(False)

    def throttle(self, store_mbit, link_mbit):
        """tbf on the bridge (the store) and each host's veth (its link)."""
        burst = '256kb'
        if store_mbit:
            _tc(None, 'qdisc', 'replace', 'dev', config.BRIDGE, 'root',
                'tbf', 'rate', '%dmbit' % store_mbit, 'burst', burst,
                'latency', '50ms')
        if link_mbit:
            for h in self.hosts:
                _tc(None, 'qdisc', 'replace', 'dev', h.veth, 'root', 'tbf',
                    'rate', '%dmbit' % link_mbit, 'burst', burst, 'latency',
                    '50ms')
                _tc(h.netns, 'qdisc', 'replace', 'dev', 'eth0', 'root',
                    'tbf', 'rate', '%dmbit' % link_mbit, 'burst', burst,
                    'latency', '50ms')

    def unthrottle(self):
        for netns, dev in [(None, config.BRIDGE)] + [
                (x, d) for h in self.hosts
                for x, d in ((None, h.veth), (h.netns, 'eth0'))]:
            cmd = ['tc', 'qdisc', 'del', 'dev', dev, 'root']
            if netns:
                cmd = ['ip', 'netns', 'exec', netns] + cmd
            subprocess.run(cmd, capture_output=True)

    make_images = staticmethod(make_images)

    def images(self, tag):
        if not self.debian:
            return super().images(tag)
        library = qemu_env.image_library()
        ids = [self.conn.image.create_image(
            'burst-%s-%s' % (tag, name), filename=library[name],
            disk_format='raw', container_format='bare', wait=True,
            vmar_guest='1').id for name in DEBIAN]
        return self.wait_maps(ids)

    def cpu_seconds(self):
        """CPU seconds so far of the processes that move blocks, by kind.

        The machine's (run nothing else beside the bench): the hosts'
        services restart with each run (:meth:`peers`) and the guests are
        the run's, so theirs are the run's; glance-api's are taken as a
        difference. Guests that powered off before the count (the test
        guest does once it has read its disk) are not in it.
        """
        out = dict.fromkeys(CPU_KINDS, 0.0)
        tick = os.sysconf('SC_CLK_TCK')
        for pid in (int(p) for p in os.listdir('/proc') if p.isdigit()):
            try:
                with open('/proc/%d/cmdline' % pid, 'rb') as f:
                    cmd = f.read().replace(b'\0', b' ').decode(
                        errors='replace')
                with open('/proc/%d/stat' % pid) as f:
                    fields = f.read().rsplit(')', 1)[1].split()
            except OSError:
                continue
            for kind, marks in CPU_KINDS.items():
                if any(m in cmd for m in marks):
                    # utime, stime: fields 14 and 15 of stat, here 11, 12
                    out[kind] += (int(fields[11]) + int(fields[12])) / tick
                    break
        return out

    def peer_counts(self):
        out = {}
        for h in self.hosts:
            st = json.loads(h.vmar_export('status', '--json'))
            out[h.name] = (st.get('peers') or {}).get('reads') or {}
        return out

    def run(self, on, tag):
        self.peers(on)
        ids = self.images(tag)
        flavor = self.conn.compute.find_flavor(
            DEBIAN_FLAVOR if self.debian else FLAVOR)
        offset = self.log_offset(self.store_log)
        cpu0 = self.cpu_seconds()
        groups = [self.conn.compute.create_server_group(
            name='burst-%s-%d' % (tag, i), policy='anti-affinity')
            for i in range(IMAGES)]
        # one request per image for its servers: Nova schedules the
        # members of one request apart; members of a group created by
        # requests at once race for hosts, fail the compute's late check
        # and run out of reschedules
        t0 = {}
        for i in range(IMAGES):
            self.conn.compute.create_server(
                name='b-%s-%d' % (tag, i), image_id=ids[i],
                flavor_id=flavor.id, networks='none',
                scheduler_hints={'group': groups[i].id},
                min_count=PER_IMAGE, max_count=PER_IMAGE)
            t0[ids[i]] = time.monotonic()
        servers = {}
        for s in self.conn.compute.servers(name='^b-%s-' % tag):
            i = ids.index(s.image.id)
            servers[s.id] = {'image': i, 't0': t0[ids[i]], 'server': s}
        if len(servers) != IMAGES * PER_IMAGE:
            raise SystemExit('%d servers made, not %d' % (
                len(servers), IMAGES * PER_IMAGE))
        self.wait_read(servers, poll=1,
                       marker=BOOTED if self.debian else bench_weigher.SHA)
        fetched, other = self.store_reads(offset, set(ids))
        # since the restart of peers(): this run's
        after = self.peer_counts()
        cpu = self.cpu_seconds()
        # the hosts' processes started with the run; glance-api did not
        cpu['glance_api'] -= cpu0['glance_api']
        self.clean_up(servers, ids)
        for g in groups:
            self.conn.compute.delete_server_group(g)
        secs = [s['seconds'] for s in servers.values()]
        spread = {}
        for s in servers.values():
            spread.setdefault(s['image'], set()).add(s['host'])
        from_peers = after
        result = {
            'peers': on, 'fetched_bytes': fetched,
            'other_store_bytes': other,
            'x_unique': None if self.debian else fetched / UNIQUE_BYTES,
            'mean_s': statistics.mean(secs), 'max_s': max(secs),
            'seconds': sorted(secs),
            'hosts_per_image': {i: len(h) for i, h in spread.items()},
            'from_peers': from_peers,
            'cpu_seconds': cpu,
        }
        self.echo('  peers %-3s: store %6.1f MiB (%s x unique; other '
                  '%.1f MiB), %s mean %5.1f s, max %5.1f s; from '
                  'peers %s' % (
                      'on' if on else 'off', fetched / MIB,
                      '?' if self.debian else '%.2f' % result['x_unique'],
                      other / MIB,
                      'VMAR-BOOTED' if self.debian else 'checksum',
                      result['mean_s'],
                      result['max_s'], ', '.join(
                          '%s %.1f MiB (waits %d, in vain %d)' % (
                              h, c.get('peer_bytes', 0) / MIB,
                              c.get('lead_waits', 0),
                              c.get('lead_misses', 0))
                          for h, c in sorted(from_peers.items()))))
        self.echo('    CPU s: %s; waited at leads %.1f s' % (
            ', '.join('%s %.1f' % kv for kv in sorted(cpu.items())),
            sum(c.get('lead_wait_ms', 0) for c in from_peers.values())
            / 1000))
        return result


def main(argv=None):
    p = argparse.ArgumentParser(prog='bench/bench_burst.py')
    p.add_argument('--state-dir')
    p.add_argument('--rounds', type=int, default=1)
    p.add_argument('--store-mbit', type=int, default=800,
                   help='the store\'s rate, Mbit/s (default 800: 100 MB/s)')
    p.add_argument('--link-mbit', type=int, default=1000,
                   help='each host\'s link, Mbit/s (default 1000)')
    p.add_argument('--images', choices=('test', 'debian'), default='test',
                   help='the test guest\'s images (default) or three of '
                        'the Debian image library')
    p.add_argument('--store-delay-ms', type=int, default=0,
                   help='the store\'s latency per read, ms (nbdkit\'s '
                        'delay filter on the range servers; default none)')
    p.add_argument('--store-first', action='store_true',
                   help='the store run first in the first round (rounds '
                        'alternate)')
    p.add_argument('--json')
    args = p.parse_args(argv)
    bench = Burst(args.state_dir, echo=lambda t: print(t, flush=True),
                  debian=args.images == 'debian')
    if len(bench.hosts) != 3:
        raise SystemExit('bench_burst needs tools/cloud.sh up --computes 3')
    bench.setup()
    bench.store_delay(args.store_delay_ms)
    rounds = []
    bench.throttle(args.store_mbit, args.link_mbit)
    try:
        for r in range(args.rounds):
            print('round %d: %d servers of %d images at once, anti-affinity'
                  % (r + 1, IMAGES * PER_IMAGE, IMAGES), flush=True)
            first = (r + args.store_first) % 2 == 0
            runs = {}
            for on in (first, not first):
                runs[on] = bench.run(on, '%d%s-%d' % (
                    r, 'on' if on else 'off', time.time()))
            on, off = runs[True], runs[False]
            unique = off['fetched_bytes'] / 3 if args.images == 'debian' \
                else UNIQUE_BYTES
            print('round %d: store bytes, peers / no peers: %.3f; against '
                  'the unique data%s: %.2f x with (goal <= 1.1), %.2f x '
                  'without; mean time to the %s %.2f x' % (
                      r + 1, on['fetched_bytes'] / max(
                          1, off['fetched_bytes']),
                      ' (a third of the store run\'s)'
                      if args.images == 'debian' else '',
                      on['fetched_bytes'] / unique,
                      off['fetched_bytes'] / unique,
                      'VMAR-BOOTED' if args.images == 'debian'
                      else 'checksum', on['mean_s'] / off['mean_s']),
                  flush=True)
            rounds.append({'peers': runs[True], 'store': runs[False]})
    finally:
        bench.unthrottle()
        bench.store_delay(0)
        bench.peers(True)
        bench.weigher(True)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(rounds, f, indent=1, sort_keys=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
