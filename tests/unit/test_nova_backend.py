"""The vmar image backend against the real Nova 34 classes."""

import json
import os
from unittest import mock
import uuid

import fixtures
from lxml import etree
from nova.api.validation.extra_specs import validators
from nova.compute import api as compute_api
from nova.compute import utils as compute_utils
from nova import exception
from nova.image import glance
from nova import objects
from nova.virt.libvirt import config as vconfig
from nova.virt.libvirt import driver as libvirt_driver
from nova.virt.libvirt import imagebackend
from oslo_concurrency import processutils
from oslo_config import cfg
from oslo_config import fixture as config_fixture
import testtools

from vmar_openstack import conf as vmar_conf
from vmar_openstack.db import hosts as db_hosts
from vmar_openstack.db import migration
from vmar_openstack import exception as vmar_exception
from vmar_openstack import hostapi
from vmar_openstack import names
from vmar_openstack.nova_imagebackend import image as vimage
from vmar_openstack.nova_imagebackend import snapshot
from vmar_openstack import nova_wrappers

objects.register_all()

SOCK = '/run/vmar/nbd.sock'
KEY = '0123456789abcdef' * 2


def instance(specs=None, image_ref=None, sysmeta=None):
    flavor = objects.Flavor(name='m1.vmar', root_gb=1, extra_specs=specs or {})
    return objects.Instance(uuid=str(uuid.uuid4()), flavor=flavor,
                            image_ref=image_ref or str(uuid.uuid4()),
                            system_metadata=sysmeta or {})


def added(image_id, version, uri=None, virtual_size=1 << 20):
    """The host API's reply to ``add``, as far as the backend reads it."""
    return {'image_id': image_id, 'map_version': version,
            'host_cache': 'base', 'holders': [], 'targets': [],
            'uri': uri or names.nbd_uri(names.export(image_id, version, KEY),
                                        SOCK),
            'virtual_size': virtual_size}


def client():
    """A host API client that answers only what a test tells it."""
    exports = mock.Mock(spec=hostapi.Client)
    exports.nbd_socket.return_value = SOCK
    return exports


VMAR = {'vmar:enabled': 'true'}
MAPPING = {'bus': 'virtio', 'dev': 'vda', 'type': 'disk'}


class BackendTestCase(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.cfg = self.useFixture(config_fixture.Config(cfg.CONF))
        self.cfg.config(instances_path=self.tmp)
        # the daemon's NBD socket, as its hello would name it
        self.useFixture(fixtures.MockPatchObject(
            hostapi.Client, 'nbd_socket', return_value=SOCK))
        nova_wrappers.install(nova_wrappers.COMPUTE)
        self.addCleanup(nova_wrappers.uninstall)
        self.backend = imagebackend.Backend(use_cow=True)


class TestBackendChoice(BackendTestCase):

    def test_vmar_flavor_root_disk_gets_the_vmar_image(self):
        disk = self.backend.by_name(instance(VMAR), 'disk',
                                    disk_info_mapping=MAPPING)
        self.assertIsInstance(disk, vimage.VmarImage)
        self.assertIsInstance(disk, imagebackend.Image)
        self.assertTrue(disk.path.endswith('/disk'))
        self.assertEqual('qcow2', disk.driver_format)

    def test_the_configured_type_is_overridden_for_vmar_only(self):
        inst = instance(VMAR)
        self.assertIsInstance(
            self.backend.by_name(inst, 'disk', image_type='flat'),
            vimage.VmarImage)
        self.assertIsInstance(
            self.backend.by_name(instance(), 'disk', image_type='flat'),
            imagebackend.Flat)
        self.assertIsInstance(self.backend.by_name(instance(), 'disk'),
                              imagebackend.Qcow2)

    def test_other_disks_of_a_vmar_instance_keep_the_backend(self):
        inst = instance(VMAR)
        for name in ('disk.eph0', 'disk.swap', 'disk.config',
                     'disk.rescue'):
            self.assertNotIsInstance(self.backend.by_name(inst, name),
                                     vimage.VmarImage, name)

    def test_by_libvirt_path_and_full_paths(self):
        inst = instance(VMAR)
        path = os.path.join(self.tmp, inst.uuid, 'disk')
        self.assertIsInstance(self.backend.by_libvirt_path(inst, path),
                              vimage.VmarImage)
        # _create_images_and_backing (hard reboot) passes a full path
        self.assertEqual(path, self.backend.by_name(inst, path).path)

    def test_enabled_false_is_an_ordinary_instance(self):
        inst = instance({'vmar:enabled': 'false'})
        self.assertNotIsInstance(self.backend.by_name(inst, 'disk'),
                                 vimage.VmarImage)

    def test_unregister_restores_stock_nova(self):
        nova_wrappers.uninstall()
        self.assertNotIsInstance(self.backend.by_name(instance(VMAR), 'disk'),
                                 vimage.VmarImage)


class TestDiskConfig(BackendTestCase):

    def xml(self, conf):
        return etree.fromstring(conf.to_xml())

    def test_disk_config_as_nova_writes_it(self):
        inst = instance(VMAR)
        disk = self.backend.by_name(inst, 'disk', disk_info_mapping=MAPPING)
        conf = disk.libvirt_info('writeback', {}, boot_order='1')
        self.assertIsInstance(conf, vconfig.LibvirtConfigGuestDisk)
        x = self.xml(conf)
        self.assertEqual('file', x.get('type'))
        drv = x.find('driver')
        self.assertEqual({'name': 'qemu', 'type': 'qcow2', 'cache': 'none',
                          'error_policy': 'stop', 'rerror_policy': 'stop'},
                         dict(drv.attrib))
        self.assertEqual(disk.path, x.find('source').get('file'))
        self.assertEqual('vda', x.find('target').get('dev'))
        self.assertEqual('1', x.find('boot').get('order'))

    def test_disk_cachemodes_cannot_give_a_vmar_disk_a_host_cache(self):
        # the driver applies [libvirt]disk_cachemodes after the backend
        drv = libvirt_driver.LibvirtDriver.__new__(
            libvirt_driver.LibvirtDriver)
        drv.disk_cachemodes = {'file': 'writeback'}
        disk = self.backend.by_name(instance(VMAR), 'disk',
                                    disk_info_mapping=MAPPING)
        conf = disk.libvirt_info('none', {})
        drv._set_cache_mode(conf)
        self.assertEqual('none', self.xml(conf).find('driver').get('cache'))
        # an ordinary disk does get the operator's mode
        plain = self.backend.by_name(instance(), 'disk',
                                     disk_info_mapping=MAPPING)
        conf = plain.libvirt_info('none', {})
        drv._set_cache_mode(conf)
        self.assertEqual('writeback',
                         self.xml(conf).find('driver').get('cache'))

    def test_quota_extra_specs_still_apply(self):
        disk = self.backend.by_name(instance(VMAR), 'disk',
                                    disk_info_mapping=MAPPING)
        conf = disk.libvirt_info(
            'none', {'quota:disk_read_iops_sec': '100'})
        self.assertEqual('100', self.xml(conf).find(
            'iotune/read_iops_sec').text)


class TestBacking(testtools.TestCase):

    def test_parse_backing(self):
        i = str(uuid.uuid4())
        self.assertEqual((i, 7, None), vimage.parse_backing(
            'nbd+unix:///%s.7?socket=%s' % (i, SOCK), SOCK))
        key = 'ab' * 16
        self.assertEqual((i, 7, key), vimage.parse_backing(
            'nbd+unix:///%s.7.%s?socket=%s' % (i, key, SOCK), SOCK))
        for bad in (None, '', '/var/lib/nova/instances/_base/abc',
                    'nbd+unix:///%s.7?socket=/other.sock' % i,
                    'nbd+unix:///%s?socket=%s' % (i, SOCK),
                    'nbd://host/%s.7' % i,
                    'nbd+unix:///%s.7x?socket=%s' % (i, SOCK),
                    'nbd+unix:///%s.7.%s?socket=%s' % (i, 'AB' * 16, SOCK),
                    'nbd+unix:///%s.7.%s?socket=%s' % (i, 'ab' * 15, SOCK)):
            self.assertIsNone(vimage.parse_backing(bad, SOCK), bad)


class TestExtraSpecs(testtools.TestCase):

    def test_valid(self):
        for k, v in (('vmar:enabled', 'true'), ('vmar:enabled', 'False'),
                     ('vmar:host_cache', 'base'),
                     ('vmar:host_cache', 'none'),
                     ('vmar:guest_cache', 'private'),
                     ('vmar:guest_cache', 'auto'),
                     ('vmar:guest_cache', 'default')):
            validators.validate(k, v)

    def test_invalid(self):
        for k, v in (('vmar:enabled', 'maybe'),
                     ('vmar:host_cache', 'writeback'),
                     ('vmar:guest_cache', 'none'),
                     ('vmar:cache', 'base'), ('vmar:', 'x')):
            self.assertRaises(exception.ValidationError,
                              validators.validate, k, v)

    def test_other_namespaces_untouched(self):
        validators.validate('hw:cpu_policy', 'dedicated')


class TestGuestCache(BackendTestCase):
    """The domain of a guest-private server: balloon and metadata."""

    NS = {'vmar': 'https://opendev.org/x/vmar-openstack/guest/1.0'}
    CHANNELS = '/run/vmar/guests'

    def setUp(self):
        super().setUp()
        # the export daemon's hello (a test double of the host API: the
        # unit tests of its client are tests/unit/test_hostapi.py)
        self.host = mock.Mock()
        self.host.guest_channel_dir.return_value = self.CHANNELS
        self.useFixture(fixtures.MockPatchObject(vimage, 'host',
                                                 return_value=self.host))

    def guest_config(self, specs, inst=None):
        """The domain XML of the hooks' D._get_guest_config.

        It wraps a stand-in for Nova's own (a test double of Nova, which
        needs a running libvirt) that returns what Nova builds with
        [libvirt] mem_stats_period_seconds = 0: a model='none' balloon.
        """
        def nova_config(driver, inst, *args, **kwargs):
            guest = vconfig.LibvirtConfigGuest()
            guest.virt_type, guest.os_type = 'qemu', 'hvm'
            guest.name, guest.uuid = 'instance-1', inst.uuid
            guest.memory, guest.vcpus = 512 * 1024, 1
            libvirt_driver.LibvirtDriver._guest_add_memory_balloon(guest)
            guest.sysinfo = vconfig.LibvirtConfigGuestSysinfo()
            guest.sysinfo.system_serial = inst.uuid
            guest.os_smbios = vconfig.LibvirtConfigGuestSMBIOS()
            return guest
        nova_wrappers.uninstall()
        self.cfg.config(mem_stats_period_seconds=0, virt_type='qemu',
                        group='libvirt')
        with mock.patch.object(libvirt_driver.LibvirtDriver,
                               '_get_guest_config', nova_config):
            nova_wrappers.install(nova_wrappers.COMPUTE)
            try:
                guest = libvirt_driver.LibvirtDriver._get_guest_config(
                    mock.sentinel.driver, inst or instance(specs), None, None,
                    None)
            finally:
                nova_wrappers.uninstall()      # before the stand-in goes
        nova_wrappers.install(nova_wrappers.COMPUTE)
        return etree.fromstring(guest.to_xml())

    def test_private_gets_a_reporting_virtio_balloon_and_says_so(self):
        inst = instance(dict(VMAR, **{'vmar:guest_cache': 'private'}),
                        sysmeta={'image_vmar_guest': '1'})
        xml = self.guest_config(None, inst)
        (balloon,) = xml.findall('./devices/memballoon')
        self.assertEqual(('virtio', 'on'), (balloon.get('model'),
                                            balloon.get('freePageReporting')))
        self.assertEqual(['vmar:guest_cache=private'], [
            e.text for e in xml.findall('./sysinfo/oemStrings/entry')])
        self.assertEqual('sysinfo', xml.find('./os/smbios').get('mode'))
        path = '%s/%s.private.sock' % (self.CHANNELS, inst.uuid)
        meta = xml.find('./metadata/vmar:guest', self.NS)
        self.assertEqual(
            {'host-cache': 'base', 'guest-cache': 'private',
             'free-page-reporting': 'on', 'guest-component': 'image',
             'channel': path},
            {e.tag.split('}')[1]: e.text for e in meta})
        (channel,) = xml.findall('./devices/channel')
        self.assertEqual('unix', channel.get('type'))
        self.assertEqual({'mode': 'bind', 'path': path},
                         dict(channel.find('source').attrib))
        self.assertEqual({'type': 'virtio',
                          'name': 'org.opendev.vmar.guest.0'},
                         dict(channel.find('target').attrib))

    def test_auto_is_private_on_the_host_side_and_says_auto(self):
        inst = instance(dict(VMAR, **{'vmar:guest_cache': 'auto'}),
                        sysmeta={'image_vmar_guest': '1'})
        xml = self.guest_config(None, inst)
        (balloon,) = xml.findall('./devices/memballoon')
        self.assertEqual(('virtio', 'on'), (balloon.get('model'),
                                            balloon.get('freePageReporting')))
        self.assertEqual(['vmar:guest_cache=auto'], [
            e.text for e in xml.findall('./sysinfo/oemStrings/entry')])
        (channel,) = xml.findall('./devices/channel')
        self.assertEqual('%s/%s.auto.sock' % (self.CHANNELS, inst.uuid),
                         channel.find('source').get('path'))

    def test_the_reporting_order_goes_to_the_guest(self):
        self.cfg.config(guest_reporting_order=3, group='vmar_compute')
        inst = instance(dict(VMAR, **{'vmar:guest_cache': 'auto'}))
        xml = self.guest_config(None, inst)
        self.assertEqual(
            ['vmar:guest_cache=auto', 'vmar:guest_reporting_order=3'],
            [e.text for e in xml.findall('./sysinfo/oemStrings/entry')])

    def test_a_daemon_without_channels_leaves_auto_without_one(self):
        logs = self.useFixture(fixtures.FakeLogger())
        self.host.guest_channel_dir.return_value = None
        inst = instance(dict(VMAR, **{'vmar:guest_cache': 'auto'}))
        xml = self.guest_config(None, inst)
        self.assertEqual([], xml.findall('./devices/channel'))
        self.assertIn('stays in its own caching', logs.output)

    def test_a_dead_daemon_does_not_fail_the_domain(self):
        logs = self.useFixture(fixtures.FakeLogger())
        self.host.guest_channel_dir.side_effect = \
            vmar_exception.ExportDaemonDown(reason='not running')
        inst = instance(dict(VMAR, **{'vmar:guest_cache': 'private'}))
        xml = self.guest_config(None, inst)
        self.assertEqual([], xml.findall('./devices/channel'))
        self.assertEqual(['vmar:guest_cache=private'], [
            e.text for e in xml.findall('./sysinfo/oemStrings/entry')])
        self.assertIn('does not answer', logs.output)

    def test_private_keeps_novas_sysinfo(self):
        inst = instance(dict(VMAR, **{'vmar:guest_cache': 'private'}))
        xml = self.guest_config(None, inst)
        (serial,) = xml.findall('./sysinfo/system/entry[@name="serial"]')
        self.assertEqual(inst.uuid, serial.text)

    def test_private_without_the_component_is_logged(self):
        logs = self.useFixture(fixtures.FakeLogger())
        inst = instance(dict(VMAR, **{'vmar:guest_cache': 'private'}))
        xml = self.guest_config(None, inst)
        meta = xml.find('./metadata/vmar:guest', self.NS)
        self.assertEqual('unknown', meta.find('vmar:guest-component',
                                              self.NS).text)
        self.assertIn('does not carry vmar-guest', logs.output)
        self.assertIn(inst.uuid, logs.output)

    def test_default_keeps_novas_balloon(self):
        xml = self.guest_config(VMAR)
        (balloon,) = xml.findall('./devices/memballoon')
        self.assertEqual('none', balloon.get('model'))
        self.assertIsNone(xml.find('./sysinfo/oemStrings'))
        self.assertEqual([], xml.findall('./devices/channel'))
        self.host.guest_channel_dir.assert_not_called()
        meta = xml.find('./metadata/vmar:guest', self.NS)
        self.assertEqual('default', meta.find('vmar:guest-cache',
                                              self.NS).text)

    def test_ordinary_instances_get_nothing(self):
        xml = self.guest_config({})
        self.assertIsNone(xml.find('./metadata'))

    def test_an_unknown_mode_in_an_old_flavor_is_refused(self):
        self.assertRaises(exception.InvalidInput, vimage.flavor_policy,
                          instance(dict(VMAR, **{'vmar:guest_cache':
                                                 'all'})).flavor)


def _patched_original(cls, name, orig):
    """Register the hooks over ``orig`` standing for Nova's ``name``."""
    nova_wrappers.uninstall()
    patcher = mock.patch.object(cls, name, orig)
    patcher.start()
    nova_wrappers.install(nova_wrappers.COMPUTE)
    return patcher


class TestMoves(BackendTestCase):
    """Resize, cold and live migration of a vmar server (doc: multinode)."""

    def setUp(self):
        super().setUp()
        self.drv = mock.MagicMock(spec=libvirt_driver.LibvirtDriver)
        self.D = libvirt_driver.LibvirtDriver
        self.exports = client()
        self.bfv = self.useFixture(fixtures.MockPatchObject(
            compute_utils, 'is_volume_backed_instance',
            return_value=False)).mock

    def original(self, name, **kwargs):
        orig = mock.Mock(**kwargs)
        patcher = _patched_original(self.D, name, orig)
        # last in, first out: the hooks go (putting the mock back on the
        # class), then the patch (putting Nova's method back)
        self.addCleanup(patcher.stop)
        self.addCleanup(nova_wrappers.uninstall)
        return orig

    def overlay(self, inst, size=1 << 20):
        """A vmar overlay as the source has it (no export behind it)."""
        uri = names.nbd_uri(names.export(inst.image_ref, 3, KEY), SOCK)
        path = os.path.join(self.tmp, inst.uuid, 'disk')
        os.makedirs(os.path.dirname(path), exist_ok=True)
        processutils.execute(
            'qemu-img', 'create', '-q', '-u', '-f', 'qcow2', '-o',
            'backing_file=%s,backing_fmt=raw' % uri.replace(',', ',,'),
            path, str(size))
        return path, uri

    def test_a_resize_that_switches_the_backend_is_refused(self):
        for old, new in ((VMAR, {}), ({}, VMAR)):
            flavor = objects.Flavor(name='other', root_gb=1, extra_specs=new)
            e = self.assertRaises(
                exception.InstanceFaultRollback,
                self.D.migrate_disk_and_power_off, self.drv, None,
                instance(old), 'dest', flavor, [])
            self.assertIsInstance(e.inner_exception, exception.ResizeError)
            self.assertIn('vmar:enabled', str(e.inner_exception))
            self.assertEqual([], self.drv.mock_calls)

    def test_a_volume_backed_server_may_switch(self):
        # its root disk is the volume: the flavor's backend is not used
        orig = self.original('migrate_disk_and_power_off',
                             return_value='disk info')
        self.bfv.return_value = True
        flavor = objects.Flavor(name='plain', root_gb=1, extra_specs={})
        self.assertEqual('disk info', self.D.migrate_disk_and_power_off(
            self.drv, None, instance(VMAR), 'dest', flavor, []))
        orig.assert_called_once()

    def test_a_resize_between_vmar_flavors_is_novas(self):
        orig = self.original('migrate_disk_and_power_off',
                             return_value='disk info')
        inst = instance(VMAR)
        flavor = objects.Flavor(name='big', root_gb=2, extra_specs=VMAR)
        self.assertEqual('disk info', self.D.migrate_disk_and_power_off(
            self.drv, None, inst, 'dest', flavor, []))
        orig.assert_called_once_with(self.drv, None, inst, 'dest', flavor,
                                     [])

    def test_confirming_a_move_releases_the_source(self):
        self.original('confirm_migration')
        inst = instance(VMAR)
        with mock.patch.object(vimage, 'release') as release:
            self.D.confirm_migration(self.drv, None, objects.Migration(
                source_compute='a', dest_compute='b'), inst, [])
            release.assert_called_once_with(inst.uuid)
            release.reset_mock()
            # a resize on the same host: the overlay there is the new one
            self.D.confirm_migration(self.drv, None, objects.Migration(
                source_compute='a', dest_compute='a'), inst, [])
            self.D.confirm_migration(self.drv, None, objects.Migration(
                source_compute='a', dest_compute='b'), instance(), [])
            release.assert_not_called()

    def test_the_disk_info_carries_the_whole_backing(self):
        inst = instance(VMAR)
        path, uri = self.overlay(inst)
        other = os.path.join(self.tmp, 'other.qcow2')
        self.original('get_instance_disk_info', return_value=json.dumps([
            {'path': path, 'backing_file': os.path.basename(SOCK),
             'type': 'qcow2'},
            {'path': other, 'backing_file': 'abc_1', 'type': 'qcow2'}]))
        disks = json.loads(self.D.get_instance_disk_info(self.drv, inst))
        self.assertEqual(uri, disks[0]['vmar_backing'])
        self.assertNotIn('vmar_backing', disks[1])
        # the resource periodic's private method is Nova's own
        self.assertNotIn(
            (self.D, '_get_instance_disk_info_from_config'),
            nova_wrappers._ORIGINALS)

    def test_the_destination_adopts_the_export_and_overlay(self):
        orig = self.original('_create_images_and_backing')
        src = instance(VMAR)
        path, uri = self.overlay(src, size=3 << 20)
        expected = vimage._qemu_img_info(path)
        inst_dir = os.path.join(self.tmp, 'dest', src.uuid)
        swap = {'path': os.path.join(inst_dir, 'disk.swap'),
                'backing_file': 'swap_1'}
        self.exports.add.return_value = added(src.image_ref, 3, uri)
        # the export is not there in a unit test: qemu-img must not open it
        real = vimage.create_overlay

        def create_overlay(path, uri, size):
            self.assertTrue(self.exports.add.called)
            with mock.patch.object(processutils, 'execute',
                                   lambda *a: real_execute(*(
                                       a[:2] + ('-u',) + a[2:]))):
                real(path, uri, size)
        real_execute = processutils.execute
        with mock.patch.object(vimage, 'host', return_value=self.exports), \
                mock.patch.object(vimage, 'create_overlay', create_overlay):
            self.D._create_images_and_backing(
                self.drv, None, src, inst_dir,
                [{'path': path, 'backing_file': os.path.basename(SOCK),
                  'virt_disk_size': 3 << 20, 'vmar_backing': uri}, swap])
        self.exports.add.assert_called_once_with(
            src.image_ref, host_cache='base', holder=src.uuid, version=3,
            key=KEY, whole=False)
        made = vimage._qemu_img_info(os.path.join(inst_dir, 'disk'))
        for key in ('backing-filename', 'backing-filename-format',
                    'virtual-size'):
            self.assertEqual(expected[key], made[key])
        # the other disks are Nova's
        orig.assert_called_once_with(self.drv, None, src, inst_dir, [swap],
                                     fallback_from_host=None)

    def test_a_destination_with_another_socket_refuses(self):
        self.original('_create_images_and_backing')
        src = instance(VMAR)
        path, uri = self.overlay(src)
        with mock.patch.object(vimage, 'host', return_value=self.exports):
            e = self.assertRaises(
                exception.MigrationPreCheckError,
                self.D._create_images_and_backing, self.drv, None, src,
                os.path.join(self.tmp, 'dest'),
                [{'path': path, 'virt_disk_size': 1 << 20,
                  'vmar_backing': uri.replace(SOCK, '/elsewhere.sock')}])
        self.assertIn('export_socket', str(e))
        self.exports.add.assert_not_called()

    def test_a_rolled_back_live_migration_releases_the_destination(self):
        self.original('rollback_live_migration_at_destination',
                      side_effect=OSError('libvirt'))
        self.cfg.config(host='dest')
        inst = instance(VMAR)
        inst.host = 'source'
        with mock.patch.object(vimage, 'release') as release:
            self.assertRaises(
                OSError, self.D.rollback_live_migration_at_destination,
                self.drv, None, inst, [], None)
        release.assert_called_once_with(inst.uuid)

    def test_a_copied_overlay_grows_with_the_flavor(self):
        inst = instance(VMAR)
        path, uri = self.overlay(inst, size=1 << 20)
        disk = vimage.VmarImage(instance=inst, disk_name='disk',
                                exports=self.exports)
        self.exports.add.return_value = added(inst.image_ref, 3, uri)
        # qemu-img resize opens the export, which a unit test lacks
        with mock.patch.object(vimage.disk_api, 'extend') as extend:
            disk.cache(fetch_func=mock.Mock(), filename='x', size=4 << 20)
            extend.assert_called_once_with(mock.ANY, 4 << 20)
            self.assertEqual(path, extend.call_args.args[0].path)
            extend.reset_mock()
            # the same size (a cold migration, a reboot): nothing to grow
            disk.cache(fetch_func=mock.Mock(), filename='x', size=1 << 20)
            extend.assert_not_called()
        self.assertEqual(uri, vimage._qemu_img_info(path)['backing-filename'])
        self.exports.add.assert_called_with(
            inst.image_ref, host_cache='base', holder=inst.uuid, version=3,
            key=KEY, whole=False)


class TestDelete(BackendTestCase):

    def test_deleting_instance_files_releases_its_exports(self):
        inst = instance(VMAR)
        self.drv = mock.MagicMock(spec=libvirt_driver.LibvirtDriver)
        with mock.patch.object(vimage, 'release') as release, \
                mock.patch.dict(nova_wrappers._ORIGINALS):
            orig = mock.Mock(return_value=True)
            nova_wrappers._ORIGINALS.clear()
            nova_wrappers.uninstall()
            with mock.patch.object(libvirt_driver.LibvirtDriver,
                                   'delete_instance_files', orig):
                nova_wrappers.install(nova_wrappers.COMPUTE)
                self.assertTrue(libvirt_driver.LibvirtDriver
                                .delete_instance_files(self.drv, inst))
                release.assert_called_once_with(inst.uuid)
                orig.return_value = False
                release.reset_mock()
                libvirt_driver.LibvirtDriver.delete_instance_files(
                    self.drv, inst)
                release.assert_not_called()
                nova_wrappers.uninstall()


class TestProvisioningErrors(BackendTestCase):
    """An image without a map (an unshelved snapshot nobody ingested)."""

    def test_no_map_is_refused_before_any_disk_is_made(self):
        exports = client()
        exports.add.side_effect = vmar_exception.ExportError(
            'no map of image X')
        inst = instance(VMAR)
        disk = vimage.VmarImage(instance=inst, disk_name='disk',
                                disk_info_mapping=MAPPING, exports=exports)
        e = self.assertRaises(exception.ImageUnacceptable, disk.cache,
                              fetch_func=mock.Mock(), filename='x',
                              image_id=inst.image_ref, size=None)
        self.assertIn('no map of image X', str(e))
        self.assertFalse(os.path.exists(disk.path))
        exports.add.assert_called_once_with(
            inst.image_ref, host_cache='base', holder=inst.uuid,
            version=None, key=None, whole=False)

    def test_a_failed_overlay_releases_the_export(self):
        exports = client()
        exports.add.return_value = added(str(uuid.uuid4()), 1)
        inst = instance(VMAR)
        disk = vimage.VmarImage(instance=inst, disk_name='disk',
                                disk_info_mapping=MAPPING, exports=exports)
        failed = processutils.ProcessExecutionError('qemu-img: no space')
        with mock.patch.object(processutils, 'execute', side_effect=failed):
            self.assertRaises(processutils.ProcessExecutionError, disk.cache,
                              fetch_func=mock.Mock(), filename='x',
                              image_id=inst.image_ref, size=None)
        exports.release.assert_called_once_with(inst.uuid)
        self.assertFalse(os.path.exists(disk.path))


class TestUnshelve(BackendTestCase):
    """Nova deletes a shelved snapshot once the server has spawned."""

    def provision(self, inst):
        disk = self.backend.by_name(inst, 'disk', disk_info_mapping=MAPPING)
        with mock.patch.object(disk.exports, 'add') as add, \
                mock.patch.object(disk, '_create_overlay'):
            disk.create_image(None, None, None, image_id=inst.image_ref)
        return add.call_args.kwargs

    def test_the_shelved_snapshot_is_copied_whole(self):
        snap = str(uuid.uuid4())
        inst = instance(VMAR, image_ref=snap,
                        sysmeta={'shelved_image_id': snap})
        self.assertTrue(self.provision(inst)['whole'])

    def test_other_images_are_not(self):
        self.assertFalse(self.provision(instance(VMAR))['whole'])
        inst = instance(VMAR, sysmeta={'shelved_image_id':
                                       str(uuid.uuid4())})
        self.assertFalse(self.provision(inst)['whole'])

    def test_an_instance_without_system_metadata_loaded(self):
        inst = objects.Instance(
            uuid=str(uuid.uuid4()), image_ref=str(uuid.uuid4()),
            flavor=objects.Flavor(name='m1.vmar', root_gb=1,
                                  extra_specs=VMAR))
        self.assertFalse(self.provision(inst)['whole'])


class TestApiChecks(testtools.TestCase):
    """nova-api refuses the moves that cannot be done safely, up front."""

    def setUp(self):
        super().setUp()
        from vmar_openstack.nova_api import checks
        self.checks = checks
        nova_wrappers.uninstall()
        self.orig = {}
        for name in ('resize', 'live_migrate', 'evacuate'):
            self.orig[name] = self.useFixture(fixtures.MockPatchObject(
                compute_api.API, name,
                mock.Mock(return_value='accepted'))).mock
        nova_wrappers.install(nova_wrappers.API)
        self.addCleanup(nova_wrappers.uninstall)
        self.flavors = {
            'vmar2': objects.Flavor(name='vmar2', extra_specs=VMAR),
            'plain2': objects.Flavor(name='plain2', extra_specs={})}
        self.useFixture(fixtures.MockPatchObject(
            objects.Flavor, 'get_by_flavor_id',
            side_effect=lambda ctx, fid, read_deleted: self.flavors[fid]))
        self.bfv = self.useFixture(fixtures.MockPatchObject(
            compute_utils, 'is_volume_backed_instance',
            return_value=False)).mock
        self.images = {}
        self.useFixture(fixtures.MockPatchObject(
            glance.API, 'get', side_effect=self._image))

    def _image(self, context, image_id):
        if image_id not in self.images:
            raise exception.ImageNotFound(image_id=image_id)
        return {'id': image_id, 'status': self.images[image_id]}

    def vmar_server(self, status='active'):
        inst = instance(VMAR)
        if status is not None:
            self.images[inst.image_ref] = status
        return inst

    def moves(self, inst):
        """Every move nova-api can be asked for, and its original."""
        api = mock.sentinel.api
        return [
            ('resize', lambda: compute_api.API.resize(api, None, inst,
                                                      'vmar2')),
            ('resize', lambda: compute_api.API.resize(api, None, inst,
                                                      host_name='b')),
            ('live_migrate', lambda: compute_api.API.live_migrate(
                api, None, inst, 'auto', False, 'b', async_=True)),
            ('evacuate', lambda: compute_api.API.evacuate(
                api, None, inst, 'b', False)),
        ]

    def test_switching_the_backend_is_refused_before_nova(self):
        for inst, to in ((self.vmar_server(), 'plain2'),
                         (instance(), 'vmar2')):
            e = self.assertRaises(exception.CannotResizeDisk,
                                  compute_api.API.resize, mock.sentinel.api,
                                  None, inst, to)
            self.assertIn('vmar:enabled', str(e))
        self.orig['resize'].assert_not_called()

    def test_a_volume_backed_server_may_switch(self):
        self.bfv.return_value = True
        self.assertEqual('accepted', compute_api.API.resize(
            mock.sentinel.api, None, instance(VMAR), 'plain2'))

    def test_other_resizes_and_migrations_are_novas(self):
        inst = self.vmar_server()
        for name, call in self.moves(inst):
            self.assertEqual('accepted', call())
        self.assertEqual(2, self.orig['resize'].call_count)
        self.orig['live_migrate'].assert_called_once_with(
            mock.sentinel.api, None, inst, 'auto', False, 'b', async_=True)
        self.orig['evacuate'].assert_called_once_with(
            mock.sentinel.api, None, inst, 'b', False)

    def test_no_move_of_a_server_whose_image_is_gone(self):
        for status, said in ((None, 'deleted'),
                             ('deactivated', 'deactivated')):
            inst = self.vmar_server(status)
            for name, call in self.moves(inst):
                e = self.assertRaises(self.checks.MoveRefused, call)
                self.assertEqual(400, e.code)
                self.assertIn(inst.uuid, str(e))
                self.assertIn('is %s in Glance' % said, str(e))
        for orig in self.orig.values():
            orig.assert_not_called()

    def test_a_deleted_image_moves_once_a_peer_host_holds_it(self):
        """Issue 34: the library's host reports say who holds its blocks."""
        tmp = self.useFixture(fixtures.TempDir()).path
        # nova-api's configuration naming the library (a ConfigOpts of
        # its own: oslo.config reports a cleared override as still set)
        conf = cfg.ConfigOpts()
        vmar_conf.register_opts(conf)
        conf([], project='vmar', default_config_files=[])
        conf.set_override('connection', 'sqlite:///%s/v.sqlite' % tmp,
                          group='vmar_database')
        self.useFixture(fixtures.MockPatchObject(self.checks, 'CONF', conf))
        migration.upgrade('head', conf=conf)
        reports = db_hosts.HostReports(conf)
        inst = self.vmar_server(None)
        image = inst.image_ref

        def refused(why):
            for name, call in self.moves(inst):
                e = self.assertRaises(self.checks.MoveRefused, call)
                self.assertIn('is deleted in Glance', str(e))
                self.assertIn(why, str(e))
        # nobody reported it; then its host's mirror still fills
        refused('no host that serves peers holds every block only that '
                'image had: the fill of a mirror of it has not finished')
        reports.record('a', [(image, 1)], {image: 3},
                       peer_address='10.0.0.1:10810')
        refused('no host that serves peers')
        # filled, but its host serves no peer
        reports.record('a', [(image, 1)], {image: 4}, complete=[image])
        refused('no host that serves peers')
        reports.record('a', [(image, 1)], {image: 4}, complete=[image],
                       peer_address='10.0.0.1:10810')
        for name, call in self.moves(inst):
            self.assertEqual('accepted', call(), name)

    def test_servers_not_on_vmar_move_without_their_image(self):
        # ordinary flavors, and vmar flavors booted from volume
        plain = instance()
        for name, call in self.moves(plain)[1:]:
            self.assertEqual('accepted', call())
        self.bfv.return_value = True
        for name, call in self.moves(self.vmar_server(None))[1:]:
            self.assertEqual('accepted', call())


class TestSnapshotRoute(BackendTestCase):
    """The direct snapshot of a vmar disk: when it runs, how it ends."""

    def setUp(self):
        super().setUp()
        self.img = vimage.VmarImage(instance=instance(VMAR),
                                    path=os.path.join(self.tmp, 'disk'),
                                    exports=client())
        self.glance = mock.Mock()
        self.useFixture(fixtures.MockPatchObject(
            glance, 'GlanceClientWrapper', return_value=self.glance))
        self.useFixture(fixtures.MockPatchObject(snapshot, 'POLL', 0))

    def test_off_is_nova_own_route(self):
        self.cfg.config(snapshot_delta=False, group='vmar_compute')
        self.assertRaises(NotImplementedError, self.img.direct_snapshot,
                          None, 'n', 'qcow2', 'id', 'base')
        self.glance.call.assert_not_called()

    def test_no_delta_falls_back(self):
        # the daemon cannot give the image's digest list
        self.useFixture(fixtures.MockPatchObject(
            vimage.VmarImage, 'inspect', return_value=(
                names.parse_export(names.export(str(uuid.uuid4()), 3, KEY)),
                1 << 30)))
        self.img.exports.digests.side_effect = vmar_exception.ExportError(
            'no digest list')
        e = self.assertRaises(exception.ImageUnacceptable,
                              self.img.direct_snapshot, None, 'n', 'qcow2',
                              'id', 'base')
        self.assertIn('no delta of the disk: no digest list', str(e))
        self.glance.call.assert_not_called()

    def _statuses(self, *statuses, failed=''):
        self.glance.call.side_effect = [
            {'status': s, 'os_glance_failed_import': failed}
            for s in statuses]

    def test_wait_until_active(self):
        self._statuses('uploading', 'importing', 'active')
        snapshot._wait_active(self.glance, None, 'id')
        self.assertEqual(3, self.glance.call.call_count)

    def test_a_failed_import_falls_back(self):
        self._statuses('importing', 'queued', failed='fs')
        e = self.assertRaises(exception.ImageUnacceptable,
                              snapshot._wait_active, self.glance, None, 'id')
        self.assertIn('status queued, failed stores fs', str(e))

    def test_an_import_that_never_ends_fails(self):
        self.cfg.config(snapshot_import_timeout=1, group='vmar_compute')
        self.glance.call.return_value = {'status': 'importing'}
        clock = iter(range(0, 100, 2))
        self.useFixture(fixtures.MockPatch(
            'time.monotonic', side_effect=lambda: next(clock)))
        e = self.assertRaises(vmar_exception.SnapshotError,
                              snapshot._wait_active, self.glance, None, 'id')
        self.assertIn('not active 1 s after', str(e))

    def test_other_formats_take_nova_own_route(self):
        self.assertRaises(NotImplementedError, self.img.direct_snapshot,
                          None, 'n', 'vmdk', 'id', 'base')
        self.glance.call.assert_not_called()
