"""Processes of the real services the tests, tools and benches run.

Each service (:class:`Service`) runs in a private work directory, on free
ports, under its own names, so it does not clash with a system service,
another test run, or what an earlier run left behind. Every process one
starts carries ``VMAR_FUNCTIONAL_OWNER`` (or the owner variable it is
given) in its environment; ``stop()`` kills exactly those processes, and
``reap_stale()`` kills processes left behind by earlier runs whose owner
is gone. The services themselves are one module each:
:mod:`.rabbitmq_env`, :mod:`.glance_env`, :mod:`.ceph_env`,
:mod:`.proxy_env`.
"""

import fcntl
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time

OWNER_VAR = 'VMAR_FUNCTIONAL_OWNER'
BIN_DIR = os.path.dirname(sys.executable)


class ServiceError(RuntimeError):
    pass


def venv_bin(name, hint=None):
    """Path of a console script in the running interpreter's venv.

    Only the directory of sys.executable is searched (not PATH), so the
    services run from the same venv, and the same glance, as the tests.
    """
    path = os.path.join(BIN_DIR, name)
    if not os.path.exists(path):
        raise ServiceError('%s not found in %s%s' % (
            name, BIN_DIR, '; ' + hint if hint else ''))
    return path


# Ports handed out to services, below the kernel's ephemeral range
# (ip_local_port_range, 32768-60999 by default): no bind to port 0 and no
# outgoing connection of anyone's takes one of them between the moment it
# is chosen and the moment its service binds it.
PORT_BAND = (20000, 32000)
# one file per port handed out, named by the port, holding the pid of the
# process it was handed to: never handed out again while that one lives
# (CI runs several chains of tests at once, each choosing ports)
PORT_DIR = '/run/lock/vmar-ports'


def _bindable(host, port):
    s = socket.socket()
    try:
        s.bind((host, port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def _held_ports():
    """Ports handed to processes still alive; forgets the others'."""
    held = set()
    for name in os.listdir(PORT_DIR):
        if not name.isdigit():
            continue
        path = os.path.join(PORT_DIR, name)
        try:
            with open(path) as f:
                pid = int(f.read() or 0)
        except (OSError, ValueError):
            continue
        if pid and _pid_alive(pid):
            held.add(int(name))
        else:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
    return held


def free_ports(count, host='127.0.0.1', contiguous=False):
    """``count`` distinct TCP ports for services of this process.

    From :data:`PORT_BAND`; none is handed to another process of the
    machine while this one lives, and each was free when chosen.
    ``contiguous``: consecutive ports (a range a service picks its own
    ports from, Ceph's ``ms bind port min/max``).
    """
    lo, hi = PORT_BAND
    os.makedirs(PORT_DIR, exist_ok=True)
    with open(os.path.join(PORT_DIR, '.lock'), 'a') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        held = _held_ports()
        start = random.randrange(lo, hi)
        out = []
        for i in range(hi - lo):
            port = lo + (start - lo + i) % (hi - lo)
            ok = port not in held and _bindable(host, port)
            if contiguous and out and (not ok or port != out[-1] + 1):
                out = []
            if ok:
                out.append(port)
            if len(out) == count:
                break
        else:
            raise ServiceError('no %d free ports left in %d-%d'
                               % (count, lo, hi))
        for port in out:
            with open(os.path.join(PORT_DIR, str(port)), 'w') as f:
                f.write(str(os.getpid()))
    return out


def free_port(host='127.0.0.1'):
    return free_ports(1, host)[0]


def port_open(port, host='127.0.0.1'):
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def log_tail(paths, lines=40):
    out = []
    for path in paths:
        try:
            with open(path, errors='replace') as f:
                tail = f.readlines()[-lines:]
        except OSError:
            continue
        out.append('--- %s (last %d lines) ---\n%s' % (
            path, len(tail), ''.join(tail)))
    return '\n'.join(out) or '(no log output)'


# -- process bookkeeping ----------------------------------------------------

def _proc_owner_tags(var=OWNER_VAR):
    """Yield (pid, tag) for every process carrying ``var`` (OWNER_VAR)."""
    prefix = (var + '=').encode()
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        try:
            with open('/proc/%s/environ' % entry, 'rb') as f:
                env = f.read().split(b'\0')
            with open('/proc/%s/stat' % entry, 'rb') as f:
                state = f.read().rsplit(b')', 1)[1].split()[0]
        except OSError:
            continue
        if state == b'Z':
            continue
        for item in env:
            if item.startswith(prefix):
                yield int(entry), item[len(prefix):].decode(errors='replace')
                break


def tagged_pids(match, var=OWNER_VAR):
    """Live processes whose tag (in ``var``) satisfies match, by pid."""
    return sorted(pid for pid, tag in _proc_owner_tags(var) if match(tag))


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_tagged(match, timeout=10, var=OWNER_VAR):
    """SIGTERM, then SIGKILL, every live process whose tag satisfies match.

    ``var`` is the environment variable holding the tag (OWNER_VAR for the
    functional tests' processes).
    """
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [pid for pid, tag in _proc_owner_tags(var)
                if match(tag) and pid != os.getpid()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + (timeout if sig == signal.SIGTERM else 5)
        while time.time() < deadline:
            if not any(match(tag) for _, tag in _proc_owner_tags(var)):
                return
            time.sleep(0.1)
    left = [pid for pid, tag in _proc_owner_tags(var) if match(tag)]
    if left:
        raise ServiceError('processes survived SIGKILL: %s' % left)


def reap_stale():
    """Kill processes of earlier runs whose owning test process is gone."""
    def stale(tag):
        try:
            owner = int(tag.split(':', 1)[0])
        except ValueError:
            return True
        return not _pid_alive(owner)
    kill_tagged(stale, timeout=5)


class Service(object):
    """A process tree, tagged with ``owner_var=tag`` in its environment.

    By default the tag names the creating process (OWNER_VAR,
    ``<pid>:<name>:<work_dir>``): the service lives as long as that process,
    and ``reap_stale`` kills it once that process is gone. A service meant
    to outlive its creator (tools/cloud.sh) passes its own ``owner_var`` and
    a ``tag`` of its own.
    """

    name = 'service'

    def __init__(self, work_dir=None, owner_var=OWNER_VAR, tag=None):
        self._own_dir = work_dir is None
        self.work_dir = os.path.abspath(
            work_dir or tempfile.mkdtemp(prefix='vmar-%s-' % self.name))
        self.owner_var = owner_var
        self.tag = tag or '%d:%s:%s' % (os.getpid(), self.name,
                                        self.work_dir)
        self.proc = None
        self._logfile = None

    def _env(self, extra=None):
        env = dict(os.environ)
        env.pop(OWNER_VAR, None)
        env[self.owner_var] = self.tag
        env.update(extra or {})
        return env

    def _spawn(self, cmd, env, log_path):
        self._logfile = open(log_path, 'ab')
        self.proc = subprocess.Popen(
            cmd, env=env, stdin=subprocess.DEVNULL, stdout=self._logfile,
            stderr=subprocess.STDOUT, start_new_session=True,
            cwd=self.work_dir)

    def _fail(self, msg):
        tail = log_tail(self.log_files())
        try:
            self.stop()
        except Exception as e:  # keep the original error visible
            tail += '\n(stop after failure also failed: %s)' % e
        raise ServiceError('%s: %s\n%s' % (self.name, msg, tail))

    def log_files(self):
        return []

    def _kill_all(self):
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc is not None:
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        kill_tagged(lambda tag: tag == self.tag, var=self.owner_var)
        self.proc = None
        if self._logfile:
            self._logfile.close()
            self._logfile = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
