"""The vmar Nova backend on the real thing.

Nova's own classes (34, from pip) provision the root disk through
``Backend.by_name(...).cache(...)`` as the libvirt driver's spawn does, and
write the domain XML (``LibvirtConfigGuest`` with the backend's
``libvirt_info``). libvirtd and virtlogd (started by the harness), stock
qemu-system-x86_64 under TCG, the patched qemu-storage-daemon behind
``vmar-export serve``.
"""

import hashlib
import os
import signal
import subprocess
import time
import uuid

from nova import objects
from nova.virt.libvirt import config as vconfig
from nova.virt.libvirt import driver as libvirt_driver
from nova.virt.libvirt import guest as libvirt_guest
from nova.virt.libvirt import imagebackend
from nova.virt.libvirt import imagecache
from nova.virt.libvirt import instancejobtracker
from nova.virt.libvirt import utils as libvirt_utils
from oslo_config import cfg
from oslo_config import fixture as config_fixture
from oslo_utils import units

from tests import base
from tests import disk_fixture
from tests.functional import test_export
from tools.vmarenv import qemu_env
from vmar_openstack.nova_imagebackend import image as vimage
from vmar_openstack.nova_imagebackend import snapshot
from vmar_openstack import nova_wrappers

objects.register_all()

MAPPING = {'bus': 'virtio', 'dev': 'vda', 'type': 'disk'}


def marked(data, offset):
    data = bytearray(data)
    data[offset:offset + 4096] = (b'vmar-marker-%d' % offset).ljust(
        4096, b'\0')
    return hashlib.sha256(data).hexdigest()


class NovaTestCase(test_export.ExportTestCase):

    def extra_conf(self):
        return 'export_socket_group = libvirt-qemu\n'

    def setUp(self):
        super().setUp()
        qemu_env.libvirt()
        self.guest_dir = qemu_env.test_guest()
        os.chmod(self.tmp, 0o755)
        # Nova's configuration is the global one, as in nova-compute
        fx = self.useFixture(config_fixture.Config(cfg.CONF))
        self.instances = os.path.join(self.tmp, 'instances')
        fx.config(instances_path=self.instances)
        fx.config(virt_type='qemu', group='libvirt')
        # nova-compute's own: the API socket of this test's daemon
        fx.config(api_socket=os.path.join(self.sock_dir, 'api.sock'),
                  qemu_img=qemu_env.SYSTEM_QEMU_IMG, group='vmar_compute')
        nova_wrappers.install(nova_wrappers.COMPUTE)
        self.addCleanup(nova_wrappers.uninstall)
        self.backend = imagebackend.Backend(use_cow=True)
        # image A: 24 MiB; image B shares two thirds of it (A is canonical)
        self.a, self.b = sorted(str(uuid.uuid4()) for _ in range(2))
        seeds = list(range(1, 6145))
        self.raw = {
            self.a: self.image('a.raw', seeds),
            self.b: self.image('b.raw', [None] * 100 + seeds[:4000]
                               + list(range(90000, 92000)) + [None] * 44)}
        for i in (self.a, self.b):
            self.lib.add(i, self.raw[i], visibility='public')
        self.serve_proc = self.serve()

    def image(self, name, seeds):
        return base.write_image(os.path.join(self.images, name), seeds)

    def instance(self, image_id, host_cache='base', root_gb=0):
        flavor = objects.Flavor(
            name='vmar.tiny', root_gb=root_gb, ephemeral_gb=0, swap=0,
            extra_specs={'vmar:enabled': 'true',
                         'vmar:host_cache': host_cache})
        return objects.Instance(uuid=str(uuid.uuid4()), flavor=flavor,
                                image_ref=image_id)

    def provision(self, inst):
        """What LibvirtDriver._create_and_inject_local_root does."""
        disk = self.backend.by_name(inst, 'disk', disk_info_mapping=MAPPING)
        disk.cache(fetch_func=libvirt_utils.fetch_image, context=None,
                   filename=imagecache.get_cache_fname(inst.image_ref),
                   image_id=inst.image_ref,
                   size=inst.flavor.root_gb * units.Gi)
        return disk

    def domain_xml(self, inst, console, args):
        """The domain, written by Nova's config classes."""
        g = vconfig.LibvirtConfigGuest()
        g.virt_type = 'qemu'
        g.name = 'vmar-nova-%s' % inst.uuid[:8]
        g.uuid = inst.uuid
        g.memory = 256 * 1024
        g.vcpus = 1
        g.os_type = 'hvm'
        g.os_kernel = os.path.join(self.guest_dir, 'vmlinuz')
        g.os_initrd = os.path.join(self.guest_dir, 'initramfs')
        g.os_cmdline = 'console=ttyS0 quiet no_timer_check ' + args
        g.features.append(vconfig.LibvirtConfigGuestFeatureACPI())
        disk = self.backend.by_name(inst, 'disk', disk_info_mapping=MAPPING)
        g.add_device(disk.libvirt_info('none', inst.flavor.extra_specs,
                                       boot_order='1'))
        serial = vconfig.LibvirtConfigGuestSerial()
        serial.type = 'file'
        serial.source_path = console
        g.add_device(serial)
        return g.name, g.to_xml()

    def boot(self, inst, args='', wait=True):
        console = os.path.join(self.tmp, '%s-%d.log'
                               % (inst.uuid, time.monotonic_ns()))
        name, xml = self.domain_xml(inst, console, args)
        path = console + '.xml'
        with open(path, 'w') as f:
            f.write(xml)
        qemu_env.run_domain(self, name, path, console, wait=wait)
        return name, console

    def checksum(self, console):
        sums = qemu_env.console_lines(console, 'VMAR-SHA256')
        self.assertEqual(1, len(sums), qemu_env.console_tail(console))
        return sums[0]

    def delete(self, inst):
        """What Nova's destroy does with the instance files."""
        drv = libvirt_driver.LibvirtDriver.__new__(
            libvirt_driver.LibvirtDriver)
        drv.job_tracker = instancejobtracker.InstanceJobTracker()
        self.assertTrue(drv.delete_instance_files(inst))

    def exports(self):
        return self.svc.list()[0]

    def read(self, path):
        with open(path, 'rb') as f:
            return f.read()


class TestNovaBackend(NovaTestCase):

    def test_boot_verify_write_reboot(self):
        inst = self.instance(self.b)
        disk = self.provision(inst)
        pin = disk.pinned()
        self.assertEqual(self.b, pin[0])
        info = vimage._qemu_img_info(disk.path)
        self.assertEqual('raw', info['backing-filename-format'])
        (exp,) = self.exports().values()
        self.assertEqual([inst.uuid], exp.holders)
        self.assertEqual(pin[1], exp.map_version)
        bases = {i: qemu_env.sha256_file(self.svc.base_file(i))
                 for i in (self.a, self.b)}
        # nothing went to Nova's image cache
        base_dir = os.path.join(self.instances, '_base')
        self.assertEqual([], os.listdir(base_dir)
                         if os.path.isdir(base_dir) else [])
        _n, console = self.boot(inst, 'vmar.write=8192')
        self.assertEqual(['ok'], qemu_env.console_lines(console,
                                                        'VMAR-WROTE'))
        data = self.read(self.raw[self.b])
        self.assertEqual(marked(data, 8192), self.checksum(console))
        # reboot: Nova's hard reboot provisions again; the write is there
        self.provision(inst)
        _n, console = self.boot(inst, 'vmar.readback=8192')
        self.assertEqual(['ok'], qemu_env.console_lines(console,
                                                        'VMAR-READBACK'))
        for i, digest in bases.items():
            self.assertEqual(digest, qemu_env.sha256_file(
                self.svc.base_file(i)))
        # a cold snapshot: the overlay flattened onto the view
        snap = os.path.join(self.tmp, 'snap.qcow2')
        disk.snapshot_extract(snap, 'qcow2')
        info = subprocess.run([qemu_env.SYSTEM_QEMU_IMG, 'info', snap],
                              capture_output=True, text=True).stdout
        self.assertNotIn('backing file', info)
        flat = os.path.join(self.tmp, 'snap.raw')
        subprocess.run([qemu_env.SYSTEM_QEMU_IMG, 'convert', '-f', 'qcow2',
                        '-O', 'raw', snap, flat], check=True)
        with open(flat, 'rb') as f:
            self.assertEqual(marked(data, 8192),
                             hashlib.sha256(f.read(len(data))).hexdigest())
        # delete: the overlay, the export and the files go
        self.delete(inst)
        self.assertFalse(os.path.exists(disk.path))
        self.assertEqual({}, self.exports())
        self.assertEqual([], os.listdir(os.path.join(self.svc.host_dir,
                                                     'bases')))

    def test_a_deleted_image_stays_readable_for_its_running_guest(self):
        inst = self.instance(self.b)
        self.provision(inst)
        expected = hashlib.sha256(self.read(self.raw[self.b])).hexdigest()
        name, console = self.boot(inst, 'vmar.loop=1', wait=False)
        qemu_env.wait_for_line(self, console, 'VMAR-SHA256')
        a_base = self.svc.base_file(self.a)
        self.assertTrue(os.path.exists(a_base))
        # the canonical image goes (Glance delete): B's map is regenerated
        self.lib.delete(self.a)
        self.assertFalse(os.path.exists(os.path.join(
            self.conf.vmar_host.map_source_dir, 'bases', self.a)))
        # a new instance of B gets the new map, next to the old one
        inst2 = self.instance(self.b)
        self.provision(inst2)
        names = sorted(self.exports())
        self.assertEqual(2, len(names), names)
        # the running guest still reads A's blocks, from the host's copy
        n = len(qemu_env.console_lines(console, 'VMAR-SHA256'))
        sums = qemu_env.wait_for_line(self, console, 'VMAR-SHA256', n + 2)
        self.assertEqual({expected}, set(sums))
        self.assertTrue(os.path.exists(a_base))
        _n2, console2 = self.boot(inst2)
        self.assertEqual(expected, self.checksum(console2))
        # the old version and A's base go with the last instance on them
        qemu_env.virsh('destroy', name)
        self.delete(inst)
        self.assertEqual(1, len(self.exports()))
        self.assertFalse(os.path.exists(a_base))
        self.delete(inst2)
        self.assertEqual({}, self.exports())

    def test_host_reboot(self):
        inst = self.instance(self.b)
        self.provision(inst)
        expected = hashlib.sha256(self.read(self.raw[self.b])).hexdigest()
        name, console = self.boot(inst, 'vmar.loop=1', wait=False)
        qemu_env.wait_for_line(self, console, 'VMAR-SHA256')
        # power cut: the guest, the export service and its daemon, libvirt
        qemu_env.virsh('destroy', name)
        qsd = self.qsd_pid()
        os.kill(self.serve_proc.pid, signal.SIGKILL)
        os.kill(qsd, signal.SIGKILL)
        qemu_env.kill_libvirtd()
        os.unlink(self.sock)
        # boot: vmar-export first, then libvirt, then Nova resumes guests
        self.serve()
        qemu_env.libvirt()
        self.provision(inst)
        _n, console = self.boot(inst)
        self.assertEqual(expected, self.checksum(console))
        self.delete(inst)

    def test_live_snapshot(self):
        inst = self.instance(self.b)
        disk = self.provision(inst)
        name, console = self.boot(inst, 'vmar.write=4096 vmar.loop=1',
                                  wait=False)
        qemu_env.wait_for_line(self, console, 'VMAR-SHA256')
        import libvirt
        conn = libvirt.open(qemu_env.libvirt())
        self.addCleanup(conn.close)
        guest = libvirt_guest.Guest(conn.lookupByName(name))
        written = []

        class Driver:
            class _host:
                write_instance_config = staticmethod(written.append)
        out = os.path.join(self.tmp, 'live.raw')
        snapshot.live_snapshot(Driver, disk, guest, disk.path, out, 'raw')
        self.assertEqual(1, len(written))   # the domain XML, put back
        data = self.read(self.raw[self.b])
        self.assertEqual(marked(data, 4096),
                         hashlib.sha256(self.read(out)).hexdigest())
        self.assertFalse(os.path.exists(out + '.delta'))
        # the guest kept running on its own disk
        n = len(qemu_env.console_lines(console, 'VMAR-SHA256'))
        qemu_env.wait_for_line(self, console, 'VMAR-SHA256', n + 1)
        self.assertIn(disk.path, guest.get_xml_desc())

    def test_flavor_root_disk_size(self):
        inst = self.instance(self.a, root_gb=1)
        disk = self.provision(inst)
        self.assertEqual(units.Gi,
                         vimage._qemu_img_info(disk.path)['virtual-size'])
        self.delete(inst)


class TestHostCache(NovaTestCase):
    """Two guests of two similar images at once: what the host caches."""

    def run_pair(self, host_cache):
        insts = [self.instance(i, host_cache) for i in (self.a, self.b)]
        bases = [self.svc.base_file(i) for i in (self.a, self.b)]
        for inst in insts:
            self.provision(inst)
        for b in bases:
            qemu_env.evict(b)
        with open('/proc/%d/io' % self.qsd_pid()) as f:
            before = int(dict(x.split(': ') for x in f.read().splitlines()
                              )['read_bytes'])
        consoles = [self.boot(inst, wait=False)[1] for inst in insts]
        for c in consoles:
            qemu_env.wait_for_line(self, c, 'VMAR-SHA256')
        with open('/proc/%d/io' % self.qsd_pid()) as f:
            read = int(dict(x.split(': ') for x in f.read().splitlines()
                            )['read_bytes']) - before
        cached = [qemu_env.fincore_bytes(b) for b in bases]
        for inst in insts:
            self.delete(inst)
        return cached, read

    @disk_fixture.on_own_disk
    def test_shared_blocks_cached_once(self):
        # This machine reclaims page cache continuously (bench/RESULTS.md),
        # so cached pages of A may go before they are counted; B's base
        # holding none of the shared blocks is exact, and reads through
        # O_DIRECT are counted exactly.
        qemu_env.set_readahead(self.tmp, 0, self)
        data_a, shared, own_b = 6144 * 4096, 4000 * 4096, 2000 * 4096
        cached, read = self.run_pair('base')
        record = {'base': (cached, read)}
        # B's base holds only B's own blocks: the shared ones were served
        # from (and cached in) A's base, once
        self.assertLessEqual(cached[1], own_b + 64 * 1024, record)
        self.assertGreater(cached[1], own_b // 2, record)
        self.assertGreater(cached[0], data_a // 2, record)
        cached_none, read_none = self.run_pair('none')
        record['none'] = (cached_none, read_none)
        self.assertEqual([0, 0], cached_none, record)
        # O_DIRECT: each guest read the shared blocks from storage
        self.assertGreaterEqual(read_none, data_a + shared + own_b, record)
        # through the host cache, much less (the union would be 0.67)
        self.assertLess(read, read_none * 9 // 10, record)
