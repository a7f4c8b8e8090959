"""Run a real RabbitMQ and a real glance-api for functional tests.

Nothing here needs systemd or Keystone. Each service runs in a private work
directory, on free ports, under its own names, so it does not clash with a
system RabbitMQ, another test run, or what an earlier run left behind.

``RabbitMQ`` starts its own ``rabbitmq-server`` node (own epmd port, own
Erlang cookie, own mnesia and log dirs) and gives a ``transport_url``.

``GlanceAPI`` writes glance-api.conf and glance-image-import.conf, runs
``glance-manage db_sync`` and serves ``glance.wsgi.api:application`` under
uWSGI (the ``pyuwsgi`` wheel), because Glance 33 no longer has a standalone
``glance-api`` server: its console script only prints an error. There is no
Keystone: a small paste filter stands in for authtoken and gives every
request a fixed project, user and roles (see PASTE_INI).

Every process either class starts carries ``VMAR_FUNCTIONAL_OWNER`` in its
environment; ``stop()`` kills exactly those processes, and ``start()`` first
kills processes left behind by earlier runs whose owner process is gone.
"""

import configparser
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

OWNER_VAR = 'VMAR_FUNCTIONAL_OWNER'
# Who every request to GlanceAPI is, unless it sends X-Project-Id/X-Roles/...
PROJECT_ID = '0a1b2c3d4e5f40718293a4b5c6d7e8f9'
USER_ID = 'f9e8d7c6b5a4493827160f5e4d3c2b1a'
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


def free_ports(count, host='127.0.0.1'):
    """count distinct free TCP ports (all held open while choosing)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


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


class _Service(object):
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


class TcpProxy(_Service):
    """socat forwarding 127.0.0.1:``port`` to ``target``.

    Stopped, it is an outage (connection refused); start() heals it.
    Paused, it is a store that hangs; resume() heals it.
    """

    name = 'tcp-proxy'

    def __init__(self, target_host, target_port, work_dir=None):
        super().__init__(work_dir)
        self.target = (target_host, int(target_port))
        self.port = free_port()

    @property
    def url(self):
        return 'http://127.0.0.1:%d' % self.port

    def log_files(self):
        return [os.path.join(self.work_dir, 'socat.log')]

    def start(self):
        self._spawn(['socat', 'TCP-LISTEN:%d,bind=127.0.0.1,reuseaddr,fork'
                     % self.port, 'TCP:%s:%d' % self.target],
                    self._env(), self.log_files()[0])
        deadline = time.time() + 10
        while not port_open(self.port):
            if self.proc.poll() is not None or time.time() > deadline:
                self._fail('socat does not listen on %d' % self.port)
            time.sleep(0.05)

    def stop(self):
        self._kill_all()

    def pause(self):
        """A store that takes connections and never answers (SIGSTOP)."""
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self):
        os.killpg(self.proc.pid, signal.SIGCONT)


# -- RabbitMQ ---------------------------------------------------------------

def _rabbit_script(name):
    for path in ('/usr/lib/rabbitmq/bin/' + name, '/usr/sbin/' + name):
        if os.path.exists(path):
            return path
    found = shutil.which(name)
    if not found:
        raise ServiceError(
            '%s not found; install it: DEBIAN_FRONTEND=noninteractive '
            'apt-get install -y --no-install-recommends rabbitmq-server'
            % name)
    return found


class RabbitMQ(_Service):
    """A private rabbitmq-server node on free ports.

    /usr/lib/rabbitmq/bin/rabbitmq-server is run directly (the /usr/sbin
    wrapper would switch to the rabbitmq user, who cannot write our dirs).
    """

    name = 'rabbitmq'

    def __init__(self, work_dir=None, user='vmar', password=None,
                 timeout=90, ports=None, nodename=None, address='127.0.0.1',
                 **tagging):
        """A node; ports and node name are chosen at start() unless given.

        ``ports``: (AMQP, distribution, epmd); ``address``: where AMQP
        listens; ``tagging``: see :class:`_Service`.
        """
        super(RabbitMQ, self).__init__(work_dir, **tagging)
        self.address = address
        self.user = user
        self.password = password or secrets.token_hex(8)
        self.timeout = timeout
        self.ports = ports
        self.port = self.dist_port = self.epmd_port = None
        self.nodename = self._nodename = nodename
        self.transport_url = None
        self.startup_seconds = None

    def log_files(self):
        return [os.path.join(self.work_dir, 'rabbitmq-server.out'),
                os.path.join(self.work_dir, 'log', 'rabbit.log')]

    def _rabbit_env(self):
        d = self.work_dir
        return self._env({
            'HOME': os.path.join(d, 'home'),  # .erlang.cookie lives here
            'RABBITMQ_CONF_ENV_FILE': os.path.join(d, 'rabbitmq-env.conf'),
            'RABBITMQ_CONFIG_FILE': os.path.join(d, 'rabbitmq.conf'),
            'RABBITMQ_ADVANCED_CONFIG_FILE': os.path.join(
                d, 'advanced.config'),
            'RABBITMQ_ENABLED_PLUGINS_FILE': os.path.join(
                d, 'enabled_plugins'),
            'RABBITMQ_PLUGINS_EXPAND_DIR': os.path.join(d, 'plugins-expand'),
            'RABBITMQ_MNESIA_BASE': os.path.join(d, 'mnesia'),
            'RABBITMQ_LOG_BASE': os.path.join(d, 'log'),
            'RABBITMQ_LOGS': os.path.join(d, 'log', 'rabbit.log'),
            'RABBITMQ_PID_FILE': os.path.join(d, 'rabbitmq.pid'),
            'RABBITMQ_NODENAME': self.nodename,
            'RABBITMQ_NODE_IP_ADDRESS': self.address,
            'RABBITMQ_NODE_PORT': str(self.port),
            'RABBITMQ_DIST_PORT': str(self.dist_port),
            # A private epmd, so we can stop it without touching others'.
            'ERL_EPMD_PORT': str(self.epmd_port),
            'ERL_EPMD_ADDRESS': '127.0.0.1',
        })

    def ctl(self, *args, timeout=60, check=True):
        result = subprocess.run(
            [_rabbit_script('rabbitmqctl'), '-n', self.nodename] + list(args),
            env=self._rabbit_env(), capture_output=True, text=True,
            timeout=timeout)
        if check and result.returncode:
            raise ServiceError('rabbitmqctl %s failed (%d): %s%s' % (
                ' '.join(args), result.returncode, result.stdout,
                result.stderr))
        return result

    def start(self):
        if self.owner_var == OWNER_VAR:
            reap_stale()
        server = _rabbit_script('rabbitmq-server')
        d = self.work_dir
        for sub in ('mnesia', 'log', 'plugins-expand'):
            path = os.path.join(d, sub)
            shutil.rmtree(path, ignore_errors=True)  # no stale node state
            os.makedirs(path)
        home = os.path.join(d, 'home')
        os.makedirs(home, exist_ok=True)
        cookie = os.path.join(home, '.erlang.cookie')
        if os.path.exists(cookie):
            os.chmod(cookie, 0o600)
        with open(cookie, 'w') as f:
            f.write(secrets.token_hex(16))
        os.chmod(cookie, 0o400)

        self.port, self.dist_port, self.epmd_port = (
            self.ports or free_ports(3))
        self.nodename = self._nodename or 'vmar%d_%s@localhost' % (
            os.getpid(), secrets.token_hex(3))
        with open(os.path.join(d, 'rabbitmq-env.conf'), 'w'):
            pass  # empty: do not read /etc/rabbitmq/rabbitmq-env.conf
        with open(os.path.join(d, 'enabled_plugins'), 'w') as f:
            f.write('[].\n')
        with open(os.path.join(d, 'advanced.config'), 'w') as f:
            f.write('[].\n')
        with open(os.path.join(d, 'rabbitmq.conf'), 'w') as f:
            f.write('default_user = %s\n'
                    'default_pass = %s\n'
                    'default_vhost = /\n'
                    'loopback_users = none\n'
                    'disk_free_limit.absolute = 50MB\n'
                    'log.console = false\n'
                    'log.file.level = info\n' % (self.user, self.password))

        t0 = time.time()
        self._spawn([server], self._rabbit_env(),
                    os.path.join(d, 'rabbitmq-server.out'))
        deadline = t0 + self.timeout
        while not port_open(self.port, self.address):
            if self.proc.poll() is not None:
                self._fail('rabbitmq-server exited with %s'
                           % self.proc.returncode)
            if time.time() > deadline:
                self._fail('AMQP port %d not open after %ds'
                           % (self.port, self.timeout))
            time.sleep(0.2)
        result = self.ctl('await_startup', '--timeout', '60', check=False)
        if result.returncode:
            self._fail('await_startup failed: %s%s'
                       % (result.stdout, result.stderr))
        self.startup_seconds = time.time() - t0
        self.transport_url = 'rabbit://%s:%s@%s:%d/' % (
            self.user, self.password, self.address, self.port)
        return self

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.ctl('stop', timeout=30, check=False)
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        # beam, erl_child_setup, inet_gethost and our private epmd all carry
        # the tag (epmd daemonizes into its own session, so killpg misses it).
        self._kill_all()
        if self._own_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)


# -- glance-api ---------------------------------------------------------------

# glance-api's paste pipeline. The ``keystone`` pipeline of the shipped
# glance-api-paste.ini with authtoken replaced by ``vmar-noauth``, which sets
# the headers keystonemiddleware would set (unless the client sent them), so
# glance's normal ContextMiddleware builds a project-scoped context with
# roles. Glance's own no-Keystone flavor (unauthenticated-context) gives a
# context with no project and no roles: secure-RBAC policy then answers 403
# to everything, and even with legacy policy an import fails because
# tasks.owner (the project) is NOT NULL.
PASTE_INI = """\
[composite:glance-api]
paste.composite_factory = glance.api:root_app_factory
/: api
/healthcheck: healthcheck

[composite:api]
paste.composite_factory = glance.api:pipeline_factory
default = cors http_proxy_to_wsgi versionnegotiation osprofiler \
vmar-noauth context rootapp
unauthenticated = cors http_proxy_to_wsgi versionnegotiation osprofiler \
unauthenticated-context rootapp

[composite:rootapp]
paste.composite_factory = glance.api:root_app_factory
/: apiversions
/v2: apiv2app

[app:apiversions]
paste.app_factory = glance.api.versions:create_resource

[app:apiv2app]
paste.app_factory = glance.api.v2.router:API.factory

[app:healthcheck]
paste.app_factory = oslo_middleware:Healthcheck.app_factory
backends = disable_by_file
disable_by_file_path = {work_dir}/healthcheck_disable

[filter:vmar-noauth]
paste.filter_factory = vmar_glance_noauth:filter_factory
project_id = {project_id}
user_id = {user_id}
roles = {roles}

[filter:context]
paste.filter_factory = \
glance.api.middleware.context:ContextMiddleware.factory

[filter:unauthenticated-context]
paste.filter_factory = \
glance.api.middleware.context:UnauthenticatedContextMiddleware.factory

[filter:versionnegotiation]
paste.filter_factory = \
glance.api.middleware.version_negotiation:VersionNegotiationFilter.factory

[filter:osprofiler]
paste.filter_factory = osprofiler.web:WsgiMiddleware.factory

[filter:cors]
paste.filter_factory = oslo_middleware.cors:filter_factory
oslo_config_project = glance
oslo_config_program = glance-api

[filter:http_proxy_to_wsgi]
paste.filter_factory = oslo_middleware:HTTPProxyToWSGI.factory
"""

# Written into <work_dir>/pylib and put on glance-api's PYTHONPATH.
NOAUTH_MODULE = '''"""Test-only stand-in for keystonemiddleware's authtoken."""


def filter_factory(global_conf, **local_conf):
    defaults = {
        'HTTP_X_IDENTITY_STATUS': 'Confirmed',
        'HTTP_X_PROJECT_ID': local_conf['project_id'],
        'HTTP_X_TENANT_ID': local_conf['project_id'],
        'HTTP_X_USER_ID': local_conf['user_id'],
        'HTTP_X_ROLES': local_conf['roles'],
        'HTTP_X_PROJECT_DOMAIN_ID': 'default',
        'HTTP_X_USER_DOMAIN_ID': 'default',
    }

    def _filter(app):
        def middleware(environ, start_response):
            for key, value in defaults.items():
                environ.setdefault(key, value)
            return app(environ, start_response)
        return middleware
    return _filter
'''


def _conf_value(value):
    if value is None:
        return ''
    if isinstance(value, bool):
        return 'true' if value else 'false'
    if isinstance(value, (list, tuple)):
        return ','.join(str(v) for v in value)
    return str(value)


def write_conf(path, sections):
    parser = configparser.RawConfigParser()
    parser.optionxform = str
    for section, opts in sections.items():
        if section != 'DEFAULT' and not parser.has_section(section):
            parser.add_section(section)
        for key, value in opts.items():
            parser.set(section, key, _conf_value(value))
    with open(path, 'w') as f:
        parser.write(f)


def merge_sections(base, extra):
    out = {s: dict(o) for s, o in base.items()}
    for section, opts in (extra or {}).items():
        out.setdefault(section, {}).update(opts)
    return out


class GlanceAPI(_Service):
    """glance-api (glance.wsgi.api:application) under uWSGI, no Keystone.

    :param work_dir: where config, database, stores and logs go.
    :param transport_url: RabbitMQ URL for notifications.
    :param import_plugins: names for [image_import_opts]
        image_import_plugins (entry points in glance.image_import.plugins).
    :param extra_config: {section: {key: value}} merged into glance-api.conf.
    :param import_config: {section: {key: value}} merged into
        glance-image-import.conf (plugin option groups go here).
    :param python_path: extra directories put in front of glance-api's
        PYTHONPATH (e.g. where a test plugin and its dist-info live).
    :param threads: uWSGI threads in the one worker process.
    :param project_id, user_id, roles: the identity every request gets
        (the paste ``vmar-noauth`` filter); a request may override them
        with X-Project-Id / X-User-Id / X-Roles headers.
    """

    name = 'glance'

    def __init__(self, work_dir, transport_url, import_plugins=(),
                 extra_config=None, import_config=None, python_path=(),
                 threads=4, timeout=120, project_id=PROJECT_ID,
                 user_id=USER_ID, roles=('admin', 'member', 'reader')):
        super(GlanceAPI, self).__init__(work_dir)
        self.transport_url = transport_url
        self.import_plugins = list(import_plugins)
        self.extra_config = extra_config or {}
        self.import_config = import_config or {}
        self.python_path = list(python_path)
        self.threads = threads
        self.project_id = project_id
        self.user_id = user_id
        self.roles = list(roles)
        self.timeout = timeout
        self.port = None
        self.endpoint = None
        self.startup_seconds = None
        d = self.work_dir
        self.etc_dir = os.path.join(d, 'etc')
        self.api_conf = os.path.join(self.etc_dir, 'glance-api.conf')
        self.import_conf = os.path.join(self.etc_dir,
                                        'glance-image-import.conf')
        self.paste_ini = os.path.join(self.etc_dir, 'glance-api-paste.ini')
        self.uwsgi_ini = os.path.join(self.etc_dir, 'glance-api-uwsgi.ini')
        self.store_dir = os.path.join(d, 'images')
        self.staging_dir = os.path.join(d, 'staging')
        self.tasks_dir = os.path.join(d, 'tasks')
        self.log_dir = os.path.join(d, 'log')
        self.api_log = os.path.join(self.log_dir, 'glance-api.log')
        self.uwsgi_log = os.path.join(self.log_dir, 'uwsgi.log')
        self.db_path = os.path.join(d, 'glance.sqlite')
        self.pylib_dir = os.path.join(d, 'pylib')

    def log_files(self):
        return [os.path.join(self.log_dir, 'db_sync.log'),
                os.path.join(self.log_dir, 'uwsgi.out'), self.uwsgi_log,
                self.api_log]

    def api_config(self):
        return merge_sections({
            'DEFAULT': {
                'debug': True,
                'log_file': self.api_log,
                'use_stderr': False,
                'transport_url': self.transport_url,
                'enabled_backends': 'fs:file',
                'enabled_import_methods': '[glance-direct,web-download]',
                'worker_self_reference_url': self.endpoint,
                'public_endpoint': self.endpoint,
                'image_cache_dir': os.path.join(self.work_dir, 'cache'),
            },
            'paste_deploy': {'flavor': '', 'config_file': self.paste_ini},
            'database': {'connection': 'sqlite:///' + self.db_path},
            'glance_store': {'default_backend': 'fs'},
            'fs': {'filesystem_store_datadir': self.store_dir},
            'os_glance_staging_store': {
                'filesystem_store_datadir': self.staging_dir},
            'os_glance_tasks_store': {
                'filesystem_store_datadir': self.tasks_dir},
            'oslo_messaging_notifications': {
                'driver': 'messagingv2',
                'transport_url': self.transport_url},
            # web-download from a local http server: loopback is refused
            # unless listed in allowed_hosts, and only ports 80/443 are
            # allowed by default (empty list = any port). These ListOpts
            # have bounds=True, so values must be written as [a,b].
            'import_filtering_opts': {
                'allowed_hosts': '[127.0.0.1,localhost]',
                'allowed_ports': '[]'},
            'oslo_concurrency': {
                'lock_path': os.path.join(self.work_dir, 'lock')},
            'wsgi': {'task_pool_threads': 4},
        }, self.extra_config)

    def image_import_config(self):
        return merge_sections({
            'image_import_opts': {
                'image_import_plugins': '[%s]' % ','.join(
                    self.import_plugins)},
        }, self.import_config)

    def _write_paste_ini(self):
        with open(self.paste_ini, 'w') as f:
            f.write(PASTE_INI.format(
                work_dir=self.work_dir, project_id=self.project_id,
                user_id=self.user_id, roles=','.join(self.roles)))
        os.makedirs(self.pylib_dir, exist_ok=True)
        with open(os.path.join(self.pylib_dir, 'vmar_glance_noauth.py'),
                  'w') as f:
            f.write(NOAUTH_MODULE)

    def _write_uwsgi_ini(self):
        # Mirrors devstack's uWSGI http-socket setup for glance: chunked
        # request bodies (what glanceclient/openstacksdk send on upload)
        # need http-auto-chunked/http-raw-body/chunked-input-limit; glance
        # reads them through uwsgi.chunked_read().
        opts = [
            ('http-socket', '127.0.0.1:%d' % self.port),
            ('module', 'glance.wsgi.api:application'),
            ('master', 'true'),
            ('processes', '1'),
            ('threads', str(self.threads)),
            ('enable-threads', 'true'),
            ('lazy-apps', 'true'),
            ('need-app', 'true'),
            ('die-on-term', 'true'),
            ('exit-on-reload', 'false'),
            ('add-header', 'Connection: close'),
            ('buffer-size', '65535'),
            ('http-auto-chunked', 'true'),
            ('http-raw-body', 'true'),
            ('chunked-input-limit', '10485760'),
            ('worker-reload-mercy', '1'),
            ('hook-master-start', 'unix_signal:15 gracefully_kill_them_all'),
            ('logto', self.uwsgi_log),
        ]
        with open(self.uwsgi_ini, 'w') as f:
            f.write('[uwsgi]\n')
            for key, value in opts:
                f.write('%s = %s\n' % (key, value))

    def service_env(self):
        pp = [self.pylib_dir] + self.python_path + [p for p in os.environ.get(
            'PYTHONPATH', '').split(os.pathsep) if p]
        env = {'OS_GLANCE_CONFIG_DIR': self.etc_dir}
        if pp:
            env['PYTHONPATH'] = os.pathsep.join(pp)
        return self._env(env)

    def start(self):
        reap_stale()
        uwsgi = venv_bin('uwsgi', 'pip install pyuwsgi')
        manage = venv_bin('glance-manage', 'pip install glance')
        for path in (self.etc_dir, self.store_dir, self.staging_dir,
                     self.tasks_dir, self.log_dir,
                     os.path.join(self.work_dir, 'lock')):
            os.makedirs(path, exist_ok=True)
        self.port = free_port()
        self.endpoint = 'http://127.0.0.1:%d' % self.port
        write_conf(self.api_conf, self.api_config())
        write_conf(self.import_conf, self.image_import_config())
        self._write_paste_ini()
        self._write_uwsgi_ini()

        env = self.service_env()
        with open(os.path.join(self.log_dir, 'db_sync.log'), 'ab') as log:
            rc = subprocess.run(
                [manage, '--config-file', self.api_conf, 'db_sync'],
                env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, timeout=300).returncode
        if rc:
            self._fail('glance-manage db_sync failed (%d)' % rc)

        t0 = time.time()
        self._spawn([uwsgi, '--ini', self.uwsgi_ini], env,
                    os.path.join(self.log_dir, 'uwsgi.out'))
        deadline = t0 + self.timeout
        while True:
            if self.proc.poll() is not None:
                self._fail('uwsgi exited with %s' % self.proc.returncode)
            if time.time() > deadline:
                self._fail('GET /versions did not answer within %ds'
                           % self.timeout)
            try:
                with urllib.request.urlopen(self.endpoint + '/versions',
                                            timeout=5) as r:
                    if r.status < 500:
                        break
            except urllib.error.HTTPError as e:
                if e.code < 500:
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        self.startup_seconds = time.time() - t0
        return self

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            # SIGINT: uWSGI master kills workers at once and exits.
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                pass
        self._kill_all()

    # -- clients ------------------------------------------------------------

    def env(self):
        """Environment for the real ``openstack`` CLI, without Keystone.

        keystoneauth's ``none`` plugin with ``OS_ENDPOINT``; openstacksdk
        then needs the image endpoint given as an override (no catalog).
        """
        env = dict(os.environ)
        for key in list(env):
            if key.startswith('OS_'):
                del env[key]
        env.update({
            'OS_AUTH_TYPE': 'none',
            'OS_ENDPOINT': self.endpoint,
            'OS_IMAGE_API_VERSION': '2',
            'OS_IMAGE_ENDPOINT_OVERRIDE': self.endpoint,
        })
        return env

    def openstack(self, *args, check=True, timeout=300, input=None):
        """Run the real openstack CLI against this glance-api.

        ``openstack image create`` without --file reads image data from
        stdin whenever stdin is not a tty (so under a test runner it would
        upload an empty image). Unless ``input`` (bytes) is given, the CLI
        gets a closed stdin, like ``<&-`` in a shell.
        """
        cmd = [venv_bin('openstack')] + list(args)
        if input is None:
            # no preexec_fn: callers may have threads (e.g. a listener)
            cmd = ['sh', '-c', 'exec "$@" <&-', 'openstack'] + cmd
        result = subprocess.run(
            cmd, env=self.env(), capture_output=True, timeout=timeout,
            input=input, stdin=None if input is not None else
            subprocess.DEVNULL)
        result.stdout = result.stdout.decode(errors='replace')
        result.stderr = result.stderr.decode(errors='replace')
        if check and result.returncode:
            raise ServiceError('openstack %s failed (%d):\n%s%s' % (
                ' '.join(args), result.returncode, result.stdout,
                result.stderr))
        return result

    def glanceclient(self):
        """A python-glanceclient v2 Client talking to this glance-api."""
        from glanceclient import client as glance_client
        return glance_client.Client('2', endpoint=self.endpoint,
                                    token='noauth')
