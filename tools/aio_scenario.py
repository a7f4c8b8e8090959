#!/usr/bin/env python3
"""All-in-one scenario: the user's path end to end, on one machine.

Real RabbitMQ, glance-api (uWSGI, file store, no Keystone, the vmar_mapgen
import plugin), vmar-agent, vmar-export with the patched
qemu-storage-daemon (maps and bases from Glance), libvirtd with stock QEMU
under TCG, and Nova's own libvirt classes driving the vmar backend:

1. ``openstack image create`` of three images of the Debian library;
2. their maps appear in Glance;
3. the vmar backend provisions two instances from two of the images and
   libvirt boots them;
4. the guests checksum their whole disks: each equals its image's;
5. the host page cache holds each shared block once (fincore);
6. ``openstack image delete`` of the canonical image leaves the running
   guests intact (they keep checksumming their disks correctly);
7. teardown leaves no process or file behind.

Prints a short report. Exit status 0 only if every step held.

Usage: tools/aio_scenario.py [--qemu-prefix P] [--library DIR] [--json OUT]
"""

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TOP)

from nova import objects  # noqa: E402
from nova.virt.libvirt import config as vconfig  # noqa: E402
from nova.virt.libvirt import driver as libvirt_driver  # noqa: E402
from nova.virt.libvirt import imagebackend  # noqa: E402
from nova.virt.libvirt import imagecache  # noqa: E402
from nova.virt.libvirt import instancejobtracker  # noqa: E402
from nova.virt.libvirt import utils as libvirt_utils  # noqa: E402
from oslo_config import cfg  # noqa: E402

from tools.vmarenv import glance_env  # noqa: E402
from tools.vmarenv import qemu_env  # noqa: E402
from vmar_openstack.db import migration  # noqa: E402
from vmar_openstack.exception import SourceError  # noqa: E402
from vmar_openstack import export  # noqa: E402
from vmar_openstack.mapsource import glance as gsource  # noqa: E402
from vmar_openstack.nova_imagebackend import hooks  # noqa: E402
from vmar_openstack import pagecache  # noqa: E402

MAPPING = {'bus': 'virtio', 'dev': 'vda', 'type': 'disk'}
IMAGES = ('minbase', 'python3', 'nginx')
BOOTED = ('python3', 'nginx')


class Failed(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failed(what)
    print('  ok: %s' % what, flush=True)


class Scenario:

    def __init__(self, args):
        self.args = args
        self.work = tempfile.mkdtemp(prefix='vmar-aio-')
        os.chmod(self.work, 0o755)
        self.sock_dir = tempfile.mkdtemp(prefix='vmar-aio-', dir='/run')
        os.chmod(self.sock_dir, 0o755)
        self.procs = []
        self.domains = []
        self.report = {}

    # -- services --------------------------------------------------------
    def start(self):
        self.rabbit = glance_env.RabbitMQ(os.path.join(self.work, 'rabbit'))
        self.rabbit.start()
        self.state = os.path.join(self.work, 'vmar')
        os.makedirs(self.state)
        sections = {'vmar': {'state_dir': self.state},
                    'vmar_database': {'connection': 'sqlite:///%s/vmar.'
                                      'sqlite' % self.state}}
        self.glance = glance_env.GlanceAPI(
            os.path.join(self.work, 'glance'), self.rabbit.transport_url,
            import_plugins=['vmar_mapgen'], import_config=sections)
        self.glance.start()
        self.sock = os.path.join(self.sock_dir, 'nbd.sock')
        self.conf_file = os.path.join(self.work, 'vmar.conf')
        glance_env.write_conf(self.conf_file, dict(sections, **{
            'DEFAULT': {'transport_url': self.rabbit.transport_url},
            'vmar': dict(sections['vmar'], **{
                'host_dir': os.path.join(self.work, 'host'),
                'export_socket': self.sock,
                'export_socket_group': 'libvirt-qemu',
                'map_source': 'glance',
                'qemu_storage_daemon': os.path.join(
                    self.args.qemu_prefix, 'bin', 'qemu-storage-daemon'),
                'qemu_img': '/usr/bin/qemu-img'}),
            'vmar_glance': {'auth_type': 'none',
                            'endpoint': self.glance.endpoint,
                            'endpoint_override': self.glance.endpoint},
            'vmar_agent': {'local_store_dir': self.glance.store_dir}}))
        # this process is the compute host: Nova's (global) configuration
        self.conf = cfg.CONF
        self.conf(['--config-file', self.conf_file], project='vmar')
        self.conf.set_override('instances_path',
                               os.path.join(self.work, 'instances'))
        self.conf.set_override('virt_type', 'qemu', group='libvirt')
        migration.upgrade('head', conf=self.conf)
        bindir = os.path.dirname(sys.executable)
        for name, cmd in (('vmar-agent', []), ('vmar-export', ['serve'])):
            log = open(os.path.join(self.work, name + '.log'), 'ab')
            self.procs.append(subprocess.Popen(
                [os.path.join(bindir, name), '--config-file',
                 self.conf_file] + cmd, stdout=log, stderr=log))
        deadline = time.time() + 60
        while not os.path.exists(self.sock):
            if time.time() > deadline:
                raise Failed('vmar-export did not publish its socket')
            time.sleep(0.1)
        qemu_env.libvirt()
        hooks.register()
        # a moderate read-ahead on the disk of host_dir, as export.rst
        # advises (this machine's is 8 MiB); files take it when opened
        self.readahead = contextlib.ExitStack()
        self.readahead.enter_context(pagecache.readahead(
            pagecache.readahead_knob(self.work), 128))
        self.exports = export.ExportService(self.conf)

    def stop(self):
        if getattr(self, 'readahead', None):
            self.readahead.close()
            self.readahead = None
        for name in self.domains:
            qemu_env.virsh('destroy', name, check=False)
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        qsd_pid = os.path.join(self.work, 'host', 'qsd.pid')
        if os.path.exists(qsd_pid):
            with open(qsd_pid) as f:
                pid = f.read().strip()
            if os.path.exists('/proc/%s' % pid):
                os.kill(int(pid), 9)
        for stop in (getattr(self, 'glance', None),
                     getattr(self, 'rabbit', None)):
            if stop is not None:
                stop.stop()
        shutil.rmtree(self.work, ignore_errors=True)
        shutil.rmtree(self.sock_dir, ignore_errors=True)

    # -- the path --------------------------------------------------------
    def images(self):
        lib = qemu_env.image_library()
        self.ids = {}
        source = gsource.GlanceSource(self.conf)
        t0 = time.monotonic()
        for name in IMAGES:
            out = self.glance.openstack(
                'image', 'create', '--file', lib[name], '--disk-format',
                'raw', '--container-format', 'bare', '--public', '-f',
                'value', '-c', 'id', 'debian-12-' + name)
            self.ids[name] = out.stdout.split()[-1]
        print('1. created %d images in %.1fs' % (len(IMAGES),
                                                 time.monotonic() - t0))
        deadline = time.time() + 600
        self.versions = {}
        for name, image_id in self.ids.items():
            while True:
                try:
                    self.versions[name] = source.current_version(image_id)
                    break
                except SourceError:
                    if time.time() > deadline:
                        raise Failed('no map of %s' % name)
                    time.sleep(0.2)
        check(len(self.versions) == 3, '2. three maps in Glance (%s)'
              % ', '.join('%s v%d' % kv for kv in self.versions.items()))
        self.report['images'] = self.ids
        self.report['maps'] = self.versions
        self.expected = {n: qemu_env.sha256_file(lib[n]) for n in BOOTED}

    def provision_and_boot(self):
        backend = imagebackend.Backend(use_cow=True)
        objects.register_all()
        self.instances, self.consoles = {}, {}
        guest_dir = qemu_env.test_guest()
        disks = {}
        for name in BOOTED:
            flavor = objects.Flavor(name='vmar', root_gb=0, ephemeral_gb=0,
                                    swap=0,
                                    extra_specs={'vmar:enabled': 'true'})
            inst = objects.Instance(uuid=str(uuid.uuid4()), flavor=flavor,
                                    image_ref=self.ids[name])
            disk = backend.by_name(inst, 'disk', disk_info_mapping=MAPPING)
            disk.cache(fetch_func=libvirt_utils.fetch_image, context=None,
                       filename=imagecache.get_cache_fname(inst.image_ref),
                       image_id=inst.image_ref, size=0)
            disks[name] = (inst, disk)
        # fetching wrote the bases through the page cache: start cold
        bases = os.path.join(self.work, 'host', 'bases')
        for b in os.listdir(bases):
            qemu_env.evict(os.path.join(bases, b))
        for name, (inst, disk) in disks.items():
            flavor = inst.flavor
            g = vconfig.LibvirtConfigGuest()
            g.virt_type, g.name, g.uuid = 'qemu', 'vmar-aio-' + name, \
                inst.uuid
            g.memory, g.vcpus, g.os_type = 256 * 1024, 1, 'hvm'
            g.os_kernel = os.path.join(guest_dir, 'vmlinuz')
            g.os_initrd = os.path.join(guest_dir, 'initramfs')
            g.os_cmdline = 'console=ttyS0 quiet vmar.loop=1'
            g.features.append(vconfig.LibvirtConfigGuestFeatureACPI())
            g.add_device(disk.libvirt_info('none', flavor.extra_specs,
                                           boot_order='1'))
            serial = vconfig.LibvirtConfigGuestSerial()
            serial.type = 'file'
            serial.source_path = os.path.join(self.work, name + '.console')
            g.add_device(serial)
            xml = os.path.join(self.work, name + '.xml')
            with open(xml, 'w') as f:
                f.write(g.to_xml())
            qemu_env.virsh('create', xml)
            self.domains.append(g.name)
            self.instances[name] = inst
            self.consoles[name] = serial.source_path
        check(True, '3. two instances provisioned by the vmar backend and '
              'booted by libvirt')
        self.wait_sums(1)
        check(True, '4. both guests read their whole disk: checksums equal '
              'the images\'')

    def wait_sums(self, n, timeout=900):
        deadline = time.time() + timeout
        for name, console in self.consoles.items():
            while True:
                sums = qemu_env.console_lines(console, 'VMAR-SHA256')
                if len(sums) >= n:
                    break
                if time.time() > deadline:
                    raise Failed('guest %s: %s' % (
                        name, qemu_env.console_tail(console)))
                time.sleep(1)
            if set(sums) != {self.expected[name]}:
                raise Failed('guest %s read %s, image is %s'
                             % (name, sums, self.expected[name]))

    def page_cache(self):
        bases = os.path.join(self.work, 'host', 'bases')
        cached = {n: qemu_env.fincore_bytes(os.path.join(bases, i))
                  for n, i in self.ids.items()
                  if os.path.exists(os.path.join(bases, i))}
        with open('/proc/%s/io' % open(os.path.join(
                self.work, 'host', 'qsd.pid')).read().strip()) as f:
            io = dict(x.split(': ') for x in f.read().splitlines())
        raw = {n: os.path.getsize(qemu_env.image_library()[n])
               for n in IMAGES}
        self.report['cache_bytes'] = cached
        self.report['qsd_read_bytes'] = int(io['read_bytes'])
        total = sum(cached.values())
        # both images read in full through the views; stock Nova would
        # cache each image's data in its own base file
        data = {n: _data_bytes(qemu_env.image_library()[n]) for n in BOOTED}
        self.report['data_bytes_of_booted_images'] = data
        check(total < sum(data.values()) * 8 // 10,
              '5. the host caches %.1f MB for two guests whose images hold '
              '%.1f MB of data: shared blocks once (raw sizes %s)'
              % (total / 1e6, sum(data.values()) / 1e6, raw))

    def delete_image(self):
        canonical = 'minbase'
        self.glance.openstack('image', 'delete', self.ids[canonical])
        source = gsource.GlanceSource(self.conf)
        deadline = time.time() + 300
        while True:
            try:
                source.current_version(self.ids[canonical])
            except SourceError:
                break
            if time.time() > deadline:
                raise Failed('the maps of the deleted image remain')
            time.sleep(0.5)
        n = max(len(qemu_env.console_lines(c, 'VMAR-SHA256'))
                for c in self.consoles.values())
        self.wait_sums(n + 1)
        check(True, '6. image %s deleted; the running guests still read '
              'their disks correctly' % canonical)

    def teardown(self):
        drv = libvirt_driver.LibvirtDriver.__new__(
            libvirt_driver.LibvirtDriver)
        drv.job_tracker = instancejobtracker.InstanceJobTracker()
        for name in list(self.domains):
            qemu_env.virsh('destroy', name)
        self.domains = []
        for inst in self.instances.values():
            drv.delete_instance_files(inst)
        left = self.exports.list()[0]
        check(left == {}, 'instances deleted: no exports left')
        work, sock_dir = self.work, self.sock_dir
        pids = [p.pid for p in self.procs]
        self.stop()
        alive = [p for p in pids if os.path.exists('/proc/%d' % p)]
        mine = [t for _pid, t in glance_env._proc_owner_tags() if work in t]
        check(not alive and not mine and not os.path.exists(work)
              and not os.path.exists(sock_dir),
              '7. teardown: no process or file left behind')


def _data_bytes(path):
    out = subprocess.run(['du', '-B1', path], capture_output=True,
                         text=True, check=True).stdout
    return int(out.split()[0])


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--qemu-prefix', default=os.environ.get(
        'VMAR_QEMU_PREFIX'))
    p.add_argument('--json')
    args = p.parse_args()
    if not args.qemu_prefix:
        args.qemu_prefix = qemu_env.qemu_prefix()
    s = Scenario(args)
    ok = False
    try:
        s.start()
        s.images()
        s.provision_and_boot()
        s.page_cache()
        s.delete_image()
        s.teardown()
        ok = True
    except Failed as e:
        print('FAILED: %s' % e)
    finally:
        if not ok:
            s.stop()
    r = s.report
    print('report:')
    print('  images: %s' % ', '.join('%s=%s' % kv for kv in
                                     r.get('images', {}).items()))
    print('  maps: %s' % ', '.join('%s v%d' % kv for kv in
                                   r.get('maps', {}).items()))
    print('  host page cache of the bases (bytes): %s'
          % r.get('cache_bytes'))
    print('  data bytes of the booted images: %s'
          % r.get('data_bytes_of_booted_images'))
    print('  bytes the export daemon read from storage: %s'
          % r.get('qsd_read_bytes'))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(r, f, indent=1)
    print('PASS' if ok else 'FAIL')
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
