"""The cloud's services, in start order, and how each starts and stops.

Every process a service starts carries ``VMAR_CLOUD_OWNER=<state_dir>:
<service>`` in its environment (the tagging of
:mod:`tools.vmarenv.glance_env`), so ``status`` and ``down`` find them from
any later process, and the functional tests' ``reap_stale`` never touches
them. One-time setup (database schemas, Keystone bootstrap, cells) is
recorded by stamp files in ``<state_dir>/stamps``.
"""

import os
import shlex
import signal
import subprocess
import time
import urllib.error
import urllib.request

from tools.vmarenv import process

OWNER_VAR = 'VMAR_CLOUD_OWNER'
ServiceError = process.ServiceError


def _http_ok(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status < 500
    except urllib.error.HTTPError as e:
        return e.code < 500
    except (OSError, ValueError):
        return False


def _start_time(pid):
    """The start time of a process (field 22 of /proc/PID/stat), or None."""
    try:
        with open('/proc/%d/stat' % pid) as f:
            return f.read().rsplit(')', 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _with_descendants(roots):
    """``roots`` and their descendants, zombies left out.

    A zombie has exited: it is a child that its parent (say, a test that
    ran ``up`` in-process) has not reaped yet.
    """
    children, zombies = {}, set()
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        try:
            with open('/proc/%s/stat' % entry) as f:
                fields = f.read().rsplit(')', 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] == 'Z':
            zombies.add(int(entry))
        else:
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = set(), [p for p in roots if os.path.exists('/proc/%d' % p)
                          and p not in zombies]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


class Service(process.Service):
    """One daemon (and whatever it forks) of the cloud."""

    endpoint = None
    timeout = 180

    def __init__(self, cloud, name):
        self.name = name
        self.cloud = cloud
        super(Service, self).__init__(
            cloud.state_dir, owner_var=OWNER_VAR,
            tag='%s:%s' % (cloud.state_dir, name))
        self.log = os.path.join(cloud.log_dir, name + '.log')
        self.out = os.path.join(cloud.log_dir, name + '.out')

    # -- what a service says about itself --------------------------------

    def command(self):
        raise NotImplementedError

    def environ(self):
        return {}

    def ready(self):
        """True once the service answers (its processes are alive)."""
        return True

    def setup(self):
        """One-time work before the first start (idempotent)."""

    def post(self):
        """Work after each start that needs the service up (idempotent)."""

    def log_files(self):
        return [self.out, self.log]

    # -- machinery -------------------------------------------------------

    def _env(self, extra=None):
        # nothing a service writes goes outside the state directory: not
        # temporary files, not stevedore's entry-point cache (~/.cache)
        env = {'TMPDIR': self.cloud.path('tmp'),
               'XDG_CACHE_HOME': self.cloud.path('cache')}
        env.update(extra or {})
        return super(Service, self)._env(env)

    @property
    def pidfile(self):
        return self.cloud.path('run', self.name + '.pid')

    def pids(self):
        """The service's live processes.

        Tagged processes, the process it started (its pid file) and their
        descendants: a process that sets its title (oslo.service's workers,
        setproctitle) overwrites the environment block /proc shows, and
        with it the tag.
        """
        roots = set(process.tagged_pids(lambda t: t == self.tag,
                                        OWNER_VAR))
        try:
            with open(self.pidfile) as f:
                pid, start = f.read().split()
            if _start_time(int(pid)) == start:
                roots.add(int(pid))
        except (OSError, ValueError):
            pass
        return sorted(_with_descendants(roots))

    def is_up(self):
        return bool(self.pids()) and self.ready()

    def run(self, cmd, what=None, env=None, timeout=600):
        """Run a one-shot command (db sync...), logged to <name>-setup.log."""
        log = os.path.join(self.cloud.log_dir, self.name + '-setup.log')
        with open(log, 'ab') as f:
            f.write(('$ %s\n' % ' '.join(shlex.quote(c) for c in cmd)
                     ).encode())
            f.flush()
            rc = subprocess.run(
                cmd, stdout=f, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, cwd=self.cloud.state_dir,
                env=self._env(dict(self.environ(), **(env or {}))),
                timeout=timeout).returncode
        if rc:
            raise ServiceError('%s: %s failed (%d)\n%s' % (
                self.name, what or ' '.join(cmd), rc,
                process.log_tail([log])))

    def stamp(self, what):
        return self.cloud.path('stamps', '%s-%s' % (self.name, what))

    def once(self, what, func):
        """Run func() unless the stamp ``what`` says it was done."""
        path = self.stamp(what)
        if os.path.exists(path):
            return
        func()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, 'w'):
            pass

    def start(self):
        self.setup()
        # a partly dead service (a uWSGI worker without its master): clean
        self.stop()
        self._t0 = time.time()
        self._spawn(self.command(), self._env(self.environ()), self.out)
        with open(self.pidfile, 'w') as f:
            f.write('%d %s\n' % (self.proc.pid, _start_time(self.proc.pid)))
        deadline = time.time() + self.timeout
        while not self.ready():
            if self.proc.poll() is not None and not self.pids():
                self._fail('exited with %s' % self.proc.returncode)
            if time.time() > deadline:
                self._fail('not ready within %ds' % self.timeout)
            time.sleep(0.2)
        self.post()

    # seconds between SIGTERM and SIGKILL
    stop_timeout = 20

    def stop(self):
        for sig, wait in ((signal.SIGTERM, self.stop_timeout),
                          (signal.SIGKILL, 5)):
            pids = self.pids()
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.time() + wait
            while pids and time.time() < deadline:
                time.sleep(0.1)
                pids = self.pids()
            if not pids:
                break
        else:
            raise ServiceError('%s: processes survived SIGKILL: %s'
                               % (self.name, pids))
        if self.proc is not None:
            self.proc.poll()  # reap it
        if os.path.exists(self.pidfile):
            os.unlink(self.pidfile)
        if self._logfile:
            self._logfile.close()
            self._logfile = None
        self.proc = None


class UwsgiService(Service):
    """A WSGI application under uWSGI (the ini next to its config)."""

    def __init__(self, cloud, name, port, ini, env, probe='/'):
        super(UwsgiService, self).__init__(cloud, name)
        self.endpoint = cloud.url(port)
        self.ini = ini
        self.env = env
        self.probe = probe

    def command(self):
        return [self.cloud.bin('uwsgi'), '--ini', self.ini]

    def environ(self):
        # where the application finds its configuration (see the ini)
        return self.env

    def ready(self):
        return _http_ok(self.endpoint + self.probe)

    def log_files(self):
        return [self.out, self.log,
                os.path.join(self.cloud.log_dir, self.name + '-uwsgi.log'),
                os.path.join(self.cloud.log_dir, self.name + '-setup.log')]


class OsloService(Service):
    """A console script reading one or more oslo.config files."""

    def __init__(self, cloud, name, script, conf, args=()):
        super(OsloService, self).__init__(cloud, name)
        self.script = script
        self.conf = conf
        self.args = list(args)

    def command(self):
        cmd = [self.cloud.bin(self.script)]
        for conf in self.conf:
            cmd += ['--config-file', conf]
        return cmd + ['--log-file', self.log] + self.args

    settle = 3

    def ready(self):
        # alive for a few seconds after start: configuration errors, which
        # end the process at once, show here and not later
        t0 = getattr(self, '_t0', None)
        return t0 is None or time.time() - t0 > self.settle
