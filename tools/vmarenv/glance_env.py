"""A real glance-api for the tests, tools and benches.

``GlanceAPI`` writes glance-api.conf and glance-image-import.conf, runs
``glance-manage db_sync`` and serves ``glance.wsgi.api:application`` under
uWSGI (the ``pyuwsgi`` wheel), because Glance 33 no longer has a standalone
``glance-api`` server: its console script only prints an error. There is no
Keystone: a small paste filter, a test double for keystonemiddleware's
authtoken, gives every request a fixed project, user and roles (see
PASTE_INI). Its processes are a :class:`~.process.Service`'s.
"""

import configparser
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

from tools.vmarenv import process

# Who every request to GlanceAPI is, unless it sends X-Project-Id/X-Roles/...
PROJECT_ID = '0a1b2c3d4e5f40718293a4b5c6d7e8f9'
USER_ID = 'f9e8d7c6b5a4493827160f5e4d3c2b1a'
BIN_DIR = os.path.dirname(sys.executable)


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


class GlanceAPI(process.Service):
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
        process.reap_stale()
        uwsgi = process.venv_bin('uwsgi', 'pip install pyuwsgi')
        manage = process.venv_bin('glance-manage', 'pip install glance')
        for path in (self.etc_dir, self.store_dir, self.staging_dir,
                     self.tasks_dir, self.log_dir,
                     os.path.join(self.work_dir, 'lock')):
            os.makedirs(path, exist_ok=True)
        # a restart keeps the address clients and agents were given
        self.port = self.port or process.free_port()
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

    def kill(self):
        """SIGKILL glance-api and its workers, as a crash would."""
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
        cmd = [process.venv_bin('openstack')] + list(args)
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
            raise process.ServiceError('openstack %s failed (%d):\n%s%s' % (
                ' '.join(args), result.returncode, result.stdout,
                result.stderr))
        return result

    def glanceclient(self):
        """A python-glanceclient v2 Client talking to this glance-api."""
        from glanceclient import client as glance_client
        return glance_client.Client('2', endpoint=self.endpoint,
                                    token='noauth')
