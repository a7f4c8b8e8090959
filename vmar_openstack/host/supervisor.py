"""``vmar-export serve``: run the export daemon, and run it again.

The supervisor starts ``qemu-storage-daemon`` with only a QMP monitor (or
adopts one an earlier ``serve`` left running), has the service restore
every export before the NBD socket appears (so a reconnecting client never
finds a missing export), and restarts the daemon with backoff whenever it
dies, until SIGTERM or SIGINT.
"""

import contextlib
import os
import signal
import subprocess
import time

from oslo_log import log as logging

from vmar_openstack import exception
from vmar_openstack.host.cache import prefetch
from vmar_openstack.host.exports import graph
from vmar_openstack.host.peers import nbdkit_proc
from vmar_openstack.host.peers import server as peers

LOG = logging.getLogger(__name__)

# seconds between two counts of what the mirrors fetched (the bytes a
# daemon that dies fetched since the last count go uncounted)
FILL_COUNT_INTERVAL = 5
PEERS_RETRY = 10        # seconds between two starts of a failed peer server


class _Adopted:
    """A daemon this process did not start: poll it through /proc."""

    def __init__(self, pid):
        self.pid = pid
        self.returncode = None

    def poll(self):
        if self.returncode is None and not os.path.exists(
                '/proc/%d' % self.pid):
            self.returncode = -1
        return self.returncode

    def wait(self, timeout=None):
        deadline = time.monotonic() + (timeout or 1e9)
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired('qemu-storage-daemon',
                                                timeout)
            time.sleep(0.05)
        return self.returncode

    def kill(self):
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


class Supervisor:
    """The daemon process of an :class:`~.service.ExportService`."""

    def __init__(self, service):
        self.service = service
        self.conf = service.conf
        self.host_dir = service.host_dir
        self.qmp_socket = service.qmp_socket
        self.pid_file = service.pid_file
        self.fetcher = self.peer_fetcher = self.peers = None
        # the peer fetcher could not start: tried again at retry_at
        self.peer_fetcher_missing, self.peer_fetcher_retry_at = False, 0
        self.peers_retry_at = 0
        self.prefetcher = prefetch.Prefetcher(service)

    def _running_daemon(self):
        """A daemon left by an earlier ``serve`` that still answers QMP."""
        try:
            with open(self.pid_file) as f:
                pid = int(f.read().strip())
            with open('/proc/%d/cmdline' % pid, 'rb') as f:
                if b'qemu-storage-daemon' not in f.read():
                    return None
        except (OSError, ValueError):
            return None
        try:
            with self.service.monitor(timeout=5):
                pass
        except exception.ExportDaemonDown:
            return None
        return _Adopted(pid)

    def start_daemon(self):
        """The running daemon (adopted, or started); a Popen-like object."""
        c = self.conf.vmar_host
        os.makedirs(self.host_dir, exist_ok=True)
        adopted = self._running_daemon()
        if adopted:
            LOG.info('adopting running qemu-storage-daemon %d', adopted.pid)
            return adopted
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.qmp_socket)
        cmd = [c.qemu_storage_daemon,
               '--chardev', 'socket,id=qmp0,path=%s,server=on,wait=off'
               % self.qmp_socket,
               '--monitor', 'chardev=qmp0', '--pidfile', self.pid_file]
        log = open(os.path.join(self.host_dir, 'qsd.log'), 'ab')
        proc = subprocess.Popen(cmd, stdout=log, stderr=log,
                                stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise exception.ExportError(
                    '%s exited with %d; see %s/qsd.log'
                    % (c.qemu_storage_daemon, proc.returncode,
                       self.host_dir))
            try:
                missing = self._missing_drivers()
                break
            except exception.ExportDaemonDown:
                # QEMU binds the socket's path before it listens on it: a
                # connection in between is refused
                pass
            if time.monotonic() > deadline:
                proc.kill()
                raise exception.ExportError(
                    'qemu-storage-daemon did not start')
            time.sleep(0.02)
        self._check_drivers(proc, missing)
        return proc

    def _missing_drivers(self):
        """The vmar drivers the daemon lacks, once its monitor answers."""
        if not os.path.exists(self.qmp_socket):
            raise exception.ExportDaemonDown(reason='no monitor socket yet')
        with self.service.monitor(timeout=5) as mon:
            return graph.missing_drivers(mon)

    def _check_drivers(self, proc, missing):
        """Stop at once, clearly, on a daemon without the vmar drivers."""
        if missing:
            proc.kill()
            proc.wait()
            raise exception.DaemonLacksDriver(
                daemon=self.conf.vmar_host.qemu_storage_daemon,
                drivers=' or '.join(missing))

    def start_fetcher(self):
        """The range server the map source needs (nbdkit), or None.

        Started before the daemon restores exports (their mirror nodes
        connect to it); it exits with this process.
        """
        source = self.service.source
        if not source.needs_range_server:
            return None
        cmd, sock, env = source.range_server_command()
        os.makedirs(self.host_dir, exist_ok=True)
        proc = nbdkit_proc.start(cmd, env,
                                 os.path.join(self.host_dir, 'fetch.log'),
                                 sock, 'the range server (%s)' % cmd[0])
        LOG.info('range server %d on %s', proc.pid, sock)
        return proc

    def serve(self, stop_event=None, max_backoff=10):
        """Run and supervise the daemon until SIGTERM/SIGINT."""
        self.fetcher = self.start_fetcher()
        # beside it, before the exports: each mirror's quorum asks it first
        self._start_peer_fetcher()
        self._check_peers()
        try:
            self._serve(stop_event, max_backoff)
        finally:
            for proc in (self.fetcher, self.peer_fetcher, self.peers):
                if proc:
                    proc.terminate()
                    proc.wait()

    def _check_peers(self):
        """(Re)start the peer server, if on and not running.

        A peer server that cannot start (its TLS files missing, its
        address taken) is logged and tried again every PEERS_RETRY
        seconds: this host's own guests do not depend on it, and other
        hosts fall back to the store meanwhile.
        """
        if not peers.enabled(self.conf) or (
                self.peers and self.peers.poll() is None) or (
                time.monotonic() < self.peers_retry_at):
            return
        if self.peers:
            LOG.error('the peer server exited with %d; restarting',
                      self.peers.returncode)
        try:
            self.peers = peers.start(self.conf)
        except exception.ExportError as e:
            LOG.error('%s', e)
            self.peers = None
            self.peers_retry_at = time.monotonic() + PEERS_RETRY

    def _start_peer_fetcher(self):
        """Start the peer fetcher if the host reads from peers.

        One that cannot start is logged and tried again every
        PEERS_RETRY seconds (:meth:`_check_fetchers`): the mirrors'
        quorums read the store meanwhile, and the guests do not wait.
        """
        self.peer_fetcher_retry_at = time.monotonic() + PEERS_RETRY
        try:
            self.peer_fetcher = peers.start_fetcher(self.conf)
        except exception.ExportError as e:
            LOG.error('%s; the store serves every miss until it starts', e)
            self.peer_fetcher = None
            self.peer_fetcher_missing = True
        else:
            self.peer_fetcher_missing = False

    def _check_fetchers(self, backoff, max_backoff):
        """Restart the range server or the peer fetcher if it exited.

        Reads of missing blocks fail until they are back (a peer read goes
        to the store meanwhile); the daemon's NBD clients reconnect by
        themselves. Returns the backoff after a failed restart.
        """
        if (self.peer_fetcher_missing
                and time.monotonic() >= self.peer_fetcher_retry_at):
            self._start_peer_fetcher()
        for attr, what, start in (
                ('fetcher', 'range server', self.start_fetcher),
                ('peer_fetcher', 'peer fetcher',
                 lambda: peers.start_fetcher(self.conf))):
            nbdkit = getattr(self, attr)
            if nbdkit is None or nbdkit.poll() is None:
                continue
            LOG.error('the %s exited with %d; restarting', what,
                      nbdkit.returncode)
            try:
                setattr(self, attr, start())
            except exception.ExportError as e:
                LOG.error('%s', e)
                time.sleep(backoff)
                backoff = min(max_backoff, backoff * 2)
        return backoff

    def _serve(self, stop_event, max_backoff):
        stopping = []

        reload = []

        def _stop(signum, frame):
            stopping.append(signum)

        def _reload(signum, frame):
            reload.append(signum)
        if stop_event is None:
            signal.signal(signal.SIGTERM, _stop)
            signal.signal(signal.SIGINT, _stop)
            # oslo.config's mutable options, as OpenStack services do
            signal.signal(signal.SIGHUP, _reload)
        backoff = 0.5
        while not stopping and not (stop_event and stop_event.is_set()):
            started = time.monotonic()
            proc = self.start_daemon()
            try:
                self.service.restore()
            except exception.ExportError as e:
                LOG.error('restoring exports failed: %s', e)
                proc.kill()
                proc.wait()
                time.sleep(backoff)
                backoff = min(max_backoff, backoff * 2)
                continue
            self.service.ready.set()
            retry_at, retry_backoff = time.monotonic() + 0.5, 0.5
            count_at = time.monotonic() + FILL_COUNT_INTERVAL
            while proc.poll() is None:
                if time.monotonic() >= count_at:
                    self.service.count_fills()
                    count_at = time.monotonic() + FILL_COUNT_INTERVAL
                if stopping or (stop_event and stop_event.is_set()):
                    self.service.ready.clear()
                    self.quit(proc)
                    break
                self.prefetcher.poll()
                if reload:
                    reload.clear()
                    self.service.reload_config()
                if (self.service.unrestored
                        and time.monotonic() >= retry_at):
                    with contextlib.suppress(exception.ExportError):
                        self.service.restore()
                    retry_at = time.monotonic() + retry_backoff
                    retry_backoff = min(max_backoff, retry_backoff * 2)
                self._check_peers()
                backoff = self._check_fetchers(backoff, max_backoff)
                time.sleep(0.1)
            else:
                self.service.ready.clear()
                LOG.error('qemu-storage-daemon exited with %d; restarting',
                          proc.returncode)
                if time.monotonic() - started > 30:
                    backoff = 0.5
                else:
                    time.sleep(backoff)
                    backoff = min(max_backoff, backoff * 2)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.service.socket)

    def quit(self, proc):
        """Ask the daemon to quit; kill it if it has not within 10 s."""
        with contextlib.suppress(exception.ExportError, OSError), \
                self.service.monitor() as mon:
            mon.execute('quit')
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
