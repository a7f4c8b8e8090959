"""Typed map sources: reader descriptions, their records, their nodes."""

import testtools

from vmar_openstack import exception
from vmar_openstack.host.exports import graph
from vmar_openstack.mapsource import base
from vmar_openstack.mapsource import local
from vmar_openstack.mapsource import readers

SOCK = '/var/lib/vmar/host/glance-fetch.sock'
ID = '11111111-2222-3333-4444-555555555555'
RANGE = readers.RangeExport(SOCK, ID + '/8192')


class TestRecords(testtools.TestCase):

    def test_round_trip_of_every_kind(self):
        for r in (readers.File('/srv/lib/bases/' + ID), RANGE,
                  readers.Qcow2(RANGE)):
            self.assertEqual(r, readers.from_record(readers.to_record(r)))
        self.assertEqual({'kind': 'qcow2', 'file': {
            'kind': 'range-export', 'socket': SOCK, 'export': ID + '/8192'}},
            readers.to_record(readers.Qcow2(RANGE)))

    def test_readers_of_earlier_releases_are_read(self):
        # what mirrors/<id>.reader held: the fetch node's QEMU options
        nbd = {'driver': 'nbd', 'read-only': True, 'export': ID + '/8192',
               'server': {'type': 'unix', 'path': SOCK}}
        self.assertEqual(RANGE, readers.from_record(nbd))
        self.assertEqual(readers.Qcow2(RANGE), readers.from_record(
            {'driver': 'qcow2', 'read-only': True, 'backing': None,
             'file': nbd}))
        self.assertEqual(readers.File('/x'), readers.from_record(
            {'driver': 'file', 'filename': '/x', 'read-only': True}))

    def test_anything_else_is_refused(self):
        for bad in ({'kind': 'http', 'url': 'x'}, {'kind': 'file'},
                    {'kind': 'file', 'path': ''},
                    {'kind': 'file', 'path': 7},
                    {'kind': 'qcow2', 'file': {'kind': 'qcow2',
                                               'file': {'kind': 'file',
                                                        'path': '/x'}}},
                    {'driver': 'vvfat', 'dir': '/'}, {}, []):
            self.assertRaises(exception.ExportError, readers.from_record,
                              bad)


class TestNodes(testtools.TestCase):
    """host/exports/graph.py alone turns a description into QEMU options."""

    def test_options_of_each_kind(self):
        nbd = {'driver': 'nbd', 'read-only': True, 'export': ID + '/8192',
               'server': {'type': 'unix', 'path': SOCK}}
        self.assertEqual(nbd, graph.reader_options(RANGE))
        self.assertEqual({'driver': 'qcow2', 'read-only': True,
                          'backing': None, 'file': nbd},
                         graph.reader_options(readers.Qcow2(RANGE)))
        self.assertEqual({'driver': 'file', 'filename': '/x',
                          'read-only': True},
                         graph.reader_options(readers.File('/x')))
        # the options of an earlier release's reader come out the same
        self.assertEqual(nbd, graph.reader_options(readers.from_record(nbd)))

    def test_not_a_description(self):
        self.assertRaises(exception.ExportError, graph.reader_options,
                          {'driver': 'file', 'filename': '/x'})


class TestCapabilities(testtools.TestCase):

    def test_a_source_says_what_it_can(self):
        src = local.LocalDirSource('/srv/lib')
        self.assertIsInstance(src, base.MapSource)
        self.assertEqual((True, True, False), (src.can_mirror,
                                               src.has_bootsets,
                                               src.needs_range_server))

    def test_what_a_source_cannot_is_a_clear_error(self):
        class Bare(base.MapSource):
            def current_version(self, image_id):
                return 1

            def fetch_map(self, image_id, version, dest):
                pass

            def fetch_base(self, image_id, dest):
                pass
        src = Bare()
        self.assertFalse(src.can_mirror or src.has_bootsets
                         or src.needs_range_server)
        for call in (lambda: src.base_reader(ID, 8192),
                     lambda: src.fetch_digests(ID, '/x'),
                     lambda: src.fetch_bootset(ID, '/x'),
                     src.range_server_command):
            e = self.assertRaises(exception.SourceError, call)
            self.assertIn('Bare map source cannot', str(e))

    def test_the_three_operations_are_required(self):
        class Half(base.MapSource):
            def current_version(self, image_id):
                return 1
        self.assertRaises(TypeError, Half)


class _Schema:
    """A monitor answering query-qmp-schema with the enums given."""

    def __init__(self, *enums):
        self.enums = enums

    def execute(self, cmd, args=None):
        assert cmd == 'query-qmp-schema', cmd
        return [{'name': str(i), 'meta-type': 'enum',
                 'members': [{'name': v} for v in values]}
                for i, values in enumerate(self.enums)] + [
            {'name': 'x', 'meta-type': 'object', 'members': []}]


class TestDaemonDrivers(testtools.TestCase):

    def test_a_patched_daemon_lacks_nothing(self):
        mon = _Schema(['on', 'off'], ['file', 'qcow2', 'raw', 'vmar',
                                      'vmar-mirror'])
        self.assertEqual([], graph.missing_drivers(mon))

    def test_a_stock_daemon_lacks_both(self):
        mon = _Schema(['file', 'qcow2', 'raw', 'vvfat'])
        self.assertEqual(['vmar', 'vmar-mirror'], graph.missing_drivers(mon))

    def test_older_schemas_list_values(self):
        mon = _Schema()
        mon.execute = lambda cmd, args=None: [
            {'name': '1', 'meta-type': 'enum',
             'values': ['qcow2', 'raw', 'vmar']}]
        self.assertEqual(['vmar-mirror'], graph.missing_drivers(mon))
