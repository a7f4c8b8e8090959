"""The guest channel on the real thing: QEMU, a library guest, vmar-guest.

A minbase guest boots under QEMU (TCG) the way Nova's vmar backend builds
an ``auto`` server: the SMBIOS OEM string ``vmar:guest_cache=auto``, a
virtio balloon with free page reporting, and the virtio-serial port
``org.opendev.vmar.guest.0`` on a unix socket that QEMU binds in the
channel directory. The export daemon's guest channels
(:class:`vmar_openstack.host.guests.channels.Guests`) then run as the
daemon runs them, once per configuration an operator would give it:

* ``pressure_high = 100``: no pressure can reach it, the guest is left in
  its own caching;
* ``pressure_high = 0`` ("every auto server guest-private at once"): the
  guest switches without a restart, lowers its page reporting order and
  drops the base data its boot cached, and the host sees the memory come
  back from its QEMU;
* ``pressure_high = 100`` again, with no calm period: back, with the
  guest kernel's reporting order restored.

tests/functional/test_cloud.py (``guest_auto``) raises real memory
pressure against Nova's servers.
"""

import os
import subprocess
import tempfile
import time
import uuid

from oslo_config import fixture as config_fixture
import testtools

from tools import boot_image
from tools.vmarenv import qemu_env
from vmar_openstack import conf as vmar_conf
from vmar_openstack.host.guests import channels as guests
from vmar_openstack import names

MIB = 1 << 20


@testtools.skipUnless(os.path.exists(boot_image.QEMU), 'no QEMU')
class TestGuestChannel(testtools.TestCase):

    def setUp(self):
        super().setUp()
        image = qemu_env.image_library()['minbase']
        self.dir = tempfile.mkdtemp(prefix='vmar-ch-', dir='/var/tmp')
        self.addCleanup(subprocess.run, ['rm', '-rf', self.dir])
        self.conf = self.useFixture(config_fixture.Config(vmar_conf.CONF))
        self.conf.config(channel_dir=os.path.join(self.dir, 'guests'),
                         calm_seconds=0, group='vmar_guest_cache')
        guests.Guests(vmar_conf.CONF).prepare()
        self.instance = str(uuid.uuid4())
        sock = os.path.join(self.dir, 'guests',
                            names.guest_channel(self.instance, 'auto'))
        self.console = os.path.join(self.dir, 'console')
        cmd = boot_image.qemu_command(image, self.console, memory=512) + [
            '-smbios', 'type=11,value=vmar:guest_cache=auto',
            '-device', 'virtio-balloon-pci,free-page-reporting=on',
            '-chardev', 'socket,id=vmar,path=%s,server=on,wait=off' % sock,
            '-device', 'virtio-serial-pci',
            '-device', 'virtserialport,chardev=vmar,name=%s'
            % names.GUEST_CHANNEL_PORT]
        self.qemu = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        self.addCleanup(self.qemu.wait)
        self.addCleanup(self.qemu.kill)
        self.wait_for('VMAR-BOOTED', lambda: boot_image.parse_marker(
            boot_image.read_console(self.console)), timeout=600)

    def wait_for(self, what, probe, timeout=120):
        deadline = time.monotonic() + timeout
        while True:
            result = probe()
            if result:
                return result
            if time.monotonic() > deadline:
                self.fail('timed out waiting for %s; console:\n%s' % (
                    what, boot_image.read_console(self.console)[-3000:]))
            time.sleep(1)

    def daemon(self, pressure_high):
        """The daemon's guest channels, configured as an operator would."""
        self.conf.config(pressure_high=pressure_high,
                         pressure_low=min(1.0, pressure_high),
                         group='vmar_guest_cache')
        g = guests.Guests(vmar_conf.CONF)
        self.addCleanup(g.stop)
        return g

    def view(self, daemon, mode, switches, extra=lambda v: True):
        """Step ``daemon`` until the guest reports ``mode``; its view."""
        def probe():
            daemon.step()
            for v in daemon.snapshot().guests:
                if (v.instance == self.instance and v.mode == mode and
                        v.switches >= switches and extra(v)):
                    return v
            return None
        return self.wait_for('the guest in %s mode' % mode, probe)

    def test_the_host_switches_the_guest_and_gets_memory_back(self):
        calm = self.daemon(100.0)
        v = self.view(calm, 'default', 0)
        self.assertEqual(('auto', 'default', 0), (v.flavor_mode, v.wanted,
                                                  v.dropped_bytes))
        self.assertEqual(self.qemu.pid, v.qemu_pid)
        kernel_order = v.reporting_order
        self.assertGreater(kernel_order, 0)
        self.assertIn('off until it asks',
                      boot_image.read_console(self.console))
        calm.stop()

        # an operator's "every auto server private": the same QEMU, told
        # at run time; what the boot cached of base data goes
        pressed = self.daemon(0.0)
        v = self.view(pressed, 'private', 1,
                      lambda v: v.returned_bytes >= 8 * MIB)
        self.assertEqual((0, 'private'), (v.reporting_order, v.wanted))
        self.assertGreater(v.dropped_bytes, 8 * MIB)
        self.assertIn('guest-private caching of /',
                      boot_image.read_console(self.console))
        pressed.stop()

        back = self.daemon(100.0)
        v = self.view(back, 'default', 2)
        self.assertEqual(kernel_order, v.reporting_order)
        self.assertIn('guest-private caching off',
                      boot_image.read_console(self.console))
