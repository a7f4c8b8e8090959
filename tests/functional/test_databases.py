"""The library on real MariaDB and PostgreSQL servers.

The oracle, scope, collision, lookahead, tier, run, split, migration and
host holdings tests of the unit suite run again here on each server,
plus concurrent ingests from separate processes.
"""

import subprocess
import sys
import threading

from tests import base
from tests.unit import test_ahead
from tests.unit import test_clusters
from tests.unit import test_mapgen
from tests.unit import test_migrations
from tests.unit import test_pending
from tests.unit import test_weigher
from tools.vmarenv import services
from vmar_openstack.db import api as db_api
from vmar_openstack.db import session as db_session
from vmar_openstack.ingest import check


def _server(start):
    """A test mixin whose library lives on the server ``start`` returns."""
    class Server:
        def database_url(self):
            try:
                url = start()
            except services.Unavailable as e:
                self.fail(str(e))
            services.reset(url)
            return url
    return Server


MariaDB = _server(services.mariadb_url)
PostgreSQL = _server(services.postgresql_url)


class TestOracleMariaDB(MariaDB, test_mapgen.TestMapsAgainstOracle):
    pass


class TestOraclePostgreSQL(PostgreSQL, test_mapgen.TestMapsAgainstOracle):
    pass


class TestOracleTiersMariaDB(MariaDB,
                             test_mapgen.TestMapsAgainstOracleTiers):
    pass


class TestOracleTiersPostgreSQL(PostgreSQL,
                                test_mapgen.TestMapsAgainstOracleTiers):
    pass


class TestTiersMariaDB(MariaDB, test_clusters.TestTiers):
    pass


class TestTiersPostgreSQL(PostgreSQL, test_clusters.TestTiers):
    pass


class TestRunsMariaDB(MariaDB, test_clusters.TestRuns):
    pass


class TestRunsPostgreSQL(PostgreSQL, test_clusters.TestRuns):
    pass


class TestSplitsMariaDB(MariaDB, test_clusters.TestSplits):
    pass


class TestSplitsPostgreSQL(PostgreSQL, test_clusters.TestSplits):
    pass


class TestAffectedMariaDB(MariaDB, test_clusters.TestAffected):
    pass


class TestAffectedPostgreSQL(PostgreSQL, test_clusters.TestAffected):
    pass


class TestPendingMapsMariaDB(MariaDB, test_pending.TestPendingMaps):
    pass


class TestPendingMapsPostgreSQL(PostgreSQL, test_pending.TestPendingMaps):
    pass


class TestMemberBasesMariaDB(MariaDB, test_clusters.TestMemberBases):
    pass


class TestMemberBasesPostgreSQL(PostgreSQL, test_clusters.TestMemberBases):
    pass


class TestShadowsMariaDB(MariaDB, test_clusters.TestShadows):
    pass


class TestShadowsPostgreSQL(PostgreSQL, test_clusters.TestShadows):
    pass


class TestMigration0018MariaDB(MariaDB, test_migrations.TestMigration0018):
    pass


class TestMigration0018PostgreSQL(PostgreSQL,
                                  test_migrations.TestMigration0018):
    pass


class TestMigration0019MariaDB(MariaDB, test_migrations.TestMigration0019):
    pass


class TestMigration0019PostgreSQL(PostgreSQL,
                                  test_migrations.TestMigration0019):
    pass


class TestMigration0020MariaDB(MariaDB, test_migrations.TestMigration0020):
    pass


class TestMigration0020PostgreSQL(PostgreSQL,
                                  test_migrations.TestMigration0020):
    pass


class TestMigration0021MariaDB(MariaDB, test_migrations.TestMigration0021):
    pass


class TestMigration0021PostgreSQL(PostgreSQL,
                                  test_migrations.TestMigration0021):
    pass


class TestMigration0006MariaDB(MariaDB, test_migrations.TestMigration0006):
    pass


class TestMigration0006PostgreSQL(PostgreSQL,
                                  test_migrations.TestMigration0006):
    pass


class TestMigration0007MariaDB(MariaDB, test_migrations.TestMigration0007):
    pass


class TestMigration0007PostgreSQL(PostgreSQL,
                                  test_migrations.TestMigration0007):
    pass


class TestMigration0013MariaDB(MariaDB, test_migrations.TestMigration0013):
    pass


class TestMigration0013PostgreSQL(PostgreSQL,
                                  test_migrations.TestMigration0013):
    pass


class TestMigration0014MariaDB(MariaDB, test_migrations.TestMigration0014):
    pass


class TestMigration0014PostgreSQL(PostgreSQL,
                                  test_migrations.TestMigration0014):
    pass


class TestMigration0015MariaDB(MariaDB, test_migrations.TestMigration0015):
    pass


class TestMigration0015PostgreSQL(PostgreSQL,
                                  test_migrations.TestMigration0015):
    pass


class TestMigration0016MariaDB(MariaDB, test_migrations.TestMigration0016):
    pass


class TestMigration0016PostgreSQL(PostgreSQL,
                                  test_migrations.TestMigration0016):
    pass


class TestSharesMariaDB(MariaDB, test_weigher.TestShares):
    pass


class TestSharesPostgreSQL(PostgreSQL, test_weigher.TestShares):
    pass


class TestUnchangedReportsMariaDB(MariaDB,
                                  test_weigher.TestUnchangedReports):
    pass


class TestUnchangedReportsPostgreSQL(PostgreSQL,
                                     test_weigher.TestUnchangedReports):
    pass


class TestReportsMariaDB(MariaDB, test_weigher.TestReportsBesideTheLibrary):
    pass


class TestReportsPostgreSQL(PostgreSQL,
                            test_weigher.TestReportsBesideTheLibrary):
    pass


class TestScopeMariaDB(MariaDB, test_mapgen.TestScopeIsolation):
    pass


class TestScopePostgreSQL(PostgreSQL, test_mapgen.TestScopeIsolation):
    pass


class TestCollisionMariaDB(MariaDB, test_mapgen.TestKeyCollision):
    pass


class TestCollisionPostgreSQL(PostgreSQL, test_mapgen.TestKeyCollision):
    pass


class TestAheadMariaDB(MariaDB, test_ahead.TestAhead):
    pass


class TestAheadPostgreSQL(PostgreSQL, test_ahead.TestAhead):
    pass


class TestAheadByKeyMariaDB(MariaDB, test_ahead.TestAheadByKey):
    pass


class TestAheadByKeyPostgreSQL(PostgreSQL, test_ahead.TestAheadByKey):
    pass


class TestAheadScanMariaDB(MariaDB, test_ahead.TestAheadScan):
    pass


class TestAheadScanPostgreSQL(PostgreSQL, test_ahead.TestAheadScan):
    pass


class ConcurrentIngests:
    """Several ``vmar-manage image add`` processes at once, same library.

    The images share most blocks, so every ingest moves fingerprints that
    the others also move: a lost update would show as a wrong cluster or a
    stale map in ``check``.
    """

    def _config(self):
        return self.write_conf_file('hash_workers = 1\n')

    def test_concurrent_ingests_lose_nothing(self):
        conf_file = self._config()
        n = 6
        common = list(range(1, 200))
        procs = []
        for i in range(n):
            seeds = common[i * 5:] + list(range(1000 * (i + 1),
                                                1000 * (i + 1) + 40))
            path = self.image('img%d' % i, seeds)
            procs.append(subprocess.Popen(
                [sys.executable, '-m', 'vmar_openstack.cmd.manage',
                 '--config-file', conf_file, 'image', 'add', '--id',
                 test_mapgen._uuid(i + 1), '--visibility', 'public', path],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        outs = [p.communicate(timeout=300) for p in procs]
        for p, (out, err) in zip(procs, outs):
            self.assertEqual(0, p.returncode, err.decode()[-2000:])
        problems, _warnings = check.check(self.conf)
        self.assertEqual([], problems)
        with db_session.reader(self.conf) as s:
            imgs = db_api.list_images(s)
            self.assertEqual(n, len(imgs))
            seqs = sorted(i.seq for i in imgs)
            self.assertEqual(len(set(seqs)), n)
            # every block shared with an earlier image is redirected to the
            # earliest one (seq order is the commit order)
            first = min(imgs, key=lambda i: i.seq)
            self.assertEqual(0, first.redirected_blocks)
            for img in imgs:
                if img.seq != first.seq:
                    self.assertGreater(img.redirected_blocks, 100)

    def test_threads_in_one_process(self):
        errors = []

        def add(i):
            try:
                path = self.image('t%d' % i, list(range(1, 120)) + [5000 + i])
                self.lib.add(test_mapgen._uuid(100 + i), path,
                             visibility='public')
            except Exception as e:  # noqa: B902 (reported below)
                errors.append(e)
        threads = [threading.Thread(target=add, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual([], errors)
        self.assertEqual([], check.check(self.conf)[0])


class TestConcurrentMariaDB(MariaDB, ConcurrentIngests,
                            base.LibraryTestCase):
    pass


class TestConcurrentPostgreSQL(PostgreSQL, ConcurrentIngests,
                               base.LibraryTestCase):
    pass


class TestConcurrentSQLite(ConcurrentIngests, base.LibraryTestCase):
    pass


class TestLeadsMariaDB(MariaDB, test_weigher.TestLeads):
    pass


class TestLeadsPostgreSQL(PostgreSQL, test_weigher.TestLeads):
    pass
