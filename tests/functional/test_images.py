"""The Debian image library boots by itself.

Each image of tools/build-image-library.sh has an MBR, SYSLINUX, the
Debian cloud kernel and systemd, and prints ``VMAR-BOOTED <name>
<seconds>`` on its serial console once multi-user.target is reached.
One image (minbase) is booted here under TCG with the stock Debian QEMU,
through tools/boot_image.py, the helper the cloud test reuses.
"""

import os
import subprocess

import fixtures
import testtools

from tools import boot_image
from tools.vmarenv import qemu_env


class TestParseMarker(testtools.TestCase):

    def test_marker_in_a_console_log(self):
        text = ('[  OK  ] Reached target multi-user.target\r\n'
                'VMAR-BOOTED nginx 34.56\r\n')
        self.assertEqual(('nginx', 34.56), boot_image.parse_marker(text))

    def test_no_marker(self):
        self.assertIsNone(boot_image.parse_marker('VMAR-BOOTED\n'))


class TestBootImage(testtools.TestCase):

    def test_minbase_boots_to_its_marker(self):
        image = qemu_env.image_library()['minbase']
        out = subprocess.run(['sfdisk', '--dump', image],
                             capture_output=True, text=True, check=True)
        self.assertIn('label: dos', out.stdout)
        self.assertIn('bootable', out.stdout)
        tmp = self.useFixture(fixtures.TempDir()).path
        console = os.path.join(tmp, 'console.log')
        result = boot_image.boot(image, console, timeout=240)
        self.assertEqual('minbase', result['name'])
        self.assertGreater(result['uptime'], 0)
        log = boot_image.read_console(console)
        # SYSLINUX from the image loaded the cloud kernel, which logged on
        # ttyS0 before the marker (systemd's own status lines may stop once
        # the serial getty owns the console, so they are not checked)
        self.assertIn('SYSLINUX', log)
        self.assertRegex(log, r'Linux version \S+-cloud-amd64')
        self.assertLess(log.index('SYSLINUX'), log.index('Linux version'))
        self.assertLess(log.index('Linux version'),
                        log.index('VMAR-BOOTED minbase'))

    def test_application_starts_when_the_host_asks(self):
        # bench/bench_apps.py's setting: the application does not start at
        # boot; the probe starts it after the marker and reports its first
        # answer
        image = qemu_env.image_library()['nginx']
        tmp = self.useFixture(fixtures.TempDir()).path
        console = os.path.join(tmp, 'console.log')
        result = boot_image.boot(
            image, console, timeout=300, oem=['vmar-test:app=1'],
            until=[r'VMAR-APP-START (\S+)', r'VMAR-APP(-ERROR)? (\S+) (\S+)'])
        (start, t_start), (end, t_end) = result['until']
        self.assertEqual('nginx', start.group(1))
        self.assertIsNone(end.group(1), end.group(0))
        self.assertEqual('nginx', end.group(2))
        self.assertGreater(int(end.group(3)), 0)
        self.assertLessEqual(result['wall'], t_start)
        self.assertLessEqual(t_start, t_end)
        # the probe checked that nginx was not running before it started
        # it (else VMAR-APP-ERROR), and it ran once started
        self.assertRegex(boot_image.read_console(console),
                         r'VMAR-APP nginx [0-9]+')
