"""A stock QEMU guest, started by libvirt, on a qcow2 overlay of a VMAR view.

The overlay's backing file is ``nbd+unix:///<image id>?socket=...`` with
backing format raw, the disk has ``cache='none'`` (the overlay is O_DIRECT;
the export daemon caches the base files) and ``rerror_policy='stop'``.
The guest (tools/build-test-guest.sh) checksums its whole disk.
"""

import os
import signal
import subprocess
import time
import uuid

from tests.functional import test_export
from tools.vmarenv import qemu_env

GUEST_XML = """<domain type='qemu'>
  <name>{name}</name>
  <memory unit='MiB'>256</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>{guest}/vmlinuz</kernel>
    <initrd>{guest}/initramfs</initrd>
    <cmdline>console=ttyS0 quiet no_timer_check {args}</cmdline>
  </os>
  <features>
    <acpi/>
  </features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2' cache='none' error_policy='stop'
              rerror_policy='stop'/>
      <source file='{overlay}'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <serial type='file'>
      <source path='{console}'/>
      <target port='0'/>
    </serial>
    <memballoon model='none'/>
  </devices>
</domain>
"""


class TestGuest(test_export.ExportTestCase):

    def extra_conf(self):
        # QEMU runs as libvirt-qemu: let it connect to the export socket
        return 'export_socket_group = libvirt-qemu\n'

    def setUp(self):
        super().setUp()
        qemu_env.libvirt()
        self.guest = qemu_env.test_guest()
        os.chmod(self.tmp, 0o755)
        # image 1: 24 MiB; image 2 shares two thirds of it
        self.first = str(uuid.uuid4())
        self.second = str(uuid.uuid4())
        seeds = list(range(1, 6145))
        a = self.image('a.raw', seeds)
        b = self.image('b.raw', [None] * 100 + seeds[:4000]
                       + list(range(90000, 92000)) + [None] * 44)
        self.lib.add(self.first, a, visibility='public')
        self.lib.add(self.second, b, visibility='public')
        self.expected = qemu_env.sha256_file(b)
        self.serve()
        r = self.export_cli('add', self.second)
        self.assertEqual(0, r.returncode, r.stderr)
        self.overlay = os.path.join(self.tmp, 'disk.qcow2')
        subprocess.run([qemu_env.SYSTEM_QEMU_IMG, 'create', '-q', '-f',
                        'qcow2', '-b', self.uri(self.second), '-F', 'raw',
                        self.overlay], check=True)
        self.bases = {i: qemu_env.sha256_file(self.svc.base_file(i))
                      for i in (self.first, self.second)}

    def boot(self, args, wait=True, timeout=240):
        name = 'vmar-test-%s' % uuid.uuid4().hex[:8]
        console = os.path.join(self.tmp, name + '.log')
        xml = os.path.join(self.tmp, name + '.xml')
        with open(xml, 'w') as f:
            f.write(GUEST_XML.format(name=name, guest=self.guest,
                                     args=args, overlay=self.overlay,
                                     console=console))
        qemu_env.run_domain(self, name, xml, console, wait, timeout)
        return name, console

    _tail = staticmethod(qemu_env.console_tail)
    lines = staticmethod(qemu_env.console_lines)

    def test_boot_read_write_reboot(self):
        _name, console = self.boot('vmar.write=8192')
        self.assertEqual(['ok'], self.lines(console, 'VMAR-WROTE'))
        sums = self.lines(console, 'VMAR-SHA256')
        self.assertEqual(1, len(sums), self._tail(console))
        # the guest saw the image with its one written block
        with open(os.path.join(self.images, 'b.raw'), 'rb') as f:
            data = bytearray(f.read())
        marker = b'vmar-marker-8192'.ljust(4096, b'\0')
        data[8192:8192 + 4096] = marker
        import hashlib
        self.assertEqual(hashlib.sha256(data).hexdigest(), sums[0])
        # the write is in the overlay, the bases are untouched
        for i, digest in self.bases.items():
            self.assertEqual(digest,
                             qemu_env.sha256_file(self.svc.base_file(i)))
        # a second boot reads the write back
        _name, console = self.boot('vmar.readback=8192')
        self.assertEqual(['ok'], self.lines(console, 'VMAR-READBACK'))

    def test_unwritten_disk_reads_as_the_image(self):
        _name, console = self.boot('')
        self.assertEqual([self.expected], self.lines(console, 'VMAR-SHA256'))

    def test_daemon_killed_while_the_guest_reads(self):
        name, console = self.boot('vmar.loop=1', wait=False)
        deadline = time.time() + 240
        while len(self.lines(console, 'VMAR-SHA256')) < 1:
            self.assertLess(time.time(), deadline, self._tail(console))
            time.sleep(0.5)
        os.kill(self.qsd_pid(), signal.SIGKILL)
        # vmar-export restarts the daemon and restores the export
        deadline = time.time() + 60
        while True:
            r = subprocess.run(
                [qemu_env.SYSTEM_QEMU_IMG, 'info', '-f', 'raw',
                 self.uri(self.second)], capture_output=True)
            if r.returncode == 0:
                break
            self.assertLess(time.time(), deadline, 'export not restored')
            time.sleep(0.2)
        # the guest may have paused on a read error (rerror=stop): resume
        # it, as Nova's power-state sync or an operator would
        before = len(self.lines(console, 'VMAR-SHA256'))
        deadline = time.time() + 300
        while len(self.lines(console, 'VMAR-SHA256')) < before + 2:
            state = qemu_env.virsh('domstate', '--reason', name).stdout
            if 'paused' in state:
                qemu_env.virsh('resume', name, check=False)
            self.assertLess(time.time(), deadline, self._tail(console))
            time.sleep(1)
        sums = self.lines(console, 'VMAR-SHA256')
        self.assertEqual([self.expected] * len(sums), sums)
