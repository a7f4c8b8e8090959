"""The Nova methods the vmar hooks wrap or call keep their signatures.

``nova_imagebackend/hooks.py`` wraps methods of Nova's libvirt driver and
image backend, and calls private ones, none of which is a stable API. The
signatures below are Nova 34's (setup.cfg caps ``nova`` below 35). When a
Nova release changes one, this test fails and names it: read the new
method, adapt the hook, then update the signature here.
"""

import inspect

import testtools

from nova.virt.libvirt import driver as libvirt_driver
from nova.virt.libvirt import host as libvirt_host
from nova.virt.libvirt import imagebackend

from vmar_openstack.nova_imagebackend import hooks

B = imagebackend.Backend
D = libvirt_driver.LibvirtDriver

# (class, method) -> signature, for every method hooks.register() wraps
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
    (D, 'check_can_live_migrate_source'):
        '(self, context, instance, dest_check_data, '
        'block_device_info=None)',
    (D, 'migrate_disk_and_power_off'):
        '(self, context, instance, dest, flavor, network_info, '
        'block_device_info=None, timeout=0, retry_interval=0)',
    (D, 'rebuild'):
        '(self, context, instance, image_meta, injected_files, '
        'admin_password, allocations, bdms, detach_block_devices, '
        'attach_block_devices, network_info=None, evacuate=False, '
        'block_device_info=None, preserve_ephemeral=False, '
        'accel_uuids=None, reimage_boot_volume=False)',
}

# private methods hooks.live_snapshot() calls
CALLED = {
    (D, '_delete_guest_configuration'): '(self, guest, keep_vtpm, keep_nvram)',
    (libvirt_host.Host, 'write_instance_config'): '(self, xml)',
    # resume.start() uses the driver's connection
    (libvirt_host.Host, 'get_connection'): '(self)',
}


class TestNovaSignatures(testtools.TestCase):

    def setUp(self):
        super().setUp()
        hooks.register()
        self.addCleanup(hooks.unregister)

    def test_every_wrapped_method_is_listed(self):
        self.assertEqual(sorted((c.__name__, n) for c, n in WRAPPED),
                         sorted((c.__name__, n) for c, n in hooks._ORIGINALS))

    def test_signatures(self):
        changed = []
        for (cls, name), want in list(WRAPPED.items()) + list(CALLED.items()):
            method = hooks._ORIGINALS.get((cls, name), getattr(cls, name))
            got = str(inspect.signature(method))
            if got != want:
                changed.append('%s.%s%s (hooks expect %s)'
                               % (cls.__name__, name, got, want))
        self.assertEqual([], changed)
