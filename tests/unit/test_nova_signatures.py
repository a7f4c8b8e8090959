"""The Nova methods vmar wraps or reaches keep their signatures.

``vmar_openstack/nova_wrappers.py`` lists every method of Nova vmar wraps
(``TABLE``) and every private attribute it reaches (``PRIVATE``). None of
them is a stable API. The signatures below are those of the Nova releases
setup.cfg allows. When a Nova release changes one, this test fails and
names it: read the new method, adapt the wrapper, then update the
signature here.
"""

import inspect

import testtools

from nova.compute import api as compute_api
from nova.image import glance
from nova.virt.libvirt import driver as libvirt_driver
from nova.virt.libvirt import host as libvirt_host
from nova.virt.libvirt import imagebackend

from vmar_openstack import nova_wrappers

B = imagebackend.Backend
D = libvirt_driver.LibvirtDriver

# (class, method) -> signature, for every method nova-compute's wrappers wrap
WRAPPED = {
    (B, 'by_name'):
        '(self, instance, name, image_type=None, disk_info_mapping=None)',
    (B, 'by_libvirt_path'): '(self, instance, path, image_type=None)',
    (D, 'init_host'): '(self, host)',
    (D, '_get_guest_config'):
        '(self, instance, network_info, image_meta, disk_info, rescue=None, '
        'block_device_info=None, context=None, mdevs=None, accel_info=None, '
        'share_info=None, old_guest=None)',
    (D, 'delete_instance_files'): '(self, instance)',
    (D, '_live_snapshot'):
        '(self, context, instance, guest, disk_path, out_path, '
        'source_format, image_format, image_meta)',
    (D, 'migrate_disk_and_power_off'):
        '(self, context, instance, dest, flavor, network_info, '
        'block_device_info=None, timeout=0, retry_interval=0)',
    (D, 'get_instance_disk_info'): '(self, instance, block_device_info=None)',
    (D, '_create_images_and_backing'):
        '(self, context, instance, instance_dir, disk_info, '
        'fallback_from_host=None)',
    (D, 'rollback_live_migration_at_destination'):
        '(self, context, instance, network_info, block_device_info, '
        'destroy_disks=True, migrate_data=None)',
    (D, 'confirm_migration'):
        '(self, context, migration, instance, network_info)',
}

# (class, method) -> signature, for every method nova-api's wrappers wrap
API_WRAPPED = {
    (compute_api.API, 'resize'):
        '(self, context, instance, flavor_id=None, clean_shutdown=True, '
        'host_name=None, auto_disk_config=None)',
    (compute_api.API, 'live_migrate'):
        '(self, context, instance, block_migration, disk_over_commit, '
        'host_name, force=None, async_=False)',
    (compute_api.API, 'evacuate'):
        '(self, context, instance, host, on_shared_storage, '
        'admin_password=None, force=None, target_state=None)',
}

# private methods snapshot.live_snapshot() calls, and what the checks call
CALLED = {
    (glance.API, 'get'):
        '(self, context, id_or_uri, include_locations=False, '
        'show_deleted=True)',
    (D, '_delete_guest_configuration'): '(self, guest, keep_vtpm, keep_nvram)',
    (libvirt_host.Host, 'write_instance_config'): '(self, xml)',
    # resume.start() uses the driver's connection
    (libvirt_host.Host, 'get_connection'): '(self)',
    # snapshot.send_delta(): the guest, Glance as the user, and the
    # backend method Nova calls for it
    (libvirt_host.Host, 'get_guest'): '(self, instance)',
    (glance.GlanceClientWrapper, 'call'):
        '(self, context, version, method, controller=None, args=None, '
        'kwargs=None)',
    (imagebackend.Image, 'direct_snapshot'):
        '(self, context, snapshot_name, image_format, image_id, '
        'base_image_id)',
}


class TestNovaSignatures(testtools.TestCase):

    def setUp(self):
        super().setUp()
        nova_wrappers.install(nova_wrappers.COMPUTE)
        nova_wrappers.install(nova_wrappers.API)
        self.addCleanup(nova_wrappers.uninstall)

    def test_every_wrapped_method_is_listed(self):
        table = {(w.cls, w.method) for w in nova_wrappers.TABLE}
        self.assertEqual(set(WRAPPED) | set(API_WRAPPED), table)
        self.assertEqual(table, set(nova_wrappers._ORIGINALS))
        for w in nova_wrappers.TABLE:
            # a top-level function of the module, by its own name
            self.assertIs(w.wrapper, getattr(nova_wrappers,
                                             w.wrapper.__name__))
            self.assertEqual(w.service, nova_wrappers.COMPUTE
                             if (w.cls, w.method) in WRAPPED
                             else nova_wrappers.API)

    def test_private_attributes_are_there(self):
        """What PRIVATE names exists on a real driver and host."""
        for p in nova_wrappers.PRIVATE:
            if p.attribute == '_host':
                # an instance attribute: set in the driver's __init__
                self.assertIn('self._host = ',
                              inspect.getsource(p.cls.__init__))
            else:
                self.assertTrue(callable(getattr(p.cls, p.attribute)),
                                p.attribute)
            self.assertTrue(p.helper.__module__.endswith(
                'nova_imagebackend.driver'), p.helper)

    def test_signatures(self):
        changed = []
        for (cls, name), want in (list(WRAPPED.items())
                                  + list(API_WRAPPED.items())
                                  + list(CALLED.items())):
            got = str(inspect.signature(nova_wrappers.original(cls, name)))
            if got != want:
                changed.append('%s.%s%s (vmar expects %s)'
                               % (cls.__name__, name, got, want))
        self.assertEqual([], changed)
