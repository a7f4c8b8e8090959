"""The Nova methods the vmar hooks wrap or call keep their signatures.

``nova_imagebackend/hooks.py`` wraps methods of Nova's libvirt driver and
image backend, and calls private ones; ``nova_api/checks.py`` wraps
methods of Nova's compute API. None of them is a stable API. The
signatures below are Nova 34's (setup.cfg caps ``nova`` below 35). When a
Nova release changes one, this test fails and names it: read the new
method, adapt the hook, then update the signature here.
"""

import inspect

import testtools

from nova.compute import api as compute_api
from nova.image import glance
from nova.virt.libvirt import driver as libvirt_driver
from nova.virt.libvirt import host as libvirt_host
from nova.virt.libvirt import imagebackend

from vmar_openstack.nova_api import checks
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

# (class, method) -> signature, for every method nova_api.checks wraps
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

# private methods hooks.live_snapshot() calls, and what the checks call
CALLED = {
    (glance.API, 'get'):
        '(self, context, id_or_uri, include_locations=False, '
        'show_deleted=True)',
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
        checks.register()
        self.addCleanup(checks.unregister)

    def test_every_wrapped_method_is_listed(self):
        self.assertEqual(sorted((c.__name__, n) for c, n in WRAPPED),
                         sorted((c.__name__, n) for c, n in hooks._ORIGINALS))
        self.assertEqual(sorted(n for c, n in API_WRAPPED),
                         sorted(n for c, n in checks._ORIGINALS))

    def test_signatures(self):
        wrapped = dict(hooks._ORIGINALS)
        wrapped.update(checks._ORIGINALS)
        changed = []
        for (cls, name), want in (list(WRAPPED.items())
                                  + list(API_WRAPPED.items())
                                  + list(CALLED.items())):
            method = wrapped.get((cls, name), getattr(cls, name))
            got = str(inspect.signature(method))
            if got != want:
                changed.append('%s.%s%s (hooks expect %s)'
                               % (cls.__name__, name, got, want))
        self.assertEqual([], changed)
