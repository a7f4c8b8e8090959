"""The library on a three-node MariaDB Galera cluster (issue 35).

One private cluster (:mod:`tools.vmarenv.galera_env`) for the module; each
test has its own database on it. The library's schema migrates on node 1
and must be seen on nodes 2 and 3; then ingest processes write through
different nodes at once (one writer process per node, each adding images
one after the other), and the checker must pass on every node with every
image there exactly once -- also while a node is SIGKILLed and restarted
in the middle.

Galera does not replicate the library lock (``SELECT ... FOR UPDATE`` on
``vmar_locks`` locks a row on one node only): two writers on different
nodes both hold "the" lock, and certification aborts one of them at
commit with MySQL error 1213 ("Deadlock found when trying to get lock;
try restarting transaction"). These tests say what the library does then.

A worker process is this module run as a script::

    python -m tests.functional.test_galera worker CONF OUT ID=PATH...

It adds the images one by one with ``Library(conf).add`` and writes one
JSON line per image to OUT (ok, or the error).
"""

import atexit
import collections
import json
import os
import subprocess
import sys
import time
import traceback

import sqlalchemy as sa

from tests import base
from tests.unit import test_mapgen
from tools.vmarenv import galera_env
from tools.vmarenv import process
from vmar_openstack.db import api as db_api
from vmar_openstack.db import migration
from vmar_openstack.db import session as db_session
from vmar_openstack.ingest import check

NODES = 3
_CLUSTER = None


def cluster():
    global _CLUSTER
    if _CLUSTER is None:
        _CLUSTER = galera_env.Galera().start()
        atexit.register(tearDownModule)
    return _CLUSTER


def tearDownModule():
    global _CLUSTER
    if _CLUSTER is not None:
        _CLUSTER.stop()
        _CLUSTER = None


class GaleraTestCase(base.LibraryTestCase):
    """A library whose database is on the cluster; node 1 migrates it."""

    def database_url(self):
        try:
            self.galera = cluster()
        except process.ServiceError as e:
            self.fail('no Galera cluster: %s' % e)
        # a database of the test's own, made on node 1
        self.db = 'vmar_galera_%s' % self.id().rsplit('.', 1)[-1][5:40]
        self.galera.sql(1, 'DROP DATABASE IF EXISTS `{0}`; '
                        'CREATE DATABASE `{0}`'.format(self.db))
        self.galera.wait_same_position()
        return self.galera.url(1, self.db)

    def setUp(self):
        super().setUp()
        self._kept = []

    def node_conf(self, index):
        conf = base.new_conf()
        conf.set_override('state_dir', self.tmp, group='vmar')
        conf.set_override('hash_workers', 1, group='vmar')
        conf.set_override('host_dir', os.path.join(self.tmp, 'host'),
                          group='vmar_host')
        conf.set_override('map_source_dir', self.tmp, group='vmar_host')
        conf.set_override('connection', self.galera.url(index, self.db),
                          group='vmar_database')
        return conf

    def node_conf_file(self, index):
        path = os.path.join(self.tmp, 'node%d.conf' % index)
        with open(path, 'w') as f:
            f.write('[DEFAULT]\nlog_file = %s/node%d.log\n'
                    '[vmar]\nstate_dir = %s\nhash_workers = 1\n'
                    '[vmar_database]\nconnection = %s\n'
                    '[vmar_host]\nhost_dir = %s\nmap_source_dir = %s\n'
                    % (self.tmp, index, self.tmp,
                       self.galera.url(index, self.db),
                       os.path.join(self.tmp, 'host'), self.tmp))
        return path

    # -- workers -----------------------------------------------------------

    def start_writers(self, per_node, first=0, pause=0.0, nodes=None):
        """One worker process per node, each adding ``per_node`` images.

        The images share most blocks, so every ingest moves fingerprints
        the others move too; their ids follow ``first``. A worker sleeps
        ``pause`` seconds after each add. Returns [(node, proc, out path,
        ids)].
        """
        common = list(range(1, 150))
        writers = []
        n = first
        for node in nodes or range(1, NODES + 1):
            args = []
            ids = []
            for _ in range(per_node):
                n += 1
                seeds = common[(n % 20) * 3:] + list(
                    range(1000 * n, 1000 * n + 30))
                path = self.image('img%d' % n, seeds)
                image_id = test_mapgen._uuid(n)
                ids.append(image_id)
                args.append('%s=%s' % (image_id, path))
            out = os.path.join(self.tmp, 'writer%d-%d.jsonl' % (node, first))
            proc = subprocess.Popen(
                [sys.executable, '-m', 'tests.functional.test_galera',
                 'worker', self.node_conf_file(node), out] + args,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                env=dict(os.environ, VMAR_GALERA_PAUSE=str(pause)))
            self.addCleanup(_reap, proc)
            writers.append((node, proc, out, ids))
        return writers

    def wait_writers(self, writers, timeout=600):
        results = {}
        for node, proc, out, _ids in writers:
            output, _ = proc.communicate(timeout=timeout)
            self.assertEqual(0, proc.returncode,
                             'writer on node %d crashed: %s'
                             % (node, output.decode()[-3000:]))
            results[node] = _read_results(out)
        keep = os.environ.get('VMAR_GALERA_RESULTS')
        if keep:
            os.makedirs(keep, exist_ok=True)
            name = '%s-%d.json' % (self.id().rsplit('.', 1)[-1],
                                   len(self._kept))
            self._kept.append(name)
            with open(os.path.join(keep, name), 'w') as f:
                json.dump(results, f, indent=1)
        return results

    def assert_library_everywhere(self, expected, maybe=()):
        """On every node: the checker passes; images are the expected ones.

        ``expected``: ids that must be there, each once; ``maybe``: ids
        that may be there (an add whose commit's answer was lost).
        """
        self.galera.wait_same_position()
        for node in range(1, NODES + 1):
            conf = self.node_conf(node)
            problems, _warnings = check.check(conf)
            self.assertEqual([], problems, 'checker on node %d' % node)
            with db_session.reader(conf) as s:
                imgs = db_api.list_images(s)
                counts = collections.Counter(i.image_id for i in imgs)
                seqs = [i.seq for i in imgs]
            self.assertEqual([], [i for i, c in counts.items() if c != 1],
                             'node %d: images there more than once' % node)
            self.assertEqual(len(seqs), len(set(seqs)))
            have = set(counts)
            self.assertEqual(set(), set(expected) - have,
                             'node %d: committed adds missing' % node)
            self.assertEqual(set(), have - set(expected) - set(maybe),
                             'node %d: images nobody added' % node)


def _reap(proc):
    if proc.poll() is None:
        proc.kill()
        proc.wait(30)


def _read_results(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def _failures(results):
    return ['%s: %s' % (r['id'], r['error']) for r in results
            if not r['ok']]


class TestGalera(GaleraTestCase):

    def test_schema_replicates(self):
        # setUp migrated node 1 to head
        tables = {}
        versions = {}
        for node in range(1, NODES + 1):
            engine = sa.create_engine(self.galera.url(node, self.db))
            try:
                with engine.connect() as c:
                    # causal reads: what node 1 committed is applied here
                    # first (replicas apply write sets asynchronously).
                    # 1 covers SELECT; SHOW (the inspector's SHOW FULL
                    # TABLES) needs 8 of its own since MariaDB 10.0
                    c.execute(sa.text('SET SESSION wsrep_sync_wait = 9'))
                    tables[node] = sorted(sa.inspect(c).get_table_names())
                    versions[node] = c.execute(sa.text(
                        'SELECT version_num FROM %s'
                        % migration.VERSION_TABLE)).scalars().all()
                    lock = c.execute(sa.text(
                        "SELECT generation FROM vmar_locks WHERE name = "
                        "'library'")).scalar()
            finally:
                engine.dispose()
            self.assertIsNotNone(lock, 'node %d has no lock row' % node)
        self.assertIn('vmar_images', tables[1])
        self.assertIn('vmar_locks', tables[1])
        self.assertEqual(tables[1], tables[2])
        self.assertEqual(tables[1], tables[3])
        self.assertEqual(versions[1], versions[2])
        self.assertEqual(versions[1], versions[3])
        # and a library mutation on node 1 is read on node 3
        path = self.image('one', list(range(1, 40)))
        self.lib.add(test_mapgen._uuid(999), path, visibility='public')
        self.assert_library_everywhere([test_mapgen._uuid(999)])

    def test_concurrent_writers_on_every_node(self):
        writers = self.start_writers(per_node=5)
        results = self.wait_writers(writers)
        ok = [r['id'] for rs in results.values() for r in rs if r['ok']]
        failed = {node: _failures(rs) for node, rs in results.items()}
        # whatever failed: the library stays consistent on every node
        self.assert_library_everywhere(
            ok, maybe=[i for _n, _p, _o, ids in writers for i in ids])
        self.assertEqual({1: [], 2: [], 3: []}, failed,
                         'adds failed although every node was up')

    def test_node_killed_and_restarted_during_writes(self):
        # the writers on nodes 1 and 2 go on while node 3 is down and
        # while it rejoins
        writers = self.start_writers(per_node=10, pause=0.3)
        # let a few adds commit, then kill node 3 in the middle
        deadline = time.time() + 300
        while sum(len(_read_results(o)) for _n, _p, o, _i in writers) < 3:
            self.assertLess(time.time(), deadline, 'no add finished')
            time.sleep(0.2)
        self.galera.kill(3)
        time.sleep(3)
        how = self.galera.restart(3)
        results = self.wait_writers(writers)
        ok = [r['id'] for rs in results.values() for r in rs if r['ok']]
        on_dead = [r['id'] for r in results[3] if not r['ok']]
        self.assert_library_everywhere(ok, maybe=on_dead)
        self.assertEqual({1: [], 2: []},
                         {n: _failures(results[n]) for n in (1, 2)},
                         'adds through the live nodes failed (node 3 '
                         'rejoined by %s)' % how)
        # the rejoined node takes writes again, beside the others
        again = self.start_writers(per_node=3, first=100)
        results = self.wait_writers(again)
        ok += [r['id'] for rs in results.values() for r in rs if r['ok']]
        self.assert_library_everywhere(ok, maybe=on_dead)
        self.assertEqual({1: [], 2: [], 3: []},
                         {n: _failures(rs) for n, rs in results.items()},
                         'adds failed after node 3 rejoined')

    def test_rejoins_by_ist_after_100_adds(self):
        """A node down for 100 adds rejoins from the others' gcache.

        IST, not a full state transfer, as long as the write sets
        replicated while it was down fit gcache.size: the sizing advice of
        doc/source/admin/scale.rst ("Galera") rests on that. The test
        measures those bytes (``wsrep_replicated_bytes`` of the nodes that
        wrote) and requires them under the cluster's gcache first, so that
        a layout whose adds outgrow it fails here and not in production.
        """
        self.galera.kill(3)
        before = {n: self._replicated(n) for n in (1, 2)}
        writers = self.start_writers(per_node=50, first=200, nodes=(1, 2))
        results = self.wait_writers(writers, timeout=1200)
        ok = [r['id'] for rs in results.values() for r in rs if r['ok']]
        self.assertEqual({1: [], 2: []},
                         {n: _failures(rs) for n, rs in results.items()},
                         'adds failed with node 3 down')
        self.assertEqual(100, len(ok))
        written = sum(self._replicated(n) - before[n] for n in (1, 2))
        self.assertGreater(written, 0)
        self.assertLess(written, galera_env.size_bytes(self.galera.gcache),
                        'the write sets of 100 adds outgrow gcache.size')
        how = self.galera.restart(3)
        self._keep('ist', {'adds': len(ok), 'replicated_bytes': written,
                           'gcache': self.galera.gcache, 'rejoined_by': how})
        self.assertEqual('IST', how, 'node 3 rejoined by %s after %d bytes '
                         'of write sets (gcache.size %s)'
                         % (how, written, self.galera.gcache))
        self.assert_library_everywhere(ok)
        # and it takes writes again
        again = self.start_writers(per_node=2, first=400, nodes=(3,))
        results = self.wait_writers(again)
        self.assertEqual([], _failures(results[3]))
        ok += [r['id'] for r in results[3]]
        self.assert_library_everywhere(ok)

    def _keep(self, name, figures):
        """Write ``figures`` to $VMAR_GALERA_RESULTS/<test>-NAME.json."""
        keep = os.environ.get('VMAR_GALERA_RESULTS')
        if keep:
            os.makedirs(keep, exist_ok=True)
            with open(os.path.join(keep, '%s-%s.json' % (
                    self.id().rsplit('.', 1)[-1], name)), 'w') as f:
                json.dump(figures, f, indent=1)

    def _replicated(self, node):
        return int(self.galera.status(node)['wsrep_replicated_bytes'])


def _where(error):
    """The library's innermost frames of ``error``'s traceback."""
    frames = traceback.extract_tb(error.__traceback__)
    ours = ['%s:%d %s' % (os.path.relpath(f.filename), f.lineno, f.name)
            for f in frames if '/vmar_openstack/' in f.filename]
    return ours[-4:]


def worker(conf_file, out, pairs):
    """Add ``ID=PATH`` images one by one; one JSON line each to ``out``."""
    from oslo_config import cfg
    from vmar_openstack import conf as vmar_conf
    from vmar_openstack import ingest

    conf = cfg.ConfigOpts()
    vmar_conf.register_opts(conf)
    conf(['--config-file', conf_file], project='vmar',
         default_config_files=[])
    lib = ingest.Library(conf)
    pause = float(os.environ.get('VMAR_GALERA_PAUSE') or 0)
    with open(out, 'a') as f:
        for i, pair in enumerate(pairs):
            if i and pause:
                time.sleep(pause)
            image_id, path = pair.split('=', 1)
            t0 = time.time()
            try:
                o = lib.add(image_id, path, visibility='public')
                r = {'id': image_id, 'ok': True, 'seq': o.seq}
            except Exception as e:  # noqa: B902 (reported to the test)
                r = {'id': image_id, 'ok': False,
                     'error': '%s.%s: %s' % (type(e).__module__,
                                             type(e).__name__,
                                             str(e)[:1500]),
                     'conflict': db_session.conflict(e),
                     'where': _where(e)}
            r.update(start=t0, end=time.time())
            f.write(json.dumps(r) + '\n')
            f.flush()


if __name__ == '__main__':
    if len(sys.argv) < 4 or sys.argv[1] != 'worker':
        sys.exit('usage: python -m tests.functional.test_galera worker '
                 'CONF OUT ID=PATH...')
    worker(sys.argv[2], sys.argv[3], sys.argv[4:])
