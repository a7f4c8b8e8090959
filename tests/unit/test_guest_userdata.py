"""vmar-guest-userdata: the cloud-config that installs the component."""

import base64
import gzip
import os

import fixtures
import testtools
import yaml

from vmar_openstack.cmd import guest as guest_cmd
from vmar_openstack import exception
from vmar_openstack.guest import status as guest_status
from vmar_openstack.guest import userdata


class TestUserData(testtools.TestCase):

    def test_installs_the_binary_and_enables_the_unit(self):
        binary = b'\x7fELF' + bytes(range(256)) * 8
        text = userdata.make(binary)
        self.assertTrue(text.startswith('#cloud-config\n'))
        doc = yaml.safe_load(text)
        files = {f['path']: f for f in doc['write_files']}
        exe = files['/usr/local/sbin/vmar-guest']
        self.assertEqual(('0755', 'gz+b64'), (exe['permissions'],
                                              exe['encoding']))
        self.assertEqual(binary, gzip.decompress(
            base64.b64decode(exe['content'])))
        with open(userdata.UNIT) as f:
            self.assertEqual(
                f.read(),
                files['/etc/systemd/system/vmar-guest.service']['content'])
        self.assertIn(['systemctl', 'enable', '--now', 'vmar-guest.service'],
                      doc['runcmd'])

    def test_too_big_for_nova_is_refused(self):
        binary = os.urandom(60000)      # does not compress
        e = self.assertRaises(exception.GuestUserDataError, userdata.make,
                              binary)
        self.assertIn('at most 65535', str(e))

    def test_the_shipped_source_builds_and_fits(self):
        text = userdata.make(userdata.build())
        self.assertLess(len(base64.b64encode(text.encode())),
                        userdata.NOVA_USER_DATA_MAX)

    def test_command_reports_a_missing_compiler(self):
        err = self.useFixture(fixtures.StringStream('stderr'))
        self.useFixture(fixtures.MonkeyPatch('sys.stderr', err.stream))
        self.assertEqual(1, guest_cmd.main(['--cc', '/nonexistent/cc']))
        err.stream.flush()
        self.assertIn('/nonexistent/cc failed', err.getDetails()[
            'stderr'].as_text())

    def test_command_writes_the_file(self):
        path = os.path.join(self.useFixture(
            fixtures.TempDir()).path, 'ud.yaml')
        exe = path + '.bin'
        with open(exe, 'wb') as f:
            f.write(b'binary')
        self.assertEqual(0, guest_cmd.main(['--binary', exe, '-o', path]))
        with open(path) as f:
            doc = yaml.safe_load(f)
        self.assertEqual(b'binary', gzip.decompress(base64.b64decode(
            doc['write_files'][0]['content'])))


class TestStatus(testtools.TestCase):
    """The host side's reading of vmar-guest's status line."""

    def test_a_console_line_around_the_status(self):
        c = guest_status.parse(
            'VMAR-WORKLOAD-LOOP 3 192962456 3118244055 passes=7 tracked=2 '
            'events=80 dropped_bytes=4096 cpu_user_s=0.250000 '
            'cpu_sys_s=1.500000')
        self.assertEqual((7, 80, 4096), (c['passes'], c['events'],
                                         c['dropped_bytes']))
        self.assertEqual(1.75, guest_status.cpu_seconds(c))
        self.assertEqual(0, c['walks'])

    def test_close_counters(self):
        c = guest_status.parse('passes=3 closes=20 close_drops=4')
        self.assertEqual((20, 4), (c['closes'], c['close_drops']))

    def test_a_garbled_value_is_zero_not_an_error(self):
        # a kernel message printed into the middle of a console line
        c = guest_status.parse(
            'passes=7 drops=5 cpu_user_s=0.25[   12.345678] virtio_blk '
            'cpu_sys_s=1.500000')
        self.assertEqual((0, 1.5, 5), (c['cpu_user_s'], c['cpu_sys_s'],
                                       c['drops']))

    def test_no_status_yet_is_all_zero(self):
        path = os.path.join(self.useFixture(fixtures.TempDir()).path, 'st')
        self.assertEqual(set(guest_status.COUNTERS),
                         set(guest_status.read(path)))
        self.assertFalse(any(guest_status.read(path).values()))
