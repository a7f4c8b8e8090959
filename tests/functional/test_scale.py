"""bench/bench_scale.py's smoke: many hosts reporting, on real services.

The measured figures (a thousand hosts) are in bench/RESULTS.md; this runs
the same code at a size CI can afford, on a real RabbitMQ, vmar-agent and
MariaDB, and checks what must hold at any size: every report recorded
without a database error, the queue drained, one row per host, the
weigher answering for hosts that hold the images.
"""

import json
import os
import subprocess
import sys

import fixtures
import testtools

from tools import memcg

TOP = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def smoke(test, what, db, *extra, script='bench_scale.py'):
    """``bench_scale.py WHAT --smoke --db DB``: its JSON result.

    The run's work directory (databases, images, logs) is gone at its end.
    """
    out = os.path.join(test.useFixture(fixtures.TempDir()).path, 'out.json')
    workdir = test.useFixture(fixtures.TempDir()).path
    os.chmod(workdir, 0o755)            # Galera's mariadbd runs as mysql
    r = subprocess.run(
        [sys.executable, os.path.join(TOP, 'bench', script)]
        + ([what] if what else []) + ['--smoke', '--db', db, '--json', out,
                                      '--workdir', workdir] + list(extra),
        capture_output=True, text=True, timeout=600)
    test.assertEqual(0, r.returncode, r.stdout[-3000:] + r.stderr[-3000:])
    test.assertEqual([], os.listdir(workdir))
    with open(out) as f:
        return json.load(f)


class TestHostsReporting(testtools.TestCase):

    def test_hosts_smoke_on_mariadb(self):
        res = smoke(self, 'hosts', 'mariadb')
        hosts = res['hosts']
        # the flood of first reports: all recorded, none put back (on
        # MariaDB the first reports of new hosts deadlocked on gap locks)
        self.assertEqual(hosts, res['flood']['reports'])
        self.assertEqual(0, res['agent_requeued'])
        sched = res['schedule']
        self.assertGreater(sched['sent'], hosts)
        self.assertEqual(0, sched['queue_end'])
        # hosts whose report says what their last one said (most of the
        # schedule's: a server changes at 5 % of them) move their row
        # alone; the others are written
        self.assertGreater(sched['unchanged'], 0)
        self.assertLess(sched['unchanged'], sched['recorded'])
        self.assertEqual(hosts, res['rows']['vmar_hosts'])
        self.assertGreater(res['rows']['vmar_host_exports'], 0)
        # the weigher found holders of the images it was asked about,
        # after the schedule and during it (in a process of its own)
        self.assertGreater(
            res['weigher_quiet']['mean_hosts_weighed_above_0'], 0)
        self.assertGreater(sched['weigher_lookups'], 0)
        self.assertGreater(sched['weigher_mean_hosts_weighed_above_0'], 0)
        # reports are no library mutation: an ingest beside them keeps
        # the lookups and map it prepared in its snapshot
        self.assertEqual(0, res['ingest_loaded']['redone'])


class TestLockHold(testtools.TestCase):

    def test_two_writers_and_the_pending_pass_on_a_capped_mariadb(self):
        """``bench_lock.py --smoke --pool``: 20 adds, 3 deletes, the pass.

        On a MariaDB of the bench's own, with a small buffer pool in a
        memory cgroup: the issue's real-size run, reduced.
        """
        groups = set(os.listdir(memcg.ROOT))
        res = smoke(self, None, 'mariadb', '--pool', '64', '--memory', '512',
                    script='bench_lock.py')
        new = res['results']['new']
        self.assertEqual(20, new['all']['adds'])
        self.assertEqual(3, new['deletes'])
        self.assertEqual([], new['check']['problems'])
        self.assertIsNone(new['stopped'])
        # the deletes left maps pending (rewrite_at_once 4), and the pass
        # rewrote them beside the writers
        self.assertGreater(new['pending_rewritten'], 0)
        # the figures of the real-size run: adds per GiB about the last
        # mark, the database per GiB of the images it holds
        self.assertEqual(['20'], list(new['add_s_per_gib_about']))
        self.assertGreater(new['database_mb_per_gib_held'], 0)
        self.assertGreater(new['check']['database_bytes'],
                           new['check']['fingerprint_rows'] * 8)
        # the server and its cgroup went with the run
        self.assertEqual(groups, set(os.listdir(memcg.ROOT)))


class TestLibrary(testtools.TestCase):

    def test_library_smoke_on_postgresql(self):
        res = smoke(self, 'library', 'postgresql')
        adds = res['adds']
        self.assertEqual(res['images'], len(adds))
        kinds = {a['kind'] for a in adds}
        self.assertEqual({'base', 'derived', 'snapshot'}, kinds)
        # the database grows with the library, and says by how much
        sizes = {int(k): sum(v.values()) for k, v in res['sizes'].items()}
        self.assertLess(sizes[10], sizes[res['images']])
        # the first base is canonical for blocks its family's images and
        # their snapshots read: its delete rewrites ten of their maps
        # ([vmar] rewrite_at_once) and leaves the others to the agent's
        # pass, which rewrites every one
        delete = res['delete_canonical']
        self.assertEqual(10, delete['maps_rewritten'])
        self.assertGreater(delete['pending'], 0)
        self.assertEqual(delete['pending'], res['pending_rewrite']['maps'])
        self.assertGreater(res['largest_cluster_members'], 10)
        # snapshots and derived images of public images do not split
        # their clusters (shadow holders): about a cluster per image,
        # where each snapshot cut its parent's clusters (2,000 an image
        # at 10,000 images, and as many rows an add updated)
        self.assertLessEqual(res['rows']['vmar_clusters'],
                             1.1 * res['images'])
        self.assertGreater(res['rows']['vmar_cluster_shadows'],
                           res['images'])


class TestWriters(testtools.TestCase):

    def test_writers_smoke_on_galera(self):
        # one ingest process, then one on each of three Galera nodes, the
        # same images: no upload lost, the library whole after each
        # then the same with deletes and the map GC beside them, writers,
        # the GC and nodes killed at random: every image not deleted in
        # the library once, none deleted, no superseded map version left,
        # and the checker finds nothing
        res = smoke(self, 'writers', 'galera', '--chaos', '0.5')
        for n in ('1', '3'):
            r = res['rounds'][n]
            self.assertEqual(0, r['failed'], r['errors'])
            self.assertEqual(0, r['checker_problems'])
            self.assertGreater(r['uploads_per_hour'], 0)
        chaos = res['chaos']
        self.assertGreater(sum(chaos['kills'].values()), 0)
        self.assertEqual((0, 0, 0), (chaos['missing'], chaos['failed'],
                                     chaos['checker_problems']),
                         (chaos['errors'], chaos['problems']))
        # a quarter of the images deleted (bases, beside images made
        # from them), none back
        self.assertGreater(chaos['to_delete'], 0)
        self.assertEqual((chaos['to_delete'], 0), (chaos['deleted'],
                                                   chaos['resurrected']))
        # their dependents' maps were rewritten: the GC dropped the
        # versions those superseded, and left none
        self.assertGreater(chaos['gc']['dropped'], 0)
        self.assertEqual(([], 0, 0), (chaos['gc']['errors'],
                                      chaos['superseded_left'],
                                      chaos['pending_left']))
