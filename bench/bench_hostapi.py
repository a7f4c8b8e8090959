#!/usr/bin/env python3
"""The spawn path through the host API against the in-process call.

vmar-nova-compute used to call ExportService.add in its own process; it
now asks vmar-export serve over the host API (vmar_openstack.hostapi).
This measures what a spawn pays for the export of an image that is
already exported (the common case: every server after an image's first
on a host): one new holder's reference, its NBD export, the reply.

Both paths run against one daemon in the same run, in alternating
rounds: ``in-process`` calls ExportService.add in the bench's process
(the old path), ``api`` calls hostapi.Client.add from a child process
(the new one, as nova-compute does) and the daemon's API thread runs the
same add. Each round adds --holders holders and releases them, untimed.

Needs the patched QEMU (qemu/build.sh). Image: any raw image (its base
is copied whole once, before the rounds).

Usage: bench_hostapi.py --qemu-prefix DIR [--rounds N] [--holders N]
       [--json OUT] IMAGE.raw
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
import uuid

from bench_export import make_conf
from vmar_openstack.host import api
from vmar_openstack.host import service as host_service
from vmar_openstack.host import supervisor
from vmar_openstack import hostapi
from vmar_openstack import ingest

# the API client's side, in a process of its own (as nova-compute is)
_CLIENT = """
import json, sys, time
from vmar_openstack import hostapi
client = hostapi.Client(sys.argv[1])
image_id, prefix, n = sys.argv[2], sys.argv[3], int(sys.argv[4])
out = []
for i in range(n):
    t = time.perf_counter()
    client.add(image_id, holder='%s-%d' % (prefix, i))
    out.append(time.perf_counter() - t)
print(json.dumps(out))
"""


def in_process(svc, image_id, prefix, n):
    out = []
    for i in range(n):
        t = time.perf_counter()
        exp = svc.add(image_id, holder='%s-%d' % (prefix, i))
        svc.uri(exp, '%s-%d' % (prefix, i))
        svc.virtual_size(exp)      # what the old path read from the map
        out.append(time.perf_counter() - t)
    return out


def through_api(path, image_id, prefix, n):
    r = subprocess.run([sys.executable, '-c', _CLIENT, path, image_id,
                        prefix, str(n)], capture_output=True, text=True,
                       check=True)
    return json.loads(r.stdout)


def release(svc, prefix, n):
    for i in range(n):
        svc.release('%s-%d' % (prefix, i))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--qemu-prefix', required=True)
    p.add_argument('--rounds', type=int, default=5)
    p.add_argument('--holders', type=int, default=40)
    p.add_argument('--json')
    p.add_argument('image')
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix='vmar-bench-hostapi-')
    try:
        return run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(args, work):
    sock = os.path.join(work, 'nbd.sock')
    conf = make_conf(os.path.join(work, 'state'), args.qemu_prefix, sock)
    image_id = str(uuid.uuid4())
    ingest.Library(conf).add(image_id, args.image, visibility='public')
    svc = host_service.ExportService(conf)
    proc = supervisor.Supervisor(svc).start_daemon()
    server = None
    try:
        svc.restore()
        svc.ready.set()
        server = api.ApiServer(svc).start()
        svc.add(image_id, holder='first')      # the export exists
        hostapi.Client(server.path).hello()     # and the API answers
        times = {'in-process': [], 'api': []}
        for r in range(args.rounds):
            for how in (('in-process', 'api') if r % 2 else
                        ('api', 'in-process')):
                prefix = '%s-%d' % (how, r)
                if how == 'api':
                    got = through_api(server.path, image_id, prefix,
                                      args.holders)
                else:
                    got = in_process(svc, image_id, prefix, args.holders)
                times[how] += got
                release(svc, prefix, args.holders)
        res = {how: {'median_ms': statistics.median(t) * 1e3,
                     'p90_ms': sorted(t)[int(len(t) * 0.9)] * 1e3,
                     'calls': len(t)} for how, t in times.items()}
        res['ratio_median'] = (res['api']['median_ms']
                               / res['in-process']['median_ms'])
    finally:
        if server:
            server.stop()
        supervisor.Supervisor(svc).quit(proc)
    print('spawn path, export already there (%d calls each, %d rounds):'
          % (res['api']['calls'], args.rounds))
    for how in ('in-process', 'api'):
        print('  %-10s median %.2f ms, p90 %.2f ms'
              % (how, res[how]['median_ms'], res[how]['p90_ms']))
    print('  api / in-process (median): %.2f (goal <= 1.10)'
          % res['ratio_median'])
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == '__main__':
    sys.exit(main())
