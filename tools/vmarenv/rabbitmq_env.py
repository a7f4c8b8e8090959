"""A private RabbitMQ node for the tests, tools and benches.

``RabbitMQ`` starts its own ``rabbitmq-server`` node (own epmd port, own
Erlang cookie, own mnesia and log dirs) and gives a ``transport_url``.
"""

import os
import secrets
import shutil
import subprocess
import time

from tools.vmarenv import process


def _rabbit_script(name):
    for path in ('/usr/lib/rabbitmq/bin/' + name, '/usr/sbin/' + name):
        if os.path.exists(path):
            return path
    found = shutil.which(name)
    if not found:
        raise process.ServiceError(
            '%s not found; install it: DEBIAN_FRONTEND=noninteractive '
            'apt-get install -y --no-install-recommends rabbitmq-server'
            % name)
    return found


class RabbitMQ(process.Service):
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
        listens; ``tagging``: see :class:`process.Service`.
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
            raise process.ServiceError('rabbitmqctl %s failed (%d): %s%s' % (
                ' '.join(args), result.returncode, result.stdout,
                result.stderr))
        return result

    def start(self):
        if self.owner_var == process.OWNER_VAR:
            process.reap_stale()
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
            self.ports or process.free_ports(3))
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
        while not process.port_open(self.port, self.address):
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
