#!/usr/bin/env python3
"""The similarity weigher on three compute hosts (issue 17).

30 servers of 6 images over the 3 hosts of ``tools/cloud.sh up --computes
3``, placed by the real nova-scheduler with the vmar weigher and without
it, alternately (``--rounds``). Without: the same cloud, with an aggregate
of all hosts whose ``vmar_weight_multiplier`` is 0 (Nova's own weighers
only; the option doc/source/admin/scheduling.rst gives operators). Each run
uploads 6 new images of the same make, so no host holds any of them.

The images are two families of three: every image has the same 16 MiB
(an OS every image shares), its family's 8 MiB, and 8 MiB of its own, in
a 64 MiB disk. The guest is the test guest (tools/build-test-guest.sh)
booted by Nova from ``kernel_id``/``ramdisk_id`` images: it reads its
whole disk once (its checksum on the console, read from the console log
on its host) and powers off, so every server reads every block of its
image.

Figures, each run against the other run of its round:

* **bytes fetched from the store**: the bytes of the run's images that
  glance-api served (its uWSGI access log: every ``GET
  /v2/images/<id>/file`` of a host's lazy mirror, a range), with the
  weigher / without (goal <= 0.6); also against the images' unique bytes
  (80 MiB, what one host holding everything would fetch). What else the
  hosts read from Glance in the run (maps, boot working sets, digest
  lists; the guest's kernel once per host) is printed apart;
* **boot time**: ``server create`` to the guest's checksum, median and
  maximum;
* where the servers went (servers and images per host), and for the
  first creates what nova-scheduler weighed (the vmar weigher's score and
  the sum of Nova's own per host, from its DEBUG log): they decide where
  each family of images goes.

The hosts' peer reads (issue 34) are off for the runs unless ``--peers``:
with them a host reads what another holds from it, so the store serves
each byte once wherever the servers go, and its bytes no longer measure
placement (both runs of a round fetched 80 MiB, 2026-11-28).

Usage: bench/bench_weigher.py [--state-dir DIR] [--rounds N]
       [--interval S] [--peers] [--json FILE]
(the cloud must be up with three compute hosts)
"""

import argparse
import ast
import hashlib
import json
import os
import random
import re
import statistics
import sys
import time

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TOP)

from tools.cloud import config  # noqa: E402
from tools.cloud import hosts  # noqa: E402
from tools.cloud import stack  # noqa: E402
from tools import cloud_scenario  # noqa: E402
from tools import multinode_scenario  # noqa: E402
from tools.vmarenv import qemu_env  # noqa: E402
from vmar_openstack import fileutils  # noqa: E402
from vmar_openstack.host.exports import hostdir  # noqa: E402

SHA = re.compile(r'VMAR-SHA256 ([0-9a-f]{64})')
# a line of glance-api's uWSGI access log for a read of image data
STORE_GET = re.compile(r'GET /v2/images/([0-9a-f-]{36})/file => '
                       r'generated (\d+) bytes')
# nova-scheduler's DEBUG lines (etc/cloud/nova-scheduler.conf.in): the
# request's instances, each weigher's score per host, the host chosen
REQ = re.compile(r'\[(?:None )?(req-[0-9a-f-]+)')
SCHEDULE = re.compile(r"Starting to schedule for instances: "
                      r"\['([0-9a-f-]{36})")
SCORE = re.compile(r'(\w+): score \(multiplier \* weight\) (\{.*\})')
SELECTED = re.compile(r'Selected host: \(([^,]+),')
MIB = 1 << 20
IMAGE_SIZE = 64 * MIB
IMAGES = 6
# the content of a run's images: the OS part, two families, six own parts
UNIQUE_BYTES = (16 + 2 * 8 + IMAGES * 8) * MIB
SERVERS = 30
FLAVOR = 'vmar.weigher'
AGGREGATE = 'vmar-bench-weigher'


def blocks(seed, mib):
    """``mib`` MiB of distinct 4 KiB blocks derived from ``seed``."""
    out = bytearray()
    h = hashlib.sha256(seed.encode()).digest()
    while len(out) < mib * MIB:
        h = hashlib.sha256(h).digest()
        out += h * 128
    return bytes(out)


def scheduler_decisions(path, offset=0):
    """What nova-scheduler weighed for each server, from its DEBUG log.

    ``{instance uuid: {'scores': {weigher: {host: score}}, 'host':
    host chosen}}`` for the requests logged after ``offset``; a request
    without a weigher's line (one host left by the filters) has none.
    """
    by_req, out = {}, {}
    with open(path, errors='replace') as f:
        f.seek(offset)
        for line in f:
            req = REQ.search(line)
            if req is None:
                continue
            d = by_req.setdefault(req.group(1), {'scores': {}})
            m = SCHEDULE.search(line)
            if m:
                d['instance'] = m.group(1)
                out[m.group(1)] = d
            m = SCORE.search(line)
            if m:
                # {('compute-1', 'compute-1'): '5.0 * 0.5', ...}
                raw = ast.literal_eval(m.group(2))
                d['scores'][m.group(1)] = {
                    k[0]: float(a) * float(b) for k, v in raw.items()
                    for a, b in [v.split(' * ')]}
            m = SELECTED.search(line)
            if m:
                d['host'] = m.group(1)
    return {k: {'scores': v['scores'], 'host': v.get('host')}
            for k, v in out.items()}


def decision_line(n, image, d):
    """One server's placement: its vmar score and the others' sum per host."""
    vmar = d['scores'].get('VmarWeigher', {})
    hosts = sorted(set(vmar) | {h for s in d['scores'].values() for h in s})
    rest = {h: sum(s.get(h, 0.0) for w, s in d['scores'].items()
                   if w != 'VmarWeigher') for h in hosts}
    return '    #%-2d image %d -> %s; %s' % (
        n, image, d['host'], ', '.join(
            '%s vmar %.2f other %+.2f' % (h, vmar.get(h, 0.0), rest[h])
            for h in hosts))


def make_images(work, tag):
    """Six raw images: shared OS, a family's part, their own part."""
    os_part = blocks('os-' + tag, 16)
    paths = []
    for i in range(IMAGES):
        family = blocks('family-%d-%s' % (i // 3, tag), 8)
        own = blocks('own-%d-%s' % (i, tag), 8)
        path = os.path.join(work, 'weigher-%s-%d.raw' % (tag, i))
        with open(path, 'wb') as f:
            f.write(os_part + family + own)
            f.truncate(IMAGE_SIZE)
        paths.append(path)
    return paths


class Bench(object):

    def __init__(self, state_dir, interval, echo=print):
        self.cloud = config.Cloud(state_dir)
        self.cloud.load()
        if len(self.cloud.hosts) != 3:
            raise SystemExit('bench_weigher needs tools/cloud.sh up '
                             '--computes 3')
        self.hosts = [hosts.Host(self.cloud, h) for h in self.cloud.hosts]
        self.by_name = {h.name: h for h in self.hosts}
        # the cloud's user path's credentials, through the API
        self.conn = cloud_scenario.CLI(self.cloud.path('openrc')).connect(
            compute_api_version='2.74')
        self.interval = interval
        self.echo = echo
        self.work = self.cloud.path('bench-weigher')
        os.makedirs(self.work, exist_ok=True)
        self.guest = qemu_env.test_guest()
        self.store_log = self.cloud.path('log', 'glance-api-uwsgi.log')
        self.scheduler_log = self.cloud.path('log', 'nova-scheduler.log')
        # what every host's vmar-export reads besides the cloud's files
        self.extra_conf = []
        self.off_conf = os.path.join(self.work, 'peers-off.conf')
        with open(self.off_conf, 'w') as f:
            f.write('# %s: no reads from peers\n[vmar_peers]\nfetch = '
                    'false\n' % os.path.basename(sys.argv[0]))

    def peers(self, on):
        """Restart every host's vmar-export with peer reads on or off.

        Its peer read counts start again from zero.
        """
        for h in self.hosts:
            svc = stack.HostExport(self.cloud, h)
            svc.conf = list(h.export_conf) + self.extra_conf + (
                [] if on else [self.off_conf])
            svc.stop()
            fileutils.unlink(hostdir.Layout(
                h.path('vmar', 'host')).peer_counts_file())
            svc.start()

    def console(self, server):
        """What the guest printed so far.

        Read from the console log on its host: the guest powers off once
        it has read its disk, and Nova answers no console output for a
        server that is not running.
        """
        host = self.by_name.get(server.compute_host)
        if host is None:
            return ''
        try:
            with open(host.path('nova', 'instances', server.id,
                                'console.log'), errors='replace') as f:
                return f.read()
        except OSError:
            return ''

    @staticmethod
    def log_offset(path):
        try:
            return os.path.getsize(path)
        except FileNotFoundError:
            return 0

    def store_reads(self, offset, ids):
        """Bytes glance-api served since ``offset``: of ``ids``, others."""
        mine = others = 0
        with open(self.store_log, errors='replace') as f:
            f.seek(offset)
            for line in f:
                m = STORE_GET.search(line)
                if m:
                    if m.group(1) in ids:
                        mine += int(m.group(2))
                    else:
                        others += int(m.group(2))
        return mine, others

    def setup(self):
        c = self.conn
        # 30 servers: above Nova's default quota of 10 instances
        c.set_compute_quotas(c.current_project_id, instances=-1, cores=-1,
                             ram=-1)
        stale = [s for s in c.compute.servers() if s.name.startswith('w-')]
        for s in stale:     # an earlier run that stopped half way
            c.compute.delete_server(s)
        for s in stale:
            c.compute.wait_for_delete(s, wait=300)
        found = {}
        for img in c.image.images():
            found.setdefault(img.name, img.id)
        if 'weigher-kernel' in found and 'weigher-ramdisk' in found:
            self.kernel = found['weigher-kernel']
            self.ramdisk = found['weigher-ramdisk']
        else:
            self._upload_guest()
        if not c.compute.find_flavor(FLAVOR):
            f = c.compute.create_flavor(name=FLAVOR, ram=192, vcpus=1,
                                        disk=0)
            c.compute.create_flavor_extra_specs(f, {'vmar:enabled': 'true'})
        agg = c.compute.find_aggregate(AGGREGATE)
        if agg is None:
            agg = c.compute.create_aggregate(name=AGGREGATE)
            for h in self.hosts:
                c.compute.add_host_to_aggregate(agg, h.name)
        self.aggregate = agg

    def _upload_guest(self):
        c = self.conn
        kernel = os.path.join(self.work, 'vmlinuz')
        with open(os.path.join(self.guest, 'vmlinuz'), 'rb') as f:
            data = bytearray(f.read())
        a, b = multinode_scenario.KERNEL_STUB
        data[a:b] = bytes(b - a)
        with open(kernel, 'wb') as f:
            f.write(data)
        self.kernel = c.image.create_image(
            'weigher-kernel', filename=kernel, disk_format='aki',
            container_format='aki', wait=True).id
        self.ramdisk = c.image.create_image(
            'weigher-ramdisk', filename=os.path.join(self.guest,
                                                     'initramfs'),
            disk_format='ari', container_format='ari', wait=True).id

    def weigher(self, on):
        self.conn.compute.set_aggregate_metadata(
            self.aggregate, {'vmar_weight_multiplier': '5.0' if on
                             else '0.0'})

    #: the run's image files: (work directory, tag) -> [path, ...]
    make_images = staticmethod(make_images)

    def images(self, tag):
        ids = []
        for path in self.make_images(self.work, tag):
            img = self.conn.image.create_image(
                os.path.basename(path), filename=path, disk_format='raw',
                container_format='bare', wait=True,
                kernel_id=self.kernel, ramdisk_id=self.ramdisk,
                # no_timer_check: TCG guests of a loaded host otherwise
                # panic now and then ("IO-APIC + timer doesn't work")
                os_command_line='console=ttyS0 no_timer_check')
            ids.append(img.id)
        return self.wait_maps(ids)

    def wait_maps(self, ids):
        """``ids`` once vmar-agent published a map of each."""
        deadline = time.monotonic() + 900
        while True:
            names = {i.name for i in self.conn.image.images(
                visibility='all', is_hidden=True)}
            if all(any(n.startswith('vmar-map-%s' % i) for n in names)
                   for i in ids):
                return ids
            if time.monotonic() > deadline:
                raise SystemExit('no map for some of %s' % ids)
            time.sleep(2)

    def wait_read(self, servers, poll, marker=SHA):
        """Wait for every guest's ``marker``: its host and seconds.

        ``servers``: ``{server id: {'t0': monotonic time of the create,
        ...}}``; each gets ``seconds`` (create to the marker on its
        console, the checksum by default) and ``host``.
        """
        pending = set(servers)
        deadline = time.monotonic() + 1800
        while pending:
            for sid in sorted(pending):
                s = self.conn.compute.get_server(sid)
                if s.status == 'ERROR':
                    raise SystemExit('server %s: %s' % (s.name, s.fault))
                if marker.search(self.console(s)):
                    servers[sid]['seconds'] = (time.monotonic()
                                               - servers[sid]['t0'])
                    servers[sid]['host'] = s.compute_host
                    pending.discard(sid)
            if time.monotonic() > deadline:
                raise SystemExit('servers never read their disks: %s'
                                 % pending)
            time.sleep(poll)

    def clean_up(self, servers, ids):
        """Delete the run's servers (waiting for them), then its images."""
        for sid in servers:
            self.conn.compute.delete_server(sid)
        for v in servers.values():
            self.conn.compute.wait_for_delete(v['server'], wait=300)
        for i in ids:
            self.conn.image.delete_image(i)

    def run(self, on, tag, order):
        self.weigher(on)
        ids = self.images(tag)
        flavor = self.conn.compute.find_flavor(FLAVOR)
        offset = self.log_offset(self.store_log)
        sched_offset = self.log_offset(self.scheduler_log)
        servers = {}
        t_start = time.monotonic()
        for n, i in enumerate(order):
            due = t_start + n * self.interval
            time.sleep(max(0, due - time.monotonic()))
            s = self.conn.compute.create_server(
                name='w-%s-%d' % (tag, n), image_id=ids[i],
                flavor_id=flavor.id, networks='none')
            servers[s.id] = {'image': i, 't0': time.monotonic(),
                             'server': s, 'n': n}
        self.wait_read(servers, poll=3)
        fetched, other = self.store_reads(offset, set(ids))
        decisions = scheduler_decisions(self.scheduler_log, sched_offset)
        self.clean_up(servers, ids)
        secs = [s['seconds'] for s in servers.values()]
        per_host = {}
        for s in servers.values():
            h = per_host.setdefault(s['host'], {'servers': 0,
                                                'images': set()})
            h['servers'] += 1
            h['images'].add(s['image'])
        result = {
            'weigher': on, 'fetched_bytes': fetched,
            'other_store_bytes': other,
            'boot_median_s': statistics.median(secs),
            'boot_max_s': max(secs),
            'hosts': {k: {'servers': v['servers'],
                          'images': sorted(v['images'])}
                      for k, v in sorted(per_host.items())},
            # in create order: what nova-scheduler weighed and chose
            'decisions': [dict(decisions.get(sid, {}), image=s['image'])
                          for sid, s in sorted(servers.items(),
                                               key=lambda x: x[1]['n'])],
        }
        self.echo('  weigher %-3s: fetched %6.1f MiB (other %.1f MiB), '
                  'boot median %5.1f s, max %5.1f s; %s' % (
                      'on' if on else 'off', fetched / MIB, other / MIB,
                      result['boot_median_s'], result['boot_max_s'],
                      ', '.join('%s %d servers/%d images' % (
                          k, v['servers'], len(v['images']))
                          for k, v in result['hosts'].items())))
        # the first creates decide where each family goes
        for n, d in enumerate(result['decisions'][:8]):
            if d.get('scores'):
                self.echo(decision_line(n, d['image'], d))
        return result


def main(argv=None):
    p = argparse.ArgumentParser(prog='bench/bench_weigher.py')
    p.add_argument('--state-dir')
    p.add_argument('--rounds', type=int, default=1)
    p.add_argument('--interval', type=float, default=2.0,
                   help='seconds between server creates (default 2)')
    p.add_argument('--seed', type=int, default=17)
    p.add_argument('--peers', action='store_true',
                   help='keep the hosts\' peer reads on (by default they '
                   'are off for the runs: with them every host reads what '
                   'another holds from it, and the store\'s bytes no '
                   'longer show where the servers went)')
    p.add_argument('--json')
    args = p.parse_args(argv)
    bench = Bench(args.state_dir, args.interval,
                  echo=lambda t: print(t, flush=True))
    bench.setup()
    if not args.peers:
        bench.peers(False)
    rng = random.Random(args.seed)
    rounds = []
    for r in range(args.rounds):
        order = [i for i in range(IMAGES) for _ in range(SERVERS // IMAGES)]
        rng.shuffle(order)
        print('round %d: %d servers of %d images, one every %.1f s'
              % (r + 1, SERVERS, IMAGES, args.interval), flush=True)
        # alternate which configuration goes first
        first = r % 2 == 0
        runs = {}
        for on in (first, not first):
            # a new tag: new images, even after an interrupted run
            runs[on] = bench.run(on, '%d%s-%d' % (
                r, 'on' if on else 'off', time.time()), order)
        ratio = runs[True]['fetched_bytes'] / max(1, runs[False][
            'fetched_bytes'])
        print('round %d: bytes fetched with the weigher / without: %.2f '
              '(goal <= 0.60); against the images\' unique bytes: '
              '%.2f x with, %.2f x without; boot median %.2f x' % (
                  r + 1, ratio,
                  runs[True]['fetched_bytes'] / UNIQUE_BYTES,
                  runs[False]['fetched_bytes'] / UNIQUE_BYTES,
                  runs[True]['boot_median_s']
                  / runs[False]['boot_median_s']), flush=True)
        rounds.append({'with': runs[True], 'without': runs[False],
                       'fetched_ratio': ratio})
    bench.weigher(True)
    if not args.peers:
        bench.peers(True)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(rounds, f, indent=1, sort_keys=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
