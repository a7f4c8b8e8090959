#!/usr/bin/env python3
"""Time inside the library lock per add, with writers side by side (issue 51).

A cloud's catalogue (:class:`bench_scale.Cloud`: bases in families,
derived images, snapshots; real size at ``--scale 1``: 1-3 GiB of data
per image, lognormal about 1.5 GiB, twice that of virtual disk) is added
by ``--writers`` processes at once, each taking every ``--writers``-th
image of the one stream, from synthetic digests (no image bytes: hashing
is measured elsewhere). Beside them:

* every ``--delete-every``-th image, its writer deletes the oldest image
  left (the first bases: canonical for the blocks most images hold), so
  that maps of other images are left pending (``[vmar]
  rewrite_at_once``, ``--rewrite-at-once``);
* a process runs vmar-agent's pending pass (``Library.rewrite_pending``
  on the agent's schedule: a pass every 6 s, each stopping after the
  first map past 1 s) until the writers end.

Publishes take no library lock in either code measured and are not run.

Each writer times every locked transaction from the moment it holds the
lock to its commit or rollback (the lock is released then), and sums an
add's own: the figure is that sum per add, its p50 and p99 over the
first tenth of the adds and over the last, and how many adds refreshed
their snapshot outside the lock or built their map under it.

``--baseline REV``: the same stream, first, on the code of git revision
REV (a worktree of this repository), in a database of its own: the
ratios printed are this tree's over REV's.

On Galera (``--db galera``) each writer has a node of its own, and the
growth of its node's ``wsrep_replicated_bytes`` across each add is that
add's write sets: per add, and per GiB of data and of new data (the
fingerprint rows at the end, 4 KiB each).

``--pool MIB`` (with ``--db mariadb``): the issue's control plane, a
database whose index does not fit its memory. A mariadbd of the bench's
own (``galera_env.Galera(size=1, wsrep=False)``) with a buffer pool of
MIB, in a memory cgroup of ``--memory`` MiB (v1
``memory.limit_in_bytes``, which counts the server's page cache too), so
that what the pool does not hold is read from the disk. The report then
gives each add's seconds per GiB of data about adds #200, #500, #1,000,
#2,000 and the last (the adds within ``WINDOW`` of it), the database's
bytes per GiB of the data its images hold, and the writers' RSS per
unique key. ``--baseline-images N`` stops the baseline at its add #N,
and either variant stops once an add is ``--cliff`` times slower per
GiB than its own adds about #200 (the cliff of an index that left the
pool).

Usage: bench_lock.py [--db sqlite|mariadb|postgresql|galera] [--images N]
       [--writers N] [--bases N] [--derived P] [--scale S]
       [--delete-every N] [--rewrite-at-once N] [--baseline REV]
       [--baseline-images N] [--cliff X] [--pool MIB [--memory MIB]]
       [--smoke] [--json OUT]
"""

import argparse
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(TOP, 'bench')

BS = 4096

# adds about a mark whose seconds per GiB are the mark's (the images' data
# varies tenfold: lognormal sizes, and bases, derived images and
# snapshots of very different shares new)
WINDOW = 50
MARKS = (200, 500, 1000, 2000)


def _load_code(root):
    """Import the library from ``root`` (a worktree or this tree) first.

    bench_scale puts this tree first on ``sys.path``; the modules loaded
    here stay the ones it gets.
    """
    sys.path.insert(0, root)
    from vmar_openstack.db import migration  # noqa: F401
    import vmar_openstack.ingest  # noqa: F401
    got = os.path.dirname(os.path.dirname(vmar_openstack.__file__))
    if got != os.path.abspath(root):
        raise SystemExit('the library was imported from %s, not %s'
                         % (got, root))
    sys.path.insert(1, BENCH)


def digests_of(seeds):
    """32 pseudo-random bytes per seed (splitmix64), never all zero."""
    import numpy as np
    x = np.asarray(seeds).astype(np.uint64)
    out = np.empty((len(x), 4), np.uint64)
    with np.errstate(over='ignore'):
        for j in range(4):
            z = x + np.uint64(0x9E3779B97F4A7C15) * np.uint64(j + 1)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            out[:, j] = (z ^ (z >> np.uint64(31))) | np.uint64(1)
    return out.view(np.uint8).reshape(len(x), 32)


def fingerprints_of(seeds):
    """The image's Fingerprints: its data blocks, then as many zeros."""
    import numpy as np
    from vmar_openstack import fingerprint
    n = len(seeds)
    digests = np.zeros((2 * n, 32), np.uint8)
    digests[:n] = digests_of(seeds)
    return fingerprint.Fingerprints('sha256', BS, 2 * n * BS, digests)


def image_uuid(i):
    return str(uuid.UUID(int=(51 << 96) + i))


class LockTimer:
    """Times the library lock's holds of this process's transactions.

    Wraps ``db_session._take_lock`` (the hold starts when it returns) and
    ``db_session.locked_writer`` (it ends when the transaction commits or
    rolls back), as both codes measured have them. On SQLite the lock is
    the database's one write lock, taken by the transaction's ``BEGIN
    IMMEDIATE`` at its first statement: the hold starts once that is
    done (``session.connection()``), not while it waits. It ends at the
    commit: what runs after it (``db_session._committed``: an SQLite
    checkpoint, passive, which blocks no writer) is not in it.

    ``writer_holds``: the same of ``db_session.writer``'s transactions
    (the compaction's; on SQLite they hold the same write lock).
    """

    def __init__(self, db_session):
        self.holds = []
        self.writer_holds = []
        taken = threading.local()
        real_take = db_session._take_lock
        real_writer = db_session.locked_writer
        real_plain = db_session.writer
        real_committed = getattr(db_session, '_committed', None)

        def committed(engine):
            taken.end = time.perf_counter()
            return real_committed(engine)
        if real_committed is not None:
            db_session._committed = committed

        def take(session, timeout):
            real_take(session, timeout)
            session.connection()
            taken.t = time.perf_counter()

        @contextlib.contextmanager
        def plain(*a, **k):
            t = taken.end = None
            try:
                with real_plain(*a, **k) as s:
                    s.connection()
                    t = time.perf_counter()
                    yield s
            finally:
                if t is not None:
                    self.writer_holds.append(
                        (taken.end or time.perf_counter()) - t)
        db_session.writer = plain

        @contextlib.contextmanager
        def writer(*a, **k):
            taken.t = taken.end = None
            try:
                with real_writer(*a, **k) as s:
                    yield s
            finally:
                if taken.t is not None:
                    self.holds.append((taken.end or time.perf_counter())
                                      - taken.t)
        db_session._take_lock = take
        db_session.locked_writer = writer


def library_conf(path):
    from oslo_config import cfg
    from vmar_openstack import conf as vmar_conf
    conf = cfg.ConfigOpts()
    vmar_conf.register_opts(conf)
    conf(['--config-file', path], project='vmar', default_config_files=[])
    return conf


def add(lib, image_id, fps, **kw):
    """``Library.add_fingerprints``; REV's private path if it has none."""
    if hasattr(lib, 'add_fingerprints'):
        return lib.add_fingerprints(image_id, fps, **kw)
    from vmar_openstack.ingest import ahead as ingest_ahead
    ahead = ingest_ahead.Ahead(lib.conf, fps.algorithm, fps.block_size)
    try:
        ahead.expect(fps.n_blocks)
        return lib._commit_add(image_id, fps, 'raw', kw.get('owner'),
                               kw.get('visibility', 'private'), None, ahead)
    finally:
        ahead.close()


def run_writer(args):
    _load_code(args.code)
    import bench_scale
    from vmar_openstack.db import session as db_session
    from vmar_openstack import exception
    from vmar_openstack import ingest
    conf = library_conf(args.conf)
    timer = LockTimer(db_session)
    lib = ingest.Library(conf)
    cloud = bench_scale.Cloud(args.bases, args.derived, args.scale)
    replicated = WriteSets(conf) if args.wsrep else None
    compact = Compactions(lib, timer)
    out = []
    for i in range(args.images):
        kind, seeds = cloud.next()
        if i % args.of != args.index:
            continue
        if os.path.exists(args.stop):
            break
        if cliff_reached(out, i, args.cliff):
            # every writer stops at the next add: the cliff is the
            # library's, not this writer's
            with open(args.stop, 'w') as f:
                f.write('at the cliff, add #%d' % (i + 1))
            break
        fps = fingerprints_of(seeds)
        k0 = len(timer.holds)
        b0 = replicated.bytes() if replicated else 0
        t = time.perf_counter()
        add(lib, image_uuid(i), fps, owner='p%d' % (i % 7),
            visibility='public' if kind != 'snapshot' else 'private')
        dt = time.perf_counter() - t
        holds = timer.holds[k0:]
        b1 = replicated.bytes() if replicated else 0
        steps = compact.run()
        out.append({'i': i, 'op': 'add', 'kind': kind,
                    'data_gib': len(seeds) * BS / 2 ** 30, 's': dt,
                    'holds': holds, 'compaction_steps': steps,
                    'writeset_bytes': (b1 - b0 if replicated else None),
                    'compaction_writeset_bytes': (
                        replicated.bytes() - b1 if replicated else None)})
        if args.delete_every and i and i % args.delete_every == 0:
            k0 = len(timer.holds)
            t = time.perf_counter()
            try:
                # the oldest first: the first bases, canonical for
                # the blocks most images hold (the most maps pend)
                d = lib.delete(image_uuid(i // args.delete_every - 1))
                pending, deleted = d.pending, True
            except exception.ImageNotFound:
                pending, deleted = None, False
            out.append({'i': i, 'op': 'delete', 's': time.perf_counter() - t,
                        'holds': timer.holds[k0:], 'pending': pending,
                        'image': i // args.delete_every - 1,
                        'deleted': deleted,
                        'compaction_steps': compact.run()})
    with open(args.out, 'w') as f:
        json.dump(out, f)


def per_gib(adds):
    gib = sum(a['data_gib'] for a in adds)
    return sum(a['s'] for a in adds) / gib if gib else None


def cliff_reached(ops, i, cliff):
    """Whether this writer's last 10 adds are ``cliff`` times slower.

    Per GiB of data, than its adds about #200; ``cliff`` 0: never.
    """
    if not cliff or i < MARKS[0] + WINDOW:
        return False
    adds = [o for o in ops if o['op'] == 'add']
    ref = per_gib([a for a in adds if abs(a['i'] - MARKS[0]) < WINDOW])
    return bool(ref) and per_gib(adds[-10:]) >= cliff * ref


def marks(adds):
    """Seconds per GiB of data of the adds within WINDOW of each mark."""
    last = max(a['i'] for a in adds) + 1
    out = {}
    for m in MARKS + (last,):
        if m <= last:
            lo = min(m - WINDOW, last - 2 * WINDOW) if m == last else (
                m - WINDOW)
            out[m] = per_gib([a for a in adds
                              if lo <= a['i'] + 1 < m + WINDOW])
    return out


class Compactions:
    """The library's compaction after each change, run and timed apart.

    The library compacts after every change it commits, outside the lock
    (``Library.compact``); here the bench runs that same call itself, so
    that the change's write sets and the compaction's are told apart.
    Each step's hold (:class:`LockTimer` ``writer_holds``): on SQLite a
    step holds the database's one write lock, which every locked
    transaction also needs. Code of before the runs (a baseline) has no
    compaction: nothing is run.
    """

    def __init__(self, lib, timer):
        self.lib = lib if hasattr(lib, 'compact') else None
        self.timer = timer
        if self.lib is not None:
            lib._compact_after_change = lambda: None

    def run(self):
        """Seconds of each step of one compaction; None: no compaction."""
        if self.lib is None:
            return None
        k = len(self.timer.writer_holds)
        self.lib.compact()
        return self.timer.writer_holds[k:]


class WriteSets:
    """Bytes of write sets this Galera node replicated so far.

    Each writer has a node of its own, so the growth across one of its
    adds is that add's write sets.
    """

    def __init__(self, conf):
        import sqlalchemy as sa
        self._sa = sa
        self._engine = sa.create_engine(conf.vmar_database.connection)

    def bytes(self):
        with self._engine.connect() as c:
            row = c.execute(self._sa.text(
                "SHOW GLOBAL STATUS LIKE 'wsrep_replicated_bytes'")).first()
        return int(row[1])


def run_pending(args):
    _load_code(args.code)
    from vmar_openstack.db import session as db_session
    from vmar_openstack.glance_hooks import agent
    from vmar_openstack import ingest
    conf = library_conf(args.conf)
    timer = LockTimer(db_session)
    lib = ingest.Library(conf)
    # as vmar-agent's loop: a pass every PENDING_PERIOD seconds, of a
    # minute's [vmar_agent] pending_maps_per_minute spread over the
    # minute's passes, stopping after the first map past
    # PENDING_PASS_SECONDS
    per_pass = -(-conf.vmar_agent.pending_maps_per_minute
                 * agent.PENDING_PERIOD // 60)
    rewritten = 0
    timer_event = threading.Event()
    while not os.path.exists(args.stop):
        rewritten += len(lib.rewrite_pending(per_pass,
                                             agent.PENDING_PASS_SECONDS))
        timer_event.wait(agent.PENDING_PERIOD)
    # the agent goes on after the writers: its pass once more
    rewritten += len(lib.rewrite_pending(per_pass,
                                         agent.PENDING_PASS_SECONDS))
    with open(args.out, 'w') as f:
        json.dump({'rewritten': rewritten, 'holds': timer.holds,
                   'max_rss_bytes': resource.getrusage(
                       resource.RUSAGE_SELF).ru_maxrss * 1024}, f)


def run_prepare(args):
    _load_code(args.code)
    from vmar_openstack.db import migration
    migration.upgrade('head', conf=library_conf(args.conf))


def run_check(args):
    """vmar-manage check's problems and warnings, into ``--out``."""
    _load_code(args.code)
    import sqlalchemy as sa
    from vmar_openstack.db import api as db_api
    from vmar_openstack.db import session as db_session
    from vmar_openstack.ingest import check
    conf = library_conf(args.conf)
    # None: not run (vmar-manage check holds every digest list and a set
    # per key in memory: some 30 MB an image of real size)
    problems = warnings = None
    if not args.no_check:
        problems, warnings = check.check(conf)
    with db_session.reader(conf) as s:
        rows = db_api.row_counts(s, ('vmar_fingerprints',
                                     'vmar_fingerprints_recent'))
        try:     # keys left in runs (none once every change compacted)
            in_runs = int(s.execute(sa.text(
                'SELECT COALESCE(SUM(n_keys), 0) FROM '
                'vmar_fingerprint_runs')).scalar())
        except sa.exc.DBAPIError:
            in_runs = 0     # code of before the runs
    with db_session.reader(conf) as s:
        database = db_api.database_bytes(s)
    with open(args.out, 'w') as f:
        json.dump({'problems': problems, 'warnings': warnings,
                   'fingerprint_rows': sum(rows.values()) + in_runs,
                   'database_bytes': sum(database.values()),
                   'database_tables': database}, f)


def pct(values, q):
    import numpy as np
    return float(np.percentile(values, q)) if len(values) else None


def summarise(adds, deletes, pending):
    n = len(adds)
    tenth = max(1, n // 10)
    adds = sorted(adds, key=lambda a: a['i'])

    def part(p):
        holds = [sum(a['holds']) for a in p]
        gib = sum(a['data_gib'] for a in p)
        return {'adds': len(p), 'hold_p50_s': pct(holds, 50),
                'hold_p99_s': pct(holds, 99), 'hold_max_s': max(holds),
                'add_s_per_gib': sum(a['s'] for a in p) / gib,
                'transactions_per_add': sum(len(a['holds']) for a in p)
                / len(p)}
    sets = [a['writeset_bytes'] for a in adds
            if a.get('writeset_bytes') is not None]
    ws = None
    if sets:
        compacted = sum(a.get('compaction_writeset_bytes') or 0
                        for a in adds)
        ws = {'p50_bytes': pct(sets, 50), 'p99_bytes': pct(sets, 99),
              'total_bytes': sum(sets), 'compaction_bytes': compacted,
              'mb_per_gib_of_data': sum(sets) / 2 ** 20
              / sum(a['data_gib'] for a in adds)}
    steps = [x for o in adds + deletes
             for x in (o.get('compaction_steps') or [])]
    compaction = None
    if steps:
        compaction = {'steps': len(steps), 'step_p50_s': pct(steps, 50),
                      'step_p99_s': pct(steps, 99), 'step_max_s': max(steps),
                      'seconds': sum(steps)}
    return {'writesets': ws, 'compaction': compaction,
            'first_tenth': part(adds[:tenth]),
            'last_tenth':
            part(adds[-tenth:]), 'all': part(adds),
            'add_s_per_gib_about': marks(adds),
            'adds_left_the_lock': sum(len(a['holds']) > 1 for a in adds),
            'deletes': len(deletes),
            'delete_hold_p99_s': pct([sum(d['holds']) for d in deletes], 99),
            'pending_rewritten': pending['rewritten'],
            'pending_hold_p99_s': pct(pending['holds'], 99),
            # the tail: which adds held longest, and how
            'longest_adds': [
                {'i': a['i'], 'kind': a['kind'], 'data_gib': a['data_gib'],
                 'holds_s': a['holds']}
                for a in sorted(adds, key=lambda a: -sum(a['holds']))[:5]]}


def run_variant(args, name, code, work, galera=None, images=None):
    sys.path.insert(0, TOP)
    import bench_scale
    from tools.vmarenv import glance_env
    state = os.path.join(work, name)
    os.makedirs(state)
    if galera is not None:
        db = '%s_lock_%s' % (galera.database, name)
        galera.sql(1, 'CREATE DATABASE `%s`' % db)
        galera.wait_same_position()
        # a node per writer; the pending pass on the last node
        urls = [galera.url(k % galera.size + 1, db)
                for k in range(args.writers)] + [galera.url(galera.size, db)]
    else:
        urls = [bench_scale.database(args.db, state, 'lock_%s' % name)] * (
            args.writers + 1)
    confs = []
    for k, url in enumerate(urls):
        confs.append(os.path.join(state, 'vmar-%d.conf' % k))
        glance_env.write_conf(confs[-1], {
            'vmar': {'state_dir': state,
                     'rewrite_at_once': str(args.rewrite_at_once)},
            'vmar_database': {'connection': url, 'lock_timeout': '600'}})
    me = [sys.executable, os.path.abspath(__file__)]
    common = ['--code', code, '--conf', confs[-1]]
    subprocess.run(me + ['_prepare'] + common, check=True)
    stream = ['--images', str(images or args.images),
              '--bases', str(args.bases),
              '--derived', str(args.derived), '--scale', str(args.scale),
              '--delete-every', str(args.delete_every)]
    stop = os.path.join(state, 'stop', 'now')
    os.makedirs(os.path.dirname(stop))
    # the writers stop at their next add once this file is there: written
    # by the first that reached the cliff, or by hand (say why in it)
    cliff = os.path.join(state, 'stop', 'writers')
    stream += ['--stop', cliff, '--cliff', str(args.cliff or 0)]
    print('%s: to stop its writers early: echo why > %s' % (name, cliff),
          flush=True)
    pend_out = os.path.join(state, 'pending.json')
    pend = subprocess.Popen(me + ['_pending'] + common + [
        '--stop', stop, '--out', pend_out])
    outs, procs = [], []
    t = time.monotonic()
    for w in range(args.writers):
        outs.append(os.path.join(state, 'writer-%d.json' % w))
        procs.append(subprocess.Popen(
            me + ['_writer', '--code', code, '--conf', confs[w]] + stream
            + ['--index', str(w), '--of', str(args.writers), '--out',
               outs[-1]] + (['--wsrep'] if galera is not None
                            and galera.wsrep else [])))
    failed = [p.wait() for p in procs]
    wall = time.monotonic() - t
    open(stop, 'w').close()
    pend.wait()
    if any(failed) or pend.returncode:
        raise SystemExit('%s: a writer or the pending pass failed' % name)
    check_out = os.path.join(state, 'check.json')
    subprocess.run(me + ['_check'] + common + ['--out', check_out] + (
        ['--no-check'] if args.no_check else []), check=True)
    ops = [o for f in outs for o in json.load(open(f))]
    with open(pend_out) as f:
        pending = json.load(f)
    adds = [o for o in ops if o['op'] == 'add']
    deletes = [o for o in ops if o['op'] == 'delete']
    r = summarise(adds, deletes, pending)
    r['wall_s'] = wall
    r['code'] = code
    r['stopped'] = None
    if os.path.exists(cliff):
        with open(cliff) as f:
            r['stopped'] = f.read().strip() or 'by hand'
    with open(check_out) as f:
        r['check'] = json.load(f)
    gone = {d['image'] for d in deletes if d['deleted']}
    r['data_gib_held'] = sum(a['data_gib'] for a in adds
                             if a['i'] not in gone)
    r['database_mb_per_gib_held'] = (r['check']['database_bytes'] / 1e6
                                     / r['data_gib_held'])
    # the pending pass's process is vmar-agent's part: its RSS (the
    # writers' holds the bench's stream of every parent image's seeds)
    r['agent_max_rss_bytes'] = pending.get('max_rss_bytes')
    if r['writesets']:
        new_gib = r['check']['fingerprint_rows'] * BS / 2 ** 30
        r['writesets']['mb_per_gib_of_new_data'] = (
            r['writesets']['total_bytes'] / 2 ** 20 / new_gib)
        r['writesets']['compaction_mb_per_gib_of_new_data'] = (
            r['writesets']['compaction_bytes'] / 2 ** 20 / new_gib)
    return r


def report(results):
    for name, r in results.items():
        print('%s (%s): %d adds in %.0f s; adds that left the lock: %d; '
              'pending maps rewritten: %d; vmar-manage check: %d problems' % (
                  name, r['code'], r['all']['adds'], r['wall_s'],
                  r['adds_left_the_lock'], r['pending_rewritten'],
                  -1 if r['check']['problems'] is None
                  else len(r['check']['problems'])))
        about = r['add_s_per_gib_about']
        first = min(about)
        print('  add s per GiB of data, the adds within %d of each: %s%s' % (
            WINDOW, ', '.join(
                '#%s %.3f (%.2f x #%s)' % (m, v, v / about[first], first)
                for m, v in sorted(about.items(), key=lambda x: int(x[0]))),
            '; stopped: %s' % r['stopped'] if r['stopped'] else ''))
        print('  database %.1f MB for %.1f GiB of data held: %.2f MB per '
              'GiB; %d unique keys; the pending pass\'s RSS (vmar-agent\'s '
              'part) at most %.0f MB' % (
                  r['check']['database_bytes'] / 1e6, r['data_gib_held'],
                  r['database_mb_per_gib_held'],
                  r['check']['fingerprint_rows'],
                  (r['agent_max_rss_bytes'] or 0) / 1e6))
        if r['writesets']:
            w = r['writesets']
            print('  write sets per add p50 %.1f MB, p99 %.1f MB; %.2f MB '
                  'per GiB of data, %.2f MB per GiB of new data; the '
                  'compactions after the adds %.2f MB per GiB of new '
                  'data' % (
                      w['p50_bytes'] / 1e6, w['p99_bytes'] / 1e6,
                      w['mb_per_gib_of_data'], w['mb_per_gib_of_new_data'],
                      w['compaction_mb_per_gib_of_new_data']))
        if r.get('compaction'):
            c = r['compaction']
            print('  compaction: %d steps, %.1f s; a step p50 %.3f s, p99 '
                  '%.3f s, max %.3f s' % (
                      c['steps'], c['seconds'], c['step_p50_s'],
                      c['step_p99_s'], c['step_max_s']))
        for part in ('first_tenth', 'last_tenth', 'all'):
            p = r[part]
            print('  %-11s hold per add p50 %.3f s, p99 %.3f s, max %.3f '
                  's; add %.2f s/GiB; %.2f transactions per add' % (
                      part, p['hold_p50_s'], p['hold_p99_s'],
                      p['hold_max_s'], p['add_s_per_gib'],
                      p['transactions_per_add']))
        print('  longest holds: ' + '; '.join(
            '#%d %s %.2f GiB %s s' % (a['i'], a['kind'], a['data_gib'],
                                      '+'.join('%.3f' % h
                                               for h in a['holds_s']))
            for a in r['longest_adds']))
    if len(results) == 2:
        base, new = results['baseline'], results['new']
        for part in ('first_tenth', 'last_tenth', 'all'):
            print('new / baseline, %s: hold p99 %.3f, p50 %.3f, add s/GiB '
                  '%.3f' % (part, new[part]['hold_p99_s']
                            / base[part]['hold_p99_s'],
                            new[part]['hold_p50_s']
                            / base[part]['hold_p50_s'],
                            new[part]['add_s_per_gib']
                            / base[part]['add_s_per_gib']))
        common = sorted(set(base['add_s_per_gib_about'])
                        & set(new['add_s_per_gib_about']), key=int)
        print('new / baseline, add s per GiB about: ' + ', '.join(
            '#%s %.3f' % (m, new['add_s_per_gib_about'][m]
                          / base['add_s_per_gib_about'][m]) for m in common))
        print('new / baseline, database per GiB held %.3f' % (
            new['database_mb_per_gib_held']
            / base['database_mb_per_gib_held']))


def private_server(args, work):
    """A mariadbd of the bench's own in a memory cgroup: (server, group).

    The buffer pool is ``--pool`` MiB; the group's limit, ``--memory``
    MiB, counts the server's heap and the page cache of its files, so the
    index's pages the pool does not hold come from the disk. Durable
    commits (``innodb_flush_log_at_trx_commit=1``) and a redo log of a
    quarter of the pool, as a control plane's server has.
    """
    sys.path.insert(0, TOP)
    from tools import memcg
    from tools.vmarenv import galera_env
    os.chmod(work, 0o755)       # mariadbd runs as the mysql user
    os.makedirs(os.path.join(work, 'mariadb'))
    group = memcg.MemoryCgroup('vmar-bench-lock-%d' % os.getpid())
    group.set_limit((args.memory or args.pool + 1024) << 20)
    server = galera_env.Galera(
        os.path.join(work, 'mariadb'), size=1, wsrep=False,
        buffer_pool='%dM' % args.pool, options={
            'innodb_flush_log_at_trx_commit': 1,
            'innodb_log_file_size': '%dM' % max(32, args.pool // 4)},
        database='vmar_bench')
    server.on_spawn = group.add
    server.start()
    return server, group


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest='cmd')
    for name in ('_writer', '_pending', '_prepare', '_check'):
        s = sub.add_parser(name)
        s.add_argument('--code', required=True)
        s.add_argument('--conf', required=True)
        if name == '_writer':
            for a, t in (('--images', int), ('--bases', int),
                         ('--derived', float), ('--scale', float),
                         ('--delete-every', int), ('--index', int),
                         ('--of', int)):
                s.add_argument(a, type=t, required=True)
            s.add_argument('--out', required=True)
            s.add_argument('--wsrep', action='store_true')
            s.add_argument('--stop', required=True)
            s.add_argument('--cliff', type=float, required=True)
        if name == '_pending':
            s.add_argument('--stop', required=True)
        if name in ('_pending', '_check'):
            s.add_argument('--out', required=True)
        if name == '_check':
            s.add_argument('--no-check', action='store_true')
    p.add_argument('--db', default='sqlite',
                   choices=('sqlite', 'mariadb', 'postgresql', 'galera'),
                   help='galera: a cluster of three (tools/vmarenv/'
                   'galera_env.py), a node per writer, and each add\'s '
                   'write sets measured (wsrep_replicated_bytes)')
    p.add_argument('--images', type=int, default=200)
    p.add_argument('--writers', type=int, default=2)
    p.add_argument('--bases', type=int, default=12)
    p.add_argument('--derived', type=float, default=0.5,
                   help='share of the images after the bases that derive '
                   'from a base (the others are snapshots)')
    p.add_argument('--scale', type=float, default=1.0,
                   help='divide image sizes by this (1: real size)')
    p.add_argument('--delete-every', type=int, default=20)
    p.add_argument('--rewrite-at-once', type=int, default=4)
    p.add_argument('--baseline', metavar='REV')
    p.add_argument('--baseline-images', type=int, metavar='N',
                   help='the baseline stops at its add #N')
    p.add_argument('--cliff', type=float, metavar='X',
                   help='a variant stops once an add takes X times as long '
                   'per GiB as its adds about #200')
    p.add_argument('--no-check', action='store_true',
                   help='no vmar-manage check after (it holds every digest '
                   'list in memory: some 30 MB an image of real size)')
    p.add_argument('--pool', type=int, metavar='MIB',
                   help='with --db mariadb: a server of the bench\'s own, '
                   'with an InnoDB buffer pool of MIB, in a memory cgroup')
    p.add_argument('--memory', type=int, metavar='MIB',
                   help='the memory cgroup\'s limit (default: --pool + '
                   '1024), page cache included')
    p.add_argument('--smoke', action='store_true',
                   help='20 images at 1/64 of real size (CI)')
    p.add_argument('--json')
    p.add_argument('--workdir')
    args = p.parse_args()
    if args.cmd == '_writer':
        return run_writer(args)
    if args.cmd == '_pending':
        return run_pending(args)
    if args.cmd == '_prepare':
        return run_prepare(args)
    if args.cmd == '_check':
        return run_check(args)
    if args.smoke:
        args.images, args.scale, args.bases = 20, 64, 4
        args.delete_every = 5
    if args.pool and args.db != 'mariadb':
        p.error('--pool needs --db mariadb')
    work = tempfile.mkdtemp(prefix='bench-lock-', dir=args.workdir)
    results = {}
    galera = group = None
    try:
        if args.pool:
            galera, group = private_server(args, work)
        elif args.db == 'galera':
            sys.path.insert(0, TOP)
            from tools.vmarenv import galera_env
            os.chmod(work, 0o755)       # mariadbd runs as the mysql user
            os.makedirs(os.path.join(work, 'galera'))
            galera = galera_env.Galera(os.path.join(work, 'galera')).start()
        if args.baseline:
            tree = os.path.join(work, 'baseline-tree')
            subprocess.run(['git', '-C', TOP, 'worktree', 'add', '--detach',
                            '-q', tree, args.baseline], check=True)
            try:
                results['baseline'] = run_variant(
                    args, 'baseline', tree, work, galera,
                    images=args.baseline_images)
            finally:
                subprocess.run(['git', '-C', TOP, 'worktree', 'remove',
                                '--force', tree], check=False)
        results['new'] = run_variant(args, 'new', TOP, work, galera)
    finally:
        if galera is not None:
            galera.stop()
        if group is not None:
            group.remove()
        shutil.rmtree(work, ignore_errors=True)
    report(results)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'args': vars(args), 'results': results}, f, indent=1)


if __name__ == '__main__':
    main()
