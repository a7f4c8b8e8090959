"""Schema migrations keep the data they find."""

import datetime

import fixtures
from oslo_config import cfg
import sqlalchemy as sa
import testtools

from tests import base
from vmar_openstack import conf as vmar_conf
from vmar_openstack.db import hosts as db_hosts
from vmar_openstack.db import migration
from vmar_openstack.db import models
from vmar_openstack.db import publications as db_publications
from vmar_openstack.db import session as db_session
from vmar_openstack.db import store as db_store
from vmar_openstack import exception
from vmar_openstack import ingest
from vmar_openstack.ingest import check


class MigrationTestCase(testtools.TestCase):
    """A library's configuration, its schema not created yet.

    On SQLite; the functional suite runs these on MariaDB and PostgreSQL.
    """

    def database_url(self):
        return 'sqlite:///%s/v.sqlite' % self.tmp

    def setUp(self):
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.conf = cfg.ConfigOpts()
        vmar_conf.register_opts(self.conf)
        self.conf([], project='vmar', default_config_files=[])
        self.conf.set_override('state_dir', self.tmp, group='vmar')
        self.conf.set_override('connection', self.database_url(),
                               group='vmar_database')

    @staticmethod
    def insert_image(c, seq, visibility='public'):
        c.execute(sa.text(
            "INSERT INTO vmar_images (seq, image_id, visibility, "
            "disk_format, virtual_size, block_size, algorithm, space_key, "
            "state, n_blocks, zero_blocks, content_sha256, map_version, "
            "redirected_blocks, n_extents, created_at, updated_at) VALUES "
            "(:s, :id, :v, 'raw', 4096, 4096, 'sha256', 0, 'active', 1, 0, "
            "'x', 0, 0, 0, '2026-11-22', '2026-11-22')"),
            {'s': seq, 'id': 'id-%d' % seq, 'v': visibility})

    @staticmethod
    def insert_cluster_with_member_rows(c, cid, members, columns=''):
        """A cluster as revisions before 0006 kept it.

        ``columns``: more column names of that revision, given the value 0.
        """
        c.execute(sa.text(
            "INSERT INTO vmar_clusters (id, members_hash, n_images, "
            "n_fingerprints%s) VALUES (:c, :h, :n, 1%s)"
            % (columns and ', ' + columns, columns and ', 0')),
            {'c': cid, 'h': 'h%d' % cid, 'n': len(members)})
        for m in members:
            c.execute(sa.text(
                'INSERT INTO vmar_cluster_members (cluster_id, seq) '
                'VALUES (:c, :m)'), {'c': cid, 'm': m})


class TestMigration0004(MigrationTestCase):
    """Smallest members of clusters and the lock generation, backfilled."""

    def test_backfill(self):
        migration.upgrade('0003', conf=self.conf)
        engine = db_session.get_engine(self.conf)
        with engine.begin() as c:
            for seq, vis in ((1, 'private'), (2, 'public'), (3, 'public')):
                self.insert_image(c, seq, vis)
            for cid, members in ((10, (1, 3)), (11, (2, 3)), (12, (1,))):
                self.insert_cluster_with_member_rows(c, cid, members)
        migration.upgrade('head', conf=self.conf)
        with engine.connect() as c:
            rows = c.execute(sa.text(
                'SELECT id, min_seq, min_public_seq FROM vmar_clusters '
                'ORDER BY id')).fetchall()
            gen = c.execute(sa.text(
                'SELECT generation FROM vmar_locks')).scalar()
        self.assertEqual([(10, 1, 3), (11, 2, 2), (12, 1, None)],
                         [tuple(r) for r in rows])
        self.assertEqual(0, gen)

    def test_check_reports_a_wrong_smallest_member(self):
        migration.upgrade('head', conf=self.conf)
        path = self.useFixture(fixtures.TempDir()).path + '/a.raw'
        base.write_image(path, [1, 2])
        lib = ingest.Library(self.conf)
        lib.add('00000001-0000-4000-8000-000000000001', path,
                visibility='public', keep_base=False)
        self.assertEqual([], check.check(self.conf)[0])
        with db_session.get_engine(self.conf).begin() as c:
            c.execute(sa.text('UPDATE vmar_clusters SET min_seq = 7, '
                              'min_public_seq = NULL'))
        problems = check.check(self.conf)[0]
        self.assertIn('min_seq 7, smallest member 1', ' '.join(problems))
        self.assertIn('min_public_seq None, smallest public member 1',
                      ' '.join(problems))


class TestMigration0005(MigrationTestCase):
    """The small fingerprint tier, added to a library that has data."""

    def test_fingerprints_stay_and_the_small_tier_starts_empty(self):
        migration.upgrade('0004', conf=self.conf)
        engine = db_session.get_engine(self.conf)
        with engine.begin() as c:
            c.execute(sa.text(
                "INSERT INTO vmar_clusters (id, members_hash, n_images, "
                "n_fingerprints, min_seq) VALUES (1, 'h', 0, 2, 0)"))
            c.execute(sa.text('INSERT INTO vmar_fingerprints (fp_key, '
                              'cluster_id) VALUES (5, 1), (-7, 1)'))
        migration.upgrade('0005', conf=self.conf)
        self.assertEqual('0005', migration.current(conf=self.conf))
        with engine.connect() as c:
            self.assertEqual([(-7, 1), (5, 1)], [tuple(r) for r in c.execute(
                sa.text('SELECT fp_key, cluster_id FROM vmar_fingerprints '
                        'ORDER BY fp_key'))])
            self.assertEqual(0, c.execute(sa.text(
                'SELECT COUNT(*) FROM vmar_fingerprints_recent')).scalar())


class TestMigration0006(MigrationTestCase):
    """Member rows become the member lists of the cluster rows."""

    def test_member_rows_become_lists(self):
        migration.upgrade('0005', conf=self.conf)
        engine = db_session.get_engine(self.conf)
        with engine.begin() as c:
            for seq in (1, 2, 3):
                self.insert_image(c, seq)
            for cid, members in ((10, (3, 1)), (11, (2,)), (12, ()),
                                 (13, (1, 2, 3))):
                self.insert_cluster_with_member_rows(c, cid, members,
                                                     'min_seq')
        migration.upgrade('0006', conf=self.conf)
        with engine.connect() as c:
            rows = c.execute(sa.text(
                'SELECT id, members FROM vmar_clusters ORDER BY id')).all()
            self.assertNotIn('vmar_cluster_members',
                             sa.inspect(c).get_table_names())
        self.assertEqual([(10, '1,3'), (11, '2'), (12, ''), (13, '1-3')],
                         [tuple(r) for r in rows])


class TestMigration0007(MigrationTestCase):
    """The fingerprint table loses its foreign key, keeps its rows."""

    def test_rows_stay_and_the_key_goes(self):
        migration.upgrade('0006', conf=self.conf)
        engine = db_session.get_engine(self.conf)
        with engine.begin() as c:
            c.execute(sa.text(
                "INSERT INTO vmar_clusters (id, members_hash, n_images, "
                "n_fingerprints, min_seq, members) VALUES (1, 'h', 1, 2, 1, "
                "'1')"))
            c.execute(sa.text('INSERT INTO vmar_fingerprints (fp_key, '
                              'cluster_id) VALUES (5, 1), (-7, 1)'))
        migration.upgrade('head', conf=self.conf)
        with engine.connect() as c:
            self.assertEqual([], sa.inspect(c).get_foreign_keys(
                'vmar_fingerprints'))
            self.assertEqual([(-7, 1), (5, 1)], [tuple(r) for r in c.execute(
                sa.text('SELECT fp_key, cluster_id FROM vmar_fingerprints '
                        'ORDER BY fp_key'))])
            if c.dialect.name == 'sqlite':
                # still keyed by the rowid: no separate index
                self.assertEqual(['vmar_fingerprints'], [
                    r[0] for r in c.execute(sa.text(
                        "SELECT name FROM sqlite_master WHERE tbl_name = "
                        "'vmar_fingerprints'"))])
            else:
                self.assertEqual([], sa.inspect(c).get_indexes(
                    'vmar_fingerprints'))


class TestMigration0008(MigrationTestCase):
    """Failure records get their cause, read from their error."""

    def test_causes_from_errors(self):
        migration.upgrade('0007', conf=self.conf)
        engine = db_session.get_engine(self.conf)
        with engine.begin() as c:
            for image_id, error in (
                    ('a', 'ImageUnusable: image a rejected by mapgen'),
                    ('b', 'HTTPServiceUnavailable: 503'),
                    ('c', 'OperationalError: database is locked')):
                c.execute(sa.text(
                    "INSERT INTO vmar_agent_failures (image_id, event, "
                    "attempts, permanent, last_error, updated_at) VALUES "
                    "(:i, 'image.activate', 5, :p, :e, '2026-11-22')"),
                    {'i': image_id, 'e': error, 'p': True})
        migration.upgrade('head', conf=self.conf)
        with engine.connect() as c:
            rows = c.execute(sa.text(
                'SELECT image_id, cause FROM vmar_agent_failures '
                'ORDER BY image_id')).all()
        self.assertEqual([('a', 'image'), ('b', 'outage'), ('c', 'outage')],
                         [tuple(r) for r in rows])


class TestMigration0011(MigrationTestCase):
    """Hosts' reports keep what they held; no host is a peer server yet."""

    def test_reports_stay_and_name_no_peer(self):
        migration.upgrade('0010', conf=self.conf)
        engine = db_session.get_engine(self.conf)
        with engine.begin() as c:
            c.execute(sa.text("INSERT INTO vmar_hosts (host, reported_at) "
                              "VALUES ('h1', '2026-11-26')"))
            c.execute(sa.text("INSERT INTO vmar_host_bases (host, base_id, "
                              "blocks) VALUES ('h1', 'b', 7)"))
        migration.upgrade('head', conf=self.conf)
        reports = db_hosts.HostReports(self.conf)
        (h,) = reports.list()
        self.assertEqual(('h1', (('b', 7),), None, None),
                         (h.host, h.holds, h.peer_address, h.load_per_cpu))
        # a host that serves no peer is nobody's holder
        self.assertEqual([], reports.holders('b'))


class TestMigration0012(MigrationTestCase):
    """Holdings stay; no mirror of an earlier report is complete."""

    def test_holdings_stay_and_nothing_is_complete(self):
        migration.upgrade('0011', conf=self.conf)
        engine = db_session.get_engine(self.conf)
        with engine.begin() as c:
            c.execute(sa.text("INSERT INTO vmar_hosts (host, reported_at, "
                              "peer_address) VALUES ('h1', '2026-11-26', "
                              "'10.0.0.1:10810')"))
            c.execute(sa.text("INSERT INTO vmar_host_bases (host, base_id, "
                              "blocks) VALUES ('h1', 'b', 7), "
                              "('h1', 'w', NULL)"))
        migration.upgrade('head', conf=self.conf)
        reports = db_hosts.HostReports(self.conf)
        (h,) = reports.list()
        self.assertEqual(((('b', 7), ('w', None)), ()),
                         (h.holds, h.complete))
        # a whole base serves every block; a mirror must say it is complete
        self.assertEqual([], reports.complete_holders('b'))
        self.assertEqual(['h1'], reports.complete_holders('w'))


class TestMigration0013(MigrationTestCase):
    """The weigher's indexes come; the rows they index stay."""

    def test_indexes_on_a_library_with_reports(self):
        migration.upgrade('0012', conf=self.conf)
        engine = db_session.get_engine(self.conf)
        with engine.begin() as c:
            self.insert_image(c, 1)
            c.execute(sa.text("INSERT INTO vmar_map_targets (seq, version, "
                              "target_id, blocks) VALUES (1, 1, 'id-1', 1)"))
            c.execute(sa.text("INSERT INTO vmar_hosts (host, reported_at) "
                              "VALUES ('h1', '2026-11-27')"))
            c.execute(sa.text("INSERT INTO vmar_host_exports (host, "
                              "image_id, map_version) VALUES "
                              "('h1', 'id-1', 1)"))
        migration.upgrade('head', conf=self.conf)
        inspector = sa.inspect(engine)
        self.assertIn(['target_id'], [
            i['column_names'] for i in inspector.get_indexes(
                'vmar_map_targets')])
        self.assertIn(['image_id', 'map_version'], [
            i['column_names'] for i in inspector.get_indexes(
                'vmar_host_exports')])
        (h,) = db_hosts.HostReports(self.conf).list()
        self.assertEqual((('id-1', 1),), h.exports)


class TestMigration0014(MigrationTestCase):
    """Shares start empty; a host's next report writes its own."""

    def test_shares_come_with_the_next_report(self):
        migration.upgrade('0013', conf=self.conf)
        engine = db_session.get_engine(self.conf)
        a = '0a000000-0000-4000-8000-00000000000a'
        with engine.begin() as c:
            c.execute(sa.text("INSERT INTO vmar_hosts (host, reported_at) "
                              "VALUES ('h1', '2026-11-27')"))
            c.execute(sa.text("INSERT INTO vmar_host_bases (host, base_id, "
                              "blocks) VALUES ('h1', :a, 1)"), {'a': a})
        migration.upgrade('head', conf=self.conf)
        # the image the row names (added at head: the library's code is)
        path = self.tmp + '/a.raw'
        with open(path, 'wb') as f:
            f.write(b'\x01' * 4096 + b'\x02' * 4096)
        ingest.Library(self.conf).add(a, path, visibility='public',
                                      keep_base=False)
        reports = db_hosts.HostReports(self.conf)
        self.assertEqual({}, reports.shares(a))
        reports.record('h1', [], {a: 1})
        self.assertEqual({'h1': 0.5}, reports.shares(a))


class TestMigration0015(MigrationTestCase):
    """Each member list becomes its cluster's base; adds go on from it."""

    def test_lists_become_bases(self):
        migration.upgrade('0014', conf=self.conf)
        engine = db_session.get_engine(self.conf)
        with engine.begin() as c:
            for seq in (1, 2, 3):
                self.insert_image(c, seq)
            for cid, members in ((10, '1,3'), (11, '2'), (12, ''),
                                 (13, '1-3')):
                c.execute(sa.text(
                    "INSERT INTO vmar_clusters (id, members_hash, n_images, "
                    "n_fingerprints, min_seq, members) VALUES (:c, :h, 1, "
                    "1, 1, :m)"), {'c': cid, 'h': 'h%d' % cid, 'm': members})
        migration.upgrade('head', conf=self.conf)
        with db_session.reader(self.conf) as s:
            store = db_store.ClusterStore(s)
            got = {c: m.tolist() for c, m in store.member_lists(
                [10, 11, 12, 13]).items()}
            bases = store.member_bases()
            rows = store.cluster_rows()
        self.assertEqual({10: [1, 3], 11: [2], 12: [], 13: [1, 2, 3]}, got)
        self.assertEqual(['h10', 'h11', 'h13'],
                         sorted(h for h, _m in bases.values()))
        self.assertIsNone(rows[12].base_id)
        self.assertEqual({('', '')}, {(r.added, r.removed)
                                      for r in rows.values()})
        self.assertNotIn('members', [c['name'] for c in sa.inspect(
            engine).get_columns('vmar_clusters')])


class TestMigration0016(MigrationTestCase):
    """No map is pending after the upgrade; the table takes them."""

    def test_pending_maps_table(self):
        migration.upgrade('0015', conf=self.conf)
        engine = db_session.get_engine(self.conf)
        with engine.begin() as c:
            self.insert_image(c, 1)
        migration.upgrade('head', conf=self.conf)
        lib = ingest.Library(self.conf)
        self.assertEqual([], lib.pending_maps())
        with db_session.locked_writer(self.conf) as s:
            db_store.ClusterStore(s).pend_maps([1], 'cause-id')
        self.assertEqual([('id-1', 'cause-id')],
                         [(p.image_id, p.cause) for p in lib.pending_maps()])


class TestMigration0017(MigrationTestCase):
    """A burst's lead per base: none after the upgrade, one per base."""

    def test_fetch_leads_table(self):
        migration.upgrade('0016', conf=self.conf)
        migration.upgrade('head', conf=self.conf)
        reports = db_hosts.HostReports(self.conf)
        reports.record('h1', [], {}, peer_address='h1:1')
        ttl = datetime.timedelta(seconds=60)
        self.assertIsNone(reports.lead('a', 'h1', ttl, 8))
        self.assertEqual('h1', reports.lead('a', 'h2', ttl, 8).host)
        self.assertEqual(1, reports.counts()['vmar_fetch_leads'])


class TestMigration0018(MigrationTestCase):
    """No shadow holder after the upgrade: every member stays one."""

    def test_no_shadows_and_images_by_owner(self):
        migration.upgrade('0017', conf=self.conf)
        engine = db_session.get_engine(self.conf)
        with engine.begin() as c:
            self.insert_image(c, 1, 'private')
            self.insert_image(c, 2)
            c.execute(sa.text("UPDATE vmar_images SET owner = 'p1'"))
        migration.upgrade('head', conf=self.conf)
        with db_session.reader(self.conf) as s:
            store = db_store.ClusterStore(s)
            self.assertEqual([], store.shadow_rows())
            (one,) = store.images_by_seq([1]).values()
            self.assertEqual([1], store.private_seqs(one, 3).tolist())
            self.assertEqual([], store.private_seqs(one, 1).tolist())
        self.assertIn('ix_vmar_images_owner', [i['name'] for i in sa.inspect(
            engine).get_indexes('vmar_images')])


class TestMigration0019(MigrationTestCase):
    """Each base's holders come from one index, and shares stand."""

    def test_the_index_covers_the_weighers_read(self):
        migration.upgrade('0018', conf=self.conf)
        reports = db_hosts.HostReports(self.conf)
        # the host's share as the agent of 0018 wrote it (the model has
        # the columns of later revisions)
        with db_session.get_engine(self.conf).begin() as c:
            c.execute(sa.text("INSERT INTO vmar_hosts (host, reported_at) "
                              "VALUES ('h1', '2026-11-28 12:00:00')"))
            c.execute(sa.text("INSERT INTO vmar_host_shares "
                              "(host, base_id, share) "
                              "VALUES ('h1', 'b1', 1.0)"))
        migration.upgrade('head', conf=self.conf)
        engine = db_session.get_engine(self.conf)
        indexes = {i['name']: i['column_names'] for i in sa.inspect(
            engine).get_indexes('vmar_host_shares')}
        self.assertEqual(['base_id', 'host', 'share'],
                         indexes['ix_vmar_host_shares_base_id_host_share'])
        self.assertNotIn('ix_vmar_host_shares_base_id', indexes)
        self.assertEqual({'b1': {'h1': 1.0}}, reports.base_shares(['b1']))


class TestMigration0020(MigrationTestCase):
    """Hosts of before have no order; the next report is recorded."""

    def test_reports_of_before_and_after(self):
        migration.upgrade('0019', conf=self.conf)
        with db_session.get_engine(self.conf).begin() as c:
            c.execute(sa.text("INSERT INTO vmar_hosts (host, reported_at) "
                              "VALUES ('h1', '2026-11-28 12:00:00')"))
        migration.upgrade('head', conf=self.conf)
        reports = db_hosts.HostReports(self.conf)
        with db_session.reader(self.conf) as s:
            row = s.get(models.HostReport, 'h1')
            self.assertEqual((None, None), (row.report_run, row.report_seq))
        self.assertTrue(reports.record('h1', [], order=('r', 5)))
        self.assertFalse(reports.record('h1', [], order=('r', 4)))
        with db_session.reader(self.conf) as s:
            row = s.get(models.HostReport, 'h1')
            self.assertEqual(('r', 5), (row.report_run, row.report_seq))


class TestMigration0021(MigrationTestCase):
    """Hosts of before have no digest; the library's epoch starts at 0."""

    def test_reports_of_before_are_written_whole(self):
        migration.upgrade('0020', conf=self.conf)
        with db_session.get_engine(self.conf).begin() as c:
            c.execute(sa.text("INSERT INTO vmar_hosts (host, reported_at) "
                              "VALUES ('h1', '2026-11-28 12:00:00')"))
        migration.upgrade('head', conf=self.conf)
        with db_session.reader(self.conf) as s:
            self.assertIsNone(s.get(models.HostReport, 'h1').report_digest)
            self.assertEqual(0, db_session.maps_epoch(s))
        reports = db_hosts.HostReports(self.conf)
        self.assertTrue(reports.record('h1', [('i1', 1)], {'b1': None}))
        (h,) = reports.list()
        self.assertEqual(((('i1', 1),), (('b1', None),)),
                         (h.exports, h.holds))
        with db_session.reader(self.conf) as s:
            self.assertIsNotNone(s.get(models.HostReport,
                                       'h1').report_digest)


class TestMigration0022(MigrationTestCase):
    """Publications start empty; the downgrade drops them."""

    def test_upgrade_then_downgrade(self):
        migration.upgrade('0021', conf=self.conf)
        migration.upgrade('0022', conf=self.conf)
        pubs = db_publications.Publications(self.conf, 'a')
        self.assertEqual(db_publications.TAKEN,
                         pubs.claim('o1', 'i1', 'map', 's' * 64, 60))
        self.assertTrue(pubs.done('o1', 's' * 64))
        self.assertEqual(db_publications.DONE, pubs.get('o1').state)
        # 0021 has no way back: refused before anything changes
        e = self.assertRaises(exception.IrreversibleMigration,
                              migration.downgrade, '0020', conf=self.conf)
        self.assertIn('0021 cannot be undone', str(e))
        self.assertEqual('0022', migration.current(conf=self.conf))
        migration.downgrade('0021', conf=self.conf)
        self.assertEqual('0021', migration.current(conf=self.conf))
        names = sa.inspect(db_session.get_engine(self.conf)).get_table_names()
        self.assertNotIn('vmar_publications', names)
        self.assertIn('vmar_hosts', names)
