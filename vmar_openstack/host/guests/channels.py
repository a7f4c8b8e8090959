"""Guest-private caching from the host: the guests' channels, and the
mode of ``vmar:guest_cache=auto`` servers.

Every guest-private (``private``) and ``auto`` server has a virtio-serial
channel to its guest component, vmar-guest: QEMU listens on a unix socket
in ``[vmar_guest_cache] channel_dir`` named after the server and its
flavor's mode (:func:`vmar_openstack.names.guest_channel`), and the export
daemon connects to it. Over it:

* the host writes ``mode=private`` or ``mode=default`` lines; vmar-guest
  starts or stops dropping base data at once, without a restart;
* vmar-guest writes its status line after each pass
  (:mod:`vmar_openstack.guest.status`): the mode it runs in and its
  counters.

The host chooses the mode of ``auto`` servers from memory pressure, the
host's and each guest's own:

* the host's (:class:`Policy`): every auto server is guest-private while
  PSI ``memory.some`` (avg10) is at or over ``pressure_high``, or
  MemAvailable under ``min_available_mb``; the decision stands until the
  pressure stayed under ``pressure_low`` for ``calm_seconds``;
* the guest's (:class:`GuestPressure`): a guest whose page cache is too
  small for what it reads (it refaults ``guest_refault_mb`` a second) is
  guest-private too, whatever the host's memory: its overlay is O_DIRECT,
  so its misses go to the disk, and the base data it drops leaves its
  memory to its private data. It goes back once the base data it dropped
  over ``calm_seconds`` would fit in its free memory.

``private`` servers are always told ``private``.

What the host sees of each server comes from its QEMU (:func:`qemu_of`:
the process at the other end of its socket, ``SO_PEERCRED``, when its
command line names the server; else the QEMU that does): the guest RAM
the host holds (the resident bytes of QEMU's RAM mappings,
:func:`guest_ram_resident`) and what the guest gave back since its peak
(the highest of those the daemon sampled, less now: free page reporting
discards guest pages). Not ``VmHWM - VmRSS``: the QEMU's own memory grows
beside the guest's (under TCG its translation buffer, hundreds of MiB),
which hides what the guest gave back.
"""

import collections
import dataclasses
import os
import socket
import threading
import time

from oslo_log import log as logging

from vmar_openstack import fileutils
from vmar_openstack.guest import status as guest_status
from vmar_openstack import names
from vmar_openstack import periodic

LOG = logging.getLogger(__name__)

PRIVATE, DEFAULT = guest_status.MODES
RESEND = 30             # seconds before telling a guest its mode again
# seconds a connected guest may say nothing before the daemon connects
# again (vmar-guest writes a status line every 5 s): a connection QEMU
# never serves (seen in CI: connected, asked, never heard) is remade
SILENT = 60
STALE = 60              # seconds a refused socket may stay: QEMU starting
READ_MAX = 1 << 20      # bytes read from one guest in one step
RAM_MAPPING_MIN = 128 << 20     # a QEMU mapping this large is guest RAM

Sample = collections.namedtuple('Sample', 'some_avg10 available')


def read_psi(path):
    """``some avg10`` of a PSI file, in percent; None if unreadable."""
    try:
        with open(path) as f:
            for line in f:
                words = line.split()
                if words and words[0] == 'some':
                    return float(dict(w.split('=', 1)
                                      for w in words[1:])['avg10'])
    except (OSError, KeyError, ValueError):
        pass
    return None


def read_kb_fields(path, *keys):
    """Fields in kB of /proc/meminfo (or a file like it), as bytes.

    One read of the file; a field it lacks (or a file that is gone) is
    None.
    """
    found = dict.fromkeys(keys)
    try:
        with open(path) as f:
            for line in f:
                key, _colon, rest = line.partition(':')
                if key in found:
                    found[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return found


def guest_ram_resident(pid):
    """Bytes of a QEMU's guest RAM resident on the host; None if unknown.

    Guest RAM is the process's writable, non-executable mappings of
    RAM_MAPPING_MIN or more (QEMU's RAM blocks; its heap arenas are 64 MiB
    and TCG's translation buffer is executable). One read of
    ``/proc/<pid>/smaps``.
    """
    total, ram, found = 0, False, False
    try:
        with open('/proc/%d/smaps' % pid) as f:
            for line in f:
                if not line[0].isupper():       # a mapping's first line
                    addr, perms = line.split(None, 2)[:2]
                    lo, _dash, hi = addr.partition('-')
                    ram = ('w' in perms and 'x' not in perms and
                           int(hi, 16) - int(lo, 16) >= RAM_MAPPING_MIN)
                    found |= ram
                elif ram and line.startswith('Rss:'):
                    total += int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return total if found else None


def _cmdline(pid):
    """The arguments of a process; () if it is gone."""
    try:
        with open('/proc/%d/cmdline' % pid, 'rb') as f:
            return tuple(f.read().split(b'\0'))
    except OSError:
        return ()


def _started(pid):
    """When process ``pid`` started (clock ticks after boot); None if gone.

    With the pid, it names one process: a pid is reused, never with the
    same start time.
    """
    try:
        with open('/proc/%d/stat' % pid, 'rb') as f:
            # after "(comm)", which may hold spaces: field 22 is the 20th
            return int(f.read().rsplit(b')', 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _runs(pid, uuid):
    """Whether process ``pid`` is the QEMU of the domain ``uuid``."""
    args = _cmdline(pid)
    return any(a == b'-uuid' and b == uuid
               for a, b in zip(args, args[1:]))


def qemu_of(instance, pid=None):
    """The pid of the QEMU that runs server ``instance``.

    ``pid``, the socket's peer, is taken when its command line names the
    server (libvirt gives QEMU ``-uuid``, Nova's instance UUID), or when
    no process's does (a QEMU libvirt did not start); else the process
    whose command line does. ``SO_PEERCRED`` names the process that
    called listen(), which need not be the QEMU that holds the socket
    now: one that opened it and passed it on, or a pid number used again.
    """
    uuid = instance.encode()
    if pid and _runs(pid, uuid):
        return pid
    for name in os.listdir('/proc'):
        if name.isdigit() and _runs(int(name), uuid):
            return int(name)
    return pid


def read_meminfo(path='/proc/meminfo', key='MemAvailable'):
    """One /proc/meminfo field in bytes; None."""
    return read_kb_fields(path, key)[key]


class Policy:
    """When the host turns its auto servers guest-private.

    Hysteresis between two thresholds and a calm period, so that the mode
    does not flip at every sample: a guest back in its own caching fills
    its cache with base data again, which is what raised the pressure.
    """

    def __init__(self, high, low, min_available, calm):
        self.high, self.low = high, low
        self.min_available, self.calm = min_available, calm
        self.mode = DEFAULT
        self.calm_since = None
        self.changed_at = None

    def pressed(self, sample):
        return ((sample.some_avg10 is not None and
                 sample.some_avg10 >= self.high) or
                (self.min_available > 0 and sample.available is not None and
                 sample.available < self.min_available))

    def calm_now(self, sample):
        return ((sample.some_avg10 is None or sample.some_avg10 < self.low)
                and not (self.min_available > 0 and
                         sample.available is not None and
                         sample.available < self.min_available))

    def decide(self, sample, now):
        """The mode auto servers should run in, given this sample."""
        if self.pressed(sample):
            self.calm_since = None
            self._set(PRIVATE, now, sample)
        elif self.mode == PRIVATE:
            if not self.calm_now(sample):
                self.calm_since = None
            else:
                if self.calm_since is None:
                    self.calm_since = now
                if now - self.calm_since >= self.calm:
                    self._set(DEFAULT, now, sample)
        return self.mode

    def _set(self, mode, now, sample):
        if mode != self.mode:
            LOG.info('auto servers go %s: memory pressure %s %%, '
                     'MemAvailable %s MiB', mode, sample.some_avg10,
                     None if sample.available is None
                     else sample.available >> 20)
            self.mode = mode
            self.changed_at = now


class GuestPressure:
    """Whether a guest's own page cache is too small for what it reads.

    Fed the guest's status lines: its refaults (file pages read again soon
    after they were reclaimed) while it runs in its own caching, and the
    base data it drops and the memory it has free while it is private.
    """

    def __init__(self, refault_rate, calm):
        self.rate, self.calm = refault_rate, calm
        self.samples = collections.deque()    # (t, refaulted, dropped, free)
        self.since = None                     # pressed since

    def add(self, now, status):
        self.samples.append((now, status['refaulted_bytes'],
                             status['dropped_bytes'],
                             status['mem_free_kb'] * 1024))
        while (len(self.samples) > 2 and
               now - self.samples[1][0] >= self.calm):
            self.samples.popleft()

    def refault_rate(self):
        """Bytes a second refaulted between the last two status lines."""
        if len(self.samples) < 2:
            return 0.0
        (t0, r0, *_), (t1, r1, *_) = self.samples[-2], self.samples[-1]
        return (r1 - r0) / (t1 - t0) if t1 > t0 else 0.0

    def fits(self, now):
        """Whether what it dropped over the calm would fit in its memory."""
        t0, _r, d0, _f = self.samples[0]
        _t, _r, d1, free = self.samples[-1]
        return now - t0 >= self.calm and d1 - d0 <= free

    def pressed(self, mode, now):
        """Whether the guest should be guest-private, given its ``mode``."""
        if self.rate <= 0 or not self.samples:
            self.since = None
        elif self.since is None:
            if mode == DEFAULT and self.refault_rate() >= self.rate:
                self.since = now
        elif now - self.since >= self.calm and self.fits(now):
            self.since = None
        return self.since is not None


@dataclasses.dataclass
class GuestStatus:
    instance: str
    flavor_mode: str           # private or auto
    connected: bool
    mode: object               # what the guest last said it runs in
    wanted: object             # what the host asks of it
    reason: object             # of a private ask: flavor, host or guest
    heard_ago: object          # seconds since its last status line
    qemu_pid: object
    resident_bytes: object     # its guest RAM the host holds
    returned_bytes: object     # the highest of those sampled, less now
    dropped_bytes: int         # by vmar-guest, cumulative
    switches: int              # of its mode, at run time
    reporting_order: object
    guest_cpu_s: float         # vmar-guest's


@dataclasses.dataclass
class GuestCacheStatus:
    auto_mode: str             # what the policy says for auto servers now
    some_avg10: object
    available_bytes: object
    guests: list


class Channel:
    """The daemon's end of one server's channel."""

    def __init__(self, path, channel, pressure):
        self.path = path
        self.instance, self.flavor_mode = channel
        self.pressure = pressure              # its GuestPressure
        self.sock = None
        self.pid = None
        self.buf = b''
        self.status = guest_status.parse('')
        self.mode = None
        self.heard_at = None
        self.wanted = self.reason = None
        self.sent_mode = self.sent_at = None
        self.ram = self.ram_peak = None
        self.peak_of = None         # (pid, start time) of ram_peak's QEMU
        self.looked_at = None       # when its QEMU was last looked for
        self.connected_at = None
        self.reconnects = 0

    def connect(self, now):
        """Connect to QEMU; False if nobody listens."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(1)
        try:
            s.connect(self.path)
        except OSError:
            s.close()
            return False
        s.setblocking(False)
        peer = fileutils.socket_peer(s)[0]
        self.pid = qemu_of(self.instance, peer)
        qemu = (self.pid, _started(self.pid)) if self.pid else None
        if qemu != self.peak_of:
            # another QEMU (a restart, a move back): its own peak. The
            # same one keeps it: a channel the guest does not answer yet
            # is connected again every SILENT seconds, and what the guest
            # gave back meanwhile is still given back.
            self.ram = self.ram_peak = None
            self.peak_of = qemu
        self.sock = s
        self.connected_at = now
        self.sent_mode = self.sent_at = None
        LOG.info('guest channel of %s (%s) connected, QEMU pid %s%s',
                 self.instance, self.flavor_mode, self.pid,
                 '' if self.pid == peer else
                 ' (the socket\'s peer is pid %d, %r)' % (
                     peer, b' '.join(_cmdline(peer))[:80]))
        return True

    def close(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.pid = None         # a pid of a QEMU that is gone is no one's

    def read(self, now):
        """Take the status lines the guest sent; False once QEMU is gone.

        At most READ_MAX bytes a step: a guest that writes without end
        cannot hold the daemon (what is left waits for the next step).
        """
        for _ in range(READ_MAX // 65536):
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                break
            except OSError:
                data = b''
            if not data:
                self.close()
                return False
            self.buf += data
        *lines, self.buf = self.buf.split(b'\n')
        self.buf = self.buf[-4096:]
        for line in lines:
            text = line.decode('ascii', 'replace')
            mode = guest_status.mode(text)
            if mode is not None:
                self.mode = mode
                self.status = guest_status.parse(text)
                self.heard_at = now
                self.pressure.add(now, self.status)
        return True

    def silent(self, now):
        """Whether the guest said nothing for SILENT seconds.

        On this connection: then it is closed, and made again at the next
        step.
        """
        last = max(self.connected_at, self.heard_at or self.connected_at)
        if now - last <= SILENT:
            return False
        (LOG.info if not self.reconnects else LOG.debug)(
            'guest channel of %s (%s): nothing heard for %.0f s; '
            'connecting again', self.instance, self.flavor_mode, now - last)
        self.reconnects += 1
        self.close()
        self.heard_at = None
        return True

    def sample_memory(self):
        """Read the guest RAM its QEMU holds; keep the highest seen.

        A QEMU whose RAM cannot be read, and whose command line does not
        name the server, is looked for again, at most every STALE seconds
        (every process is read).
        """
        self.ram = guest_ram_resident(self.pid) if self.pid else None
        now = time.monotonic()
        if (self.ram is None and self.sock is not None
                and not (self.pid and _runs(self.pid,
                                            self.instance.encode()))
                and (self.looked_at is None
                     or now - self.looked_at >= STALE)):
            self.looked_at = now
            pid = qemu_of(self.instance, self.pid)
            if pid != self.pid:
                LOG.info('guest channel of %s: its QEMU is pid %s, not %s',
                         self.instance, pid, self.pid)
                self.pid, self.ram_peak = pid, None
                self.peak_of = (pid, _started(pid)) if pid else None
                self.ram = guest_ram_resident(pid) if pid else None
        if self.ram is not None:
            self.ram_peak = max(self.ram_peak or 0, self.ram)

    def want(self, host_mode, now):
        """What to ask of the guest, and why: (mode, reason)."""
        if self.flavor_mode == PRIVATE:
            return PRIVATE, 'flavor'
        guest = self.pressure.pressed(self.mode, now)
        if host_mode == PRIVATE:
            return PRIVATE, 'host'
        return (PRIVATE, 'guest') if guest else (DEFAULT, None)

    def tell(self, wanted, now):
        """Ask the guest for ``wanted`` unless it runs in it already.

        A guest that has not answered is asked again after RESEND
        seconds (its vmar-guest may have started after the first word).
        """
        self.wanted = wanted
        if self.mode == wanted:
            return
        if (self.sent_mode == wanted and self.sent_at is not None and
                now - self.sent_at < RESEND):
            return
        try:
            self.sock.send(('mode=%s\n' % wanted).encode())
        except OSError as e:
            LOG.warning('guest channel of %s: %s', self.instance, e)
            self.close()
            return
        self.sent_mode, self.sent_at = wanted, now
        LOG.info('asked the guest of %s (%s) for %s caching',
                 self.instance, self.flavor_mode, wanted)

    def view(self, now):
        self.sample_memory()
        return GuestStatus(
            self.instance, self.flavor_mode, self.sock is not None,
            self.mode, self.wanted, self.reason,
            None if self.heard_at is None else round(now - self.heard_at, 1),
            self.pid,
            self.ram,
            None if self.ram is None else self.ram_peak - self.ram,
            int(self.status['dropped_bytes']), int(self.status['switches']),
            int(self.status['reporting_order']) if self.mode else None,
            guest_status.cpu_seconds(self.status))


class Guests(periodic.Periodic):
    """The daemon's guest channels and auto policy: one step per interval."""

    name = 'vmar-guests'

    def __init__(self, conf):
        g = conf.vmar_guest_cache
        super().__init__(g.interval)
        self.conf = conf
        self.dir = g.channel_dir
        self.pressure_file = g.pressure_file
        self.policy = Policy(0, 0, 0, 0)
        self.channels = {}
        self.sample = Sample(None, None)
        self.lock = threading.Lock()
        self._configure()

    def prepare(self, gid=None):
        """Create the channel directory QEMU binds its sockets in."""
        os.makedirs(self.dir, exist_ok=True)
        if gid is not None:
            os.chown(self.dir, -1, gid)
        os.chmod(self.dir, 0o2770)

    def _configure(self):
        """Take the thresholds (mutable: they change on SIGHUP)."""
        g = self.conf.vmar_guest_cache
        if g.pressure_low > g.pressure_high:
            raise ValueError('[vmar_guest_cache] pressure_low (%s) is above '
                             'pressure_high (%s)' % (g.pressure_low,
                                                     g.pressure_high))
        p = self.policy
        p.high, p.low = g.pressure_high, g.pressure_low
        p.min_available, p.calm = g.min_available_mb << 20, g.calm_seconds
        self.refault_rate = g.guest_refault_mb * (1 << 20)
        self.calm = g.calm_seconds
        for ch in self.channels.values():
            ch.pressure.rate, ch.pressure.calm = self.refault_rate, self.calm

    def step(self, now=None):
        now = time.monotonic() if now is None else now
        with self.lock:
            try:
                self._configure()
            except ValueError as e:
                LOG.error('%s: keeping the thresholds of before', e)
            self.sample = Sample(read_psi(self.pressure_file),
                                 read_meminfo())
            auto = self.policy.decide(self.sample, now)
            self._scan(now)
            for ch in list(self.channels.values()):
                if ch.sock is None and not ch.connect(now):
                    self._stale(ch.path)    # the next scan drops it
                    continue
                if not ch.read(now) or ch.silent(now):
                    continue
                ch.sample_memory()
                wanted, ch.reason = ch.want(auto, now)
                ch.tell(wanted, now)

    def _scan(self, now):
        try:
            entries = os.listdir(self.dir)
        except FileNotFoundError:
            entries = []
        found = {}
        for name in entries:
            channel = names.parse_guest_channel(name)
            if channel is not None:
                found[os.path.join(self.dir, name)] = channel
        for path in set(self.channels) - set(found):
            self.channels.pop(path).close()
        for path, channel in found.items():
            if path in self.channels:
                continue
            ch = Channel(path, channel,
                         GuestPressure(self.refault_rate, self.calm))
            if not ch.connect(now):
                self._stale(path)
                continue
            self.channels[path] = ch

    def _stale(self, path):
        """Remove a socket nobody listens on, once it is old.

        Its QEMU is gone; a QEMU that is starting binds it first.
        """
        try:
            if time.time() - os.lstat(path).st_mtime > STALE:
                os.unlink(path)
                LOG.info('removed the stale guest channel %s', path)
        except FileNotFoundError:
            pass

    def snapshot(self):
        now = time.monotonic()
        with self.lock:
            return GuestCacheStatus(
                self.policy.mode, self.sample.some_avg10,
                self.sample.available,
                sorted((ch.view(now) for ch in self.channels.values()),
                       key=lambda g: g.instance))

    def start(self, gid=None):
        self.prepare(gid)
        return super().start()

    def close(self):
        with self.lock:
            for ch in self.channels.values():
                ch.close()
            self.channels.clear()


def start(conf, gid=None):
    """Start the daemon's guest channels, or None if they are off."""
    if not conf.vmar_guest_cache.interval:
        return None
    return Guests(conf).start(gid)
