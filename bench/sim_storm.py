#!/usr/bin/env python3
"""A boot storm, simulated: hosts, servers, images, the store and peers.

A discrete-event model of compute hosts booting servers from images that
a remote store (Glance) serves, calibrated against what this repository
measured on one host (``bench/bench_boot.py``) and on three
(``bench/bench_weigher.py``, ``bench/bench_peers_hosts.py``, the
multinode stage's peer cases), then run where nothing can be measured
here: 10 to 1,000 hosts, 10,000 and 100,000 servers of 100 images, as a
storm (every server within 60 s) and as a day's Poisson arrivals.

Usage::

    sim_storm.py --calibrate          model against the measured figures
    sim_storm.py --scale              the scale runs, printed
    sim_storm.py --report DIR         both, and DIR/*.png, sim.md,
                                      RESULTS-draft.md, sim.json
    sim_storm.py --render DIR         the plots and Markdown again from
                                      DIR/sim.json, without running
    sim_storm.py --smoke              a reduced run of everything (CI)

``--report bench/report-scale`` regenerates ``bench/report-scale/``
(about 15 minutes on two shared cores under ``nice -n 19``; the
100,000-server storm on 1,000 hosts is a third of it).

Configurations (``CONFIGS``):

``stock``
    stock Nova: the first server of an image on a host downloads the
    whole image (every byte of its virtual size, as a Glance download of
    a raw image streams it) into ``_base``; the others wait for that
    copy; the boot then reads only local disk.
``ondemand``
    stock on-demand: qcow2 overlays on the remote image, no host cache;
    every boot reads all its reads from the store.
``lazy`` / ``lazy-pf``
    VMAR lazy mirrors: a host fetches each canonical block once (per host
    and base; blocks images share are one canonical copy), on demand;
    ``lazy-pf`` adds the prefetch of the image's boot working set when its
    first export is added.
``weigher``
    ``lazy-pf`` with the similarity weigher placing servers.
``peers``
    ``weigher`` with peer fetch: hosts read the blocks other hosts hold
    from them, the store only what no known peer holds.

The model
---------

*Store*: one processor-sharing resource: bandwidth ``B`` shared equally
among the transfers in flight, and a latency ``L`` per request that is
not shared (the nbdkit ``delay-read`` of the benches). *Host links*
(scale runs: 10 Gbit/s; the calibrations: none): each host's inbound
link is a processor-sharing resource too; a transfer crosses the store
(or a peer's server) and the reader's link, each at its own share, and
ends when both have carried it (the slower bounds it; the faster's
capacity is not handed to others meanwhile, as max-min sharing would).
*Peers*: each host's peer server is a resource of its own
(``rate_mib``, 100 MiB/s) with latency ``peer_lat`` (1 ms); it refuses
a reader beyond ``max_clients`` (16) transfers in flight, and a reader
skips a peer that would serve its run slower than ``read_timeout`` (5
s), as the peer fetcher gives up on it; both then go to the next holder
or the store.

*Images* are sets of *regions*: runs of canonical blocks, each in one
base. A region has the blocks a boot reads (``size``, its boot working
set, read first) and its data (``data``, what the fill reads). A boot is
a sequence of ``P`` phases; phase ``j`` reads the first ``(j+1)/P`` of
each region (``interleaved``; a whole-disk read takes the regions one
after the other instead), waits for what is missing, then computes
``(T - credit)/P`` seconds. ``T`` is the recorded boot's time to
VMAR-BOOTED, ``credit`` the time its own local reads took in the trace
(the replay does not repeat it). A boot of ``R`` serial read rounds pays
``R/P`` round trips of latency per phase whose reads all miss, fewer in
proportion when part of the phase's reads are held. The calibration runs
``P = R`` (one phase per read round); the scale runs aggregate to
``--phases`` phases per boot and per region rather than per 4 KiB block.

*Computing*: a boot's computing is its trace's, whatever else runs
(host CPUs are not modelled), but for ``bench_weigher``'s times, where
three hosts' TCG guests shared one machine's two cores (below).

*Host mirrors*: per host and region, a pointer of what is held (the
blocks fetched, in boot order) and the fetches in flight. A read finds a
block held, or in flight (it waits for that fetch: one fetch per block
and host), or fetches it. Blocks are assumed read in the same order by
every boot and by the prefetch (the recorded set); a guest read the
prefetch has not reached yet is fetched on demand, as the mirror does.
The prefetch reads the boot working set in 4 MiB requests, one after
another, each costing a round trip per 583 KB (the cloud's recorded
prefetch: 55,386,112 bytes in 95 reads). The fill (``[vmar_host]
fill``, on by default) reads the rest of each exported image's data
``fill_delay`` (600 s) after its first export, one export at a time per
host, at most ``fill_rate`` (20 MB/s; 256 MiB requests in the scale
runs).

*Metadata*: with a Glance map source, a host fetches the image's map
(0.056 MB per GiB) and each base's digest list it lacks (32 bytes per 4
KiB block: 8 MiB per GiB), in one request, before the export is served,
so the boot waits for it. The benches of one host read maps from a
library directory (not counted), so the calibration of ``bench_boot.py``
runs without it; ``bench_weigher`` prints them apart, and
``bench_peers_hosts`` counts them.

*Placement*: Nova spreads (the least-loaded host; its RAM, CPU and disk
weighers, each normalised to [0, 1] over the hosts, ``spread`` = 3 in
all; the three-host cloud's log shows less, CLOUD_SCHEDULER). The
weigher adds ``5 x share``, the share HostReports.shares gives: the
exports a host has reported hold what their images read, and a host
holds a base in the proportion of its canonical data they cover, and
that proportion of what the image reads from it; a host reports a new
export ``change_delay`` (``[vmar_host] report_change_delay``, 1 s) after
the spawn (``spawn_delay``), or, with ``change_delay`` 0 (the product
before 2026-11-28, which the recorded three-host runs measured), at its
next periodic report (``report_interval``, 60 s). With the
weigher, a host takes at most ``per_host`` servers, or ``headroom`` x
servers / hosts (placement filters; without them one host would take a
whole family). Servers stay (no deletions).

*Peer discovery* (doc/source/admin/peers.rst): a host asks vmar-agent for the
holders of a base when its first export of it is added and every
``report_interval`` after; the agent names hosts that reported holding
blocks of it (their first report after their first block). The four
least loaded (approximated: up to eight sampled at random, ordered by
the transfers their peer server has in flight) are tried; block status
is exact, so a peer serves what it holds at that moment, the store the
rest. A burst of a new image on many hosts therefore goes to the store:
the leads that hosts wait for (peers.rst, "Bursts") are not modelled.

Inputs and derivations
----------------------

``bench/report/rounds.json`` (bench_boot.py, 2026-11-25, store
``rate=800M`` = 100 MiB/s and ``delay-read=2ms``) and
``bench/report-store/rounds.json`` (``rate=200M``) keep every boot's
arrival, image, time and the point's store bytes, and each trace's time
to VMAR-BOOTED and read count, **but not the traces' reads** (offsets,
lengths, times). What the model needs of them is derived:

* *bytes a boot reads* ``D_i`` (stock on-demand's store bytes): the two
  image mixes (n=10: minbase, python3, postgresql, nginx twice, apache2
  and mariadb once; n=30: five each) give two equations; within each
  group of images the mixes cannot tell apart, ``D_i`` is shared in
  proportion to the blocks a real boot of that image read
  (bench_layout.py, "The introspected boot set against a real boot":
  14,932 ... 22,652 blocks).
* *canonical blocks a boot reads* and their sharing: a core ``C`` every
  image's boot reads (minbase's blocks) plus blocks of its own ``U_i``,
  with ``C + U_i = k x`` the same per-image block counts. Two recorded
  unions fix ``k`` and ``C``: the six boots' unique-blocks limit of
  bench_boot (109,993,984 bytes) and the three boots (minbase, python3,
  nginx) of bench_coldhost's lazy-0 limit (70,307,840 bytes). Result:
  ``k`` about 1.06, ``C`` about 15,700 blocks (64 MB), ``U_i`` from 130
  blocks (minbase) to 8,300 (mariadb).
* *credit*: the mean storage wait of VMAR lazy + prefetch at the n=30,
  100 MiB/s points (negative: -0.14 s), whose boots wait for nothing.
* *serial read rounds* ``R_i`` (the trace's reads that did not overlap):
  fitted per image so that the model's stock on-demand waits at n=30,
  0.5 arrivals/s (the least contended point) match the recorded ones per
  image; every other point validates them.
* *image data* (fill, weigher shares): bench_layout.py's data and stored
  metadata blocks per image, an image's own data being what it stores
  beyond minbase.

Three hosts: ``bench_weigher.py`` (store bytes are exact functions of
where the servers went, and the model's scheduler is compared with the
runs; boot times are TCG guests of three hosts on one machine's two
cores, modelled as processor sharing of those cores, with the time from
create to boot, the guests' CPU work and glance-api's CPU per byte
fitted on round 1), ``bench_peers_hosts.py`` (four hosts reading minbase
in turn: bytes) and the multinode stage's peer cases (bytes).

Scale: 100 images in ``families`` (4) families; each family has its own
core (C, minbase's data) and its images cycle through the six measured
images' own parts, boot times and read rounds; images are chosen
uniformly (one seed); each image is 1 GiB. Storage wait is a boot's
time beyond its own computing; "needed bandwidth" is the smallest store
bandwidth at which no boot waits more than 1 s (found by
bisection on a log scale to 25 %), at the store's latency of 2 ms, with
the fill on (a storm's search runs without it: it starts 600 s after
the boots; the figures then come from a run with it). "Unreachable":
the longest wait stays above 1 s at any bandwidth (latency, host links or
peer servers bound it).
"""

import argparse
import bisect
import collections
import dataclasses
import heapq
import json
import math
import os
import random
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import report_boot  # noqa: E402
BS = 4096
MIB = 1 << 20
GIB = 1 << 30
INF = float('inf')

# -- recorded inputs (bench/RESULTS.md; sources in the module docstring) ---

ROUNDS = os.path.join(HERE, 'report', 'rounds.json')
ROUNDS_SLOW = os.path.join(HERE, 'report-store', 'rounds.json')
IMAGES6 = ('minbase', 'python3', 'postgresql', 'nginx', 'apache2',
           'mariadb')
# bench_layout.py, "The introspected boot set against a real boot" (e623ead):
# distinct non-zero blocks one real TCG boot of each image read
LAYOUT_BOOT_READ = {'minbase': 14932, 'python3': 14998, 'postgresql': 15107,
                    'nginx': 15898, 'apache2': 15819, 'mariadb': 22652}
# bench_layout.py, "Classified shares": data + stored metadata blocks
LAYOUT_STORED = {'minbase': 68314 + 1919, 'python3': 78282 + 2144,
                 'postgresql': 146614 + 2902, 'nginx': 70792 + 2000,
                 'apache2': 95480 + 2546, 'mariadb': 124075 + 2697}
# bench_coldhost.py, "Bytes fetched from the store", lazy-0 (limit), run 1:
# the distinct canonical blocks of minbase, python3 and nginx's boots
COLDHOST_LIMIT3 = (('minbase', 'python3', 'nginx'), 70307840)
# the cloud's prefetch of minbase's recorded set: bytes in reads
PREFETCH_RUN = 55386112 / 95
MAP_PER_GIB = 0.056e6          # bench_library.py, map bytes per GiB
DIGEST_PER_BLOCK = 32          # SHA-256 digest list
# bench_weigher.py's recorded runs (RESULTS.md): per recording, the code,
# its [vmar_host] report_change_delay (0: reports were periodic only) and
# its runs: round, weigher, MiB fetched, boot median and max (s), and
# servers per image on each host (the runs record servers and images per
# host; which images is chosen here so that the counts hold; the bytes
# depend only on which images a host has)
WEIGHER_RECORDINGS = (
    ('deb4a20', 0.0, (      # 2026-11-25 19:43-19:55
        (1, True, 128.0, 93.5, 108.7,
         {'c2': {3: 5, 0: 3, 1: 2}, 'c3': {0: 2, 1: 3, 2: 5, 4: 5, 5: 5}}),
        (1, False, 232.0, 101.4, 125.8,
         {'c1': {0: 2, 1: 1, 2: 1, 3: 3, 4: 2, 5: 1},
          'c2': {0: 1, 1: 2, 2: 2, 3: 2, 4: 1, 5: 1},
          'c3': {0: 2, 1: 2, 2: 2, 4: 2, 5: 3}}),
        (2, False, 240.0, 120.5, 147.9,
         {'c1': {0: 2, 1: 2, 2: 2, 3: 2, 4: 1, 5: 1},
          'c2': {0: 1, 1: 1, 2: 1, 3: 2, 4: 2, 5: 2},
          'c3': {0: 2, 1: 2, 2: 2, 3: 1, 4: 2, 5: 2}}),
        (2, True, 80.0, 91.3, 109.1, {'c1': {k: 5 for k in range(6)}}),
    )),
    ('1e030fa', 0.0, (      # 2026-11-28 10:20-10:33, peer reads off
        (1, True, 128.0, 67.7, 86.0,
         {'c1': {0: 5, 1: 5, 2: 5, 5: 5}, 'c2': {4: 5}, 'c3': {3: 5}}),
        (1, False, 224.0, 90.5, 116.6,
         {'c1': {0: 2, 1: 2, 2: 2, 3: 2, 4: 2},
          'c2': {0: 2, 1: 2, 3: 2, 4: 2, 5: 2},
          'c3': {0: 1, 1: 1, 2: 3, 3: 1, 4: 1, 5: 3}}),
        (2, False, 232.0, 99.3, 126.0,
         {'c1': {0: 1, 1: 1, 2: 2, 3: 3, 4: 1, 5: 1},
          'c2': {0: 2, 1: 2, 2: 1, 3: 2, 4: 1, 5: 2},
          'c3': {0: 2, 1: 2, 2: 2, 4: 3, 5: 2}}),
        (2, True, 96.0, 70.4, 80.1,
         {'c1': {0: 5, 1: 5, 2: 5}, 'c2': {3: 5, 4: 5, 5: 5}}),
    )),
    ('722ccb4', 1.0, (      # 2026-11-28 13:35-13:50, change reports
        (1, True, 128.0, 90.1, 110.4,
         {'c1': {0: 5, 1: 5, 2: 5, 5: 5}, 'c2': {3: 5}, 'c3': {4: 5}}),
        (1, False, 240.0, 117.8, 160.1,
         {'c1': {0: 2, 1: 2, 2: 2, 3: 2, 4: 1, 5: 1},
          'c2': {0: 1, 1: 1, 2: 1, 3: 2, 4: 2, 5: 2},
          'c3': {0: 2, 1: 2, 2: 2, 3: 1, 4: 2, 5: 2}}),
        (2, False, 224.0, 138.1, 165.9,
         {'c1': {0: 1, 1: 2, 2: 1, 3: 2, 4: 1},
          'c2': {0: 2, 2: 2, 3: 2, 4: 2, 5: 2},
          'c3': {0: 2, 1: 3, 2: 2, 3: 1, 4: 2, 5: 3}}),
        (2, True, 80.0, 134.9, 163.0, {'c2': {k: 5 for k in range(6)}}),
    )),
    ('cf3fd3e', 1.0, (      # 2026-11-28 21:18-21:37, scheduler DEBUG
        (1, True, 128.0, 146.2, 183.0,
         {'c1': {4: 5}, 'c2': {0: 5, 1: 5, 2: 5, 5: 5}, 'c3': {3: 5}}),
        (1, False, 216.0, 160.2, 205.3,
         {'c1': {0: 2, 1: 2, 3: 2, 4: 3},
          'c2': {0: 2, 1: 1, 3: 2, 4: 1, 5: 4},
          'c3': {0: 1, 1: 2, 2: 5, 3: 1, 4: 1, 5: 1}}),
        (2, False, 224.0, 203.2, 249.3,
         {'c1': {0: 3, 1: 2, 2: 1, 4: 3, 5: 3},
          'c2': {0: 1, 2: 3, 3: 4, 4: 1, 5: 1},
          'c3': {0: 1, 1: 3, 2: 1, 3: 1, 4: 1, 5: 1}}),
        (2, True, 112.0, 140.1, 163.4,
         {'c2': {0: 5, 1: 5, 2: 5, 5: 1}, 'c3': {3: 5, 4: 5, 5: 4}}),
    )),
)
# bench_peers_hosts.py (9e3a047): minbase read whole by 4 hosts in turn;
# Glance's MiB per host without peers (data and metadata) and the
# metadata (digest list and map) every later host still fetched
PEERS_HOSTS = {'hosts': 4, 'per_host_mib': 298.2, 'meta_mib': 8.0,
               'store_mib': 1192.7, 'peers_mib': 322.3}
# the multinode stage's "ok" peer case: a 64 MiB image of 8 MiB distinct
# data, read whole on compute-1, then on another host from its peer
MULTINODE_OK = {'data_mib': 8.0, 'from_peers_mib': 8.0, 'store_data': 0}


def nbdkit_rate(text):
    """Bytes per second of an nbdkit ``rate=`` (bits, 1024-based)."""
    units = {'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30}
    mult = units.get(text[-1:].upper(), 1)
    num = text[:-1] if text[-1:].upper() in units else text
    return float(num) * mult / 8


# -- the event engine -----------------------------------------------------

class Sim(object):
    """Time and a heap of (time, seq, callback, argument)."""

    __slots__ = ('now', 'q', 'seq', 'events')

    def __init__(self):
        self.now = 0.0
        self.q = []
        self.seq = 0
        self.events = 0

    def at(self, t, fn, arg=None):
        self.seq += 1
        heapq.heappush(self.q, (t, self.seq, fn, arg))

    def run(self):
        q, pop = self.q, heapq.heappop
        n = 0
        while q:
            t, _s, fn, arg = pop(q)
            self.now = t
            fn(arg)
            n += 1
        self.events += n


class Event(object):
    """Something that happens once; callbacks run when it does."""

    __slots__ = ('done', 'waiters')

    def __init__(self):
        self.done = False
        self.waiters = []

    def fire(self, _arg=None):
        self.done = True
        waiters, self.waiters = self.waiters, None
        for fn in waiters:
            fn()


class Proc(object):
    """A generator run as a process: it yields seconds or Events."""

    __slots__ = ('sim', 'gen')

    def __init__(self, sim, gen):
        self.sim, self.gen = sim, gen
        self.step()

    def step(self, _arg=None):
        gen = self.gen
        while True:
            try:
                ev = next(gen)
            except StopIteration:
                return
            if type(ev) is float:
                if ev > 0:
                    self.sim.at(self.sim.now + ev, self.step)
                    return
            elif not ev.done:
                ev.waiters.append(self.step)
                return


class Resource(object):
    """Processor sharing: ``capacity`` split equally among transfers.

    Each transfer runs at ``min(flow_cap, capacity / n)``. Kept in virtual
    time (the bytes each transfer has received since the resource was
    last idle), so a start or an end costs O(log n). One wake-up is
    pending at a time: a start that delays the next completion leaves it
    (it wakes early and re-arms); one that brings it forward adds one.
    """

    __slots__ = ('sim', 'cap', 'flow_cap', 'v', 't', 'n', 'heap', 'wake',
                 'seq', 'served', 'busy')

    def __init__(self, sim, capacity, flow_cap=INF):
        self.sim, self.cap, self.flow_cap = sim, float(capacity), flow_cap
        self.v = self.t = 0.0
        self.n = self.seq = 0
        self.wake = INF
        self.heap = []
        self.served = 0.0
        self.busy = 0.0

    def rate(self):
        r = self.cap / self.n
        return r if r < self.flow_cap else self.flow_cap

    def _advance(self):
        now = self.sim.now
        if self.n:
            self.v += self.rate() * (now - self.t)
            self.busy += now - self.t
        self.t = now

    def transfer(self, size, ev=None):
        """Transfer ``size``; the Event fires when done."""
        if ev is None:
            ev = Event()
        self._advance()
        self.seq += 1
        heapq.heappush(self.heap, (self.v + size, self.seq, ev))
        self.n += 1
        self.served += size
        self._arm()
        return ev

    def fetch(self, size, latency):
        """A request: ``latency`` (not shared), then the transfer."""
        ev = Event()
        if latency > 0:
            self.sim.at(self.sim.now + latency, self._begin, (size, ev))
        else:
            self.transfer(size, ev)
        return ev

    def _begin(self, arg):
        self.transfer(arg[0], arg[1])

    def _arm(self):
        if self.heap:
            now = self.sim.now
            dt = (self.heap[0][0] - self.v) / self.rate()
            t = now + (dt if dt > 0 else 0.0)
            if t < self.wake:
                self.wake = t
                self.sim.at(t, self._complete, t)

    def _complete(self, t):
        if t != self.wake:
            return              # a later wake-up, superseded
        self.wake = INF
        self._advance()
        heap, done = self.heap, []
        rate = self.rate()
        now = self.sim.now
        while heap:
            dt = (heap[0][0] - self.v) / rate
            # due, or too close for the clock to tell apart
            if dt > 1e-9 and now + dt > now:
                break
            done.append(heapq.heappop(heap)[2])
        self.n -= len(done)
        if not self.n:
            self.v = 0.0
        self._arm()
        for ev in done:
            ev.fire()


class CpuStore(object):
    """A store whose cost is CPU on the guests' cores.

    The multinode stage's: glance-api, the range servers and the guests
    share one machine's two cores. A request is latency, then
    ``per_byte`` CPU seconds per byte on that processor-sharing resource.
    """

    def __init__(self, cpu, per_byte):
        self.cpu, self.per_byte = cpu, per_byte
        self.served = 0.0

    @property
    def n(self):
        return self.cpu.n

    def fetch(self, size, latency):
        self.served += size
        return self.cpu.fetch(size * self.per_byte, latency)


# -- images ---------------------------------------------------------------

@dataclasses.dataclass
class Region:
    """Canonical blocks of one base.

    A boot reads ``size`` bytes of it (the boot working set, first), the
    fill ``data`` bytes.
    """

    name: str
    size: float
    data: float
    base: str


@dataclasses.dataclass
class Image:
    """What servers boot: regions, and one boot's recorded figures."""

    name: str
    regions: list
    compute: float          # T: the trace's time to VMAR-BOOTED (s)
    credit: float = 0.0     # time of the trace's own local reads (s)
    rounds: float = 1.0     # R: serial read rounds of a boot
    ondemand: float = 0.0   # D: bytes a boot reads (on-demand store bytes)
    virtual: float = GIB
    sequential: bool = False   # reads its regions one after another
    cpu: float = 0.0        # CPU seconds of a boot (shared-cores model)
    family: int = 0

    @property
    def boot_bytes(self):
        return sum(r.size for r in self.regions)

    @property
    def data_bytes(self):
        return sum(r.data for r in self.regions)


@dataclasses.dataclass
class Library:
    images: list
    digest: dict            # base -> bytes of its digest list

    def regions(self):
        out = {}
        for img in self.images:
            for r in img.regions:
                out.setdefault(r.name, r)
        return out


def _rounds_doc(path):
    with open(path) as f:
        return json.load(f)


def derive_boot_library(doc=None, credit=None, rounds=None):
    """The six images of bench_boot.py, as the module docstring derives.

    ``rounds``: {image: R} (fitted by :func:`fit_rounds`; else a first
    guess from each image's read count); ``credit`` likewise.
    """
    doc = doc or _rounds_doc(ROUNDS)
    names = [n for n in IMAGES6 if n in doc['traces']]
    r = np.array([LAYOUT_BOOT_READ[n] for n in names], dtype=float)
    # D_i: one scale per group of images the recorded mixes cannot tell
    # apart, shares within a group by the blocks a real boot read
    eqs = {}
    for rnd in doc['rounds']:
        if rnd['config'] == 'stock-ondemand':
            c = collections.Counter(b['image'] for b in rnd['boots'])
            eqs[tuple(c[n] for n in names)] = rnd['store_bytes']
    counts = np.array(list(eqs), dtype=float)          # eq x image
    groups = sorted({tuple(counts[:, i]) for i in range(len(names))})
    gidx = [groups.index(tuple(counts[:, i])) for i in range(len(names))]
    a = np.zeros((len(eqs), len(groups)))
    for i in range(len(names)):
        a[:, gidx[i]] += counts[:, i] * r[i]
    scale = np.linalg.lstsq(a, np.array(list(eqs.values()), dtype=float),
                            rcond=None)[0]
    ondemand = {n: scale[gidx[i]] * r[i] for i, n in enumerate(names)}
    # C, k from two unions: union(S) = k sum_S r - (|S| - 1) C
    limit = np.mean([rnd['limit_bytes'] for rnd in doc['rounds']]) / BS
    unions = [(names, limit), (COLDHOST_LIMIT3[0], COLDHOST_LIMIT3[1] / BS)]
    a = np.array([[sum(LAYOUT_BOOT_READ[n] for n in s), -(len(s) - 1)]
                  for s, _u in unions], dtype=float)
    k, core = np.linalg.solve(a, np.array([u for _s, u in unions]))
    stored0 = LAYOUT_STORED['minbase'] * BS
    core_region = Region('core', core * BS, max(core * BS, stored0),
                         'minbase')
    images = []
    for i, n in enumerate(names):
        own = max(k * r[i] - core, 1.0) * BS
        own_data = max(own, (LAYOUT_STORED[n] - LAYOUT_STORED['minbase'])
                       * BS)
        t = doc['traces'][n]
        guess = (rounds or {}).get(n, t['reads'] * 0.2)
        images.append(Image(
            n, [core_region, Region('own-' + n, own, own_data, n)],
            compute=t['booted'], credit=credit or 0.0, rounds=guess,
            ondemand=ondemand[n]))
    digest = {n: GIB / BS * DIGEST_PER_BLOCK for n in names}
    lib = Library(images, digest)
    lib.k, lib.core_blocks = float(k), float(core)
    return lib


def scale_library(boot, n_images=100, families=4):
    """``n_images`` images of ``families`` families made of the six.

    Family f has its own core (the measured core: minbase's boot blocks
    and data); image j is in family j mod F and takes the own part, time,
    rounds and on-demand bytes of the measured image (j // F) mod 6. An
    image built on minbase itself (the template minbase) owns its boot
    part and 2 % of the core's data (a rebuild's changed files).
    """
    t_core = boot.images[0].regions[0]
    images, digest = [], {}
    for f in range(families):
        digest['base-%d' % f] = GIB / BS * DIGEST_PER_BLOCK
    cores = [Region('core-%d' % f, t_core.size, t_core.data, 'base-%d' % f)
             for f in range(families)]
    for j in range(n_images):
        f = j % families
        t = boot.images[(j // families) % len(boot.images)]
        own = t.regions[1]
        data = own.data if t.name != 'minbase' else max(
            own.size, 0.02 * t_core.data)
        base = 'img-%d' % j
        digest[base] = GIB / BS * DIGEST_PER_BLOCK
        images.append(Image(
            '%s-%d' % (t.name, j),
            [cores[f], Region('own-%d' % j, own.size, data, base)],
            compute=t.compute, credit=t.credit, rounds=t.rounds,
            ondemand=t.ondemand, family=f))
    return Library(images, digest)


def weigher_library():
    """bench_weigher.py's six images.

    16 MiB every image has, 8 MiB per family of three, 8 MiB of their
    own, in 64 MiB disks the guest reads whole (zeros are not fetched).
    The first image of each part is its canonical base.
    """
    os_part = Region('os', 16 * MIB, 16 * MIB, 'w0')
    fams = [Region('fam-%d' % f, 8 * MIB, 8 * MIB, 'w%d' % (3 * f))
            for f in range(2)]
    images = []
    for i in range(6):
        own = Region('own-%d' % i, 8 * MIB, 8 * MIB, 'w%d' % i)
        images.append(Image('w%d' % i, [os_part, fams[i // 3], own],
                            compute=0.0, rounds=32 * MIB / (128 << 10),
                            ondemand=32 * MIB, virtual=64 * MIB,
                            sequential=True, family=i // 3))
    return Library(images, {'w%d' % i: 64 * MIB / BS * DIGEST_PER_BLOCK
                            for i in range(6)})


# -- the cloud ------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Config:
    name: str
    label: str
    mode: str               # download | ondemand | lazy
    prefetch: bool = False
    weigher: bool = False
    peers: bool = False
    leads: bool = False


CONFIGS = {c.name: c for c in (
    Config('stock', 'stock Nova (download)', 'download'),
    Config('ondemand', 'stock on-demand', 'ondemand'),
    Config('lazy', 'VMAR lazy', 'lazy'),
    Config('lazy-pf', 'VMAR lazy + prefetch', 'lazy', prefetch=True),
    Config('weigher', 'VMAR lazy + prefetch + weigher', 'lazy', True, True),
    Config('peers', 'VMAR lazy + prefetch + weigher + peers', 'lazy', True,
           True, True),
    Config('leads', 'VMAR lazy + prefetch + weigher + peers + leads',
           'lazy', True, True, True, True),
)}
SCALE_CONFIGS = ('stock', 'ondemand', 'lazy-pf', 'weigher', 'peers')


@dataclasses.dataclass
class Params:
    store_bw: float = nbdkit_rate('800M')
    store_lat: float = 0.002
    link: float = INF               # a host's inbound link (bytes/s)
    peer_bw: float = 100 * MIB      # [vmar_peers] rate_mib
    peer_lat: float = 0.001
    report_interval: float = 60.0
    # [vmar_host] report_change_delay: a new export is reported this long
    # after it is added; 0: at the host's next periodic report
    change_delay: float = 1.0
    # reports a second one vmar-agent records (their periodic ones, one
    # per host and report_interval, take their part first)
    agent_rate: float = INF
    spawn_delay: float = 10.0
    spawn_jitter: float = 0.0       # spawn_delay +- this, uniformly
    metadata: bool = False          # maps and digest lists from the store
    phases: int = 0                 # 0: one per read round of the image
    prefetch_chunk: float = 4 * MIB  # [vmar_host] prefetch_request
    prefetch_run: float = PREFETCH_RUN
    fill: bool = False
    fill_delay: float = 600.0
    fill_rate: float = 20e6
    fill_chunk: float = 4 * MIB
    multiplier: float = 5.0
    spread: float = 3.0
    headroom: float = 1.2
    per_host: int = 0               # >0: servers a host takes (placement)
    cores: float = 0.0              # >0: boots compute on shared cores
    store_cpu: float = 0.0          # with cores: CPU s per store byte
    overhead: float = 0.0           # s from create to the boot's start
    max_holders: int = 4
    peer_max_clients: int = 16      # transfers a peer server takes
    peer_timeout: float = 5.0       # [vmar_peers] read_timeout
    lead_fanout: int = 8            # [vmar_agent] fetch_lead_fanout
    seed: int = 0


class Held(object):
    """One region on one host: held prefix, fetches in flight."""

    __slots__ = ('present', 'requested', 'pending', 'fetched', 'first')

    def __init__(self):
        self.present = self.requested = self.fetched = 0.0
        self.pending = collections.deque()
        self.first = False


class Host(object):
    __slots__ = ('idx', 'held', 'exported', 'meta', 'meta_bytes',
                 'downloads', 'disk', 'tick', 'peer', 'link', 'asked',
                 'fillq', 'filling', 'report_due', 'report_seen')

    def __init__(self, idx, tick):
        self.idx, self.tick = idx, tick
        self.held = {}
        self.exported = set()
        self.meta = {}
        self.meta_bytes = 0.0
        self.downloads = {}
        self.disk = 0.0
        self.peer = self.link = None
        self.asked = {}
        self.fillq = collections.deque()
        self.filling = False
        self.report_due = -INF      # the host's last change report,
        self.report_seen = -INF     # and when the agent recorded it


class Cloud(object):
    """One run: hosts, the store, servers arriving."""

    def __init__(self, config, params, library, n_hosts):
        self.c, self.p, self.lib = config, params, library
        self.sim = sim = Sim()
        self.rng = random.Random(params.seed)
        self.nprng = np.random.default_rng(params.seed)
        self.cpu = (Resource(sim, params.cores, 1.0) if params.cores
                    else None)
        if self.cpu is not None and params.store_cpu:
            self.store = CpuStore(self.cpu, params.store_cpu)
        else:
            self.store = Resource(sim, params.store_bw)
        interval = params.report_interval
        self.hosts = [Host(k, self.rng.uniform(0, interval) if interval
                           else 0.0) for k in range(n_hosts)]
        for h in self.hosts:
            if config.peers:
                h.peer = Resource(sim, params.peer_bw)
            if params.link < INF:
                h.link = Resource(sim, params.link)
        regions = library.regions()
        self.rindex = {name: i for i, name in enumerate(regions)}
        self.regions = list(regions.values())
        self.holders = [[] for _r in self.regions]
        self.plans = {}
        for img in library.images:
            img.ri = [self.rindex[r.name] for r in img.regions]
            img.need = [(ri, r.size) for ri, r in zip(img.ri, img.regions)]
            img.boot_size = img.boot_bytes
            img.w = np.array([r.data for r in img.regions])
        self.vis = np.zeros((len(self.regions), n_hosts), dtype=bool)
        # HostReports.shares: a host is taken to hold a base's blocks in
        # the proportion of its canonical blocks it holds
        bases = sorted({r.base for r in self.regions})
        self.base_of = np.array([bases.index(r.base) for r in self.regions])
        sizes = np.array([r.data for r in self.regions])
        canon = np.bincount(self.base_of, weights=sizes)
        self.part = sizes / canon[self.base_of]   # of its base's data
        self.frac = np.zeros((len(bases), n_hosts))
        self.loads = np.zeros(n_hosts)
        self.cap = INF
        self.store_bytes = collections.Counter()
        self.change_reports = []    # when hosts sent them
        self.agent_free = 0.0       # when the agent has recorded them
        left = params.agent_rate - (n_hosts / params.report_interval
                                    if params.report_interval else 0.0)
        self.agent_cost = 1.0 / left if left > 0 else INF
        self.peer_bytes = collections.Counter()
        self.boots = []
        self.leads = {}         # base -> [host index, ...] in ask order

    # -- placement --

    def shares(self, img):
        """Each host's share of ``img``, as HostReports.shares has it.

        The hosts' visible exports hold the regions they read; a host
        holds each base in the proportion of its canonical data they
        cover, and that proportion of what ``img`` reads from the base.
        """
        return img.w @ self.frac[self.base_of[img.ri]] / img.w.sum()

    def place(self, img):
        loads, p = self.loads, self.p
        if not self.c.weigher:
            cand = np.flatnonzero(loads == loads.min())
        else:
            ok = loads < self.cap
            lo, hi = loads[ok].min(), loads[ok].max()
            w = p.multiplier * self.shares(img)
            if hi > lo:
                w = w + p.spread * (hi - loads) / (hi - lo)
            w[~ok] = -INF
            cand = np.flatnonzero(w >= w.max() - 1e-9)
        h = int(cand[self.nprng.integers(len(cand))]) if len(cand) > 1 \
            else int(cand[0])
        loads[h] += 1
        return h

    def _tick(self, h, t):
        """The first report of host ``h`` at or after ``t``."""
        iv = self.p.report_interval
        if not iv:
            return t
        return h.tick + math.ceil(max(t - h.tick, 0.0) / iv) * iv

    def _visible(self, arg):
        h, img = arg
        new = [ri for ri in img.ri if not self.vis[ri, h.idx]]
        self.vis[new, h.idx] = True
        np.add.at(self.frac[:, h.idx], self.base_of[new], self.part[new])

    # -- fetching --

    def region(self, h, ri):
        held = h.held.get(ri)
        if held is None:
            held = h.held[ri] = Held()
        return held

    def _asked(self, h, base):
        """When ``h`` last asked the agent for the holders of ``base``."""
        t0 = h.asked.get(base, self.sim.now)
        iv = self.p.report_interval
        if not iv:
            return self.sim.now
        return t0 + math.floor((self.sim.now - t0) / iv) * iv

    def _holder(self, h, ri, a, x):
        lst = self.holders[ri]
        k = bisect.bisect_right(lst, (self._asked(h, self.regions[ri].base),
                                      INF))
        if not k:
            return None
        idx = range(k) if k <= 8 else self.rng.sample(range(k), 8)
        cands = [self.hosts[lst[i][1]] for i in idx if lst[i][1] != h.idx]
        if not cands:
            return None
        cands.sort(key=lambda c: (c.peer.n, -c.held[ri].present))
        # a server with max_clients readers refuses more; a read it would
        # serve slower than read_timeout is given up on: both go on to
        # the next holder, then the store
        p = self.p
        cands = [c for c in cands[:p.max_holders]
                 if c.peer.n < p.peer_max_clients
                 and (x - a) * (c.peer.n + 1) / p.peer_bw < p.peer_timeout]
        if not cands:
            return None
        for c in cands:
            if c.held[ri].present >= x:
                return c, x
        best = max(cands, key=lambda c: c.held[ri].present)
        end = best.held[ri].present
        return (best, end) if end > a else None

    def get(self, src, h, size, latency):
        """A request of ``h`` to ``src`` (the store or a peer).

        After the latency the bytes cross ``src`` and the host's link,
        each processor-sharing; the request ends when both have carried
        them (the slower of the two bounds it).
        """
        if h.link is None:
            return src.fetch(size, latency)
        ev = Event()
        if latency > 0:
            self.sim.at(self.sim.now + latency, self._legs,
                        (src, h.link, size, ev))
        else:
            self._legs((src, h.link, size, ev))
        return ev

    @staticmethod
    def _legs(arg):
        src, link, size, ev = arg
        left = [2]

        def one():
            left[0] -= 1
            if not left[0]:
                ev.fire()
        src.transfer(size).waiters.append(one)
        link.transfer(size).waiters.append(one)

    def fetch(self, h, held, ri, a, x, rounds, kind):
        """Fetch [a, x) of region ``ri`` to ``h``: peers, then the store.

        Returns the Events of the fetches made.
        """
        evs = []
        if self.c.peers:
            got = self._holder(h, ri, a, x)
            if got is not None:
                peer, end = got
                n = end - a
                ev = self.get(peer.peer, h, n, self.p.peer_lat * rounds)
                self._pending(h, held, ri, a, end, ev, n)
                self.peer_bytes[kind] += n
                evs.append(ev)
                a = end
        if a < x and self.c.leads:
            got = self._lead(h, ri, x)
            if got is not None:
                lead, after = got
                n = x - a
                ev = self._after(after, lambda: self.get(
                    lead.peer, h, n, self.p.peer_lat * rounds))
                self._pending(h, held, ri, a, x, ev, n)
                self.peer_bytes[kind] += n
                evs.append(ev)
                a = x
        if a < x:
            ev = self.get(self.store, h, x - a, self.p.store_lat * rounds)
            self._pending(h, held, ri, a, x, ev, x - a)
            self.store_bytes[kind] += x - a
            evs.append(ev)
        held.requested = x
        return evs

    def _lead(self, h, ri, x):
        """``(lead host, its fetches to wait for)``, or None: the store.

        The host ``h`` waits for in the burst of the region's base (the
        one at place ``(i - 1) // lead_fanout`` for ``h``'s place ``i``),
        if it has asked for the region through ``x`` (its fetches in
        flight or landed: what the peer fetcher waits ``lead_wait`` for)
        and its peer server takes one more reader. A lead that has not
        asked for it yet is not waited for (the real fetcher waits up to
        ``lead_wait``; the model never).
        """
        lead = self.lead_of(h, self.regions[ri].base)
        if lead is None:
            return None
        lh = lead.held.get(ri)
        if (lh is None or lh.requested < x
                or lead.peer.n >= self.p.peer_max_clients):
            return None
        return lead, [ev for a, _e, ev in lh.pending
                      if a < x and not ev.done]

    def lead_of(self, h, base):
        """The host ``h`` waits for in a burst of ``base``, or None."""
        places = self.leads.get(base) or []
        i = places.index(h.idx) if h.idx in places else 0
        if not i:
            return None
        return self.hosts[places[(i - 1) // self.p.lead_fanout]]

    @staticmethod
    def _after(evs, start):
        """An Event fired with ``start()``'s, called once ``evs`` are done."""
        out = Event()
        left = [len(evs)]

        def go():
            start().waiters.append(out.fire)

        def one():
            left[0] -= 1
            if not left[0]:
                go()
        if not evs:
            go()
        for ev in evs:
            ev.waiters.append(one)
        return out

    def _pending(self, h, held, ri, a, end, ev, n):
        held.pending.append((a, end, ev))
        ev.waiters.append(lambda: self._landed(h, held, ri, n))

    def _landed(self, h, held, ri, n):
        held.fetched += n
        if not held.first:
            held.first = True
            if self.c.peers:
                bisect.insort(self.holders[ri],
                              (self._tick(h, self.sim.now), h.idx))
        pend = held.pending
        while pend and pend[0][2].done:
            held.present = pend.popleft()[1]

    def need(self, h, ri, x):
        """Events to wait for before [0, x) of region ``ri`` is on ``h``."""
        held = self.region(h, ri)
        out = []
        for a, _e, ev in held.pending:
            if a >= x:
                break
            if not ev.done:
                out.append(ev)
        return out

    # -- servers --

    def plan(self, img, phases):
        """Per phase, [(region index, bytes of it read by then)]."""
        key = (img.name, phases)
        out = self.plans.get(key)
        if out is not None:
            return out
        out = []
        total = img.boot_bytes
        for j in range(phases):
            f = (j + 1) / phases
            row = []
            if img.sequential:
                cum, off = f * total, 0.0
                for ri, r in zip(img.ri, img.regions):
                    row.append((ri, min(max(cum - off, 0.0), r.size)))
                    off += r.size
            else:
                row = [(ri, r.size * f) for ri, r in zip(img.ri, img.regions)]
            out.append(row)
        self.plans[key] = out
        return out

    def phases(self, img):
        return self.p.phases or max(1, int(round(img.rounds)))

    def compute(self, img, share):
        if self.cpu is not None:
            return self.cpu.transfer(img.cpu * share)
        return float((img.compute - img.credit) * share)

    def arrive(self, arg):
        k, img, host = arg
        h = self.hosts[self.place(img) if host is None else host]
        if host is not None:
            self.loads[host] += 1
        Proc(self.sim, self.boot(k, h, img))

    def boot(self, k, h, img):
        sim, p, c = self.sim, self.p, self.c
        t0 = sim.now
        if p.overhead:
            yield float(p.overhead)
        if c.mode == 'download':
            ev = h.downloads.get(img.name)
            if ev is None:
                ev = h.downloads[img.name] = self.get(
                    self.store, h, img.virtual, p.store_lat)
                self.store_bytes['download'] += img.virtual
                h.disk += img.virtual
            if not ev.done:
                yield ev
            yield self.compute(img, 1.0)
        elif c.mode == 'ondemand':
            n = self.phases(img)
            size, lat = img.ondemand / n, p.store_lat * img.rounds / n
            for _j in range(n):
                self.store_bytes['ondemand'] += size
                yield self.get(self.store, h, size, lat)
                yield self.compute(img, 1.0 / n)
        else:
            yield from self.boot_lazy(h, img)
        total = sim.now - t0
        self.boots.append((k, img.name, h.idx, t0, total,
                           total - p.overhead
                           - (img.compute - img.credit)))

    def export_added(self, h, img):
        p, now = self.p, self.sim.now
        h.exported.add(img.name)
        for r in img.regions:
            h.asked.setdefault(r.base, now)
            if self.c.leads:
                # places in the burst, in the order hosts ask
                self.leads.setdefault(r.base, []).append(h.idx)
        if self.c.weigher:
            added = now + p.spawn_delay + (
                self.rng.uniform(-p.spawn_jitter, p.spawn_jitter)
                if p.spawn_jitter else 0.0)
            if not p.change_delay:
                seen = self._tick(h, added)
            elif added <= h.report_due:
                seen = h.report_seen    # in the report not sent yet
            else:
                sent = h.report_due = added + p.change_delay
                self.change_reports.append(sent)
                # the agent records reports in turn
                self.agent_free = seen = h.report_seen = max(
                    self.agent_free, sent) + self.agent_cost
            self.sim.at(seen, self._visible, (h, img))
        if p.fill:
            self.sim.at(now + p.fill_delay, self._fill_queue, (h, img))

    def metadata(self, h, img):
        """Fetch the map and the missing digest lists; Events to wait for.

        One request for what the export lacks (latency once), shared by
        later exports that need the same digest lists.
        """
        out, size, want = [], 0.0, []
        for key, nbytes in [('map:' + img.name, MAP_PER_GIB * img.virtual
                             / GIB)] + [(r.base, self.lib.digest[r.base])
                                        for r in img.regions]:
            ev = h.meta.get(key)
            if ev is None and self.c.leads:
                # a digest list from the lead, once it has it
                lead = self.lead_of(h, key)
                got = lead.meta.get(key) if lead is not None else None
                if got is not None:
                    ev = h.meta[key] = self._after(
                        [] if got.done else [got],
                        lambda lead=lead, n=nbytes: self.get(
                            lead.peer, h, n, self.p.peer_lat))
                    self.peer_bytes['metadata'] += nbytes
                    h.meta_bytes += nbytes
            if ev is None:
                want.append(key)
                size += nbytes
            elif not ev.done:
                out.append(ev)
        if want:
            ev = self.get(self.store, h, size, self.p.store_lat)
            for key in want:
                h.meta[key] = ev
            self.store_bytes['metadata'] += size
            h.meta_bytes += size
            out.append(ev)
        return out

    @staticmethod
    def ready(h, img):
        held = h.held
        for ri, size in img.need:
            x = held.get(ri)
            if x is None or x.present < size:
                return False
        return True

    def boot_lazy(self, h, img):
        p = self.p
        first = img.name not in h.exported
        if first:
            self.export_added(h, img)
        if p.metadata:
            for ev in self.metadata(h, img):
                yield ev
        if first and self.c.prefetch:
            Proc(self.sim, self.prefetch(h, img))
        if self.ready(h, img) and self.cpu is None:
            yield self.compute(img, 1.0)
            return
        n = self.phases(img)
        rounds_phase = img.rounds / n
        phase_bytes = img.boot_size / n
        for j, row in enumerate(self.plan(img, n)):
            if j and self.cpu is None and self.ready(h, img):
                # the prefetch (or another boot) brought the rest
                yield self.compute(img, (n - j) / n)
                return
            new, nb = [], 0.0
            for ri, x in row:
                held = h.held.get(ri) or self.region(h, ri)
                if x > held.requested:
                    new.append((ri, held, x))
                    nb += x - held.requested
            if new:
                rounds = rounds_phase * min(1.0, nb / phase_bytes)
                rounds = max(rounds, min(1.0, rounds_phase))
                for ri, held, x in new:
                    self.fetch(h, held, ri, held.requested, x, rounds, 'boot')
            waits = []
            for ri, x in row:
                held = h.held[ri]
                if x <= held.present:
                    continue
                for a, _e, ev in held.pending:
                    if a >= x:
                        break
                    if not ev.done:
                        waits.append(ev)
            for ev in waits:
                if not ev.done:
                    yield ev
            yield self.compute(img, 1.0 / n)

    def prefetch(self, h, img):
        p = self.p
        for ri, r in zip(img.ri, img.regions):
            held = self.region(h, ri)
            while held.requested < r.size:
                a = held.requested
                x = min(r.size, a + p.prefetch_chunk)
                for ev in self.fetch(h, held, ri, a, x,
                                     max(1.0, (x - a) / p.prefetch_run),
                                     'prefetch'):
                    yield ev

    def _fill_queue(self, arg):
        h, img = arg
        h.fillq.append(img)
        if not h.filling:
            Proc(self.sim, self.filler(h))

    def filler(self, h):
        p, sim = self.p, self.sim
        h.filling = True
        while h.fillq:
            img = h.fillq.popleft()
            for ri, r in zip(img.ri, img.regions):
                held = self.region(h, ri)
                while held.requested < r.data:
                    t0, a = sim.now, held.requested
                    x = min(r.data, a + p.fill_chunk)
                    for ev in self.fetch(h, held, ri, a, x,
                                         max(1.0, (x - a) / (4 * MIB)),
                                         'fill'):
                        yield ev
                    rest = (x - a) / p.fill_rate - (sim.now - t0)
                    if rest > 0:
                        yield float(rest)
        h.filling = False

    # -- a run --

    def run(self, servers):
        """``servers``: [(arrival s, image, host index or None)]."""
        if self.c.weigher:
            self.cap = self.p.per_host or math.ceil(
                self.p.headroom * len(servers) / len(self.hosts))
        for k, (t, img, host) in enumerate(servers):
            self.sim.at(t, self.arrive, (k, img, host))
        wall = time.monotonic()
        self.sim.run()
        return self.result(time.monotonic() - wall)

    def result(self, wall):
        b = self.boots
        total = np.array([x[4] for x in b])
        wait = np.array([x[5] for x in b])
        disk = []
        for h in self.hosts:
            disk.append(h.disk + h.meta_bytes
                        + sum(x.fetched for x in h.held.values()))
        data = sum(v for k, v in self.store_bytes.items() if k != 'metadata')
        return {
            'config': self.c.name, 'hosts': len(self.hosts),
            'servers': len(b), 'store_bw': self.p.store_bw,
            'store_bytes': data + self.store_bytes['metadata'],
            'store_data': data, 'store_by_kind': dict(self.store_bytes),
            'peer_bytes': sum(self.peer_bytes.values()),
            'peer_by_kind': dict(self.peer_bytes),
            'mean_s': float(total.mean()), 'median_s': float(
                np.median(total)), 'p95_s': float(np.percentile(total, 95)),
            'max_s': float(total.max()), 'mean_wait': float(wait.mean()),
            'p95_wait': float(np.percentile(wait, 95)),
            'max_wait': float(wait.max()),
            'disk_mean': float(np.mean(disk)), 'disk_max': float(max(disk)),
            'change_reports': len(self.change_reports),
            'change_reports_peak': _peak_rate(self.change_reports),
            'events': self.sim.events, 'wall_s': wall,
            'end_s': self.sim.now, 'boots': b,
        }


def _peak_rate(times, window=10.0):
    """The most events a second in any ``window`` seconds of ``times``."""
    t = np.sort(np.asarray(times))
    if not len(t):
        return 0.0
    ends = np.searchsorted(t, t + window, side='left')
    return float((ends - np.arange(len(t))).max() / window)


def simulate(config, params, library, n_hosts, servers):
    """Run ``servers`` ([(t, Image, host or None)]); the figures."""
    return Cloud(CONFIGS[config] if isinstance(config, str) else config,
                 params, library, n_hosts).run(servers)


# -- calibration: one host (bench_boot.py) --------------------------------

BENCH_CONFIGS = {'stock': 'stock', 'stock-writeback': 'stock',
                 'stock-ondemand': 'ondemand', 'vmar-lazy': 'lazy',
                 'vmar-lazy-pf': 'lazy-pf'}


def recorded_points(doc):
    """{(n, rate, memory): {bench config: [rounds]}} of a rounds.json."""
    out = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in doc['rounds']:
        out[(r['servers'], r['rate'], r['memory'])][r['config']].append(r)
    return out


def replay(rnd, library):
    """A recorded round's servers: its arrivals and images, one host."""
    by = {img.name: img for img in library.images}
    return [(b['arrival'], by[b['image']], 0) for b in rnd['boots']]


def run_round(config, rnd, library, params):
    return simulate(config, params, library, 1, replay(rnd, library))


def image_waits(res):
    out = collections.defaultdict(list)
    for _k, name, _h, _t0, total, _w in res['boots']:
        out[name].append(total)
    return out


def fit_credit(doc):
    """The trace's own read time: minus lazy-pf's mean wait at n=30."""
    vals = [r['mean_wait_s'] for r in doc['rounds']
            if r['config'] == 'vmar-lazy-pf' and r['servers'] == 30
            and r['memory'] is None]
    return max(0.0, -float(np.mean(vals))) if vals else 0.0


def fit_rounds(doc, library, params, iterations=4):
    """R per image: on-demand waits at the least contended point.

    The point with the lowest arrival rate (n=30, 0.5/s): each image's
    mean (time - T) in the model is made equal to the recorded one by
    moving R by the difference over the latency, ``iterations`` times.
    """
    pts = recorded_points(doc)
    key = min((k for k in pts if k[2] is None and 'stock-ondemand'
               in pts[k]), key=lambda k: (k[1], -k[0]))
    rnds = pts[key]['stock-ondemand']
    measured = collections.defaultdict(list)
    for rnd in rnds:
        for b in rnd['boots']:
            measured[b['image']].append(b['wait'])
    by = {img.name: img for img in library.images}
    for img in library.images:
        img.rounds = max(1.0, (np.mean(measured[img.name]) + img.credit
                               - img.ondemand / params.store_bw)
                         / params.store_lat)
    for _i in range(iterations):
        model = collections.defaultdict(list)
        for rnd in rnds:
            res = run_round('ondemand', rnd, library, params)
            for name, totals in image_waits(res).items():
                model[name] += [t - by[name].compute for t in totals]
        for img in library.images:
            diff = np.mean(measured[img.name]) - np.mean(model[img.name])
            img.rounds = max(1.0, img.rounds + diff / params.store_lat)
    return key, {img.name: img.rounds for img in library.images}


def calibrated_library(params=None):
    """bench_boot's six images with credit and rounds fitted."""
    params = params or Params()
    doc = _rounds_doc(ROUNDS)
    credit = fit_credit(doc)
    lib = derive_boot_library(doc, credit=credit)
    key, rounds = fit_rounds(doc, lib, params)
    lib.fit = {'credit': credit, 'rounds': rounds, 'point': key}
    return lib


def _err(model, measured):
    return (model - measured) / measured if measured else 0.0


def calibrate_one_host(lib, phases=0, smoke=False):
    """Rows: model against bench_boot.py at each recorded point."""
    rows = []
    for path in (ROUNDS, ROUNDS_SLOW):
        doc = _rounds_doc(path)
        params = Params(store_bw=nbdkit_rate(doc['store']['rate']),
                        store_lat=float(doc['store']['delay'].rstrip('ms'))
                        / 1000, phases=phases)
        for (n, rate, mem), cfgs in sorted(
                recorded_points(doc).items(),
                key=lambda kv: (kv[0][2] is not None, -kv[0][0],
                                -kv[0][1])):
            if smoke and (n != 30 or rate != 3.0 or mem is not None):
                continue
            for bench, rnds in cfgs.items():
                model_cfg = BENCH_CONFIGS.get(bench)
                if model_cfg is None:
                    continue
                runs = [run_round(model_cfg, r, lib, params) for r in rnds]
                mt = float(np.mean([r['mean_s'] for r in runs]))
                mb = float(np.mean([r['store_bytes'] for r in runs]))
                mw = float(np.mean([
                    np.mean([x[4] for x in r['boots']]) - np.mean(
                        [lib_img(lib, x[1]).compute for x in r['boots']])
                    for r in runs]))
                rt = float(np.mean([r['mean_s'] for r in rnds]))
                rb = float(np.mean([r['store_bytes'] for r in rnds]))
                rw = float(np.mean([r['mean_wait_s'] for r in rnds]))
                rows.append({
                    'where': 'one host', 'store': doc['store']['rate'],
                    'point': 'n=%d, %g/s%s' % (
                        n, rate, '' if mem is None else
                        ', %d MiB' % (mem >> 20)),
                    'config': bench, 'rounds': len(rnds),
                    'time_measured': rt, 'time_model': mt,
                    'time_err': _err(mt, rt),
                    'wait_measured': rw, 'wait_model': mw,
                    'bytes_measured': rb, 'bytes_model': mb,
                    'bytes_err': _err(mb, rb), 'fitted': (
                        'R' if bench == 'stock-ondemand'
                        and (n, rate, mem) == lib.fit['point']
                        and path == ROUNDS else '')})
    return rows


def lib_img(lib, name):
    for img in lib.images:
        if img.name == name:
            return img
    raise KeyError(name)


# -- calibration: three hosts ---------------------------------------------

def weigher_servers(lib, run, seed, interval=2.0):
    """bench_weigher's 30 servers with a run's recorded placement."""
    placement = run[5]
    hosts = sorted(placement)
    order = [(img, hosts.index(h)) for h in hosts
             for img, cnt in placement[h].items() for _i in range(cnt)]
    random.Random(seed).shuffle(order)
    return [(k * interval, lib.images[img], h)
            for k, (img, h) in enumerate(order)]


def weigher_orders(rounds=2, seed=17):
    """bench_weigher.py's create orders (images, one every 2 s)."""
    rng, out = random.Random(seed), []
    for _r in range(rounds):
        order = [i for i in range(6) for _j in range(5)]
        rng.shuffle(order)
        out.append(order)
    return out


# the three-host cloud (tools/cloud.sh up --computes 3): hosts of two
# cores at cpu_allocation_ratio 16 take 32 one-vCPU servers; Nova's own
# weighers (all_weighers: RAM, CPU, disk, I/O ops...) moved a host's
# weight by 0.3-1.0 between hosts of 0 to 14 servers in nova-scheduler's
# log of a bench_weigher run (2026-11-28), not by 3
CLOUD_SCHEDULER = dict(per_host=32, spread=1.0)
# seconds from the scheduler's choice to the export on the host: 2.2 and
# 3.7 s in that run (vmar-export's log); reported at the next tick
CLOUD_SPAWN = dict(spawn_delay=2.95, spawn_jitter=0.75)


def weigher_params(**kw):
    """The multinode test cloud's parameters.

    report_interval 5 s; CLOUD_SCHEDULER and CLOUD_SPAWN. Exports are
    reported at the periodic report only (``change_delay`` 0), as in the
    recorded runs, unless ``kw`` says otherwise.
    """
    base = dict(report_interval=5.0, change_delay=0.0, phases=32,
                store_lat=0.002, **CLOUD_SCHEDULER, **CLOUD_SPAWN)
    base.update(kw)
    return Params(**base)


def fit_weigher_time(lib, runs_fit):
    """The guests' CPU seconds W, create-to-boot O, store CPU per byte c.

    Fitted on round 1: weigher on (median and max) and off (median).
    """
    on = next(r for r in runs_fit if r[1])
    off = next(r for r in runs_fit if not r[1])

    def model(run, w, c):
        for img in lib.images:
            img.cpu = w
        res = simulate('lazy', weigher_params(cores=2.0, store_cpu=c),
                       lib, 3, weigher_servers(lib, run, seed=run[0]))
        return res['median_s'], res['max_s']

    def solve(lo, hi, below):
        """The x in [lo, hi] where ``below(x)`` turns false (bisection)."""
        for _j in range(24):
            x = (lo + hi) / 2
            if below(x):
                lo = x
            else:
                hi = x
        return x

    def spread_short(x):
        med, mx = model(on, x, c)
        return mx - med < on[4] - on[3]

    c = 0.05 / MIB
    w = o = 0.0
    for _i in range(3):
        # O shifts every boot alike (a delay before the shared cores), so
        # the spread max - median fixes W and the median then O
        w = solve(1.0, 200.0, spread_short)
        o = on[3] - model(on, w, c)[0]
        if o < 0:
            # a spread wider than any W gives with the median (boots slower
            # than the cores explain, one after another): no delay, and W
            # from the median alone
            o = 0.0
            w = solve(1.0, 200.0, lambda x: model(on, x, c)[0] < on[3])
        c = solve(0.0, 2.0 / MIB, lambda x: model(off, w, x)[0] + o
                  < off[3])
    return w, o, c


def weigher_rows(lib, code, delay, runs, seeds, orders, times=True):
    """The calibration rows of one recording of bench_weigher.

    Bytes with the recorded placements; bytes with the model's scheduler
    and bench_weigher's own create orders, each run on its own, over
    ``seeds`` (report ticks, spawn times, ties); with ``times``, boot
    times on shared cores, fitted on the recording's round 1.
    """
    rows = []

    def point(run, what):
        return 'bench_weigher %s round %d, weigher %s, %s' % (
            code, run[0], 'on' if run[1] else 'off', what)
    for run in runs:
        res = simulate('lazy', weigher_params(change_delay=delay), lib, 3,
                       weigher_servers(lib, run, seed=run[0]))
        rows.append({
            'where': 'three hosts', 'point': point(run, 'recorded placement'),
            'config': 'lazy', 'bytes_measured': run[2] * MIB,
            'bytes_model': res['store_bytes'],
            'bytes_err': _err(res['store_bytes'], run[2] * MIB)})
    for run in runs:
        got = []
        for s in range(seeds):
            servers = [(k * 2.0, lib.images[i], None)
                       for k, i in enumerate(orders[run[0] - 1])]
            cfg = Config('w', 'w', 'lazy', weigher=run[1])
            got.append(simulate(cfg, weigher_params(
                seed=s, change_delay=delay), lib, 3, servers)['store_bytes'])
        rows.append({
            'where': 'three hosts', 'point': point(
                run, 'model scheduler (%d seeds: %.0f-%.0f MiB)' % (
                    seeds, min(got) / MIB, max(got) / MIB)),
            'config': 'weigher' if run[1] else 'lazy',
            'bytes_measured': run[2] * MIB,
            'bytes_model': float(np.mean(got)),
            'bytes_err': _err(float(np.mean(got)), run[2] * MIB)})
    if not times:
        return rows
    w, o, c = fit_weigher_time(lib, [r for r in runs if r[0] == 1])
    for img in lib.images:
        img.cpu = w
    for run in runs:
        res = simulate('lazy', weigher_params(cores=2.0, store_cpu=c), lib,
                       3, weigher_servers(lib, run, seed=run[0]))
        for stat, meas in (('median', run[3]), ('max', run[4])):
            fitted = run[0] == 1 and (run[1] or stat == 'median')
            mt = res[stat + '_s'] + o
            rows.append({
                'where': 'three hosts', 'point': point(run, 'boot ' + stat),
                'config': 'lazy', 'time_measured': meas,
                'time_model': mt, 'time_err': _err(mt, meas),
                'fitted': 'W, O, c' if fitted else ''})
    rows[-1]['fit'] = {'recording': code, 'cpu_s': w, 'overhead_s': o,
                       'store_cpu_s_per_mib': c * MIB}
    return rows


def calibrate_three_hosts(smoke=False):
    """Rows: bench_weigher (bytes, time, scheduler), peers (bytes)."""
    rows = []
    lib = weigher_library()
    seeds = 4 if smoke else 20
    orders = weigher_orders()
    for code, delay, runs in WEIGHER_RECORDINGS:
        rows += weigher_rows(lib, code, delay, runs, seeds, orders,
                             times=not smoke)
    # bench_peers_hosts: 4 hosts read minbase whole, in turn
    ph = PEERS_HOSTS
    data = (ph['per_host_mib'] - ph['meta_mib']) * MIB
    img = Image('minbase', [Region('minbase', data, data, 'minbase')],
                compute=0.0, rounds=1.0, sequential=True)
    plib = Library([img], {'minbase': GIB / BS * DIGEST_PER_BLOCK})
    servers = [(100.0 * k, img, k) for k in range(ph['hosts'])]
    for peers, meas in ((False, ph['store_mib']), (True, ph['peers_mib'])):
        cfg = Config('p', 'p', 'lazy', peers=peers)
        res = simulate(cfg, Params(metadata=True, report_interval=0.0,
                                   phases=64), plib, ph['hosts'], servers)
        rows.append({
            'where': 'three hosts', 'point': 'bench_peers_hosts, 4 hosts '
            'in turn, %s' % ('peers' if peers else 'store only'),
            'config': 'peers' if peers else 'lazy',
            'bytes_measured': meas * MIB, 'bytes_model': res['store_bytes'],
            'bytes_err': _err(res['store_bytes'], meas * MIB)})
    # the multinode stage's peer case "ok"
    mn = MULTINODE_OK
    img = Image('mn', [Region('mn', mn['data_mib'] * MIB,
                              mn['data_mib'] * MIB, 'mn')],
                compute=0.0, rounds=1.0, virtual=64 * MIB, sequential=True)
    mlib = Library([img], {'mn': 64 * MIB / BS * DIGEST_PER_BLOCK})
    res = simulate(Config('p', 'p', 'lazy', peers=True),
                   Params(report_interval=0.0, phases=16), mlib, 3,
                   [(0.0, img, 0), (100.0, img, 1)])
    second = res['peer_bytes']
    rows.append({
        'where': 'three hosts', 'point': 'multinode peer case ok: the '
        'second host\'s bytes from peers', 'config': 'peers',
        'bytes_measured': mn['from_peers_mib'] * MIB, 'bytes_model': second,
        'bytes_err': _err(second, mn['from_peers_mib'] * MIB)})
    rows.append({
        'where': 'three hosts', 'point': 'multinode peer case ok: store '
        'data bytes of both hosts (the first host\'s 8 MiB)',
        'config': 'peers', 'bytes_measured': mn['data_mib'] * MIB,
        'bytes_model': res['store_data'],
        'bytes_err': _err(res['store_data'], mn['data_mib'] * MIB)})
    return rows


def aggregation_check(lib, phases):
    """One phase per read round against ``phases`` per boot.

    At bench_boot's busiest points (n=30 at 3/s, both stores): what
    aggregating the scale runs costs. [(store, bench config, mean s
    full, aggregated, store bytes full, aggregated)].
    """
    out = []
    for path in (ROUNDS, ROUNDS_SLOW):
        doc = _rounds_doc(path)
        bw = nbdkit_rate(doc['store']['rate'])
        for bench, rnds in recorded_points(doc)[(30, 3.0, None)].items():
            if bench not in ('stock-ondemand', 'vmar-lazy', 'vmar-lazy-pf'):
                continue
            full = run_round(BENCH_CONFIGS[bench], rnds[0], lib,
                             Params(store_bw=bw))
            agg = run_round(BENCH_CONFIGS[bench], rnds[0], lib,
                            Params(store_bw=bw, phases=phases))
            out.append((doc['store']['rate'], bench, full['mean_s'],
                        agg['mean_s'], full['store_bytes'],
                        agg['store_bytes']))
    return out


def _mib(v):
    return '%.1f MiB' % (v / MIB) if v < 10 * GIB else '%.2f GiB' % (v / GIB)


def _mb(v):
    return '%.1f MB' % (v / 1e6)


def _cell(row, key, fmt):
    return fmt(row[key]) if key in row else ''


def format_calibration(rows):
    """The calibration rows as a Markdown table, errors flagged."""
    lines = ['| where | store | point | config | time measured s | model s '
             '| err | wait measured s | model s | bytes measured | model | '
             'err | note |', '|' + '---|' * 13]
    for r in rows:
        # as bench/RESULTS.md gives them: MB for bench_boot, MiB for the
        # three-host benches
        unit = _mb if r['where'] == 'one host' else _mib
        note = [r['fitted']] if r.get('fitted') else []
        note += ['> 15 %' for key in ('time_err', 'bytes_err')
                 if abs(r.get(key, 0)) > 0.15]
        lines.append('| ' + ' | '.join([
            r['where'], r.get('store', ''), r['point'], r['config'],
            _cell(r, 'time_measured', '{:.1f}'.format),
            _cell(r, 'time_model', '{:.1f}'.format),
            _cell(r, 'time_err', lambda v: '%+.1f %%' % (100 * v)),
            _cell(r, 'wait_measured', '{:.2f}'.format),
            _cell(r, 'wait_model', '{:.2f}'.format),
            _cell(r, 'bytes_measured', unit), _cell(r, 'bytes_model', unit),
            _cell(r, 'bytes_err', lambda v: '%+.1f %%' % (100 * v)),
            ', '.join(note)]) + ' |')
    return '\n'.join(lines)


def calibrate(smoke=False, phases_check=8):
    """Every calibration row, the fit, the aggregation check."""
    t0 = time.monotonic()
    lib = calibrated_library()
    rows = calibrate_one_host(lib, smoke=smoke)
    rows += calibrate_three_hosts(smoke=smoke)
    agg = [] if smoke else aggregation_check(lib, phases_check)
    return {'rows': rows, 'fit': lib.fit, 'k': lib.k, 'phases': phases_check,
            'core_blocks': lib.core_blocks,
            'images': [{'name': i.name, 'compute': i.compute,
                        'rounds': i.rounds, 'ondemand': i.ondemand,
                        'boot_bytes': i.boot_bytes,
                        'own_boot': i.regions[1].size,
                        'own_data': i.regions[1].data}
                       for i in lib.images],
            'aggregation': agg, 'wall_s': time.monotonic() - t0,
            'library': lib}


def print_calibration(cal):
    fit = cal['fit']
    print('== calibration (model against recorded runs)')
    print('derived: core %.0f blocks (%.1f MB) every boot reads, k %.3f; '
          'credit %.2f s; R fitted at %s' % (
              cal['core_blocks'], cal['core_blocks'] * BS / 1e6, cal['k'],
              fit['credit'], 'n=%d, %g/s' % fit['point'][:2]))
    for i in cal['images']:
        print('  %-10s T %5.1f s  R %6.1f  D %6.1f MB  boot set %5.1f MB '
              '(own %5.2f MB)  own data %6.1f MB' % (
                  i['name'], i['compute'], i['rounds'], i['ondemand'] / 1e6,
                  i['boot_bytes'] / 1e6, i['own_boot'] / 1e6,
                  i['own_data'] / 1e6))
    print(format_calibration(cal['rows']))
    for row in cal['rows']:
        if 'fit' in row:
            f = row['fit']
            print('three-host time fit: guest CPU W %.1f s, create to boot '
                  'O %.1f s, store CPU c %.3f s per MiB' % (
                      f['cpu_s'], f['overhead_s'], f['store_cpu_s_per_mib']))
    if cal['aggregation']:
        print('aggregation: %d phases per boot against one per read round '
              '(n=30, 3/s):' % cal['phases'])
        for store, bench, ft, at, fb, ab in cal['aggregation']:
            print('  %-4s %-15s mean %.2f s against %.2f s, store %.1f / '
                  '%.1f MB' % (store, bench, at, ft, ab / 1e6, fb / 1e6))
    over = [r for r in cal['rows'] if any(
        abs(r.get(k, 0)) > 0.15 for k in ('time_err', 'bytes_err'))]
    print('rows over 15 %%: %d of %d; %.1f s' % (
        len(over), len(cal['rows']), cal['wall_s']))


# -- the scale runs -------------------------------------------------------

STORM_S = 60.0
DAY_S = 86400.0


def scale_servers(lib, n, arrival, seed):
    """``n`` servers of uniformly chosen images.

    'storm': uniform over 60 s; 'day': a Poisson process over a day,
    given n arrivals (uniform order statistics).
    """
    rng = np.random.default_rng(seed)
    window = STORM_S if arrival == 'storm' else DAY_S
    times = np.sort(rng.uniform(0, window, n))
    imgs = rng.integers(len(lib.images), size=n)
    return [(float(t), lib.images[i], None) for t, i in zip(times, imgs)]


# bench_scale.py hosts (RESULTS.md, "Agent: time per report"): reports a
# second one vmar-agent drained from a flood of 1,000 hosts' reports, with
# MariaDB on the same two cores
AGENT_RATE = 157.0


def scale_params(**kw):
    base = dict(metadata=True, fill=True, phases=8, fill_chunk=256 * MIB,
                link=10e9 / 8, agent_rate=AGENT_RATE)
    base.update(kw)
    return Params(**base)


def needed_bandwidth(run_at, guess, target=1.0, tol=1.25, hi=1e13,
                     stat='max_wait'):
    """The smallest bandwidth whose ``stat`` of storage wait <= ``target``.

    ``hi`` first (at it only latency and the per-transfer cap bound the
    wait; above target there: unreachable), then a bracket of factors of
    4 around ``guess``, then bisection in log space until the bracket is
    within ``tol``. Returns (bandwidth or None, its
    result, [(bandwidth, the stat)] tried).
    """
    tried, res = [], {}

    def wait(bw):
        res[bw] = run_at(bw)
        tried.append((bw, res[bw][stat]))
        return res[bw][stat]
    if wait(hi) > target:
        return None, res[hi], tried
    b = min(max(guess, 1e5), hi / 4)
    if wait(b) > target:
        bad = b
        while True:
            b = min(b * 4, hi)
            if b == hi or wait(b) <= target:
                good = b
                break
            bad = b
    else:
        good = b
        while True:
            b = b / 4
            if b < 1e4:
                return good, res[good], tried
            if wait(b) > target:
                bad = b
                break
            good = b
    while good / bad > tol:
        b = math.sqrt(good * bad)
        if wait(b) > target:
            bad = b
        else:
            good = b
    return good, res[good], tried


def scale_run(lib, config, hosts, n, arrival, seed=0, search=True,
              **kw):
    """One scale point: its needed bandwidth and figures at it.

    A storm's boots are over long before the fill starts (``fill_delay``
    after each first export), so its search runs without the fill, and
    the figures come from one more run with it at the bandwidth found;
    a day's runs have the fill throughout.
    """
    servers = scale_servers(lib, n, arrival, seed)
    memo = {}
    storm = arrival == 'storm'

    def at(bw, fill=not storm):
        if (bw, fill) not in memo:
            memo[(bw, fill)] = simulate(config, scale_params(
                store_bw=bw, seed=seed, fill=fill, **kw), lib, hosts,
                servers)
        return memo[(bw, fill)]
    if not search:
        bw = scale_params(**kw).store_bw
        return {'needed_bw': None, 'result': at(bw, True), 'tried': [],
                'at_bw': bw}
    top = at(1e13)
    need = top['store_bytes'] - top['store_by_kind'].get('fill', 0)
    # a storm: what its boots fetch, over its minute; a day: what a first
    # export fetches (the boots that wait), in a second
    exports = len({(b[2], b[1]) for b in top['boots']})
    guess = need / STORM_S if storm else need / exports
    bw, res, tried = needed_bandwidth(at, guess)
    final = at(bw if bw else 1e13, True)
    return {'needed_bw': bw, 'result': final, 'tried': tried,
            'floor_wait': top['max_wait'], 'at_bw': bw or 1e13}


def _slim(res):
    return {k: v for k, v in res.items() if k != 'boots'}


def scale(lib, hosts=(10, 100, 1000), servers=(10000, 100000),
          arrivals=('storm', 'day'), configs=SCALE_CONFIGS, echo=print,
          **kw):
    out = []
    for n in servers:
        for arrival in arrivals:
            for h in hosts:
                for c in configs:
                    t0 = time.monotonic()
                    r = scale_run(lib, c, h, n, arrival, **kw)
                    r.update(config=c, hosts=h, servers=n, arrival=arrival,
                             wall_s=time.monotonic() - t0)
                    r['result'] = _slim(r['result'])
                    out.append(r)
                    echo(scale_line(r))
    return out


def _bw(v, floor=None):
    if v is None:
        return 'unreachable' if floor is None else \
            'unreachable (%.2f s)' % floor
    if v >= 1e9:
        return '%.1f GB/s' % (v / 1e9)
    return '%.0f MB/s' % (v / 1e6)


def _bytes(v):
    for unit, div in (('TB', 1e12), ('GB', 1e9), ('MB', 1e6)):
        if v >= div:
            return '%.1f %s' % (v / div, unit)
    return '%.0f B' % v


def scale_line(r):
    res = r['result']
    kinds = res['store_by_kind']
    return ('%6d servers %-5s %4d hosts %-8s need %-12s store %-9s '
            '(boot %s, meta %s, fill %s) peers %-9s wait %.2f s max %.2f '
            'disk/host %s max %s reports %d (%.0f/s) [%.0f s, %d runs]' % (
                r['servers'], r['arrival'], r['hosts'], r['config'],
                _bw(r['needed_bw'], r.get('floor_wait')),
                _bytes(res['store_bytes']),
                _bytes(sum(v for k, v in kinds.items()
                           if k not in ('metadata', 'fill'))),
                _bytes(kinds.get('metadata', 0)),
                _bytes(kinds.get('fill', 0)), _bytes(res['peer_bytes']),
                res['mean_wait'], res['max_wait'], _bytes(res['disk_mean']),
                _bytes(res['disk_max']), res['change_reports'],
                res['change_reports_peak'], r['wall_s'], len(r['tried'])))


def format_scale(runs):
    lines = ['| servers | arrivals | hosts | config | store bytes | of them '
             'boots / metadata / fill | from peers | needed bandwidth | '
             'mean / longest wait at it s | host disk mean / max | '
             'change reports (peak a second) |',
             '|' + '---|' * 11]
    order = {k: i for i, k in enumerate(_combos(runs))}
    for r in sorted(runs, key=lambda r: (order[(r['servers'], r['arrival'])],
                                         r['hosts'],
                                         SCALE_CONFIGS.index(r['config'])
                                         if r['config'] in SCALE_CONFIGS
                                         else 99)):
        res = r['result']
        k = res['store_by_kind']
        lines.append('| %d | %s | %d | %s | %s | %s / %s / %s | %s | %s | '
                     '%.2f / %.2f | %s / %s | %s |' % (
                         r['servers'], r['arrival'], r['hosts'],
                         r['config'], _bytes(res['store_bytes']),
                         _bytes(sum(v for kk, v in k.items()
                                    if kk not in ('metadata', 'fill'))),
                         _bytes(k.get('metadata', 0)),
                         _bytes(k.get('fill', 0)),
                         _bytes(res['peer_bytes']),
                         _bw(r['needed_bw'], r.get('floor_wait')),
                         res['mean_wait'], res['max_wait'],
                         _bytes(res['disk_mean']), _bytes(res['disk_max']),
                         '%d (%.0f)' % (res['change_reports'],
                                        res['change_reports_peak'])
                         if res['change_reports'] else ''))
    return '\n'.join(lines)


# -- the report -----------------------------------------------------------

def plots(out_dir, cal, runs):
    import matplotlib
    matplotlib.use('Agg')
    from matplotlib import pyplot as plt
    paths = []
    # calibration: model against measured, one host
    rows = [r for r in cal['rows'] if 'time_model' in r
            and r['where'] == 'one host']
    if rows:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
        for ax, (key, unit, div) in zip(axes, (
                ('time', 's', 1.0), ('bytes', 'MB', 1e6))):
            meas = [r[key + '_measured'] / div for r in rows]
            mod = [r[key + '_model'] / div for r in rows]
            ax.scatter(meas, mod, s=18)
            lim = [min(meas + mod) * 0.8, max(meas + mod) * 1.2]
            ax.plot(lim, lim, 'k-', lw=0.8)
            ax.plot(lim, [v * 1.15 for v in lim], 'k:', lw=0.8)
            ax.plot(lim, [v / 1.15 for v in lim], 'k:', lw=0.8)
            if key == 'bytes':
                ax.set_xscale('log')
                ax.set_yscale('log')
            ax.set_xlabel('measured (%s)' % unit)
            ax.set_ylabel('model (%s)' % unit)
            ax.set_title('bench_boot.py: mean boot %s' % key
                         if key == 'time' else 'bench_boot.py: store bytes')
        fig.suptitle('Calibration on one host (dotted: +-15 %)')
        fig.tight_layout()
        paths.append(os.path.join(out_dir, 'calibration.png'))
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    # scale figures
    for key, title, fname, fn in (
            ('store', 'Store bytes', 'store-bytes.png',
             lambda r: r['result']['store_bytes']),
            ('bw', 'Store bandwidth for every boot\'s storage wait <= 1 s',
             'store-bandwidth.png', lambda r: r['needed_bw']),
            ('disk', 'Host disk for mirrors (mean per host)',
             'host-disk.png', lambda r: r['result']['disk_mean'])):
        combos = _combos(runs)
        if not combos:
            continue
        fig, axes = plt.subplots(1, len(combos), figsize=(
            4.2 * len(combos), 4.2), squeeze=False)
        for ax, (n, arr) in zip(axes[0], combos):
            for c in SCALE_CONFIGS:
                pts = sorted((r['hosts'], fn(r)) for r in runs
                             if r['servers'] == n and r['arrival'] == arr
                             and r['config'] == c)
                xs = [p[0] for p in pts if p[1] is not None]
                ys = [p[1] for p in pts if p[1] is not None]
                gone = [p[0] for p in pts if p[1] is None]
                label = c + (' (unreachable at %s hosts)' % ', '.join(
                    str(h) for h in gone) if gone else '')
                if xs:
                    ax.plot(xs, ys, 'o-', label=label)
                elif gone:
                    ax.plot([], [], 'o-', label=label)
            ax.set_xscale('log')
            ax.set_yscale('log')
            ax.set_xlabel('hosts')
            ax.set_title('%d servers, %s' % (n, arr))
            ax.set_ylabel('bytes/s' if key == 'bw' else 'bytes')
            ax.grid(True, which='both', alpha=0.3)
            ax.legend(fontsize=6)
        fig.suptitle(title)
        fig.tight_layout()
        paths.append(os.path.join(out_dir, fname))
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    # storage wait against bandwidth, the largest storm
    big = [r for r in runs if r['tried']]
    if big:
        n = max(r['servers'] for r in big)
        h = max(r['hosts'] for r in big)
        fig, ax = plt.subplots(figsize=(6, 4.2))
        for r in big:
            if (r['servers'], r['hosts'], r['arrival']) == (n, h, 'storm'):
                pts = sorted(r['tried'])
                ax.plot([p[0] for p in pts], [max(p[1], 1e-3) for p in pts],
                        'o-', label=r['config'])
        ax.axhline(1.0, color='k', lw=0.8)
        ax.set_xscale('log')
        ax.set_yscale('log')
        ax.set_xlabel('store bandwidth (bytes/s)')
        ax.set_ylabel('longest storage wait (s)')
        ax.set_title('%d servers in a 60 s storm on %d hosts' % (n, h))
        ax.legend(fontsize=7)
        ax.grid(True, which='both', alpha=0.3)
        fig.tight_layout()
        paths.append(os.path.join(out_dir, 'wait-bandwidth.png'))
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


def machine():
    m = report_boot.machine()
    return '%s, %d CPUs, Python %s, numpy %s' % (
        m['cpu'] or 'unknown CPU', m['cpus'] or 0,
        sys.version.split()[0], np.__version__)


def write_report(out_dir, cal, runs, argv, wall, date=None):
    """The plots, sim.json, sim.md and RESULTS-draft.md in ``out_dir``."""
    date = date or time.strftime('%Y-%m-%d')
    os.makedirs(out_dir, exist_ok=True)
    pngs = plots(out_dir, cal, runs)
    with open(os.path.join(out_dir, 'sim.json'), 'w') as f:
        json.dump({'calibration': {k: v for k, v in cal.items()
                                   if k != 'library'},
                   'scale': runs, 'argv': argv, 'wall_s': wall,
                   'date': date}, f, indent=1,
                  default=float)
    with open(os.path.join(out_dir, 'sim.md'), 'w') as f:
        f.write(summary(cal, runs, argv, wall, pngs))
    with open(os.path.join(out_dir, 'RESULTS-draft.md'), 'w') as f:
        f.write(results_draft(cal, runs, argv, wall, date))
    return pngs


def render(out_dir):
    """The plots and Markdown again from ``out_dir``/sim.json."""
    with open(os.path.join(out_dir, 'sim.json')) as f:
        doc = json.load(f)
    return write_report(out_dir, doc['calibration'], doc['scale'],
                        doc['argv'], doc['wall_s'], doc.get('date'))


def over_15(rows, where, key):
    return [r for r in rows if r['where'] == where and key in r
            and abs(r[key]) > 0.15]


def print_fit(cal):
    """The derived and fitted inputs, as Markdown."""
    fit = cal['fit']
    out = ['Derived: a core of %.0f blocks (%.1f MB) every boot reads, '
           'k = %.3f; credit %.2f s; R fitted on stock on-demand at n=%d, '
           '%g/s (100 MiB/s).' % (
               cal['core_blocks'], cal['core_blocks'] * BS / 1e6, cal['k'],
               fit['credit'], fit['point'][0], fit['point'][1]), '',
           '| image | T s | R | D MB | boot set MB | own boot MB | own data '
           'MB |', '|---|---|---|---|---|---|---|']
    for i in cal['images']:
        out.append('| %s | %.1f | %.0f | %.1f | %.1f | %.2f | %.1f |' % (
            i['name'], i['compute'], i['rounds'], i['ondemand'] / 1e6,
            i['boot_bytes'] / 1e6, i['own_boot'] / 1e6, i['own_data'] / 1e6))
    for row in cal['rows']:
        if 'fit' in row:
            f = row['fit']
            out += ['', 'Three-host time fit (bench_weigher %s, round 1): '
                    'guest CPU W = %.1f s, create to boot O = %.1f s, store '
                    'CPU c = %.3f s per MiB.' % (
                        f['recording'], f['cpu_s'], f['overhead_s'],
                        f['store_cpu_s_per_mib'])]
    return '\n'.join(out)


def calibration_reading(cal):
    """Which calibration goals are met, which not, and why."""
    rows = cal['rows']
    one = [r for r in rows if r['where'] == 'one host']
    errs = [abs(r['time_err']) for r in one if 'time_err' in r]
    sched = [r for r in rows if 'model scheduler' in r['point']]
    wtime = [r for r in rows if r['where'] == 'three hosts'
             and 'time_err' in r]
    out = [
        '- **One host, time: %s.** Every point of `bench_boot.py` (both '
        'stores, four configurations, `stock-writeback` modelled as '
        '`stock`) within %.1f %% (%d rows over 15 %%). R is fitted on one '
        'point (stock on-demand, n=30 at 0.5/s), the credit on the lazy + '
        'prefetch waits; the other points, the other configurations and '
        'the 200M store validate them.' % (
            'met' if not over_15(rows, 'one host', 'time_err') else
            'not met', 100 * max(errs or [0]),
            len(over_15(rows, 'one host', 'time_err'))),
        '- **One host, bytes: met, but not a test.** The recorded bytes '
        'are inputs: D from stock on-demand\'s bytes, the core and k from '
        'the unique-blocks limits, stock from the images\' size. What the '
        'model adds is its accounting (a block once per host and base, '
        'in-flight fetches shared), which keeps lazy at the limit '
        'whatever the arrivals.',
        '- **Three hosts, bytes with the recorded placement: met** (%s), '
        'and `bench_peers_hosts` (store only, peers in turn) and the '
        'multinode peer case: met.' % ', '.join(
            '%+.1f %%' % (100 * r['bytes_err']) for r in rows
            if 'recorded placement' in r['point'])]
    if sched:
        out.append(
            '- **Three hosts, bytes with the model\'s scheduler: %s** '
            '(%s). Each recorded run with bench_weigher\'s own create '
            'order; shares as HostReports.shares has them; the cloud\'s '
            'hosts take 32 servers; Nova\'s own weighers moved hosts of '
            '0-14 servers 0.3-1.0 apart in nova-scheduler\'s log of a '
            'run (2026-11-28, bench/report-scale/nova-weights-'
            '2026-11-28.txt), hence spread 1 here; exports reached '
            'vmar-export 2.2-3.7 s after the choice (spawn_delay 2.95 s '
            '+- 0.75). The model\'s seeds fall in two groups for round 2 '
            'with the weigher: 96 MiB (the third create sees the first '
            'host\'s export and each family stays on one host) or '
            '136-168 MiB (it does not, and a family splits). Every '
            'recording of that run with periodic reports is in the first '
            'group: 80 MiB on 2026-11-25 (all 30 servers on one host, '
            'which no seed does) and 96 MiB on 2026-11-28; round 1 '
            'measured 128 MiB four times, the model\'s most frequent '
            'seed. The means are compared; a recording is one draw. '
            'cf3fd3e is the one recording with nova-scheduler\'s '
            'per-weigher scores logged (bench/RESULTS.md): in its round 2 '
            'with the weigher the first two creates went blind to the two '
            'least loaded hosts (Nova\'s weighers 1.0 apart, as modelled), '
            'the third saw the first host\'s export 4 s after its choice '
            '(vmar 3.75 against 1.0), and every later create followed the '
            'shares: 112 MiB on two hosts, within 1 %% of the model\'s '
            'mean, and all four of its points within 15 %%. The 80 MiB '
            'recordings (all on one host) need the second create to see '
            'the first\'s export within 2 s, which no logged run shows; '
            'they stay in the table as measured.' % (
                'not met' if any(abs(r['bytes_err']) > 0.15 for r in sched)
                else 'met',
                ', '.join('%s %+.0f %%' % (
                    r['point'].split(', model')[0].replace(
                        'bench_weigher ', ''), 100 * r['bytes_err'])
                    for r in sched)))
    if wtime:
        bad = [r for r in wtime if abs(r['time_err']) > 0.15]
        out.append(
            '- **Three hosts, time: %s.** The only recorded times of the '
            'three-host cloud are `bench_weigher`\'s: TCG guests of three '
            'hosts on one machine\'s two cores, CPU-bound. Modelled as '
            'processor sharing of the two cores with three fitted values '
            '(each recording\'s round 1), its round 2 validates: %s. '
            'Over 15 %%: %s. The measurement itself varies more than '
            'that between rounds of the same configuration (deb4a20, '
            'weigher off: median 101.4 s and 120.5 s for 232 and 240 '
            'MiB), and between recordings (weigher on, round 1: median '
            '93.5 s and 67.7 s for the same placement); in 1e030fa\'s '
            'round 1 the spread from median to max (18 s) is below what '
            'processor sharing gives for any guest CPU W (W stops at '
            'its floor, 1 s).' % (
                'met' if not bad else 'not met',
                ', '.join('%s %+.1f %%' % (
                    r['point'].replace('bench_weigher ', ''),
                    100 * r['time_err'])
                          for r in wtime if not r.get('fitted')),
                '; '.join(r['point'] for r in bad) or 'none'))
    out.append(
        '- **Not calibrated:** the traces\' read timing (bench_boot keeps '
        'each trace\'s read count and time, not its reads: the model '
        'spreads a boot\'s reads evenly over its time, and the 200M '
        'store point, store-bound, checks that shape); the 96 MiB page '
        'cache budget (not modelled; measured times did not move); '
        '`vmar-full` (its copies ran one base at a time, not modelled); '
        'the peer read times of `bench_peers_hosts` (one machine, no '
        'network: context only); the times of `bench_burst` (TCG-bound; '
        'its bytes are calibrated by `--burst`).')
    return out


def _combos(runs):
    """(servers, arrivals) in order: fewer servers first, storm first."""
    return sorted({(r['servers'], r['arrival']) for r in runs},
                  key=lambda k: (k[0], k[1] != 'storm'))


def _by(runs, **kw):
    return [r for r in runs if all(r[k] == v for k, v in kw.items())]


def scale_reading(runs):
    """What the scale runs say, in numbers."""
    out = []
    keys = sorted({(r['servers'], r['arrival'], r['hosts']) for r in runs})
    if not keys:
        return out

    def get(key, c):
        rs = _by(runs, servers=key[0], arrival=key[1], hosts=key[2],
                 config=c)
        return rs[0] if rs else None

    def span(vals, fmt='%.3f'):
        return (fmt + '-' + fmt) % (min(vals), max(vals))

    def store(r):
        return r['result']['store_bytes']

    def boots(r):
        k = r['result']['store_by_kind']
        return sum(v for kk, v in k.items() if kk != 'fill')
    for arrival in ('storm', 'day'):
        for c in ('lazy-pf', 'weigher', 'peers'):
            rs, rb = [], []
            for key in keys:
                a, b = get(key, c), get(key, 'stock')
                if key[1] == arrival and a and b:
                    rs.append(store(a) / store(b))
                    rb.append(boots(a) / boots(b))
            if rs:
                out.append(
                    '- %s, %s: store bytes %s x stock\'s with the fill, '
                    '%s x without it (what boots fetch before and while '
                    'booting).' % (arrival, c, span(rs), span(rb)))
    meta = []
    for r in _by(runs, config='lazy-pf'):
        k = r['result']['store_by_kind']
        pre = sum(v for kk, v in k.items() if kk != 'fill')
        if pre:
            meta.append(k.get('metadata', 0) / pre)
    if meta:
        out.append('- Digest lists and maps are %s %% of what lazy + '
                   'prefetch fetches for its boots (32 bytes per 4 KiB of '
                   'each base a host mirrors, fetched before its first '
                   'export is served, so first boots wait for them).'
                   % span([100 * m for m in meta], '%.0f'))
    fill = [r['result']['store_by_kind'].get('fill', 0) / store(r)
            for r in _by(runs, config='lazy-pf') if store(r)]
    if fill:
        out.append('- The fill (on by default: every block of an exported '
                   'image\'s data, 600 s after its first export) is %s %% '
                   'of lazy + prefetch\'s store bytes and of its hosts\' '
                   'disk.' % span([100 * f for f in fill], '%.0f'))
    st = [r for r in _by(runs, config='stock', arrival='storm')]
    gone = [r for r in st if r['needed_bw'] is None]
    if st:
        out.append('- Stock Nova in a storm: unreachable at %d of %d points '
                   '(longest wait %s s at any store bandwidth): a host\'s 10 '
                   'Gbit/s link carries every image it boots whole, %s GB '
                   'per host.' % (
                       len(gone), len(st), span([r['floor_wait']
                                                 for r in gone] or [0],
                                                '%.0f'),
                       span([r['result']['disk_mean'] / 1e9 for r in st],
                            '%.0f')))
    od = _by(runs, config='ondemand')
    if od and all(r['needed_bw'] is None for r in od):
        worst = max(od, key=lambda r: r['floor_wait'])
        out.append('- Stock on-demand never gets every boot under 1 s: '
                   'with the store\'s 2 ms a boot\'s serial reads (R x L) '
                   'alone make its longest wait %.2f s at any bandwidth, '
                   'and where host links carry every boot\'s reads much '
                   'more (%.0f s for %d servers in a %s on %d hosts).' % (
                       min(r['floor_wait'] for r in od),
                       worst['floor_wait'], worst['servers'],
                       worst['arrival'], worst['hosts']))
    for c in ('lazy-pf', 'weigher', 'peers'):
        gone = [r for r in _by(runs, config=c) if r['needed_bw'] is None]
        if gone:
            out.append('- %s is unreachable at %s: its longest wait stays '
                       '%s s at any store bandwidth.%s' % (
                           c, ', '.join('%d servers in a %s on %d hosts' % (
                               r['servers'], r['arrival'], r['hosts'])
                               for r in gone),
                           span([r['floor_wait'] for r in gone], '%.2f'),
                           ' Peers serve a run first whenever one holds '
                           'it; a peer server shares 100 MiB/s '
                           '(rate_mib) among its readers, slower than the '
                           'store and the link can be, and the reader '
                           'gives up on it only after read_timeout (5 s).'
                           if c == 'peers' else ''))
    for arrival in ('storm', 'day'):
        for c, base in (('weigher', 'lazy-pf'), ('peers', 'weigher')):
            pw = []
            for key in keys:
                a, b = get(key, c), get(key, base)
                if key[1] == arrival and a and b and a['needed_bw'] and \
                        b['needed_bw']:
                    pw.append(a['needed_bw'] / b['needed_bw'])
            if pw:
                out.append('- %s against %s, %s: needed bandwidth %s x.' % (
                    c, base, arrival, span(pw, '%.2f')))
    out.append('- With the weigher a host takes a family\'s servers until '
               'it is full (1.2 x servers / hosts here, for the placement '
               'filters), so its savings grow with that room: the '
               '100,000-server day concentrates images on fewer hosts than '
               'the 10,000-server one.')
    out.append('- In a storm the weigher sees a new export once its host '
               'reports the change (report_change_delay 1 s after the '
               'spawn, then the agent\'s turn: one agent records %.0f '
               'reports a second, less the periodic ones); what the mirrors '
               'hold, which peer discovery reads, only at the periodic '
               'report (report_interval 60 s, the storm\'s length), and '
               'this model has no leads (peers.rst, "Bursts").'
               % AGENT_RATE)
    peaks = [(r['result']['change_reports_peak'], r) for r in runs
             if r['result']['change_reports']]
    if peaks:
        top, r = max(peaks, key=lambda x: x[0])
        out.append('- Change reports peak at %.0f a second (%d servers, '
                   '%s, %d hosts, %s: %d reports in all), against %.0f a '
                   'second one agent records: where the peak is above it, '
                   'the agent\'s queue holds the difference for the storm\'s '
                   'length and the weigher sees the later exports that much '
                   'later (modelled); more agents share the queue.' % (
                       top, r['servers'], r['arrival'], r['hosts'],
                       r['config'], r['result']['change_reports'],
                       AGENT_RATE))
    return out


def summary(cal, runs, argv, wall, pngs):
    """sim.md: everything, with the plots."""
    lines = ['# Boot storms, simulated (`bench/sim_storm.py`)', '',
             'Command: `%s` (%.0f s; %s).' % (
                 ' '.join(argv), wall, machine()), '',
             'The model and its assumptions: the docstring of '
             '`bench/sim_storm.py`.', '', '## Calibration', '',
             print_fit(cal), '', format_calibration(cal['rows']), '']
    lines += calibration_reading(cal) + ['']
    if cal['aggregation']:
        lines += ['Aggregation: the scale runs\' %d phases per boot against '
                  'one phase per read round, n=30 at 3/s:' % cal['phases'],
                  '']
        for store, bench, ft, at, fb, ab in cal['aggregation']:
            lines.append('- %s, %s: mean boot %.2f s against %.2f s (%+.1f '
                         '%%); store %.1f MB against %.1f MB' % (
                             store, bench, at, ft, 100 * (at - ft) / ft,
                             ab / 1e6, fb / 1e6))
        lines.append('')
    lines += ['## Scale', '', format_scale(runs), ''] + scale_reading(runs)
    lines += [''] + ['![%s](%s)' % (os.path.basename(p), os.path.basename(p))
                     for p in pngs]
    return '\n'.join(lines) + '\n'


def _figure_table(runs, title, fn):
    combos = _combos(runs)
    hosts = sorted({r['hosts'] for r in runs})
    lines = ['**%s**' % title, '',
             '| servers, arrivals | config | ' + ' | '.join(
                 '%d hosts' % h for h in hosts) + ' |',
             '|---|---|' + '---|' * len(hosts)]
    for n, arr in combos:
        for c in SCALE_CONFIGS:
            cells = []
            for h in hosts:
                rs = _by(runs, servers=n, arrival=arr, hosts=h, config=c)
                cells.append(fn(rs[0]) if rs else '')
            if any(cells):
                lines.append('| %d, %s | %s | %s |' % (
                    n, arr, c, ' | '.join(cells)))
    return lines


def results_draft(cal, runs, argv, wall, date):
    """A section for bench/RESULTS.md."""
    text = [
        '## `bench/sim_storm.py`: boot storms, simulated (issue 35)', '',
        'Command: `python3 bench/sim_storm.py --report bench/report-scale`'
        ' (%.1f min under `nice -n 19`, %s; %s, other work on the '
        'machine). A discrete-event model of hosts, servers, images, the '
        'store and peers; its docstring says what it assumes and how '
        'each input is derived from the recorded runs. `--calibrate` '
        'prints the calibration alone; `--smoke` is CI\'s reduced run. '
        'Plots and the full tables: `bench/report-scale/` (`sim.md`).' % (
            wall / 60, date, machine()), '',
        '### Calibration: model against measured', '',
        '**Goal:** the model reproduces `bench/bench_boot.py` on one host '
        'and the multinode stage on three hosts, each within 15 % on time '
        'and bytes.', '', '**Latest:**', '', print_fit(cal), '',
        format_calibration(cal['rows']), '']
    text += calibration_reading(cal) + ['']
    if cal['aggregation']:
        worst = max(abs(at - ft) / ft
                    for _s, _b, ft, at, _f, _a in cal['aggregation'])
        text += ['**Notes.** The scale runs aggregate a boot\'s read '
                 'rounds into %d phases: at bench_boot\'s busiest points '
                 'that moves the mean boot by %.1f %% at most.' % (
                     cal['phases'], 100 * worst), '']
    text += [
        '### Scale: store bytes, bandwidth for 1 s of storage wait, host '
        'disk', '',
        '**Goal:** none set; the issue asks for the figures: 10, 100 and '
        '1,000 hosts; 10,000 and 100,000 servers of 100 images, as a storm '
        '(within 60 s) and as a day\'s Poisson arrivals.', '',
        '**Latest** (100 images in 4 families, images chosen uniformly, '
        'store latency 2 ms, host links 10 Gbit/s, the fill on, 8 phases '
        'per boot; "needed": the smallest store bandwidth at which no '
        'boot waits more than 1 s for storage, to 25 %; bytes and disk '
        'at that bandwidth):', '']
    text += _figure_table(runs, 'Store bytes (with the fill)',
                          lambda r: _bytes(r['result']['store_bytes'])) + ['']
    text += _figure_table(
        runs, 'Store bytes before and while booting (without the fill)',
        lambda r: _bytes(sum(v for k, v in
                             r['result']['store_by_kind'].items()
                             if k != 'fill'))) + ['']
    text += _figure_table(
        runs, 'Store bandwidth needed for every boot\'s storage wait <= '
        '1 s (unreachable: the longest wait at any bandwidth)',
        lambda r: _bw(r['needed_bw'], r.get('floor_wait'))) + ['']
    text += _figure_table(runs, 'Host disk for mirrors (or `_base`), mean '
                          'per host (max)', lambda r: '%s (%s)' % (
                              _bytes(r['result']['disk_mean']),
                              _bytes(r['result']['disk_max']))) + ['']
    text += ['**Reading.**', ''] + scale_reading(runs) + ['']
    return '\n'.join(text) + '\n'


# -- main -----------------------------------------------------------------

# bench_burst.py (2026-11-28 03:10-03:35, three pairs, identical bytes): 3
# new images of 16 MiB shared and 8 MiB own, each read whole by a server
# on each of 3 hosts, all created at once; Glance's image data
BURST = {'hosts': 3, 'store_mib': 120.0, 'leads_mib': 40.0,
         'store_mbit': 800, 'link_mbit': 1000}
#: seconds over which a burst's servers start
BURST_SPREAD_S = 10.0


def burst_library():
    """bench_burst.py's three images: a shared part and their own."""
    shared = Region('b-os', 16 * MIB, 16 * MIB, 'b0')
    images = [Image('b%d' % i, [shared, Region('b-own-%d' % i, 8 * MIB,
                                               8 * MIB, 'b%d' % i)],
                    compute=0.0, rounds=24 * MIB / (128 << 10),
                    ondemand=24 * MIB, virtual=64 * MIB, sequential=True)
              for i in range(3)]
    return Library(images, {'b%d' % i: 64 * MIB / BS * DIGEST_PER_BLOCK
                            for i in range(3)})


def burst_servers(images, n_hosts, spread, seed=0):
    """A server of each image on each host, within ``spread`` seconds."""
    rng = random.Random(seed)
    out = [(rng.uniform(0, spread), j, k) for j in range(len(images))
           for k in range(n_hosts)]
    return [(t, images[j], k) for t, j, k in sorted(out)]


def burst(cal_lib, hosts=(10, 100, 1000), echo=print):
    """Issue 34's burst, calibrated on bench_burst.py, then at scale.

    First the measured point (three hosts, the test images read whole,
    no prefetch: the store only against peers with leads). Then three
    images of the calibrated library (minbase, python3, postgresql: the
    boot working sets prefetched), a server of each on every one of N
    hosts within BURST_SPREAD_S, through the scale runs' parameters
    (10 Gbit/s links, maps and digest lists from the store, the store at
    100 MiB/s, 2 ms) without the fill, for ``lazy-pf`` (no peers),
    ``peers`` and ``leads``. [row] of dicts.
    """
    rows = []
    b = BURST
    lib = burst_library()
    servers = burst_servers(lib.images, b['hosts'], 1.0)
    for cfg, meas in ((Config('b', 'b', 'lazy'), b['store_mib']),
                      (Config('b', 'b', 'lazy', peers=True, leads=True),
                       b['leads_mib'])):
        res = simulate(cfg, Params(
            store_bw=b['store_mbit'] * 1e6 / 8, store_lat=0.0,
            link=b['link_mbit'] * 1e6 / 8, report_interval=0.0),
            lib, b['hosts'], servers)
        rows.append({'hosts': b['hosts'], 'config': 'leads' if cfg.leads
                     else 'lazy', 'point': 'bench_burst',
                     'bytes_measured': meas * MIB,
                     'store_bytes': res['store_data'],
                     'bytes_err': _err(res['store_data'], meas * MIB),
                     'mean_s': res['mean_s']})
        echo(burst_line(rows[-1]))
    images = [i for i in cal_lib.images
              if i.name in ('minbase', 'python3', 'postgresql')]
    for n in hosts:
        servers = burst_servers(images, n, BURST_SPREAD_S)
        for c in ('lazy-pf', 'peers', 'leads'):
            t0 = time.monotonic()
            res = simulate(c, scale_params(fill=False), cal_lib, n, servers)
            rows.append({'hosts': n, 'config': c, 'point': 'scale',
                         'store_bytes': res['store_data'],
                         'metadata_bytes': res['store_bytes']
                         - res['store_data'],
                         'peer_bytes': res['peer_bytes'],
                         'mean_s': res['mean_s'], 'p95_s': res['p95_s'],
                         'max_wait': res['max_wait'],
                         'wall_s': time.monotonic() - t0})
            echo(burst_line(rows[-1]))
    return rows


def burst_line(r):
    if r['point'] == 'bench_burst':
        return ('burst, measured point: %d hosts %-8s store %s (measured '
                '%s, %+.1f %%), boot mean %.2f s' % (
                    r['hosts'], r['config'], _bytes(r['store_bytes']),
                    _bytes(r['bytes_measured']), 100 * r['bytes_err'],
                    r['mean_s']))
    return ('burst: %4d hosts %-8s store data %-9s metadata %-9s peers '
            '%-9s boot mean %.1f s p95 %.1f s, max wait %.1f s [%.0f s]' % (
                r['hosts'], r['config'], _bytes(r['store_bytes']),
                _bytes(r['metadata_bytes']), _bytes(r['peer_bytes']),
                r['mean_s'], r['p95_s'], r['max_wait'], r['wall_s']))


def smoke(echo=print):
    """CI's reduced run.

    A part of the calibration and one small scale point per
    configuration; it checks that everything runs, no figure.
    """
    t0 = time.monotonic()
    cal = calibrate(smoke=True)
    print_calibration(cal)
    lib = scale_library(cal['library'], n_images=20, families=2)
    runs = scale(lib, hosts=(10,), servers=(1000,),
                 arrivals=('storm', 'day'), echo=echo, phases=4)
    echo('smoke: %.1f s' % (time.monotonic() - t0))
    return cal, runs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--calibrate', action='store_true')
    p.add_argument('--scale', action='store_true')
    p.add_argument('--report', metavar='DIR')
    p.add_argument('--smoke', action='store_true')
    p.add_argument('--burst', action='store_true',
                   help='issue 34\'s burst: the measured point, then a '
                        'server of each of 3 images on every one of '
                        '--hosts at once')
    p.add_argument('--render', metavar='DIR',
                   help='the plots and Markdown again from DIR/sim.json '
                        '(a --report run), without running the model')
    p.add_argument('--hosts', default='10,100,1000')
    p.add_argument('--servers', default='10000,100000')
    p.add_argument('--arrivals', default='storm,day')
    p.add_argument('--configs', default=','.join(SCALE_CONFIGS))
    p.add_argument('--images', type=int, default=100)
    p.add_argument('--families', type=int, default=4)
    p.add_argument('--phases', type=int, default=8,
                   help='phases per boot in the scale runs')
    p.add_argument('--no-search', action='store_true',
                   help='scale runs at the measured store (100 MiB/s) '
                        'only, no bandwidth search')
    args = p.parse_args(argv)
    t0 = time.monotonic()
    if args.smoke:
        smoke()
        return 0
    if args.render:
        for path in render(args.render):
            print(path)
        return 0
    if not (args.calibrate or args.scale or args.report or args.burst):
        p.error('one of --calibrate, --scale, --report, --burst, --render, '
                '--smoke')
    cal = calibrate()
    if args.burst:
        burst(cal['library'], [int(x) for x in args.hosts.split(',')])
    if args.calibrate or args.report:
        print_calibration(cal)
    runs = []
    if args.scale or args.report:
        print('== scale (%d images, %d families)' % (args.images,
                                                     args.families))
        lib = scale_library(cal['library'], args.images, args.families)
        runs = scale(lib, [int(x) for x in args.hosts.split(',')],
                     [int(x) for x in args.servers.split(',')],
                     args.arrivals.split(','), args.configs.split(','),
                     search=not args.no_search, phases=args.phases)
    if args.report:
        cmd = ['python3', 'bench/sim_storm.py'] + list(
            sys.argv[1:] if argv is None else argv)
        for path in write_report(args.report, cal, runs, cmd,
                                 time.monotonic() - t0):
            print(path)
    return 0


if __name__ == '__main__':
    sys.exit(main())
