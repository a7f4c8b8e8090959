#!/usr/bin/env python3
"""Store bytes for N hosts reading one image, with peers and without.

Issue 34's first figure: the store should serve each block about once per
cloud, not once per host. Everything is real but the network (one
machine): RabbitMQ, glance-api (file store, MariaDB; uwsgi's request log
counts the bytes its ``/file`` range requests send), vmar-agent (ingest,
maps, digest lists, the hosts' reports and the holders RPC) and N
``vmar-export serve`` lazy hosts (``map_source = glance``), each with its
own host directory, export daemon, range server and, with peers, peer
server (TLS, the run's host CA) and discovery.

The hosts read the image one after the other, the whole of it through
their own NBD export (``qemu-img compare`` with the image file: what
they read is also checked), as servers booted on them in turn would;
before a host reads, the agent has the reports of the hosts before it.
Two runs, each on fresh host directories:

* ``store``: no peer server, no discovery: every host fetches from
  Glance (the baseline, and today's behaviour);
* ``peers``: ``[vmar_peers] listen_address`` and ``discover`` on every
  host: a host asks the agent who holds the image and reads from them.

With ``--latency`` it then measures a guest's read latency on a serving
host: random 4 KiB reads (fio, queue depth 1) of host 0's export, alone,
while the other hosts, their mirrors emptied, read the whole image at
once from the store (the machine as busy: on one machine the readers
share host 0's CPUs), and while they read it from host 0 (its peer
server at ``--rate-mib``). Serving's cost is the last against the
second.

Figures: Glance's bytes per host and in all, the ratio peers / store,
the fio latency percentiles (p50, p99) of both phases. Times are context
(one machine: no network between the hosts).

Usage: bench_peers_hosts.py --qemu-prefix DIR [--image minbase]
       [--hosts 4] [--latency] [--rate-mib 100] [--json OUT]
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                '..'))

from oslo_config import cfg  # noqa: E402

import bench_peers  # noqa: E402
from tools.vmarenv import glance_env  # noqa: E402
from tools.vmarenv import pki  # noqa: E402
from tools.vmarenv import process  # noqa: E402
from tools.vmarenv import qemu_env  # noqa: E402
from tools.vmarenv import rabbitmq_env  # noqa: E402
from tools.vmarenv import services  # noqa: E402
from vmar_openstack import conf as vmar_conf  # noqa: E402
from vmar_openstack.db import hosts as db_hosts  # noqa: E402
from vmar_openstack.db import migration  # noqa: E402
from vmar_openstack.host.exports import hostdir  # noqa: E402
from vmar_openstack.host.peers import source as peer_source  # noqa: E402
from vmar_openstack.mapsource import glance as gsource  # noqa: E402

MIB = 1 << 20
BIN = os.path.dirname(sys.executable)


class Cloud:
    """RabbitMQ, glance-api and vmar-agent, and the library's config."""

    def __init__(self, work):
        self.work = work
        self.rabbit = rabbitmq_env.RabbitMQ(os.path.join(work, 'rabbit'))
        self.glance = self.agent = None

    def start(self):
        self.rabbit.start()
        self.glance = glance_env.GlanceAPI(
            os.path.join(self.work, 'glance'), self.rabbit.transport_url,
            extra_config={'database': {
                'connection': services.mariadb_database('benchpeers')}})
        self.glance.start()
        state = os.path.join(self.work, 'library')
        os.makedirs(state)
        self.conf_file = os.path.join(self.work, 'vmar.conf')
        glance_env.write_conf(self.conf_file, {
            'DEFAULT': {'transport_url': self.rabbit.transport_url},
            'vmar': {'state_dir': state},
            'vmar_database': {
                'connection': 'sqlite:///%s/vmar.sqlite' % state},
            'vmar_glance': {'auth_type': 'none',
                            'endpoint': self.glance.endpoint,
                            'endpoint_override': self.glance.endpoint}})
        self.conf = cfg.ConfigOpts()
        vmar_conf.register_opts(self.conf)
        self.conf(['--config-file', self.conf_file], project='vmar')
        migration.upgrade('head', conf=self.conf)
        with open(os.path.join(self.work, 'agent.log'), 'ab') as log:
            self.agent = subprocess.Popen(
                [os.path.join(BIN, 'vmar-agent'), '--config-file',
                 self.conf_file], stdout=log, stderr=log,
                stdin=subprocess.DEVNULL)

    def upload(self, path, timeout=600):
        """Upload an image; its id once its map and digest list are out."""
        out = self.glance.openstack(
            'image', 'create', '--file', path, '--disk-format', 'raw',
            '--container-format', 'bare', '-f', 'value', '-c', 'id',
            'bench-peers-hosts')
        image_id = out.stdout.strip().splitlines()[-1]
        uuid.UUID(image_id)
        source = gsource.GlanceSource(self.conf)
        dest = os.path.join(self.work, 'digests-check')
        deadline = time.monotonic() + timeout
        while True:
            try:
                source.current_version(image_id)
                source.fetch_digests(image_id, dest)
                return image_id
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)

    def stop(self):
        if self.agent and self.agent.poll() is None:
            self.agent.terminate()
            self.agent.wait(30)
        for svc in (self.glance, self.rabbit):
            if svc:
                try:
                    svc.stop()
                except Exception:
                    pass


class Host:
    """One compute host: ``vmar-export serve`` of its own directory."""

    def __init__(self, cloud, run, index, tls=None):
        self.cloud, self.index, self.tls = cloud, index, tls
        self.name = '%s-%d' % (run, index)
        self.dir = os.path.join(cloud.work, self.name)
        self.conf_file = self.dir + '.conf'
        self.port = process.free_port() if tls else None
        self.cmd = [os.path.join(BIN, 'vmar-export'), '--config-file',
                    self.conf_file]
        self.proc = self.sock_dir = None

    def _configure(self):
        cloud = self.cloud
        self.sock_dir = tempfile.mkdtemp(prefix='vmar-bph-', dir='/run')
        peers = {}
        if self.tls:
            peers = {'vmar_peers': {
                'listen_address': '127.0.0.1', 'listen_port': self.port,
                'discover': 'true', 'tls_dir': self.tls,
                'rate_mib': cloud.rate_mib}}
        glance_env.write_conf(self.conf_file, {
            'DEFAULT': {'transport_url': cloud.rabbit.transport_url},
            'vmar_host': {
                'host': self.name, 'host_dir': self.dir,
                'map_source': 'glance', 'base_fetch': 'lazy',
                'report_interval': '1', 'fill': 'false',
                'warm_metadata_mb': '0',
                'export_socket': os.path.join(self.sock_dir, 'nbd.sock'),
                'qemu_storage_daemon': qemu_env.qemu_bin(
                    'qemu-storage-daemon')},
            'vmar_glance': {'auth_type': 'none',
                            'endpoint': cloud.glance.endpoint,
                            'endpoint_override': cloud.glance.endpoint},
            **peers})

    def start(self):
        self._configure()
        os.makedirs(self.dir, exist_ok=True)
        with open(self.dir + '-serve.log', 'ab') as log:
            self.proc = subprocess.Popen(
                self.cmd + ['serve'], stdout=log, stderr=log,
                stdin=subprocess.DEVNULL, start_new_session=True)
        sock = os.path.join(self.sock_dir, 'nbd.sock')
        deadline = time.monotonic() + 120
        while not os.path.exists(sock):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError('%s did not start: see %s-serve.log'
                                   % (self.name, self.dir))
            time.sleep(0.2)

    def add(self, image_id):
        r = subprocess.run(self.cmd + ['add', image_id], capture_output=True,
                           text=True, check=True)
        return r.stdout.strip().split()[-1]

    def read_all(self, uri, image_path):
        """The whole export, compared with the image file."""
        t = time.monotonic()
        subprocess.run([qemu_env.SYSTEM_QEMU_IMG, 'compare', '-f', 'raw',
                        '-F', 'raw', uri, image_path], check=True,
                       capture_output=True)
        return time.monotonic() - t

    def held(self, image_id):
        return hostdir.Layout(self.dir).holdings().get(image_id) or 0

    def peer_counts(self):
        return peer_source.read_counts(
            hostdir.Layout(self.dir).peer_counts_file())

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.sock_dir:
            shutil.rmtree(self.sock_dir, ignore_errors=True)

    def empty(self):
        """Stopped, and everything it held gone: a cold host."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def wait_reported(cloud, hosts, image_id, timeout=60):
    """Until the agent has each host's last word on the image.

    That is, what its mirror holds on disk, once that stopped changing
    (the present bits reach the disk after the data).
    """
    reports = db_hosts.HostReports(cloud.conf)
    deadline = time.monotonic() + timeout
    last = None
    while True:
        held = {h.name: h.held(image_id) for h in hosts}
        told = {r.host: dict(r.holds).get(image_id) or 0
                for r in reports.list()}
        if held == last and all(told.get(n) == b for n, b in held.items()):
            return
        if time.monotonic() > deadline:
            raise RuntimeError('the agent has not heard what %s hold: %s, '
                               'not %s' % (sorted(held), told, held))
        last = held
        time.sleep(1)


def one_run(cloud, run, n, image_id, image_path, tls):
    """N hosts read the image in turn; Glance's bytes and times each."""
    hosts = [Host(cloud, run, i, tls) for i in range(n)]
    out = []
    for h in hosts:
        h.start()
    for i, h in enumerate(hosts):
        if tls and i:
            wait_reported(cloud, hosts[:i], image_id)
        before = bench_peers.glance_bytes(cloud.glance)
        secs = h.read_all(h.add(image_id), image_path)
        sent = bench_peers.glance_bytes(cloud.glance) - before
        time.sleep(peer_source.COUNTS_INTERVAL + 0.5)
        peers = h.peer_counts()
        out.append({'host': h.name, 'glance_bytes': sent, 'seconds': secs,
                    'peer_counts': peers})
        print('%-8s host %d: Glance sent %7.1f MiB, peers %7.1f MiB (%d '
              'runs not held), read in %5.1f s' % (
                  run, i, sent / MIB, peers['peer_bytes'] / MIB,
                  peers['not_held'], secs), flush=True)
    return hosts, out


def fio_latency(uri, runtime):
    """p50 and p99 completion latency (us) of 4 KiB random reads, QD 1."""
    r = subprocess.run(
        ['fio', '--name=lat', '--ioengine=nbd', '--uri=%s' % uri,
         '--rw=randread', '--bs=4k', '--iodepth=1', '--time_based',
         '--runtime=%d' % runtime, '--output-format=json'],
        capture_output=True, text=True, check=True)
    doc = json.loads(r.stdout[r.stdout.index('{'):])
    pct = doc['jobs'][0]['read']['clat_ns']['percentile']
    return (pct['50.000000'] / 1000, pct['99.000000'] / 1000,
            doc['jobs'][0]['read']['iops'])


def latency(cloud, hosts, image_id, image_path, runtime):
    """Host 0's guest read latency, in three phases.

    Alone; while the other hosts, emptied, read the image from the store
    (the machine as busy, host 0 serving nothing); and while they read it
    from host 0 (serving them).
    """
    server, readers = hosts[0], hosts[1:]
    uri = server.add(image_id)
    out = {'readers': len(readers), 'alone': fio_latency(uri, runtime)}
    for phase, tls in (('store', None), ('serving', server.tls)):
        # cold readers: the agent learns it from their next reports
        for h in readers:
            h.empty()
            h.tls = tls
            h.start()
        wait_reported(cloud, readers, image_id, timeout=30)
        before = bench_peers.glance_bytes(cloud.glance)
        uris = [h.add(image_id) for h in readers]
        procs = [subprocess.Popen(
            [qemu_env.SYSTEM_QEMU_IMG, 'compare', '-f', 'raw', '-F', 'raw',
             u, image_path], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL) for u in uris]
        t = time.monotonic()
        lat = fio_latency(uri, runtime)
        for p in procs:
            p.wait()
        if any(p.returncode for p in procs):
            raise RuntimeError('a reader read wrong bytes')
        out[phase] = lat
        out[phase + '_readers_seconds'] = time.monotonic() - t
        out[phase + '_glance_bytes'] = (bench_peers.glance_bytes(
            cloud.glance) - before)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--qemu-prefix', required=True)
    p.add_argument('--image', default='minbase')
    p.add_argument('--hosts', type=int, default=4)
    p.add_argument('--latency', action='store_true')
    p.add_argument('--latency-runtime', type=int, default=10)
    p.add_argument('--rate-mib', type=int, default=100)
    p.add_argument('--json')
    args = p.parse_args()
    os.environ['VMAR_QEMU_PREFIX'] = args.qemu_prefix
    image_path = qemu_env.image_library()[args.image]
    work = tempfile.mkdtemp(prefix='vmar-bench-peers-hosts-')
    cloud = Cloud(work)
    cloud.rate_mib = args.rate_mib
    hosts = []
    try:
        ca = os.path.join(work, 'ca')
        pki.make_ca(ca, 'bench host CA')
        tls = os.path.join(work, 'tls')
        pki.make_cert(ca, tls, 'server', '127.0.0.1', 'IP:127.0.0.1')
        pki.make_cert(ca, tls, 'client', 'compute')
        cloud.start()
        image_id = cloud.upload(image_path)
        data = sum(n for _o, n in bench_peers.data_runs(image_path))
        res = {'image': args.image, 'hosts': args.hosts,
               'data_bytes': data, 'rate_mib': args.rate_mib}
        for run, creds in (('store', None), ('peers', tls)):
            run_hosts, res[run] = one_run(cloud, run, args.hosts, image_id,
                                          image_path, creds)
            hosts += run_hosts
            if run == 'store':
                for h in run_hosts:
                    h.stop()
        totals = {run: sum(h['glance_bytes'] for h in res[run])
                  for run in ('store', 'peers')}
        res['totals'] = totals
        print('Glance sent in all: store %.1f MiB (%.2f x the data), '
              'peers %.1f MiB (%.2f x the data); peers / store = %.3f'
              % (totals['store'] / MIB, totals['store'] / data,
                 totals['peers'] / MIB, totals['peers'] / data,
                 totals['peers'] / totals['store']))
        if args.latency:
            lat = latency(cloud, hosts[args.hosts:], image_id, image_path,
                          args.latency_runtime)
            res['latency'] = lat
            a = lat['alone']
            for phase, what in (('alone', 'alone'),
                                ('store', 'others reading the store'),
                                ('serving', 'serving the others')):
                p50, p99, iops = lat[phase]
                extra = ('' if phase == 'alone' else
                         '; the %d readers took %.1f s, Glance sent %.1f MiB'
                         % (lat['readers'], lat[phase + '_readers_seconds'],
                            lat[phase + '_glance_bytes'] / MIB))
                print('host 0 guest reads (4 KiB random, QD 1), %-26s p50 '
                      '%4.0f us (%.2f x alone), p99 %5.0f us (%.2f x)%s'
                      % (what + ':', p50, p50 / a[0], p99, p99 / a[1],
                         extra))
            print('serving against the same load from the store: p50 '
                  '%.2f x, p99 %.2f x' % (lat['serving'][0] / lat['store'][0],
                                          lat['serving'][1] / lat['store'][1]))
        if args.json:
            with open(args.json, 'w') as f:
                json.dump(res, f, indent=1)
    finally:
        for h in hosts:
            h.stop()
        cloud.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == '__main__':
    main()
