#!/usr/bin/env python3
"""Issue 35's measured figures: hosts reporting, the weigher, the library.

``hosts``: a library of ``--bases`` synthetic bases and their derived
images (real ingests, :class:`vmar_openstack.ingest.Library`) on SQLite,
MariaDB or PostgreSQL; a real RabbitMQ and a real ``vmar-agent``; then
``--hosts`` simulated compute hosts that send the real ``vmar.host.exports``
notification (:mod:`vmar_openstack.host.observe.report`'s payload, through
oslo.messaging's notifier, on ``[vmar_reports] report_topic``) every
``--interval`` seconds, each at its own phase, for ``--minutes``. Time
runs ``--speed`` times faster than the real schedule: at ``--speed 6`` a
10-minute run is an hour of simulated time, at six times the real rate.

What a simulated host holds: each host keeps a Poisson(``--holds``) number
of the bases (at least one), drawn by popularity (Zipf, exponent 1: a few
OS releases carry most servers); a tenth of them whole, the others as
mirrors holding a uniform 5-100 % of the base's blocks. Its servers (a
Poisson(``--servers``) number) run images of those bases (the base or one
of its derived images). At each report one server goes and one comes with
probability ``--churn``, which may add a base.

Figures, measured against the agent's own ``/metrics``
(``vmar_agent_report_seconds``) and RabbitMQ's queue:

* **time per report**: the agent's mean and the report rate it sustains
  when the queue is full (a flood of one report per host at the start,
  before the schedule: the rate is what the agent drains); on the
  schedule, how many reports were unchanged (``vmar_agent_reports_total``:
  their host's row alone moved); the mirrors here do not grow between
  reports, so every report without a churn is one;
* **keeps up**: the queue's depth sampled every two seconds over the run
  (max and at the end) against the rate the schedule asks;
* **rows**: ``vmar_hosts``, ``vmar_host_exports``, ``vmar_host_bases``;
* **a map-GC pass**: :func:`vmar_openstack.glance_hooks.gc.plan` (what the
  agent computes each pass before it deletes) at this scale;
* **the weigher**: nova-scheduler's real ``HostWeightHandler`` with the
  real ``VmarWeigher`` over ``--hosts`` ``HostState`` objects, each lookup
  one ``RequestSpec`` of a vmar flavor for a random image: p50/p99 while
  the reports arrive (in a process of their own, as nova-scheduler's) and
  on a quiet database after them (goal: p99 <= 10 ms); the baseline is
  the same handler with Nova's RAM weigher alone.

``library``: a cloud's catalogue added image by image (:class:`Cloud`:
bases in families, derived images, snapshots; sizes divided by
``--scale``), on PostgreSQL, MariaDB or SQLite. Figures: the add time per
GiB of data around #10, #1,000 and #10,000 (goal: #10,000 <= 1.3 x
#1,000), the database's size per image, the largest cluster and a map
built against it, and the delete of the image canonical for the most
shared blocks (its time, the maps it rewrites and those it leaves to
vmar-agent's pass, ``[vmar] rewrite_at_once``; then the pass, a batch of
50 maps per transaction; each map a map image vmar-agent republishes to
Glance).

Usage: bench_scale.py hosts [--db sqlite|mariadb|postgresql] [--hosts N]
       [--bases N] [--derived N] [--minutes M] [--speed X] [--json FILE]
       [--smoke]
       bench_scale.py library [--db ...] [--images N] [--bases N]
       [--derived P] [--scale S] [--rewrite-at-once N] [--json FILE]
       [--smoke]
"""

import argparse
import json
import logging
import multiprocessing
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TOP)
sys.path.insert(0, os.path.join(TOP, 'bench'))

import numpy as np  # noqa: E402
from oslo_config import cfg  # noqa: E402
from prometheus_client import parser as prom_parser  # noqa: E402
from sqlalchemy import exc as sa_exc  # noqa: E402

import bench_ingest  # noqa: E402
from tools.vmarenv import glance_env  # noqa: E402
from tools.vmarenv import process  # noqa: E402
from tools.vmarenv import rabbitmq_env  # noqa: E402
from tools.vmarenv import services  # noqa: E402
from vmar_openstack import conf as vmar_conf  # noqa: E402
from vmar_openstack.db import hosts as db_hosts  # noqa: E402
from vmar_openstack.db import migration  # noqa: E402
from vmar_openstack.glance_hooks import gc  # noqa: E402
from vmar_openstack import ingest  # noqa: E402
from vmar_openstack import names  # noqa: E402

BS = 4096


def database(kind, state, name='scale'):
    """A new, empty library database of ``kind``, named after ``name``.

    A database of its own on the server, which the functional tests (who
    reset the default one) and other runs leave alone.
    """
    if kind == 'sqlite':
        return 'sqlite:///%s/vmar.sqlite' % state
    if kind == 'mariadb':
        return services.mariadb_database(name)
    if kind == 'postgresql':
        return services.postgresql_database(name)
    raise ValueError('no %s database here (writers only)' % kind)


class Redone(logging.Handler):
    """Counts the ingests that looked their fingerprints up again.

    An ingest prepares its lookups and map in a snapshot and uses them
    only if no library mutation committed meanwhile
    (:mod:`vmar_openstack.ingest.ahead`).
    """

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record):
        msg = record.getMessage()
        # the message of before 0cfce86, and of since
        if ('looking its fingerprints up again' in msg
                or 'building its map under the lock' in msg):
            self.count += 1


def ingest_images(conf, work, k, mib, tag):
    """Add ``k`` images of ``mib`` MiB, each half new: their add times."""
    lib = ingest.Library(conf)
    n = mib * (1 << 20) // BS
    path = os.path.join(work, 'ingest-%s.raw' % tag)
    times = []
    for i in range(k):
        seeds = np.concatenate([10 ** 6 + np.arange(n // 2), 10 ** 14 * (
            1 + i) + (0 if tag == 'quiet' else 10 ** 8) + np.arange(n // 2)])
        bench_ingest.write_blocks(path, seeds)
        bench_ingest.settle(path)
        t = time.perf_counter()
        lib.add(str(uuid.uuid4()), path, keep_base=False,
                visibility='public')
        times.append(time.perf_counter() - t)
    os.unlink(path)
    return times


def library_conf(path):
    conf = cfg.ConfigOpts()
    vmar_conf.register_opts(conf)
    conf(['--config-file', path], project='vmar', default_config_files=[])
    return conf


def make_library(conf, work, n_bases, derived, mib, seed=35):
    """Bases and derived images, ingested: ``[(image, base index)]``.

    A base is its family's shared blocks (family = ten bases: the same
    distribution's releases) and its own; a derived image is its base with
    2 % of the blocks changed and its own packages appended. Returns the
    images with their current map versions.
    """
    lib = ingest.Library(conf)
    rnd = np.random.default_rng(seed)
    n = mib * (1 << 20) // BS
    path = os.path.join(work, 'scale.raw')
    images, versions = [], {}
    for b in range(n_bases):
        family = 10 ** 6 * (1 + b // 10) + np.arange(n // 2)
        base = np.concatenate([family, 10 ** 9 * (1 + b)
                               + np.arange(n - n // 2)])
        for d in range(derived + 1):
            seeds = base.copy()
            if d:
                own = rnd.choice(n, size=n // 50, replace=False)
                seeds[own] += 10 ** 12 * d
                seeds = np.concatenate([seeds, 10 ** 13 * (1 + b) + 10 ** 4
                                        * d + np.arange(n // 8)])
            bench_ingest.write_blocks(path, seeds)
            image_id = str(uuid.uuid4())
            out = lib.add(image_id, path, keep_base=False,
                          visibility='public')
            versions[image_id] = out.map_version
            versions.update(out.regenerated)
            images.append((image_id, b))
    os.unlink(path)
    return [(i, b, versions[i]) for i, b in images]


class Hosts:
    """The simulated hosts' state and their reports' payloads."""

    def __init__(self, n, images, n_bases, holds, servers, churn, seed=35):
        self.rnd = random.Random(seed)
        self.images = images
        self.by_base = {}
        for image_id, b, v in images:
            self.by_base.setdefault(b, []).append((image_id, v))
        self.bases = [self.by_base[b][0][0] for b in range(n_bases)]
        # Zipf(1) popularity of the bases
        self.weights = [1.0 / (k + 1) for k in range(n_bases)]
        self.churn = churn
        self.hosts = {}
        np_rnd = np.random.default_rng(seed)
        for h in range(n):
            name = 'sim-%04d' % h
            k = max(1, int(np_rnd.poisson(holds)))
            held = set(self.rnd.choices(range(n_bases), self.weights, k=k))
            exports = [self._server(held)
                       for _ in range(int(np_rnd.poisson(servers)))]
            self.hosts[name] = {'held': held, 'exports': exports,
                                'fill': {}}

    def _server(self, held):
        b = self.rnd.choice(sorted(held))
        return self.rnd.choice(self.by_base[b])

    def payload(self, name):
        h = self.hosts[name]
        if h['exports'] and self.rnd.random() < self.churn:
            h['exports'].pop(self.rnd.randrange(len(h['exports'])))
            b = self.rnd.choices(range(len(self.bases)), self.weights)[0]
            h['held'].add(b)
            h['exports'].append(self._server(h['held']))
        holds = []
        for b in sorted(h['held']):
            if b not in h['fill']:
                h['fill'][b] = (None if self.rnd.random() < 0.1
                                else self.rnd.uniform(0.05, 1.0))
            f = h['fill'][b]
            holds.append([self.bases[b],
                          None if f is None else int(f * 256 * 16)])
        return {'host': name,
                'exports': sorted([list(e) for e in set(h['exports'])]),
                'holds': holds,
                'complete': [], 'peer': '%s:10810' % name,
                'load': round(self.rnd.uniform(0, 1.5), 3)}


def scrape(port, tries=6):
    """The agent's metrics, by name (and ``name:label values``).

    An agent draining a flood may not answer within the timeout (its
    pool's threads hold the GIL): tried again, ``tries`` times in all.
    """
    for k in range(tries):
        try:
            with urllib.request.urlopen(
                    'http://127.0.0.1:%d/metrics' % port, timeout=10) as r:
                text = r.read().decode()
            break
        except (TimeoutError, urllib.error.URLError):
            if k == tries - 1:
                raise
    out = {}
    for fam in prom_parser.text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
            if s.labels:    # and each series: name:label values
                key = '%s:%s' % (s.name, ','.join(
                    v for _k, v in sorted(s.labels.items())))
                out[key] = out.get(key, 0.0) + s.value
    return out


def unchanged(m0, m1):
    """Reports the agent recorded as unchanged between two scrapes."""
    key = 'vmar_agent_reports_total:unchanged'
    return int(m1.get(key, 0) - m0.get(key, 0))


class QueueDepth:
    """Messages waiting in the agent's queue (a passive declare)."""

    def __init__(self, url, queue):
        import kombu
        self.conn = kombu.Connection(url.replace('rabbit://', 'amqp://'))
        self.queue = queue

    def __call__(self):
        ch = self.conn.channel()
        try:
            return ch.queue_declare(self.queue, passive=True).message_count
        finally:
            ch.close()


def agent_queue(rabbit, topic):
    names_ = rabbit.ctl('list_queues', '-q', 'name').stdout.split()
    found = [q for q in names_ if q.startswith(topic)]
    if not found:
        raise RuntimeError('no queue of %s among %s' % (topic, names_))
    return found[0]


class Weighing:
    """nova-scheduler's weight handler over the simulated hosts."""

    def __init__(self, host_names):
        from nova import objects
        from nova.scheduler import host_manager
        from nova.scheduler import weights
        from nova.scheduler.weights import ram
        from vmar_openstack.nova_scheduler import weigher
        objects.register_all()
        self.objects = objects
        cell = str(uuid.uuid4())
        self.states = []
        for h in host_names:
            s = host_manager.HostState(h, h, cell)
            s.free_ram_mb = 65536
            self.states.append(s)
        self.handler = weights.HostWeightHandler()
        self.vmar = [weigher.VmarWeigher()]
        self.ram = [ram.RAMWeigher()]

    def spec(self, image_id):
        o = self.objects
        return o.RequestSpec(
            flavor=o.Flavor(extra_specs={'vmar:enabled': 'true'}),
            image=o.ImageMeta(id=image_id))

    def once(self, image_id, vmar=True):
        spec = self.spec(image_id)
        t = time.perf_counter()
        out = self.handler.get_weighed_objects(
            self.vmar if vmar else self.ram, self.states, spec)
        dt = time.perf_counter() - t
        return dt, out


def lookups_process(url, host_names, image_ids, rate, stop, out, seed=11):
    """Weigh requests at ``rate`` a second until ``stop`` is set.

    The body of a process of its own, as nova-scheduler's: under the
    schedule the bench's process is busy sending reports and ingesting, and
    its lookups would wait on its interpreter lock, which no scheduler
    does. Sends ``(times, hosts)`` to the pipe ``out`` at the end: each
    lookup's time (s) and how many hosts it weighed above 0 (none would,
    were the process not reading the bench's database).
    """
    vmar_conf.CONF([], project='vmar', default_config_files=[])
    vmar_conf.CONF.set_override('connection', url, 'vmar_database')
    w = Weighing(host_names)
    rnd = random.Random(seed)
    times, held = [], []
    out.send('ready')
    while not stop.wait(1.0 / rate):
        dt, weighed = w.once(rnd.choice(image_ids))
        times.append(dt)
        held.append(above_zero(weighed))
    out.send((times, held))
    out.close()


class Lookups:
    """:func:`lookups_process` in a spawned process, started and stopped."""

    def __init__(self, url, host_names, image_ids, rate):
        ctx = multiprocessing.get_context('spawn')
        self._stop = ctx.Event()
        self._recv, send = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(
            target=lookups_process, name='vmar-bench-lookups',
            args=(url, host_names, image_ids, rate, self._stop, send))
        self._proc.start()
        send.close()
        # its imports (Nova's) and first connection are not lookups
        if not self._recv.poll(120) or self._recv.recv() != 'ready':
            self._proc.kill()
            raise RuntimeError('the lookup process did not start')

    def stop(self):
        """:func:`lookups_process`'s ``(times, hosts)``, once it ends."""
        self._stop.set()
        try:
            if not self._recv.poll(60):
                raise RuntimeError('the lookup process did not answer')
            return self._recv.recv()
        finally:
            self._proc.join(30)
            if self._proc.is_alive():
                self._proc.kill()


def above_zero(weighed):
    """How many of Nova's weighed hosts weigh more than 0."""
    return sum(1 for o in weighed if o.weight > 0)


def pct(values, q):
    if not values:
        return None
    return float(np.percentile(np.asarray(values), q))


def weigh_many(w, images, n, vmar=True, seed=7):
    rnd = random.Random(seed)
    times, held = [], 0
    for _ in range(n):
        dt, out = w.once(rnd.choice(images)[0], vmar)
        times.append(dt)
        held += above_zero(out)
    return {'lookups': n, 'p50_ms': pct(times, 50) * 1e3,
            'p99_ms': pct(times, 99) * 1e3,
            'mean_hosts_weighed_above_0': held / n}


def run_hosts(args):
    work = args.work
    state = os.path.join(work, 'state')
    os.makedirs(state)
    rabbit = rabbitmq_env.RabbitMQ(os.path.join(work, 'rabbit'))
    rabbit.start()
    agent = None
    try:
        url = database(args.db, state,
                       'scale_smoke' if args.smoke else 'scale')
        metrics_port = process.free_port()
        conf_file = os.path.join(work, 'vmar.conf')
        glance_env.write_conf(conf_file, {
            'DEFAULT': {'transport_url': rabbit.transport_url},
            'vmar': {'state_dir': state},
            'vmar_database': {'connection': url},
            # no Glance here: the agent's periodic work against it is off
            'vmar_glance': {'auth_type': 'none',
                            'endpoint': 'http://127.0.0.1:9',
                            'endpoint_override': 'http://127.0.0.1:9'},
            'vmar_agent': dict({'resync_interval': '0',
                                'map_gc_interval': '0',
                                'metrics_port': str(metrics_port)},
                               **({'report_workers': str(args.report_workers)}
                                  if args.report_workers else {}))})
        conf = library_conf(conf_file)
        migration.upgrade('head', conf=conf)
        vmar_conf.CONF([], project='vmar', default_config_files=[])
        vmar_conf.CONF.set_override('connection', url, 'vmar_database')
        t = time.perf_counter()
        images = make_library(conf, work, args.bases, args.derived, args.mib)
        lib_s = time.perf_counter() - t
        print('library: %d images (%d bases) in %.1f s on %s'
              % (len(images), args.bases, lib_s, args.db), flush=True)
        sim = Hosts(args.hosts, images, args.bases, args.holds,
                    args.servers, args.churn)
        log = open(os.path.join(work, 'agent.log'), 'ab')
        agent = subprocess.Popen(
            [os.path.join(os.path.dirname(sys.executable), 'vmar-agent'),
             '--config-file', conf_file], stdout=log, stderr=log,
            stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                scrape(metrics_port)
                break
            except OSError:
                if time.monotonic() > deadline or agent.poll() is not None:
                    raise RuntimeError('vmar-agent did not start; see %s'
                                       % log.name)
                time.sleep(0.5)
        import oslo_messaging
        transport = oslo_messaging.get_notification_transport(
            conf, url=rabbit.transport_url)
        topic = conf.vmar_reports.report_topic
        notifier = oslo_messaging.Notifier(
            transport, publisher_id='vmar-export.sim', driver='messagingv2',
            topics=[topic])
        time.sleep(2)
        depth = QueueDepth(rabbit.transport_url,
                           agent_queue(rabbit, conf.vmar_agent.pool))
        w = Weighing(sorted(sim.hosts))
        result = {'db': args.db, 'hosts': args.hosts, 'bases': args.bases,
                  'images': len(images), 'library_s': lib_s,
                  'interval_s': args.interval, 'speed': args.speed,
                  'minutes': args.minutes, 'ingest_mib': args.ingest_mib}
        # the flood: one report per host, sent as fast as possible
        m0 = scrape(metrics_port)
        t0 = time.perf_counter()
        for name in sorted(sim.hosts):
            notifier.info({}, names.HOST_EXPORTS_EVENT, sim.payload(name))
        sent_s = time.perf_counter() - t0
        # each scrape timed: what a Prometheus server waits for meanwhile
        scrapes, waiting = [], 0
        while True:
            t = time.perf_counter()
            m = scrape(metrics_port)
            scrapes.append(time.perf_counter() - t)
            waiting = max(waiting, m.get('vmar_agent_reports_waiting', 0))
            if not depth() and m.get(
                    'vmar_agent_report_seconds_count', 0) - m0.get(
                    'vmar_agent_report_seconds_count', 0) >= args.hosts:
                break
            time.sleep(0.2)
        drain_s = time.perf_counter() - t0
        m1 = scrape(metrics_port)
        n = (m1['vmar_agent_report_seconds_count']
             - m0.get('vmar_agent_report_seconds_count', 0))
        result['flood'] = {
            'reports': n, 'send_s': sent_s, 'drain_s': drain_s,
            'reports_per_s': n / drain_s,
            'mean_record_ms': 1e3 * (m1['vmar_agent_report_seconds_sum']
                                     - m0.get('vmar_agent_report_seconds_sum',
                                              0)) / n,
            'scrapes': len(scrapes), 'scrape_p50_s': pct(scrapes, 50),
            'scrape_max_s': max(scrapes), 'reports_waiting_max': waiting}
        print('flood: %d reports drained in %.1f s: %.1f/s, %.1f ms each '
              'to record; %d scrapes of /metrics meanwhile took %.2f s '
              '(median), %.2f s at most' % (
                  n, drain_s, n / drain_s, result['flood']['mean_record_ms'],
                  len(scrapes), pct(scrapes, 50), max(scrapes)), flush=True)
        result['weigher_baseline_ram'] = weigh_many(w, images, args.lookups,
                                                    vmar=False)
        result['weigher_quiet_before'] = weigh_many(w, images, args.lookups)
        # ingests without reports, then beside the schedule
        redone = Redone()
        lib_log = logging.getLogger('vmar_openstack.ingest.library')
        lib_log.setLevel(logging.DEBUG)
        lib_log.addHandler(redone)
        quiet = ingest_images(conf, work, args.ingests, args.ingest_mib,
                              'quiet')
        result['ingest_quiet'] = {'times': quiet,
                                  'redone': redone.count}
        redone.count = 0
        # the schedule, with weigher lookups and ingests beside it
        result['schedule'] = schedule(
            args, sim, notifier, depth, metrics_port, url, images,
            lambda: ingest_images(conf, work, args.ingests,
                                  args.ingest_mib, 'loaded'))
        result['ingest_loaded'] = {'times': result['schedule'].pop(
            'ingest_times'), 'redone': redone.count}
        result['weigher_quiet'] = weigh_many(w, images, args.lookups)
        with open(log.name, errors='replace') as f:
            # reports the agent could not record and put back in the queue
            result['agent_requeued'] = f.read().count(' not recorded: ')
        reports = db_hosts.HostReports(conf)
        result['rows'] = reports.counts()
        lib = ingest.Library(conf)
        t = time.perf_counter()
        p = gc.plan(conf, lib, min_age=0)
        result['gc_plan'] = {'s': time.perf_counter() - t,
                             'superseded': len(p.deletable) + len(p.kept),
                             'deletable': len(p.deletable)}
        print(json.dumps(result, indent=1, default=str), flush=True)
        report(result)
        if args.json:
            with open(args.json, 'w') as f:
                json.dump(result, f, indent=1, default=str)
        return result
    finally:
        if agent is not None:
            agent.terminate()
            try:
                agent.wait(30)
            except subprocess.TimeoutExpired:
                agent.kill()
        rabbit.stop()


def schedule(args, sim, notifier, depth, metrics_port, url, images,
             ingests):
    """Every host reports every ``interval / speed`` s for ``minutes``.

    Beside it: weigher lookups at ``--lookup-rate`` in a process of their
    own (:class:`Lookups`, on the database ``url``), the queue's depth
    every two seconds, and ``ingests()`` once, from the start.
    """
    period = args.interval / args.speed
    names_ = sorted(sim.hosts)
    phase = {h: random.Random(h).uniform(0, period) for h in names_}
    stop = threading.Event()
    samples = []

    def sample():
        while not stop.wait(2):
            samples.append((time.monotonic() - start, depth()))

    ingest_times = []

    def ingest():
        ingest_times.extend(ingests())
    weigher = Lookups(url, names_, [i[0] for i in images],
                      args.lookup_rate)
    m0 = scrape(metrics_port)
    start = time.monotonic()
    threads = [threading.Thread(target=f, daemon=True)
               for f in (sample, ingest)]
    for t in threads:
        t.start()
    end = start + args.minutes * 60
    sent = late = 0
    k = 0
    while True:
        # report k of every host: at its phase plus k periods
        due = sorted((start + phase[h] + k * period, h) for h in names_)
        if due[0][0] >= end:
            break
        for at, h in due:
            if at >= end:
                break
            now = time.monotonic()
            if at > now:
                time.sleep(at - now)
            elif now - at > 1:
                late += 1
            notifier.info({}, names.HOST_EXPORTS_EVENT, sim.payload(h))
            sent += 1
        k += 1
    stop.set()
    lookups, held = weigher.stop()
    for t in threads:
        t.join()
    if len(ingest_times) < args.ingests:
        raise RuntimeError('the ingests beside the schedule did not finish')
    final = depth()
    m1 = scrape(metrics_port)
    n = (m1['vmar_agent_report_seconds_count']
         - m0['vmar_agent_report_seconds_count'])
    # the reports sent and not recorded yet: the queue's depth counts only
    # those no consumer took (the agent's prefetch holds more); the quiet
    # figures after the schedule need an agent that recorded them all
    t_end = time.monotonic()
    recorded = n
    while recorded < sent and time.monotonic() - t_end < 300:
        time.sleep(0.5)
        recorded = (scrape(metrics_port)['vmar_agent_report_seconds_count']
                    - m0['vmar_agent_report_seconds_count'])
    drain_s = time.monotonic() - t_end
    d = [x for _t, x in samples]
    out = {'sent': sent, 'sent_late_over_1s': late,
           'asked_per_s': args.hosts / period,
           'recorded': n, 'wall_s': t_end - start,
           'backlog_end': sent - n, 'drained_after_s': drain_s,
           'recorded_after': recorded, 'unchanged': unchanged(m0, m1),
           'mean_record_ms': 1e3 * (m1['vmar_agent_report_seconds_sum']
                                    - m0['vmar_agent_report_seconds_sum'])
           / max(n, 1),
           'queue_max': max(d) if d else 0,
           'queue_median': statistics.median(d) if d else 0,
           'queue_end': final, 'queue_samples': samples,
           'weigher_p50_ms': pct(lookups, 50) * 1e3 if lookups else None,
           'weigher_p99_ms': pct(lookups, 99) * 1e3 if lookups else None,
           'weigher_lookups': len(lookups),
           'weigher_mean_hosts_weighed_above_0':
           statistics.mean(held) if held else 0,
           'ingest_times': ingest_times}
    print('schedule: %d reports sent (%.1f/s asked, %d late), %d recorded '
          '(all %d %.1f s after the end); queue max %d, end %d; weigher p50 '
          '%.2f ms p99 %.2f ms under load'
          % (sent, out['asked_per_s'], late, n, recorded, drain_s,
             out['queue_max'], final, out['weigher_p50_ms'] or 0,
             out['weigher_p99_ms'] or 0), flush=True)
    return out


def report(r):
    f, s = r['flood'], r['schedule']
    print()
    print('== %d hosts, %d images (%d bases), %s' % (
        r['hosts'], r['images'], r['bases'], r['db']))
    print('time per report (agent, recorded): %.2f ms flood, %.2f ms on '
          'schedule (%d of %d unchanged: the host\'s row alone)' % (
              f['mean_record_ms'], s['mean_record_ms'], s['unchanged'],
              s['recorded']))
    print('sustained (flood drain): %.1f reports/s; the schedule asks '
          '%.1f/s (x%.1f of the real rate): headroom %.1f x' % (
              f['reports_per_s'], s['asked_per_s'], r['speed'],
              f['reports_per_s'] / s['asked_per_s']))
    print('queue over %.0f s (%.0f min simulated): max %d, median %d, '
          'end %d; sent and not recorded at the end %d (the agent\'s '
          'prefetch), all recorded %.1f s later' % (
              s['wall_s'], s['wall_s'] * r['speed'] / 60, s['queue_max'],
              s['queue_median'], s['queue_end'], s['backlog_end'],
              s['drained_after_s']))
    q, lo = r['ingest_quiet'], r['ingest_loaded']
    print('ingest of %d MiB, half new: median %.2f s beside the reports, '
          '%.2f s without: %.2f x; looked up again under the lock: %d of '
          '%d beside, %d of %d without' % (
              r['ingest_mib'], statistics.median(lo['times']),
              statistics.median(q['times']),
              statistics.median(lo['times']) / statistics.median(q['times']),
              lo['redone'], len(lo['times']), q['redone'], len(q['times'])))
    print('reports the agent put back after a database error: %d'
          % r['agent_requeued'])
    print('rows: %s' % ', '.join('%s %d' % kv for kv in
                                 sorted(r['rows'].items())))
    print('map-GC plan: %.3f s for %d superseded versions' % (
        r['gc_plan']['s'], r['gc_plan']['superseded']))
    for key in ('weigher_baseline_ram', 'weigher_quiet_before',
                'weigher_quiet'):
        x = r[key]
        print('%s: p50 %.2f ms, p99 %.2f ms (%d lookups, %.0f hosts > 0)'
              % (key, x['p50_ms'], x['p99_ms'], x['lookups'],
                 x['mean_hosts_weighed_above_0']))
    print('weigher under load: p50 %.2f ms, p99 %.2f ms (goal p99 <= 10 '
          'ms); p99 / RAM weigher alone %.1f' % (
              s['weigher_p50_ms'], s['weigher_p99_ms'],
              s['weigher_p99_ms'] / r['weigher_baseline_ram']['p99_ms']))


# -- library: a cloud's images ---------------------------------------------

FAMILY = 5
COMMON = 16


class Cloud:
    """The images of a cloud, shaped by how clouds fill their catalogues.

    ``bases`` OS releases, in families of ``FAMILY`` releases of one
    distribution (a later release shares half its blocks with the
    family's first), all with the same ``COMMON`` blocks first (a boot
    loader: the one cluster every image joins); each later image is, with
    probability ``derived``, an image derived from a base (1 % of the
    base's blocks changed: configuration; 2-10 % of its size appended:
    packages), else a snapshot of a server of a base or derived image (a
    few percent changed: 1-5 %, new files and rewritten ones). The bases
    come first, as a cloud's catalogue does.

    Sizes: the data of a base is lognormal with a median of 1.5 GiB and
    sigma 0.5 (cloud images of Debian, Ubuntu, CentOS and Windows Server
    Core hold 0.3-6 GiB of data; the median of Glance's public images on
    the clouds we looked at, about 1-2 GiB), divided by ``scale`` to fit
    one machine; the virtual size is twice the data (free space: zero
    blocks, absent from maps). Every figure is given per GiB of data, so
    the scale divides sizes, not the rates the goals are about.
    """

    def __init__(self, bases, derived, scale, seed=35):
        self.rnd = np.random.default_rng(seed)
        self.n_bases = bases
        self.p_derived = derived
        self.scale = scale
        self.images = []        # (kind, seeds of its data blocks)
        self.parents = []       # the images snapshots are made of
        self.next_seed = 10 ** 15

    def _fresh(self, n):
        out = self.next_seed + np.arange(n, dtype=np.int64)
        self.next_seed += n
        return out

    def _data_blocks(self):
        gib = float(self.rnd.lognormal(np.log(1.5), 0.5))
        return max(256, int(gib * (1 << 30) / self.scale) // BS)

    def next(self):
        """``(kind, seeds)`` of the next image's data blocks."""
        i = len(self.images)
        if i < self.n_bases:
            seeds = self._fresh(self._data_blocks())
            # what every image holds: the same boot loader and EFI files
            # (one cluster of every image, the largest the library has)
            seeds[:COMMON] = 10 ** 14 + np.arange(COMMON)
            if i % FAMILY:
                # a later release of the distribution: half of its blocks
                # are the family's first release's
                first = self.images[i - i % FAMILY][1]
                k = min(len(seeds), len(first)) // 2
                seeds[:k] = first[:k]
            kind = 'base'
        elif self.rnd.random() < self.p_derived:
            seeds = self.images[int(self.rnd.integers(self.n_bases))][1]
            seeds = seeds.copy()
            ch = self.rnd.choice(len(seeds), size=len(seeds) // 100,
                                 replace=False)
            seeds[ch] = self._fresh(len(ch))
            extra = int(len(seeds) * self.rnd.uniform(0.02, 0.10))
            seeds = np.concatenate([seeds, self._fresh(extra)])
            kind = 'derived'
        else:
            parent = self.parents[int(self.rnd.integers(len(self.parents)))]
            seeds = self.images[parent][1].copy()
            k = int(len(seeds) * self.rnd.uniform(0.01, 0.05))
            # half rewritten files (a run), half new files at the end
            start = int(self.rnd.integers(0, max(1, len(seeds) - k // 2)))
            run = seeds[start:start + k // 2]
            seeds[start:start + len(run)] = self._fresh(len(run))
            seeds = np.concatenate([seeds, self._fresh(k - k // 2)])
            kind = 'snapshot'
        if kind != 'snapshot':
            self.parents.append(i)
        # no image is made of a snapshot: its seeds are not kept (at
        # real size a stream of 2,000 images keeps gigabytes of them)
        self.images.append((kind, seeds if kind != 'snapshot' else None))
        return kind, seeds


def write_image(path, seeds):
    """Data blocks, then as many zero blocks (the free half of the disk).

    The zeros are a hole (``write_blocks`` makes no zero block of any
    seed: seed 0 is a block like any other).
    """
    bench_ingest.write_blocks(path, seeds)
    os.truncate(path, 2 * len(seeds) * BS)


SHARED_DEFAULTS = {
    'hosts': {'db': 'mariadb'},
    'library': {'db': 'postgresql', 'images': 10000, 'bases': 40,
                'scale': 128, 'derived': 0.2},
    'writers': {'db': 'galera', 'images': 60, 'bases': 10, 'scale': 256,
                'derived': 0.2},
}

# maps per transaction of the pending pass, as vmar-manage map rewrite
PENDING_BATCH = 50


def pending_pass(lib, max_maps=None):
    """Rewrite pending maps a batch per transaction, as vmar-agent's pass.

    Until none is left, or about ``max_maps``. Returns ``[(maps,
    seconds)]``, a pair per batch.
    """
    batches = []
    while max_maps is None or sum(n for n, _s in batches) < max_maps:
        t = time.perf_counter()
        done = lib.rewrite_pending(PENDING_BATCH)
        if not done:
            break
        batches.append((len(done), time.perf_counter() - t))
    return batches


def run_library(args):
    from vmar_openstack.db import api as db_api
    from vmar_openstack.db import session as db_session
    work = args.work
    state = os.path.join(work, 'state')
    os.makedirs(state)
    url = database(args.db, state, 'library_smoke' if args.smoke
                   else 'library')
    conf_file = os.path.join(work, 'vmar.conf')
    glance_env.write_conf(conf_file, {
        'vmar': {'state_dir': state,
                 'rewrite_at_once': str(args.rewrite_at_once)},
        'vmar_database': {'connection': url}})
    conf = library_conf(conf_file)
    migration.upgrade('head', conf=conf)
    lib = ingest.Library(conf)
    cloud = Cloud(args.bases, args.derived, args.scale)
    # the image files are written in memory, not on the library's disk
    tmp = args.image_dir or ('/dev/shm' if os.path.isdir('/dev/shm')
                             else work)
    path = os.path.join(tmp, 'bench-library-%d.raw' % os.getpid())
    adds, ids = [], []
    marks = sorted({m for m in (10, 100, 1000, 10000, args.images)
                    if m <= args.images})
    sizes = {}
    t_all = time.monotonic()
    try:
        for i in range(args.images):
            kind, seeds = cloud.next()
            write_image(path, seeds)
            image_id = str(uuid.uuid4())
            t = time.perf_counter()
            out = lib.add(image_id, path, keep_base=False,
                          visibility='public' if kind != 'snapshot'
                          else 'private', owner='p%d' % (i % 50))
            dt = time.perf_counter() - t
            gib = len(seeds) * BS / (1 << 30)
            adds.append({'n': i + 1, 'kind': kind, 'data_gib': gib,
                         's': dt, 's_per_gib': dt / gib,
                         'regenerated': len(out.regenerated)})
            ids.append(image_id)
            if i + 1 in marks:
                with db_session.reader(conf) as s:
                    sizes[i + 1] = db_api.database_bytes(s)
                print('#%d: add %.3f s (%.2f s/GiB of data), %s; database '
                      '%.1f MiB, %.1f s so far' % (
                          i + 1, dt, dt / gib, kind,
                          sum(sizes[i + 1].values()) / 2 ** 20,
                          time.monotonic() - t_all), flush=True)
    finally:
        if os.path.exists(path):
            os.unlink(path)
    result = {'db': args.db, 'images': args.images, 'bases': args.bases,
              'scale': args.scale, 'adds': adds, 'sizes': sizes}
    result.update(add_figures(adds, marks))
    # the most shared cluster, and a map built against it
    with db_session.reader(conf) as s:
        result['largest_cluster_members'] = db_api.largest_cluster(s)
        result['rows'] = db_api.row_counts(s, ('vmar_clusters',
                                               'vmar_cluster_shadows',
                                               'vmar_fingerprints'))
    t = time.perf_counter()
    lib.remap(ids[-1])
    result['remap_s'] = time.perf_counter() - t
    # deleting the image canonical for the most shared blocks: the first
    # base, which every image of its family and their snapshots read
    t = time.perf_counter()
    out = lib.delete(ids[0])
    result['delete_canonical'] = {'s': time.perf_counter() - t,
                                  'maps_rewritten': len(out.regenerated),
                                  'pending': out.pending}
    # what vmar-agent's background pass then does, a batch per transaction
    batches = pending_pass(lib, args.pass_maps)
    result['pending_rewrite'] = {
        'maps': sum(n for n, _s in batches),
        's': sum(dt for _n, dt in batches),
        'batch': PENDING_BATCH,
        'batch_s_max': max((dt for _n, dt in batches), default=0.0)}
    library_report(result)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(result, f, indent=1)
    return result


# adds about a mark whose time per GiB is the mark's: the images' data
# varies tenfold (lognormal) and an add's fixed cost is most of it at the
# bench's sizes, so 21 adds gave +-20 % from one mark to the next
MARK_WINDOW = 100


def add_figures(adds, marks):
    """Add time per GiB of data about each mark, and per 1,000 adds.

    ``add_s_per_gib``: the seconds of the adds within MARK_WINDOW of the
    mark over their GiB of data (the last mark: the 2 * MARK_WINDOW
    before it); ``add_median_21``: the median of the 21 adds' own
    seconds per GiB about it (what this bench printed first);
    ``add_s_per_gib_by_1000``: the seconds over the GiB of each 1,000
    adds, the trend.
    """
    def per_gib(part):
        return sum(a['s'] for a in part) / sum(a['data_gib'] for a in part)
    out = {'add_s_per_gib': {}, 'add_median_21': {},
           'add_s_per_gib_by_1000': []}
    for m in marks:
        lo = max(0, min(m - 1 - MARK_WINDOW, len(adds) - 2 * MARK_WINDOW))
        out['add_s_per_gib'][m] = per_gib(adds[lo:m + MARK_WINDOW])
        out['add_median_21'][m] = statistics.median(
            a['s_per_gib'] for a in adds[max(0, m - 11):m + 10])
    for i in range(0, len(adds) - 999, 1000):
        out['add_s_per_gib_by_1000'].append(per_gib(adds[i:i + 1000]))
    return out


def library_report(r):
    print()
    print('== library of %d images (%d bases), %s, sizes / %d' % (
        r['images'], r['bases'], r['db'], r['scale']))
    per = r['add_s_per_gib']
    first = min(per)
    med = r.get('add_median_21', {})
    for m, v in sorted(per.items()):
        print('add #%d: %.3f s per GiB of data (the adds within %d of it; '
              'median of the 21 about it %.3f)%s' % (
                  m, v, MARK_WINDOW, med.get(m, float('nan')),
                  '' if m == first else '; %.2f x #%d' % (v / per[first],
                                                          first)))
    if 1000 in per and r['images'] in per and r['images'] > 1000:
        print('add #%d / add #1000: %.2f (goal <= 1.3; medians of 21: '
              '%.2f)' % (r['images'], per[r['images']] / per[1000],
                         med[r['images']] / med[1000]))
    trend = r.get('add_s_per_gib_by_1000', [])
    if trend:
        print('s per GiB of each 1,000 adds: %s' % ', '.join(
            '%.2f' % v for v in trend))
    last = r['sizes'][max(r['sizes'])]
    print('database: %.1f MiB for %d images: %.1f KiB per image' % (
        sum(last.values()) / 2 ** 20, max(r['sizes']),
        sum(last.values()) / 1024 / max(r['sizes'])))
    print('largest cluster: %d holders; a map built against it: %.2f s' % (
        r['largest_cluster_members'], r['remap_s']))
    if 'rows' in r:
        print('rows: %s' % ', '.join('%s %d' % kv
                                     for kv in sorted(r['rows'].items())))
    d = r['delete_canonical']
    print('delete of the most shared canonical image: %.1f s, %d maps '
          'rewritten in its transaction, %d left pending ([vmar] '
          'rewrite_at_once)' % (d['s'], d['maps_rewritten'],
                                d.get('pending', 0)))
    p = r.get('pending_rewrite')
    if p and p['maps']:
        print('the agent\'s pass: %d maps in %.1f s (%.1f maps/s), batches '
              'of %d, the library lock held %.2f s at most' % (
                  p['maps'], p['s'], p['maps'] / p['s'], p['batch'],
                  p['batch_s_max']))
    print('maps the agent republishes to Glance: %d' % (
        d['maps_rewritten'] + (p['maps'] if p else 0)))


# -- writers: several agents ingesting at once -------------------------------


# how long a writer of the chaos round waits for its database node to
# come back, trying again as vmar-agent's retries of a notification would
WRITER_PATIENCE = 180


def _with_patience(fn):
    """``fn()``'s error or None; database errors tried WRITER_PATIENCE s.

    As vmar-agent requeues an event whose handling failed for the
    database (a node down, or a conflict lost more often than the
    library's own retries allow). Returns ``(error, tries)``.
    """
    from vmar_openstack.db import session as db_session
    t, tries = time.perf_counter(), 0
    while True:
        tries += 1
        try:
            fn()
            return None, tries
        except Exception as e:   # noqa: B902  reported by the run
            if ((isinstance(e, sa_exc.DBAPIError) or db_session.conflict(e))
                    and time.perf_counter() - t < WRITER_PATIENCE):
                time.sleep(1)
                continue
            return '%s: %s' % (type(e).__name__, str(e)[:300]), tries


def writer(conf_file, out, ops):
    """Run ``add:ID=PATH`` and ``delete:ID`` one by one: a JSON line each.

    What vmar-agent does for a notification of an upload or a delete, less
    Glance. An image the library has already (its add committed before
    this writer was killed), or has no more (its delete did), counts as
    done. An operation that fails for the database (its node down) is
    tried again for WRITER_PATIENCE seconds.
    """
    from vmar_openstack import exception
    conf = library_conf(conf_file)
    lib = ingest.Library(conf)

    def run(op, arg):
        try:
            if op == 'add':
                image_id, path = arg.split('=', 1)
                lib.add(image_id, path, keep_base=False,
                        visibility='public')
            else:
                lib.delete(arg)
        except (exception.ImageExists, exception.ImageNotFound):
            pass
    with open(out, 'a') as f:
        for o in ops:
            op, arg = o.split(':', 1)
            t = time.perf_counter()
            err, tries = _with_patience(lambda: run(op, arg))
            f.write(json.dumps({'op': op, 'id': arg.split('=', 1)[0],
                                'error': err, 'tries': tries,
                                's': time.perf_counter() - t}) + '\n')
            f.flush()


def map_gc(conf_file, out, stop_file):
    """The agent's map GC and pending pass, again and again.

    Each pass drops the superseded map versions no host holds
    (:func:`vmar_openstack.glance_hooks.gc.plan`, no minimum age: the
    bench has no hosts) and rewrites pending maps; one last pass after
    ``stop_file`` appears. A JSON line per pass that changed something.
    """
    conf = library_conf(conf_file)
    lib = ingest.Library(conf)
    last = False
    with open(out, 'a') as f:
        while not last:
            last = os.path.exists(stop_file)
            done = {'dropped': 0, 'rewritten': 0}

            def one_pass():
                for sv in gc.plan(conf, lib, 0).deletable:
                    done['dropped'] += lib.drop_map_version(sv.image_id,
                                                            sv.version)
                done['rewritten'] += sum(n for n, _s in pending_pass(lib))
            err, _tries = _with_patience(one_pass)
            if err or any(done.values()):
                f.write(json.dumps(dict(done, error=err)) + '\n')
                f.flush()
            if not last:
                time.sleep(0.5)


def _writer_confs(args, galera, work, n, tag):
    """Configuration files of ``n`` writers on a new, empty library."""
    if galera is not None:
        db = '%s_%s' % (galera.database, tag)
        galera.sql(1, 'DROP DATABASE IF EXISTS `{0}`; CREATE '
                   'DATABASE `{0}`'.format(db))
        galera.wait_same_position()
        urls = [galera.url(k % galera.size + 1, db) for k in range(n)]
    else:
        urls = [database(args.db, work, tag)] * n
    state = os.path.join(work, 'state-%s' % tag)
    confs = []
    for k, url in enumerate(urls):
        path = os.path.join(work, 'writer-%s-%d.conf' % (tag, k))
        glance_env.write_conf(path, {
            'vmar': {'state_dir': state, 'hash_workers': '1'},
            'vmar_database': {'connection': url}})
        confs.append(path)
    migration.upgrade('head', conf=library_conf(confs[0]))
    if galera is not None:
        galera.wait_same_position()
    return confs


def _ops(images, deletes=False):
    """A writer's operations on its part of the images, in order.

    With ``deletes``, after every fourth add the earliest image not yet
    deleted goes: a quarter of the images, the catalogue's bases first,
    while images made from them come (their maps are rewritten, and the
    versions they supersede are the map GC's).
    """
    ops = []
    for j, (i, p, _n) in enumerate(images):
        ops.append('add:%s=%s' % (i, p))
        if deletes and j % 4 == 3:
            ops.append('delete:%s' % images[j // 4][0])
    return ops


def _op_key(o):
    """``op:id`` of an operation, as :func:`_recorded` keys its record."""
    op, arg = o.split(':', 1)
    return '%s:%s' % (op, arg.split('=', 1)[0])


def _start_writer(conf_file, out, ops):
    return subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), '_writer', conf_file,
         out] + list(ops))


def _start_gc(conf_file, out, stop_file):
    return subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), '_map_gc', conf_file,
         out, stop_file])


def _recorded(out):
    """The records of a writer's output file, by ``op:id``."""
    if not os.path.exists(out):
        return {}
    with open(out) as f:
        return {'%s:%s' % (x['op'], x['id']): x
                for x in map(json.loads, f) if x}


def _writers_round(conf_file, outs, images, deleted=()):
    """What a round left: records, failures, the checker's verdict.

    Every image of ``images`` but ``deleted`` must be in the library,
    and none of ``deleted``.
    """
    from vmar_openstack.db import api as db_api
    from vmar_openstack.db import session as db_session
    from vmar_openstack.ingest import check
    lines = {}
    for o in outs:
        lines.update(_recorded(o))
    failed = [x for x in lines.values() if x['error']]
    conf = library_conf(conf_file)
    problems, _warnings = check.check(conf)
    with db_session.reader(conf) as s:
        have = {i.image_id for i in db_api.list_images(s)}
    deleted = set(deleted)
    return {'images': sum(x['op'] == 'add' for x in lines.values()),
            'deleted': sum(x['op'] == 'delete' for x in lines.values()),
            'failed': len(failed),
            # the writer's own retries (a node down; a conflict lost past
            # the library's retries): vmar-agent's requeues
            'retried': sum(x['tries'] > 1 for x in lines.values()),
            'errors': [x['error'] for x in failed][:5],
            'missing': len({i for i, _p, _n in images} - deleted - have),
            'resurrected': len(deleted & have),
            'checker_problems': len(problems), 'problems': problems[:5]}


def _chaos_round(args, galera, work, images):
    """The writers again, deleting too, with map GC, killed at random.

    Each writer adds its part of the images and deletes a quarter of them
    on the way (:func:`_ops`); one more process runs the agent's map GC
    and pending pass all along (:func:`map_gc`). Every ``--chaos`` seconds
    or so (0.5 to 1.5 times), one of: a writer or the GC SIGKILLed and
    started again (a writer on what it has not recorded, as a restarted
    vmar-agent is given the notifications it did not acknowledge); or, on
    Galera, a node SIGKILLed and restarted (its writers try again until it
    is back). Then every image not deleted must be in the library once,
    none deleted, no superseded map version left after the last GC pass,
    and the checker find nothing.
    """
    rnd = random.Random(35)
    n = args.writers
    confs = _writer_confs(args, galera, work, n, 'chaos')
    parts = [_ops(images[k::n], deletes=True) for k in range(n)]
    deleted = {o.split(':', 1)[1] for part in parts for o in part
               if o.startswith('delete:')}
    outs = [os.path.join(work, 'chaos-%d.jsonl' % k) for k in range(n)]
    gc_out = os.path.join(work, 'chaos-gc.jsonl')
    stop = os.path.join(work, 'chaos-gc.stop')
    # the GC on the last writer's node (on Galera: not the first's)
    gc_conf = confs[-1]
    procs = [_start_writer(c, o, part)
             for c, o, part in zip(confs, outs, parts)]
    gc_proc = _start_gc(gc_conf, gc_out, stop)
    kills = {'writers': 0, 'gc': 0, 'nodes': 0}
    t0 = time.perf_counter()
    while any(p.poll() is None for p in procs):
        time.sleep(args.chaos * rnd.uniform(0.5, 1.5))
        alive = [k for k, p in enumerate(procs) if p.poll() is None]
        if not alive:
            break
        roll = rnd.random()
        if galera is not None and roll < 0.4:
            node = rnd.randint(1, galera.size)
            galera.kill(node)
            kills['nodes'] += 1
            time.sleep(rnd.uniform(1, 5))
            galera.restart(node)
        elif roll < 0.6:
            gc_proc.kill()
            gc_proc.wait()
            kills['gc'] += 1
            gc_proc = _start_gc(gc_conf, gc_out, stop)
        else:
            k = rnd.choice(alive)
            procs[k].kill()
            procs[k].wait()
            kills['writers'] += 1
            done = _recorded(outs[k])
            procs[k] = _start_writer(confs[k], outs[k], [
                o for o in parts[k] if _op_key(o) not in done])
    for p in procs:
        p.wait()
    with open(stop, 'w'):
        pass
    gc_proc.wait()
    if galera is not None:
        galera.wait_same_position()
    r = _writers_round(confs[0], outs, images, deleted)
    r['to_delete'] = len(deleted)
    with open(gc_out) as f:
        passes = [json.loads(x) for x in f]
    r['gc'] = {'passes': len(passes),
               'dropped': sum(x['dropped'] for x in passes),
               'rewritten': sum(x['rewritten'] for x in passes),
               'errors': [x['error'] for x in passes if x['error']][:5]}
    lib = ingest.Library(library_conf(confs[0]))
    r['superseded_left'] = len(lib.superseded())
    r['pending_left'] = len(lib.pending_maps())
    r.update(writers=n, wall_s=time.perf_counter() - t0, kills=kills)
    print('chaos: %d writers and a map GC; %d writers and the GC %d times '
          'killed and started again, %d database nodes killed and '
          'restarted: %d of %d images in the library, %d deleted (%d '
          'back), %d failed, %d tried again; GC dropped %d map versions, '
          'rewrote %d maps, %d superseded left; checker: %d problems' % (
              n, kills['writers'], kills['gc'], kills['nodes'],
              len(images) - len(deleted) - r['missing'],
              len(images) - len(deleted), r['deleted'], r['resurrected'],
              r['failed'], r['retried'], r['gc']['dropped'],
              r['gc']['rewritten'],
              r['superseded_left'], r['checker_problems']), flush=True)
    return r


def run_writers(args):
    """Uploads per hour with one writer, then one per node, same images.

    Each writer is an ingest process (what an agent runs per upload, less
    the download from Glance) on its own database node: a Galera cluster
    of three (``tools/vmarenv/galera_env.py``), or PostgreSQL with two
    writers on the one server. Each round starts from an empty library.
    """
    from tools.vmarenv import galera_env
    work = args.work
    cloud = Cloud(args.bases, args.derived, args.scale)
    images = []
    for i in range(args.images):
        _kind, seeds = cloud.next()
        path = os.path.join(work, 'img-%04d.raw' % i)
        write_image(path, seeds)
        images.append((str(uuid.uuid4()), path, len(seeds) * BS))
    gib = sum(n for _i, _p, n in images) / (1 << 30)
    galera = None
    if args.db == 'galera':
        os.chmod(work, 0o755)       # mariadbd runs as the mysql user
        os.makedirs(os.path.join(work, 'galera'))
        galera = galera_env.Galera(os.path.join(work, 'galera')).start()
    result = {'db': args.db, 'images': args.images, 'data_gib': gib,
              'rounds': {}}
    try:
        for n in (1, args.writers):
            confs = _writer_confs(args, galera, work, n, 'writers_%d' % n)
            outs, procs = [], []
            t = time.perf_counter()
            for k, c in enumerate(confs):
                out = os.path.join(work, 'writer-%d-%d.jsonl' % (n, k))
                outs.append(out)
                procs.append(_start_writer(c, out, _ops(images[k::n])))
            for proc in procs:
                proc.wait()
            wall = time.perf_counter() - t
            r = result['rounds'][n] = _writers_round(confs[0], outs, images)
            r.update(writers=n, wall_s=wall,
                     uploads_per_hour=r['images'] * 3600 / wall,
                     gib_per_hour=gib * 3600 / wall)
            print('%d writer(s): %d images in %.1f s: %.0f uploads/hour, '
                  '%.1f GiB/hour; %d failed; checker: %d problems' % (
                      n, r['images'], wall, r['uploads_per_hour'],
                      r['gib_per_hour'], r['failed'], r['checker_problems']),
                  flush=True)
        if args.chaos:
            result['chaos'] = _chaos_round(args, galera, work, images)
    finally:
        if galera is not None:
            galera.stop()
        for _i, p, _n in images:
            os.unlink(p)
    one, many = result['rounds'][1], result['rounds'][args.writers]
    print('%d writers / 1: %.2f x the uploads per hour (%s, %d images, '
          '%.2f GiB of data)' % (
              args.writers, many['uploads_per_hour'] / one['uploads_per_hour'],
              args.db, args.images, gib))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(result, f, indent=1)
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest='what', required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument('--db', choices=('sqlite', 'mariadb', 'postgresql',
                                         'galera'))
    common.add_argument('--workdir')
    common.add_argument('--json')
    common.add_argument('--keep', action='store_true',
                        help='keep the work directory (databases, logs)')
    common.add_argument('--smoke', action='store_true',
                        help='CI: a small run of the same code')
    h = sub.add_parser('hosts', parents=[common],
                       help='a thousand hosts reporting; weigher')
    h.add_argument('--hosts', type=int, default=1000)
    h.add_argument('--bases', type=int, default=100)
    h.add_argument('--derived', type=int, default=2,
                   help='derived images per base')
    h.add_argument('--mib', type=int, default=1,
                   help='size of each synthetic image')
    h.add_argument('--holds', type=float, default=8,
                   help='mean bases a host keeps')
    h.add_argument('--servers', type=float, default=20,
                   help='mean servers (exports) per host')
    h.add_argument('--churn', type=float, default=0.05)
    h.add_argument('--interval', type=float, default=60,
                   help='[vmar_host] report_interval simulated')
    h.add_argument('--speed', type=float, default=6)
    h.add_argument('--minutes', type=float, default=10)
    h.add_argument('--ingests', type=int, default=5,
                   help='images ingested without reports, then beside them')
    h.add_argument('--ingest-mib', type=int, default=64)
    h.add_argument('--report-workers', type=int,
                   help='the agent\'s [vmar_agent] report_workers '
                   '(default: its default)')
    h.add_argument('--lookups', type=int, default=500)
    h.add_argument('--lookup-rate', type=float, default=10)
    # the synthetic catalogue (Cloud) the library and writers runs add
    catalogue = argparse.ArgumentParser(add_help=False)
    catalogue.add_argument('--images', type=int)
    catalogue.add_argument('--bases', type=int)
    catalogue.add_argument('--derived', type=float,
                           help='share of the later images derived from a '
                           'base (the others are snapshots; default 0.2)')
    catalogue.add_argument('--scale', type=int,
                           help='image sizes divided by this')
    lb = sub.add_parser('library', parents=[common, catalogue],
                        help='a library of many images')
    lb.add_argument('--image-dir')
    lb.add_argument('--rewrite-at-once', type=int, default=64,
                    help='[vmar] rewrite_at_once of the library')
    lb.add_argument('--pass-maps', type=int,
                    help='stop the pending pass after about this many maps '
                    '(default: all)')
    wr = sub.add_parser('writers', parents=[common, catalogue],
                        help='uploads per hour, one writer against several')
    wr.add_argument('--writers', type=int, default=None,
                    help='default: 3 on Galera (one per node), else 2')
    wr.add_argument('--chaos', type=float, metavar='SECONDS',
                    help='then a round whose writers (and Galera nodes) '
                    'are killed at random about this often')
    if len(sys.argv) > 1 and sys.argv[1] == '_writer':
        writer(sys.argv[2], sys.argv[3], sys.argv[4:])
        return
    if len(sys.argv) > 1 and sys.argv[1] == '_map_gc':
        map_gc(*sys.argv[2:5])
        return
    args = p.parse_args()
    # each subcommand's defaults of the options it shares with another
    # (set_defaults would set them on the actions both share)
    for k, v in SHARED_DEFAULTS.get(args.what, {}).items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    if args.what == 'writers':
        if args.writers is None:
            args.writers = 3 if args.db == 'galera' else 2
        if args.smoke:
            args.images, args.scale = 30, 2048
    elif args.what == 'library':
        if args.smoke:
            args.images, args.bases, args.scale = 120, 10, 2048
            args.rewrite_at_once = 10
    elif args.smoke:
        args.hosts, args.bases, args.minutes, args.lookups = 50, 5, 0.5, 50
        args.ingests, args.ingest_mib = 2, 64
    # one work directory a run; gone at its end, however it ends
    args.work = tempfile.mkdtemp(prefix='bench-%s-' % args.what,
                                 dir=args.workdir)
    try:
        dict(hosts=run_hosts, library=run_library,
             writers=run_writers)[args.what](args)
    finally:
        if args.keep:
            print('work directory kept: %s' % args.work)
        else:
            shutil.rmtree(args.work, ignore_errors=True)


if __name__ == '__main__':
    main()
