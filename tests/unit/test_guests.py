"""The export daemon's guest channels and the auto policy.

(vmar_openstack/host/guests/channels.py.)

The guests' side here is a unix socket server in the test that speaks
vmar-guest's line protocol (a test double of QEMU's chardev and the guest
behind it); tests/functional/test_guest_channel.py runs the real QEMU and
the real vmar-guest in a guest.
"""

import mmap
import os
import socket
import subprocess
import sys
import threading
import time
from unittest import mock
import uuid

import fixtures
from oslo_config import fixture as config_fixture
import testtools

from vmar_openstack import conf as vmar_conf
from vmar_openstack.host.guests import channels as guests
from vmar_openstack.host.observe import metrics as export_metrics
from vmar_openstack import names

MIB = 1 << 20

STATUS = ('mode=%s passes=3 tracked=2 events=9 closes=4 walks=1 '
          'walked_files=7 drops=5 close_drops=4 dropped_bytes=%d '
          'mincores=9 syscalls=99 table_full=0 compactions=0 switches=%d '
          'reporting_order=0 mem_free_kb=1000 refaulted_bytes=%d '
          'cpu_user_s=0.010000 cpu_sys_s=0.020000\n')


class TestPolicy(testtools.TestCase):

    def policy(self, **kw):
        args = dict(high=10.0, low=1.0, min_available=0, calm=60)
        args.update(kw)
        return guests.Policy(**args)

    def test_pressure_turns_auto_private_and_calm_turns_it_back(self):
        p = self.policy()
        self.assertEqual('default', p.decide(guests.Sample(5.0, None), 0))
        self.assertEqual('private', p.decide(guests.Sample(10.0, None), 5))
        # between the thresholds: no change either way
        self.assertEqual('private', p.decide(guests.Sample(5.0, None), 10))
        self.assertEqual('private', p.decide(guests.Sample(0.5, None), 15))
        self.assertEqual('private', p.decide(guests.Sample(0.5, None), 74))
        self.assertEqual('default', p.decide(guests.Sample(0.5, None), 75))
        self.assertEqual(75, p.changed_at)

    def test_a_spike_during_the_calm_starts_it_again(self):
        p = self.policy()
        p.decide(guests.Sample(20.0, None), 0)
        p.decide(guests.Sample(0.0, None), 10)
        p.decide(guests.Sample(3.0, None), 50)       # not calm, not pressed
        p.decide(guests.Sample(0.0, None), 60)
        self.assertEqual('private', p.decide(guests.Sample(0.0, None), 119))
        self.assertEqual('default', p.decide(guests.Sample(0.0, None), 120))

    def test_no_calm_period_leaves_at_once(self):
        p = self.policy(calm=0)
        p.decide(guests.Sample(20.0, None), 0)
        self.assertEqual('default', p.decide(guests.Sample(0.0, None), 1))

    def test_the_watermark_acts_without_stalls(self):
        p = self.policy(min_available=100 << 20)
        self.assertEqual('private',
                         p.decide(guests.Sample(0.0, 50 << 20), 0))
        self.assertEqual('private',
                         p.decide(guests.Sample(0.0, 50 << 20), 500))
        p.decide(guests.Sample(0.0, 200 << 20), 501)
        self.assertEqual('default',
                         p.decide(guests.Sample(0.0, 200 << 20), 561))

    def test_an_unreadable_pressure_is_no_pressure(self):
        p = self.policy()
        self.assertEqual('default', p.decide(guests.Sample(None, None), 0))


class TestGuestPressure(testtools.TestCase):

    MIB = 1 << 20

    def status(self, refaulted=0, dropped=0, free_mib=40):
        return {'refaulted_bytes': refaulted * self.MIB,
                'dropped_bytes': dropped * self.MIB,
                'mem_free_kb': free_mib * 1024}

    def test_a_thrashing_guest_is_pressed_until_its_reads_fit(self):
        p = guests.GuestPressure(refault_rate=self.MIB, calm=30)
        p.add(0, self.status(refaulted=0))
        self.assertFalse(p.pressed('default', 0))
        p.add(5, self.status(refaulted=2))         # 0.4 MiB/s: not yet
        self.assertFalse(p.pressed('default', 5))
        p.add(10, self.status(refaulted=20))       # 3.6 MiB/s
        self.assertTrue(p.pressed('default', 10))
        # private now: it drops 100 MiB of base data every 5 s, far more
        # than its 40 MiB free, however long
        for t in range(15, 200, 5):
            p.add(t, self.status(refaulted=20, dropped=20 * t))
            self.assertTrue(p.pressed('private', t), t)
        # it stops reading after 195 s: a calm later, back
        for t in range(200, 221, 5):
            p.add(t, self.status(refaulted=20, dropped=20 * 195))
            self.assertTrue(p.pressed('private', t), t)
        p.add(225, self.status(refaulted=20, dropped=20 * 195))
        self.assertFalse(p.pressed('private', 225))

    def test_refaults_while_private_do_not_count(self):
        p = guests.GuestPressure(refault_rate=self.MIB, calm=30)
        p.add(0, self.status(refaulted=0))
        p.add(5, self.status(refaulted=50))
        self.assertFalse(p.pressed('private', 5))

    def test_off_when_the_rate_is_zero(self):
        p = guests.GuestPressure(refault_rate=0, calm=30)
        p.add(0, self.status(refaulted=0))
        p.add(5, self.status(refaulted=500))
        self.assertFalse(p.pressed('default', 5))


class TestReaders(testtools.TestCase):

    def write(self, text):
        path = os.path.join(self.useFixture(fixtures.TempDir()).path, 'f')
        with open(path, 'w') as f:
            f.write(text)
        return path

    def test_psi(self):
        self.assertEqual(12.5, guests.read_psi(self.write(
            'some avg10=12.50 avg60=3.00 avg300=1.00 total=99\n'
            'full avg10=1.00 avg60=0.00 avg300=0.00 total=9\n')))

    def test_psi_missing_or_garbled(self):
        self.assertIsNone(guests.read_psi('/nonexistent/pressure'))
        self.assertIsNone(guests.read_psi(self.write('some avg60=1\n')))

    def test_the_hosts_psi_reads(self):
        if not os.path.exists('/proc/pressure/memory'):
            self.skipTest('this kernel has no PSI')
        self.assertIsInstance(guests.read_psi('/proc/pressure/memory'),
                              float)

    def test_meminfo(self):
        self.assertEqual(2048 * 1024, guests.read_meminfo(self.write(
            'MemTotal: 9999 kB\nMemAvailable:     2048 kB\n')))
        self.assertIsNone(guests.read_meminfo(self.write('MemTotal: 1 kB\n')))

    def test_a_process_status_read_once(self):
        self.assertEqual(
            {'VmRSS': 4096, 'VmHWM': 8192, 'RssAnon': None},
            guests.read_kb_fields(self.write(
                'Name: qemu\nVmHWM:\t   8 kB\nVmRSS:\t   4 kB\n'),
                'VmRSS', 'VmHWM', 'RssAnon'))
        self.assertEqual({'VmRSS': None},
                         guests.read_kb_fields('/proc/0/none', 'VmRSS'))


class TestGuestRam(testtools.TestCase):
    """The guest RAM of a process: its large writable mappings only."""

    def test_resident_bytes_of_large_writable_mappings(self):
        before = guests.guest_ram_resident(os.getpid()) or 0
        ram = mmap.mmap(-1, guests.RAM_MAPPING_MIN)
        self.addCleanup(ram.close)
        # a large mapping the process cannot write is not guest RAM
        ro = mmap.mmap(-1, guests.RAM_MAPPING_MIN, prot=mmap.PROT_READ)
        self.addCleanup(ro.close)
        for off in range(0, 8 * MIB, mmap.PAGESIZE):
            ram[off] = 1
        self.assertEqual(before + 8 * MIB,
                         guests.guest_ram_resident(os.getpid()))
        # what free page reporting does: the pages go back to the host
        ram.madvise(mmap.MADV_DONTNEED, 0, 2 * MIB)
        self.assertEqual(before + 6 * MIB,
                         guests.guest_ram_resident(os.getpid()))

    def test_a_process_without_guest_ram(self):
        self.assertIsNone(guests.guest_ram_resident(1 << 30))


class TestQemuOf(testtools.TestCase):
    """Which process is a server's QEMU: the one naming it, as libvirt's."""

    def qemu(self, instance):
        """A process with a command line like a QEMU libvirt started."""
        p = subprocess.Popen([sys.executable, '-c', 'import time; '
                              'time.sleep(60)', '-uuid', instance])
        self.addCleanup(p.wait)
        self.addCleanup(p.kill)
        for _ in range(200):        # until it has exec'd
            if guests._runs(p.pid, instance.encode()):
                return p.pid
            time.sleep(0.01)
        self.fail('the stand-in QEMU did not start')

    def test_the_peer_when_it_names_the_server(self):
        instance = str(uuid.uuid4())
        pid = self.qemu(instance)
        self.assertEqual(pid, guests.qemu_of(instance, pid))

    def test_the_process_naming_the_server_over_another_peer(self):
        # SO_PEERCRED names whoever called listen(): here not the QEMU
        instance = str(uuid.uuid4())
        pid = self.qemu(instance)
        self.assertEqual(pid, guests.qemu_of(instance, os.getpid()))
        self.assertEqual(pid, guests.qemu_of(instance, 1 << 30))

    def test_the_peer_when_no_process_names_the_server(self):
        self.assertEqual(os.getpid(),
                         guests.qemu_of(str(uuid.uuid4()), os.getpid()))
        self.assertIsNone(guests.qemu_of(str(uuid.uuid4())))


class TestLookingForTheQemu(testtools.TestCase):
    """A channel looks for its QEMU again rarely, never for its own."""

    def channel(self, pid):
        ch = guests.Channel('/nowhere', (str(uuid.uuid4()), 'private'),
                            None)
        ch.sock, ch.pid = object(), pid
        return ch

    def test_at_most_every_stale_seconds(self):
        ch = self.channel(1 << 30)          # no such process: no RAM
        calls = []
        now = [1000.0]
        self.useFixture(fixtures.MockPatch(
            'vmar_openstack.host.guests.channels.qemu_of',
            side_effect=lambda inst, pid: calls.append(pid) or pid))
        self.useFixture(fixtures.MockPatch(
            'vmar_openstack.host.guests.channels.time.monotonic',
            side_effect=lambda: now[0]))
        ch.sample_memory()
        now[0] += guests.STALE - 1
        ch.sample_memory()
        self.assertEqual(1, len(calls))
        now[0] += 1
        ch.sample_memory()
        self.assertEqual(2, len(calls))

    def test_not_for_the_qemu_naming_the_server(self):
        ch = self.channel(None)
        p = subprocess.Popen([sys.executable, '-c', 'import time; '
                              'time.sleep(60)', '-uuid', ch.instance])
        self.addCleanup(p.wait)
        self.addCleanup(p.kill)
        for _ in range(200):
            if guests._runs(p.pid, ch.instance.encode()):
                break
            time.sleep(0.01)
        ch.pid = p.pid                      # a small process: no RAM
        with mock.patch.object(guests, 'qemu_of') as looked:
            ch.sample_memory()
        self.assertIsNone(ch.ram)
        looked.assert_not_called()


class TestReconnect(testtools.TestCase):
    """A channel connected again keeps its QEMU's peak, if the same QEMU."""

    def setUp(self):
        super().setUp()
        tmp = self.useFixture(fixtures.TempDir()).path
        self.path = os.path.join(tmp, 'channel.sock')
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(self.server.close)
        self.server.bind(self.path)
        self.server.listen(4)
        self.ch = guests.Channel(self.path, (str(uuid.uuid4()), 'private'),
                                 None)
        self.addCleanup(self.ch.close)

    def connect(self, qemu_pid):
        """Connect again (as a silent channel is), to ``qemu_pid``."""
        self.ch.close()
        with mock.patch.object(guests, 'qemu_of', return_value=qemu_pid):
            self.assertTrue(self.ch.connect(now=0))
        self.server.accept()[0].close()

    def sleeper(self):
        """A process of its own (a stand-in QEMU); its pid."""
        p = subprocess.Popen([sys.executable, '-c',
                              'import time; time.sleep(60)'])
        self.addCleanup(p.wait)
        self.addCleanup(p.kill)
        return p.pid

    def test_the_same_qemu_keeps_its_peak(self):
        qemu = self.sleeper()
        self.connect(qemu)
        self.ch.ram, self.ch.ram_peak = 100 * MIB, 150 * MIB
        self.connect(qemu)
        self.assertEqual((qemu, 100 * MIB, 150 * MIB),
                         (self.ch.pid, self.ch.ram, self.ch.ram_peak))

    def test_another_qemu_starts_anew(self):
        self.connect(self.sleeper())
        self.ch.ram, self.ch.ram_peak = 100 * MIB, 150 * MIB
        other = self.sleeper()
        self.connect(other)
        self.assertEqual((other, None, None),
                         (self.ch.pid, self.ch.ram, self.ch.ram_peak))

    def test_a_pid_used_again_is_another_qemu(self):
        qemu = self.sleeper()
        self.connect(qemu)
        self.ch.ram, self.ch.ram_peak = 100 * MIB, 150 * MIB
        started = guests._started(qemu)
        self.assertIsNotNone(started)
        with mock.patch.object(guests, '_started',
                               return_value=started + 1):
            self.connect(qemu)
        self.assertEqual((None, None), (self.ch.ram, self.ch.ram_peak))


class FakeGuest:
    """A guest's channel as QEMU serves it: one client at a time.

    What the daemon writes is recorded; status lines go back on request.
    """

    def __init__(self, path):
        self.path = path
        self.lines = []
        self.conn = None
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(1)
        self.got = threading.Event()
        self.connected = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        try:
            conn, _ = self.server.accept()
        except OSError:                 # closed before the daemon came
            return
        self.conn = conn
        self.connected.set()
        buf = b''
        while True:
            data = conn.recv(4096)
            if not data:
                return
            buf += data
            *lines, buf = buf.split(b'\n')
            self.lines += [x.decode() for x in lines]
            self.got.set()

    def accept_again(self):
        """Serve the next client (after the daemon hung up)."""
        self.connected.clear()
        threading.Thread(target=self._serve, daemon=True).start()

    def say(self, mode, dropped=0, switches=0, refaulted=0):
        assert self.connected.wait(5), 'the daemon never connected'
        self.conn.sendall((STATUS % (mode, dropped, switches,
                                     refaulted)).encode())

    def close(self):
        if self.conn:
            self.conn.close()
        self.server.close()


class TestGuests(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.dir = self.useFixture(fixtures.TempDir()).path
        self.psi = os.path.join(self.dir, 'pressure')
        self.pressure(0.0)
        self.conf = self.useFixture(config_fixture.Config(vmar_conf.CONF))
        self.conf.config(channel_dir=os.path.join(self.dir, 'guests'),
                         pressure_file=self.psi, calm_seconds=30,
                         group='vmar_guest_cache')
        self.guests = guests.Guests(vmar_conf.CONF)
        self.guests.prepare()
        self.addCleanup(self.guests.stop)

    def pressure(self, avg10):
        # a PSI file of the test's own: the policy above is what reads it
        with open(self.psi, 'w') as f:
            f.write('some avg10=%.2f avg60=0.00 avg300=0.00 total=1\n'
                    % avg10)

    def guest(self, mode):
        inst = str(uuid.uuid4())
        g = FakeGuest(os.path.join(self.guests.dir,
                                   names.guest_channel(inst, mode)))
        self.addCleanup(g.close)
        return inst, g

    def wait_line(self, g, n):
        for _ in range(100):
            if len(g.lines) >= n:
                return
            g.got.wait(0.05)
            g.got.clear()
        self.fail('no line %d from the daemon: %s' % (n, g.lines))

    def step_until(self, g, n, now):
        """Step the daemon until ``g`` got ``n`` lines.

        The daemon reads the guest's status lines as they come, as from
        QEMU: a step may come before a line the test sent.
        """
        for _ in range(100):
            g.got.clear()
            self.guests.step(now=now)
            if len(g.lines) >= n:
                return
            g.got.wait(0.05)
        self.fail('no line %d from the daemon: %s' % (n, g.lines))

    def test_the_directory_is_for_qemus_group(self):
        st = os.stat(self.guests.dir)
        self.assertEqual(0o2770, st.st_mode & 0o7777)

    def test_auto_follows_the_pressure_private_always_private(self):
        auto, ga = self.guest('auto')
        private, gp = self.guest('private')
        self.guests.step(now=0)
        self.wait_line(gp, 1)
        self.wait_line(ga, 1)
        # each is told its mode when the daemon connects
        self.assertEqual(['mode=private'], gp.lines)
        self.assertEqual(['mode=default'], ga.lines)
        ga.say('default')
        gp.say('private', dropped=1 << 20)
        self.pressure(50.0)
        self.step_until(ga, 2, now=1)
        self.assertEqual(['mode=default', 'mode=private'], ga.lines)
        ga.say('private', switches=1)
        self.pressure(0.0)
        self.guests.step(now=20)                     # the calm starts
        self.guests.step(now=49)                     # not long enough
        self.assertEqual(2, len(ga.lines))
        self.guests.step(now=50)
        self.wait_line(ga, 3)
        self.assertEqual(['mode=default', 'mode=private', 'mode=default'],
                         ga.lines)
        # the private one said it runs private: it is not asked again
        self.assertEqual(['mode=private'], gp.lines)
        st = {g.instance: g for g in self.guests.snapshot().guests}
        self.assertEqual(('auto', 'private', 'default', 1),
                         (st[auto].flavor_mode, st[auto].mode,
                          st[auto].wanted, st[auto].switches))
        self.assertEqual(('private', 'private', 1 << 20),
                         (st[private].flavor_mode, st[private].mode,
                          st[private].dropped_bytes))
        # the peer is this process: its memory is what the view reads
        self.assertEqual(os.getpid(), st[private].qemu_pid)
        ram = mmap.mmap(-1, guests.RAM_MAPPING_MIN)     # "guest RAM"
        self.addCleanup(ram.close)
        for off in range(0, 4 * MIB, mmap.PAGESIZE):
            ram[off] = 1
        held = self.view(private).resident_bytes
        self.assertGreaterEqual(held, 4 * MIB)
        ram.madvise(mmap.MADV_DONTNEED, 0, MIB)     # reported free pages
        v = self.view(private)
        self.assertEqual((held - MIB, MIB),
                         (v.resident_bytes, v.returned_bytes))

    def view(self, instance):
        return {g.instance: g
                for g in self.guests.snapshot().guests}[instance]

    def test_a_thrashing_auto_guest_goes_private_without_host_pressure(self):
        inst, g = self.guest('auto')
        self.guests.step(now=0)
        self.wait_line(g, 1)                        # mode=default
        g.say('default', refaulted=0)
        self.guests.step(now=5)
        g.say('default', refaulted=50 << 20)        # 10 MiB/s
        self.step_until(g, 2, now=10)
        self.assertEqual(['mode=default', 'mode=private'], g.lines)
        (view,) = self.guests.snapshot().guests
        self.assertEqual(('private', 'guest'), (view.wanted, view.reason))

    def test_garbage_from_a_guest_is_ignored(self):
        _inst, g = self.guest('auto')
        self.guests.step(now=0)
        self.wait_line(g, 1)
        g.connected.wait(5)
        flood = threading.Thread(target=g.conn.sendall, args=(
            b'mode=evil dropped_bytes=9\n' + b'x' * (3 << 20) +
            b'\n\xff\xfe dropped_bytes=7\n',))
        flood.start()
        for t in range(1, 40):
            self.guests.step(now=t)
            if not flood.is_alive():
                break
        flood.join(10)
        self.guests.step(now=40)
        (view,) = self.guests.snapshot().guests
        # no line said a mode: nothing was taken for a status
        self.assertEqual((None, 0), (view.mode, view.dropped_bytes))
        self.assertTrue(view.connected)

    def test_a_guest_that_did_not_answer_is_asked_again_later(self):
        _inst, g = self.guest('private')
        self.guests.step(now=0)
        self.wait_line(g, 1)
        self.guests.step(now=guests.RESEND - 1)
        self.guests.step(now=guests.RESEND)
        self.wait_line(g, 2)
        self.assertEqual(['mode=private'] * 2, g.lines)

    def test_a_silent_connection_is_made_again(self):
        """A connection the guest never speaks on is made again.

        QEMU serves one client at a time; a connection it never served
        (connected, asked, never heard: seen in CI) is closed and made
        again, while a guest that speaks keeps its connection.
        """
        _inst, quiet = self.guest('private')
        self.guests.step(now=0)
        self.wait_line(quiet, 1)
        first = quiet.conn
        self.guests.step(now=guests.SILENT)
        self.assertIs(first, quiet.conn)
        # SILENT is past RESEND: the daemon asked again; the fake's reader
        # takes that line before the test reads the connection's end
        self.wait_line(quiet, 2)
        self.guests.step(now=guests.SILENT + 1)
        # the daemon hung up: the fake QEMU sees the end of its client
        self.assertEqual(b'', first.recv(1))
        # and connects again at the next step (QEMU takes it)
        quiet.accept_again()
        self.guests.step(now=guests.SILENT + 2)
        self.assertTrue(quiet.connected.wait(5))
        self.assertIsNot(first, quiet.conn)
        # a guest that speaks is not disturbed
        _inst, talker = self.guest('private')
        self.guests.step(now=100)
        talker.say('private')
        self.step_until(talker, 1, now=100)
        conn = talker.conn
        for t in range(110, 300, 20):
            talker.say('private')
            self.guests.step(now=t)
            time.sleep(0.05)
            self.guests.step(now=t)
        self.assertIs(conn, talker.conn)

    def test_a_gone_qemu_drops_its_channel(self):
        _inst, g = self.guest('private')
        self.guests.step(now=0)
        self.assertEqual(1, len(self.guests.snapshot().guests))
        g.close()
        os.unlink(g.path)
        self.guests.step(now=1)
        self.assertEqual([], self.guests.snapshot().guests)

    def test_a_stale_socket_is_removed_once_old(self):
        path = os.path.join(self.guests.dir, names.guest_channel(
            str(uuid.uuid4()), 'auto'))
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(path)
        s.close()                       # nobody listens: QEMU is gone
        self.guests.step(now=0)
        self.assertTrue(os.path.exists(path))     # QEMU may be starting
        old = os.stat(path).st_mtime - guests.STALE - 1
        os.utime(path, (old, old), follow_symlinks=False)
        self.guests.step(now=1)
        self.assertFalse(os.path.exists(path))

    def test_other_files_are_left_alone(self):
        other = os.path.join(self.guests.dir, 'notes.txt')
        open(other, 'w').close()
        self.guests.step(now=0)
        self.assertTrue(os.path.exists(other))
        self.assertEqual([], self.guests.snapshot().guests)

    def test_new_thresholds_take_effect_at_the_next_step(self):
        # what a SIGHUP's mutate_config_files does to mutable options
        self.assertEqual(10.0, self.guests.policy.high)
        self.conf.config(pressure_high=30.0, min_available_mb=100,
                         calm_seconds=5, group='vmar_guest_cache')
        self.guests.step(now=0)
        p = self.guests.policy
        self.assertEqual((30.0, 100 << 20, 5),
                         (p.high, p.min_available, p.calm))
        # a bad pair is refused and the thresholds of before are kept
        logs = self.useFixture(fixtures.FakeLogger())
        self.conf.config(pressure_low=50.0, group='vmar_guest_cache')
        self.guests.step(now=1)
        self.assertEqual(30.0, self.guests.policy.high)
        self.assertIn('pressure_low', logs.output)

    def test_thresholds_that_cannot_work_are_refused(self):
        self.conf.config(pressure_low=20.0, pressure_high=10.0,
                         group='vmar_guest_cache')
        self.assertRaises(ValueError, guests.Guests, vmar_conf.CONF)


class TestNames(testtools.TestCase):

    def test_round_trip(self):
        inst = str(uuid.uuid4())
        for mode in ('private', 'auto'):
            self.assertEqual((inst, mode), names.parse_guest_channel(
                names.guest_channel(inst, mode)))

    def test_refused(self):
        self.assertRaises(ValueError, names.guest_channel,
                          str(uuid.uuid4()), 'default')
        self.assertRaises(ValueError, names.guest_channel, 'x', 'auto')
        self.assertIsNone(names.parse_guest_channel('x.auto.sock'))


class TestMetrics(testtools.TestCase):

    def test_each_server_is_a_labelled_sample(self):
        view = guests.GuestStatus(
            'i-1', 'auto', True, 'private', 'private', 'host', 1.0, 123,
            100, 50, 10, 1, 0, 0.1)
        silent = guests.GuestStatus(
            'i-2', 'private', False, None, 'private', 'flavor', None, None,
            None, None, 0, 0, None, 0.0)
        families = {f.name: f for f in export_metrics._guest_metrics(
            guests.GuestCacheStatus('private', None, 1 << 30,
                                    [view, silent]))}
        self.assertNotIn('vmar_guest_cache_memory_pressure', families)
        self.assertEqual(1, families['vmar_guest_cache_auto_private']
                         .samples[0].value)

        def values(name):
            return {s.labels['instance']: s.value
                    for s in families[name].samples}
        self.assertEqual({'i-1': 1, 'i-2': 0}, values('vmar_guest_private'))
        # a guest not heard from has no memory figures, not zeros
        self.assertEqual({'i-1': 50}, values('vmar_guest_returned_bytes'))
        self.assertEqual({'i-1': 100}, values('vmar_guest_resident_bytes'))
