"""Where a lazy host reads an image Glance keeps in Ceph.

The location parsing, the range server's export names, and the choice
base_reader makes between RBD and Glance's data API. Glance is an
in-memory fake here; tests/functional/test_ceph.py runs the same code
against glance-api on a real Ceph cluster.
"""

import os
import sys
import types
from unittest import mock

import fixtures
import testtools

from vmar_openstack.exception import SourceError
from vmar_openstack.mapsource import glance as gsource
from vmar_openstack.mapsource import rbd
from vmar_openstack import names

ID = '0e000000-0000-4000-8000-00000000000e'
FSID = '6ca63753-984d-4f27-9127-4b4b900fd637'


class TestLocation(testtools.TestCase):

    def test_glance_stores_four_part_urls(self):
        loc = rbd.parse_location('rbd://%s/images/%s/snap' % (FSID, ID))
        self.assertEqual(rbd.Location(FSID, 'images', ID, 'snap'), loc)
        # glance_store quotes each part
        self.assertEqual(
            rbd.Location(FSID, 'my/pool', 'i@x', 's%'),
            rbd.parse_location('rbd://%s/my%%2Fpool/i%%40x/s%%25' % FSID))

    def test_other_schemes_are_not_rbd(self):
        for url in (None, 42, '', 'file:///var/lib/glance/images/x',
                    'http://h/rbd://x', 'RBD://a/b/c/d'):
            self.assertIsNone(rbd.parse_location(url))

    def test_rbd_urls_without_a_snapshot_are_refused(self):
        for url in ('rbd://' + ID, 'rbd://%s/images/%s' % (FSID, ID),
                    'rbd://%s/images/%s/snap/x' % (FSID, ID),
                    'rbd://%s//%s/snap' % (FSID, ID), 'rbd://'):
            self.assertRaises(ValueError, rbd.parse_location, url)

    def test_image_location_prefers_direct_url_then_locations(self):
        url = 'rbd://%s/images/%s/snap' % (FSID, ID)
        other = 'rbd://%s/other/%s/snap' % (FSID, ID)
        self.assertEqual('images', rbd.image_location(
            {'direct_url': url, 'locations': [{'url': other}]}).pool)
        self.assertEqual('other', rbd.image_location(
            {'direct_url': 'file:///x', 'locations': [
                'junk', {'url': 'rbd://' + ID}, {'url': other}]}).pool)
        self.assertIsNone(rbd.image_location({'direct_url': 'file:///x'}))
        self.assertIsNone(rbd.image_location({}))


class TestFetchExport(testtools.TestCase):

    def test_round_trip(self):
        for loc in (rbd.Location(FSID, 'images', ID, 'snap'),
                    rbd.Location(FSID, 'a/b', 'c d', 'e%2F')):
            name = rbd.fetch_export(loc, 1 << 30)
            self.assertTrue(rbd.is_fetch_export(name))
            self.assertFalse(rbd.is_fetch_export(
                names.glance_fetch_export(ID, 1 << 30)))
            self.assertEqual((loc._replace(fsid=None), 1 << 30),
                             rbd.parse_fetch_export(name))

    def test_names_are_checked(self):
        for bad in ('rbd/images/%s/snap' % ID, 'rbd/images/%s/snap/x' % ID,
                    'rbd//%s/snap/1' % ID, 'rbd/a/b/c/1/2',
                    names.glance_fetch_export(ID, 10), ''):
            self.assertRaises(ValueError, rbd.parse_fetch_export, bad)


class TestConfFsid(testtools.TestCase):

    def test_fsid_of_the_global_section(self):
        d = self.useFixture(fixtures.TempDir()).path
        path = os.path.join(d, 'ceph.conf')
        with open(path, 'w') as f:
            f.write('[global]\n\tfsid = %s  ; the cluster\n'
                    'mon host = [v2:127.0.0.1:3300]\n[client]\nkeyring = '
                    '/k\n' % FSID)
        self.assertEqual(FSID, rbd.conf_fsid(path))
        with open(path, 'w') as f:
            f.write('[client]\nkeyring = /k\n')
        self.assertIsNone(rbd.conf_fsid(path))
        e = self.assertRaises(SourceError, rbd.conf_fsid,
                              os.path.join(d, 'missing'))
        self.assertIn('cannot read Ceph configuration', str(e))


class TestBaseReaderChoosesRbd(testtools.TestCase):

    def setUp(self):
        super().setUp()
        d = self.useFixture(fixtures.TempDir()).path
        self.ceph_conf = os.path.join(d, 'ceph.conf')
        with open(self.ceph_conf, 'w') as f:
            f.write('[global]\nfsid = %s\n' % FSID)
        self.meta = {'id': ID, 'status': 'active', 'disk_format': 'raw',
                     'size': 8192,
                     'direct_url': 'rbd://%s/images/%s/snap' % (FSID, ID)}
        self.conf = types.SimpleNamespace(
            vmar_host=types.SimpleNamespace(host_dir='/h'),
            vmar_rbd=types.SimpleNamespace(ceph_conf=self.ceph_conf))
        self.source = gsource.GlanceSource(
            self.conf, glance=types.SimpleNamespace(
                images=types.SimpleNamespace(get=lambda i: dict(self.meta))))

    def export(self):
        return self.source.base_reader(ID, 8192).export

    def test_an_image_in_the_hosts_cluster_is_read_from_rbd(self):
        self.assertEqual(
            (rbd.Location(None, 'images', ID, 'snap'), 8192),
            rbd.parse_fetch_export(self.export()))

    def test_otherwise_through_glance(self):
        glance_export = names.glance_fetch_export(ID, 8192)
        # another cluster's image
        self.meta['direct_url'] = 'rbd://other/images/%s/snap' % ID
        self.assertEqual(glance_export, self.export())
        # no location (show_image_direct_url off), or not in RBD
        for url in (None, 'file:///var/lib/glance/images/' + ID):
            self.meta['direct_url'] = url
            self.assertEqual(glance_export, self.export())
        # the host does not read Ceph
        self.meta['direct_url'] = 'rbd://%s/images/%s/snap' % (FSID, ID)
        self.conf.vmar_rbd.ceph_conf = None
        self.assertEqual(glance_export, self.export())

    def test_a_client_conf_without_fsid_trusts_the_digests(self):
        with open(self.ceph_conf, 'w') as f:
            f.write('[global]\nmon host = 127.0.0.1\n')
        self.meta['direct_url'] = 'rbd://other/images/%s/snap' % ID
        self.assertTrue(rbd.is_fetch_export(self.export()))


class FakeCeph:
    """Stand-ins for Debian's ``rados`` and ``rbd`` modules.

    A test double of Ceph's Python bindings (a cluster runs in
    tests/functional/test_ceph.py): clusters, pool contexts and images
    that record being closed; ``fail`` makes the next reads raise.
    """

    def __init__(self):
        self.clusters = []
        self.fail = 0
        self.error = OSError(110, 'RBD operation timeout')
        self.refuse = False
        test = self

        class Handle:
            closed = False

            def close(self):
                self.closed = True

        class Image(Handle):
            def __init__(self, ioctx, name, snapshot, read_only):
                assert read_only
                self.cluster = ioctx.cluster

            def read(self, offset, length):
                if test.fail:
                    test.fail -= 1
                    raise test.error
                return bytes([self.cluster.n]) * length

        class Ioctx(Handle):
            def __init__(self, cluster):
                self.cluster = cluster

        class Rados:
            def __init__(self, conffile, rados_id, conf):
                self.conf, self.down, self.n = conf, False, len(test.clusters)
                test.clusters.append(self)

            def connect(self, timeout):
                if test.refuse:
                    raise OSError(110, 'error connecting to the cluster')

            def open_ioctx(self, pool):
                return Ioctx(self)

            def shutdown(self):
                self.down = True

        self.rados = types.SimpleNamespace(Rados=Rados)
        self.rbd = types.SimpleNamespace(Image=Image)


class TestReader(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.ceph = FakeCeph()
        patch = mock.patch.dict(sys.modules, rados=self.ceph.rados,
                                rbd=self.ceph.rbd)
        patch.start()
        self.addCleanup(patch.stop)
        self.reader = rbd.Reader(types.SimpleNamespace(
            vmar_rbd=types.SimpleNamespace(
                ceph_conf='/etc/ceph/ceph.conf', user='vmar',
                connect_timeout=10, op_timeout=30)))
        self.loc = rbd.Location(None, 'images', ID, 'snap')

    def test_one_connection_with_the_timeouts(self):
        for _i in range(3):
            self.assertEqual(b'\0' * 8, self.reader.read(self.loc, 0, 8))
        self.assertEqual(1, len(self.ceph.clusters))
        self.assertEqual({'client_mount_timeout': '10',
                          'rados_osd_op_timeout': '30',
                          'rados_mon_op_timeout': '30'},
                         self.ceph.clusters[0].conf)

    def test_a_failed_read_retires_the_connection(self):
        self.reader.read(self.loc, 0, 8)
        old = self.ceph.clusters[0]
        self.ceph.fail = 1
        e = self.assertRaises(SourceError, self.reader.read, self.loc, 0, 8)
        self.assertIn('RBD images/%s@snap, bytes 0-7' % ID, str(e))
        self.assertTrue(old.down)
        # the next read connects afresh
        self.assertEqual(b'\1' * 8, self.reader.read(self.loc, 0, 8))
        self.assertEqual(2, len(self.ceph.clusters))
        self.assertFalse(self.ceph.clusters[1].down)

    def test_a_retired_connection_waits_for_its_reads(self):
        conn = self.reader._acquire()       # a read in flight
        self.ceph.fail = 1
        self.assertRaises(SourceError, self.reader.read, self.loc, 0, 8)
        self.assertFalse(conn.cluster.down)
        self.reader._release(conn, failed=False)
        self.assertTrue(conn.cluster.down)

    def test_an_error_of_one_image_keeps_the_connection(self):
        self.reader.read(self.loc, 0, 8)
        self.ceph.fail, self.ceph.error = 1, OSError(2, 'image not found')
        self.assertRaises(SourceError, self.reader.read, self.loc, 0, 8)
        self.assertEqual(b'\0' * 8, self.reader.read(self.loc, 0, 8))
        self.assertEqual(1, len(self.ceph.clusters))

    def test_a_failed_connect_is_not_tried_again_at_once(self):
        clock = [100.0]
        self.useFixture(fixtures.MockPatch('time.monotonic',
                                           lambda: clock[0]))
        self.ceph.refuse = True
        e = self.assertRaises(SourceError, self.reader.read, self.loc, 0, 8)
        self.assertIn('cannot connect to Ceph', str(e))
        tried = len(self.ceph.clusters)
        self.assertRaises(SourceError, self.reader.read, self.loc, 0, 8)
        self.assertEqual(tried, len(self.ceph.clusters))
        self.ceph.refuse = False
        clock[0] += rbd.Reader.CONNECT_BACKOFF
        self.assertEqual(b'\1' * 8, self.reader.read(self.loc, 0, 8))
