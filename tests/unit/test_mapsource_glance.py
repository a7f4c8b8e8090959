"""A host waits for the map of an image that is active but has none yet.

Glance is replaced by an in-memory fake; tests/functional/test_glance.py
and the cloud's user path run the same code against a real glance-api.
"""

import os
import subprocess
import types

import fixtures
from glanceclient import exc as glance_exc
import testtools

from vmar_openstack.exception import SourceError
from vmar_openstack.mapsource import glance as gsource
from vmar_openstack.mapsource import readers
from vmar_openstack import names

ID = '0e000000-0000-4000-8000-00000000000e'


class Images(object):
    """images.get and images.list: a map after ``publish_after`` lists."""

    def __init__(self, status='active', publish_after=None):
        self.status = status
        self.publish_after = publish_after
        self.lists = 0

    def get(self, image_id):
        if self.status is None:
            raise glance_exc.HTTPNotFound()
        return {'id': image_id, 'status': self.status}

    def list(self, filters):
        self.lists += 1
        if self.publish_after is None or self.lists <= self.publish_after:
            return []
        return [{names.PROP_OF: filters[names.PROP_OF],
                 names.PROP_VERSION: '2', 'owner': 'agent'}]


class TestCurrentVersion(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.clock = [0.0]
        self.useFixture(fixtures.MockPatch(
            'time.monotonic', lambda: self.clock[0]))
        self.useFixture(fixtures.MockPatch(
            'time.sleep', lambda s: self.clock.__setitem__(
                0, self.clock[0] + s)))

    def source(self, images, wait=300):
        conf = types.SimpleNamespace(vmar_glance=types.SimpleNamespace(
            map_owner='agent', map_wait=wait))
        return gsource.GlanceSource(
            conf, glance=types.SimpleNamespace(images=images))

    def test_waits_for_the_agent_to_publish(self):
        images = Images(publish_after=3)
        self.assertEqual(2, self.source(images).current_version(ID))
        self.assertEqual(4, images.lists)
        self.assertLess(self.clock[0], 300)

    def test_gives_up_after_map_wait(self):
        images = Images()
        e = self.assertRaises(SourceError,
                              self.source(images, 30).current_version, ID)
        self.assertIn('no published VMAR map', str(e))
        self.assertLessEqual(self.clock[0], 30)
        self.assertGreater(images.lists, 2)

    def test_no_wait_for_an_image_that_is_not_active(self):
        for status in ('queued', 'deleted', None):
            images = Images(status=status)
            self.assertRaises(SourceError, self.source(images).current_version,
                              ID)
            self.assertEqual(1, images.lists)
            self.assertEqual(0, self.clock[0])


class TestBaseReader(testtools.TestCase):
    """Which QEMU node a lazy mirror fetches a Glance image through."""

    def setUp(self):
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.meta = {'id': ID, 'status': 'active', 'disk_format': 'raw',
                     'size': 8192}
        self.head = b''
        self.reads = []

        def read(image_id, offset, length):
            self.reads.append((image_id, offset, length))
            return self.head[offset:offset + length]
        conf = types.SimpleNamespace(
            vmar_host=types.SimpleNamespace(host_dir='/h'),
            vmar_rbd=types.SimpleNamespace(ceph_conf=None))
        self.source = gsource.GlanceSource(conf, glance=types.SimpleNamespace(
            images=types.SimpleNamespace(get=lambda i: dict(self.meta))))
        self.source._ranges = types.SimpleNamespace(read=read)

    def test_raw_is_the_range_servers_export(self):
        node = self.source.base_reader(ID, 8192)
        self.assertEqual(readers.RangeExport('/h/glance-fetch.sock',
                                             ID + '/8192'), node)
        self.assertEqual((ID, 8192),
                         names.parse_glance_fetch_export(node.export))
        self.assertEqual([], self.reads)

    def test_qcow2_header_is_inspected_then_read_by_qemus_driver(self):
        path = os.path.join(self.tmp, 'x.qcow2')
        subprocess.run(['qemu-img', 'create', '-f', 'qcow2', path, '1M'],
                       check=True, capture_output=True)
        with open(path, 'rb') as f:
            self.head = f.read()
        self.meta.update(disk_format='qcow2', size=len(self.head))
        node = self.source.base_reader(ID, 1 << 20)
        self.assertIsInstance(node, readers.Qcow2)
        self.assertEqual(ID + '/%d' % len(self.head), node.file.export)
        self.assertEqual([(ID, 0, 512)], self.reads)
        # a map of another size is another image
        e = self.assertRaises(SourceError, self.source.base_reader, ID, 4096)
        self.assertIn('map says 4096', str(e))

    def test_hostile_qcow2_is_refused(self):
        path = os.path.join(self.tmp, 'x.qcow2')
        subprocess.run(['qemu-img', 'create', '-f', 'qcow2', '-b',
                        '/etc/passwd', '-F', 'raw', path], check=True,
                       capture_output=True)
        with open(path, 'rb') as f:
            self.head = f.read()
        self.meta.update(disk_format='qcow2', size=len(self.head))
        e = self.assertRaises(SourceError, self.source.base_reader, ID,
                              1 << 20)
        self.assertIn('backing', str(e))

    def test_other_formats_and_states_are_refused(self):
        for change in ({'disk_format': 'vmdk'}, {'status': 'queued'}):
            self.meta.update(change)
            self.assertRaises(SourceError, self.source.base_reader, ID, 8192)
            self.meta.update(disk_format='raw', status='active')

    def test_export_names_are_checked(self):
        for bad in (ID, ID + '/x', 'nope/12', ''):
            self.assertRaises(ValueError, names.parse_glance_fetch_export, bad)
