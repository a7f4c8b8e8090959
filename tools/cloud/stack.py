"""The all-in-one cloud: its services in start order, up, down, status."""

from concurrent import futures
import os
import shutil
import signal
import socket
import subprocess
import time

from tools.cloud import config
from tools.cloud import hosts
from tools.cloud import keystone_setup
from tools.cloud.services import OsloService
from tools.cloud.services import OWNER_VAR
from tools.cloud.services import Service
from tools.cloud.services import ServiceError
from tools.cloud.services import UwsgiService
from tools.vmarenv import process
from tools.vmarenv import qemu_env
from tools.vmarenv import rabbitmq_env


def _sql(cloud, database, query, *args):
    import pymysql
    conn = pymysql.connect(
        host=cloud.address, port=cloud.port('mysql'), user='nova',
        password=cloud.password('nova_db'), database=database)
    try:
        with conn.cursor() as cur:
            cur.execute(query, args)
            return cur.fetchall()
    finally:
        conn.close()


class MariaDB(Service):
    """mariadbd with its own datadir, socket and port (my.cnf)."""

    def __init__(self, cloud):
        super(MariaDB, self).__init__(cloud, 'mariadb')
        self.cnf = cloud.etc('mysql', 'my.cnf')
        self.datadir = cloud.path('mysql')
        self.endpoint = '%s:%d' % (cloud.address, cloud.port('mysql'))

    def command(self):
        return ['mariadbd', '--defaults-file=' + self.cnf]

    def ready(self):
        return process.port_open(self.cloud.port('mysql'),
                                 self.cloud.address)

    def setup(self):
        log = os.path.join(self.cloud.log_dir, 'mariadb.log')
        if not os.path.exists(log):
            open(log, 'a').close()
        shutil.chown(log, 'mysql', 'mysql')
        if os.path.isdir(os.path.join(self.datadir, 'mysql')):
            return
        os.makedirs(self.datadir, exist_ok=True)
        shutil.chown(self.datadir, 'mysql', 'mysql')
        self.run(['mariadb-install-db', '--defaults-file=' + self.cnf,
                  '--auth-root-authentication-method=socket',
                  '--skip-test-db'], 'mariadb-install-db')

    def post(self):
        self.once('databases', self._databases)

    def _databases(self):
        sql = []
        for user, databases in config.DATABASES.items():
            password = self.cloud.password(user + '_db')
            sql.append("CREATE USER IF NOT EXISTS '%s'@'%s' "
                       "IDENTIFIED BY '%s'" % (user, self.cloud.address,
                                               password))
            for db in databases:
                sql.append('CREATE DATABASE IF NOT EXISTS %s '
                           'CHARACTER SET utf8mb4' % db)
                sql.append("GRANT ALL ON %s.* TO '%s'@'%s'"
                           % (db, user, self.cloud.address))
        self.run(['mariadb', '--defaults-file=' + self.cnf, '-uroot',
                  '-e', ';'.join(sql)], 'creating databases')

    def log_files(self):
        return [self.out, os.path.join(self.cloud.log_dir, 'mariadb.log')]


class RabbitMQ(Service):
    """A private RabbitMQ node (rabbitmq_env.RabbitMQ) on fixed ports."""

    def __init__(self, cloud):
        super(RabbitMQ, self).__init__(cloud, 'rabbitmq')
        self.endpoint = 'amqp://%s:%d' % (cloud.address, cloud.port('rabbit'))
        self.mq = rabbitmq_env.RabbitMQ(
            cloud.path('rabbitmq'), user='vmar',
            password=cloud.password('rabbit'),
            ports=(cloud.port('rabbit'), cloud.port('rabbit_dist'),
                   cloud.port('rabbit_epmd')),
            nodename=cloud.settings['rabbit_node'], owner_var=OWNER_VAR,
            tag=self.tag, address=cloud.address)

    def ready(self):
        return process.port_open(self.cloud.port('rabbit'),
                                 self.cloud.address)

    def start(self):
        self.mq.stop()
        self.mq.start()

    def stop(self):
        self.mq.stop()

    def log_files(self):
        return self.mq.log_files()


class Keystone(UwsgiService):

    def __init__(self, cloud):
        super(Keystone, self).__init__(
            cloud, 'keystone', 'keystone',
            cloud.etc('keystone', 'keystone-uwsgi.ini'),
            {'OS_KEYSTONE_CONFIG_FILES': cloud.etc('keystone',
                                                   'keystone.conf')},
            probe='/v3')
        self.endpoint = cloud.keystone_url

    def setup(self):
        self.once('bootstrap', self._bootstrap)

    def _bootstrap(self):
        c = self.cloud
        for d in ('fernet-keys', 'credential-keys', 'lock'):
            os.makedirs(c.path('keystone', d), mode=0o700, exist_ok=True)
        manage = [c.bin('keystone-manage'), '--config-file',
                  c.etc('keystone', 'keystone.conf')]
        owner = ['--keystone-user', 'root', '--keystone-group', 'root']
        self.run(manage + ['db_sync'])
        self.run(manage + ['fernet_setup'] + owner)
        self.run(manage + ['credential_setup'] + owner)
        url = c.keystone_url
        self.run(manage + [
            'bootstrap', '--bootstrap-username', 'admin',
            '--bootstrap-project-name', 'admin',
            '--bootstrap-role-name', 'admin',
            '--bootstrap-service-name', 'keystone',
            '--bootstrap-region-id', config.REGION,
            '--bootstrap-admin-url', url, '--bootstrap-internal-url', url,
            '--bootstrap-public-url', url],
            env={'OS_BOOTSTRAP_PASSWORD': c.password('admin')})

    def post(self):
        self.once('catalogue', lambda: keystone_setup.ensure(self.cloud))


class Placement(UwsgiService):

    def __init__(self, cloud):
        super(Placement, self).__init__(
            cloud, 'placement', 'placement',
            cloud.etc('placement', 'placement-uwsgi.ini'),
            {'OS_PLACEMENT_CONFIG_DIR': cloud.etc('placement')})

    def setup(self):
        self.once('db', lambda: self.run([
            self.cloud.bin('placement-manage'), '--config-file',
            self.cloud.etc('placement', 'placement.conf'), 'db', 'sync']))


class Glance(UwsgiService):

    def __init__(self, cloud):
        super(Glance, self).__init__(
            cloud, 'glance-api', 'glance_api',
            cloud.etc('glance', 'glance-api-uwsgi.ini'),
            {'OS_GLANCE_CONFIG_DIR': cloud.etc('glance')},
            probe='/versions')

    def setup(self):
        c = self.cloud
        for d in ('images', 'staging', 'tasks', 'lock'):
            os.makedirs(c.path('glance', d), exist_ok=True)
        os.makedirs(c.path('vmar'), exist_ok=True)
        self.once('db', lambda: self.run([
            c.bin('glance-manage'), '--config-file',
            c.etc('glance', 'glance-api.conf'), 'db_sync']))
        # the vmar_mapgen import plugin (in glance-api) and vmar-agent
        # share the cluster tables
        self.once('vmar-db', lambda: self.run([
            c.bin('vmar-manage'), '--config-file',
            c.etc('vmar', 'vmar.conf'), 'db', 'sync']))


class Neutron(UwsgiService):

    def __init__(self, cloud):
        super(Neutron, self).__init__(
            cloud, 'neutron', 'neutron',
            cloud.etc('neutron', 'neutron-uwsgi.ini'),
            {'OS_NEUTRON_CONFIG_DIR': cloud.etc('neutron'),
             'TMPDIR': cloud.path('neutron', 'tmp')})

    def setup(self):
        c = self.cloud
        for d in ('tmp', 'lock'):
            os.makedirs(c.path('neutron', d), exist_ok=True)
        self.once('db', lambda: self.run([
            c.bin('neutron-db-manage'),
            '--config-file', c.etc('neutron', 'neutron.conf'),
            '--config-file', c.etc('neutron', 'plugins', 'ml2',
                                   'ml2_conf.ini'),
            'upgrade', 'heads']))


class NovaAPI(UwsgiService):

    # its uWSGI worker ignores SIGTERM for as long as we wait: nothing of
    # the API's state is lost by killing it
    stop_timeout = 5

    def __init__(self, cloud):
        super(NovaAPI, self).__init__(
            cloud, 'nova-api', 'nova_api',
            cloud.etc('nova', 'nova-api-uwsgi.ini'),
            {'OS_NOVA_CONFIG_DIR': cloud.etc('nova'),
             # Nova's default pair, then nova-api's own settings
             'OS_NOVA_CONFIG_FILES': 'api-paste.ini;nova.conf;nova-api.conf'})
        self.endpoint = cloud.url('nova_api') + '/v2.1'

    def setup(self):
        c = self.cloud
        for d in ('instances', 'lock'):
            os.makedirs(c.path('nova', d), exist_ok=True)
        manage = [c.bin('nova-manage'), '--config-file',
                  c.etc('nova', 'nova.conf')]
        self.once('api-db', lambda: self.run(manage + ['api_db', 'sync']))
        self.once('cell0', lambda: self.run(manage + [
            'cell_v2', 'map_cell0', '--database_connection',
            c.db_url('nova', 'nova_cell0')]))
        self.once('cell1', lambda: self.run(manage + [
            'cell_v2', 'create_cell', '--name', 'cell1']))
        self.once('db', lambda: self.run(manage + ['db', 'sync']))


class Libvirt(Service):
    """virtlogd and libvirtd of the cloud, in a mount namespace of their own.

    /etc/libvirt, /run/libvirt, /var/lib/libvirt, /var/cache/libvirt and
    /var/log/libvirt are bind mounts of <state_dir>/libvirt/* in that
    namespace only: the system libvirtd (the tests') and this one share no
    domain, socket, pid file or capabilities cache, and no mount is seen
    outside. The namespace ends with its last process.
    """

    SCRIPT = r'''set -e
L=$1
mount --make-rprivate /
mount --bind "$L/etc" /etc/libvirt
mount --bind "$L/run" /run/libvirt
mount --bind "$L/lib" /var/lib/libvirt
mount --bind "$L/cache" /var/cache/libvirt
mount --bind "$L/log" /var/log/libvirt
virtlogd -d -p /run/libvirt/virtlogd.pid -f /etc/libvirt/virtlogd.conf
exec libvirtd -p /run/libvirt/libvirtd.pid -f /etc/libvirt/libvirtd.conf
'''
    MOUNT_POINTS = ('/etc/libvirt', '/run/libvirt', '/var/lib/libvirt',
                    '/var/cache/libvirt', '/var/log/libvirt')

    def __init__(self, cloud, name='libvirtd', root=None):
        super(Libvirt, self).__init__(cloud, name)
        self.root = root or cloud.path('libvirt')
        self.socket = os.path.join(self.root, 'run', 'libvirt-sock')
        self.endpoint = 'qemu:///system?socket=%s' % self.socket

    def command(self):
        return ['unshare', '--mount', '--propagation', 'private', '--',
                'sh', '-c', self.SCRIPT, 'libvirt-ns', self.root]

    def setup(self):
        # /run is a tmpfs: without systemd nobody makes the package's
        # runtime directory after a boot until a libvirtd starts
        os.makedirs('/run/libvirt', mode=0o755, exist_ok=True)
        missing = [p for p in self.MOUNT_POINTS if not os.path.isdir(p)]
        if missing:
            raise ServiceError('libvirt is not installed (no %s): '
                               'tools/install-deps.sh cloud' % missing)
        for d in ('etc/qemu', 'run', 'lib', 'cache', 'log'):
            os.makedirs(os.path.join(self.root, d), exist_ok=True)
        # see qemu_env: without udev, libvirt re-probes QEMU on every start
        qemu_env._kvm_device_as_debian_sets_it()

    def virsh(self, *args):
        return subprocess.run(['virsh', '-c', self.endpoint] + list(args),
                              capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=60)

    def ready(self):
        return (os.path.exists(self.socket)
                and self.virsh('version').returncode == 0)

    def log_files(self):
        return [self.out, os.path.join(self.root, 'log', 'libvirtd.log')]

    def destroy_domains(self):
        """Destroy and undefine every domain of this libvirtd."""
        if not self.pids():
            return []
        out = self.virsh('list', '--all', '--name')
        names = [n for n in out.stdout.split() if n]
        for name in names:
            self.virsh('destroy', name)
            self.virsh('undefine', '--nvram', name)
        return names

    def stop(self):
        self.destroy_domains()
        super(Libvirt, self).stop()


class VmarExport(OsloService):

    def __init__(self, cloud, name='vmar-export', conf=None):
        super(VmarExport, self).__init__(
            cloud, name, 'vmar-export',
            conf or [cloud.etc('vmar', 'vmar-export.conf')], args=['serve'])
        self.endpoint = 'nbd+unix:///?socket=%s' % cloud.export_socket
        self.socket = cloud.export_socket

    def setup(self):
        if not self.cloud.qemu_prefix:
            raise ServiceError('no patched QEMU: run tools/cloud.sh, or '
                               'pass --qemu-prefix')
        os.makedirs(self.cloud.path('run'), exist_ok=True)
        os.chmod(self.cloud.path('run'), 0o755)

    def ready(self):
        return (os.path.exists(self.socket)
                and super(VmarExport, self).ready())


class NovaCompute(OsloService):
    """vmar-nova-compute: Nova's nova-compute with the vmar backend."""

    # oslo.service's graceful shutdown waits out the whole timeout; the
    # domains are gone already (down destroys them first)
    stop_timeout = 5

    def __init__(self, cloud, name='nova-compute', conf=(), host_name=None,
                 libvirt_uri=None):
        super(NovaCompute, self).__init__(
            cloud, name, 'vmar-nova-compute',
            [cloud.etc('nova', 'nova.conf')] + list(conf))
        self.host_name = host_name or socket.gethostname()
        self.endpoint = libvirt_uri or cloud.libvirt_uri

    def ready(self):
        if not super(NovaCompute, self).ready():
            return False
        try:
            return bool(_sql(
                self.cloud, 'nova_cell1', 'SELECT id FROM compute_nodes '
                'WHERE host=%s AND deleted=0', self.host_name))
        except Exception:
            return False

    def post(self):
        mapped = _sql(self.cloud, 'nova_api', 'SELECT id FROM host_mappings '
                      'WHERE host=%s', self.host_name)
        if not mapped:
            self.run([self.cloud.bin('nova-manage'), '--config-file',
                      self.cloud.etc('nova', 'nova.conf'), 'cell_v2',
                      'discover_hosts', '--verbose'])


class _OnHost(object):
    """Mixin: the service runs in its host's namespaces (``self.host``)."""

    def command(self):
        return self.host.nsenter() + super(_OnHost, self).command()


class HostLibvirt(Libvirt):
    """A compute host's virtlogd and libvirtd, in the host's namespaces."""

    SCRIPT = r'''set -e
virtlogd -d -p /run/libvirt/virtlogd.pid -f /etc/libvirt/virtlogd.conf
exec libvirtd --listen -p /run/libvirt/libvirtd.pid \
    -f /etc/libvirt/libvirtd.conf
'''

    def __init__(self, cloud, host):
        super(HostLibvirt, self).__init__(cloud, 'libvirtd@' + host.name,
                                          host.path('libvirt'))
        self.host = host

    def command(self):
        # the host's mount namespace has the bind mounts already
        return self.host.nsenter() + ['sh', '-c', self.SCRIPT]

    def setup(self):
        self.host.up()
        super(HostLibvirt, self).setup()


class HostSshd(Service):
    """A compute host's sshd: Nova copies disks between hosts with scp."""

    def __init__(self, cloud, host):
        super(HostSshd, self).__init__(cloud, 'sshd@' + host.name)
        self.host = host
        self.endpoint = 'ssh://%s' % host.address

    def command(self):
        return self.host.nsenter() + [
            '/usr/sbin/sshd', '-D', '-e', '-f', self.cloud.etc(
                'ssh', 'sshd_config'),
            '-o', 'ListenAddress=%s' % self.host.address]

    def setup(self):
        self.host.up()

    def ready(self):
        return process.port_open(22, self.host.address)


class HostExport(_OnHost, VmarExport):
    """A compute host's vmar-export, with its peer server (issue 34)."""

    def __init__(self, cloud, host):
        self.host = host
        super(HostExport, self).__init__(cloud, 'vmar-export@' + host.name,
                                         conf=host.export_conf)
        # the same path on every host, seen from here in the host's dir
        self.socket = host.path('run', os.path.basename(cloud.export_socket))

    def setup(self):
        self.host.up()
        self.host.peer_tls()
        super(HostExport, self).setup()


class HostCompute(_OnHost, NovaCompute):

    def __init__(self, cloud, host):
        self.host = host
        super(HostCompute, self).__init__(
            cloud, 'nova-compute@' + host.name,
            conf=[host.path('etc', 'nova-compute.conf')],
            host_name=host.name, libvirt_uri=HostLibvirt(cloud, host).endpoint)

    def setup(self):
        self.host.up()


def host_services(cloud):
    """Every compute host's services, host by host, in start order."""
    out = []
    for spec in cloud.hosts:
        host = hosts.Host(cloud, spec)
        out += [HostLibvirt(cloud, host), HostSshd(cloud, host),
                HostExport(cloud, host), HostCompute(cloud, host)]
    return out


def services(cloud):
    """The services in start order."""
    nova_conf = [cloud.etc('nova', 'nova.conf')]
    return [
        MariaDB(cloud),
        RabbitMQ(cloud),
        Keystone(cloud),
        Placement(cloud),
        Glance(cloud),
        Neutron(cloud),
        NovaAPI(cloud),
        OsloService(cloud, 'nova-conductor', 'nova-conductor', nova_conf),
        OsloService(cloud, 'nova-scheduler', 'nova-scheduler', nova_conf + [
            cloud.etc('nova', 'nova-scheduler.conf')]),
        OsloService(cloud, 'vmar-agent', 'vmar-agent',
                    [cloud.etc('vmar', 'vmar.conf')]),
    ] + (host_services(cloud) if cloud.hosts else [
        Libvirt(cloud),
        VmarExport(cloud),
        NovaCompute(cloud),
    ])


def up(cloud, echo=print, computes=None):
    cloud.load(create=True, computes=computes)
    for d in ('log', 'stamps', 'run', 'tmp', 'cache'):
        os.makedirs(cloud.path(d), exist_ok=True)
    os.chmod(cloud.path('run'), 0o755)
    os.chmod(cloud.path('tmp'), 0o1777)  # MariaDB and QEMU use it too
    cloud.render()
    if cloud.hosts:
        # the control plane listens on the hosts' bridge
        hosts.network_up(cloud)
    for svc in services(cloud):
        if svc.is_up():
            echo('%-15s running' % svc.name)
            svc.post()
            continue
        t0 = time.time()
        svc.start()
        echo('%-15s started in %.1f s' % (svc.name, time.time() - t0))
    return cloud.write_openrc()


def _ancestors():
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            with open('/proc/%d/stat' % pid) as f:
                pid = int(f.read().rsplit(')', 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def strays(cloud):
    """Processes of this cloud that no service accounts for.

    Tagged processes of any service, and processes whose command line
    names the state directory (QEMU guests: libvirtd gives them a clean
    environment, so they carry no tag).
    """
    prefix = cloud.state_dir + ':'
    found = set(process.tagged_pids(lambda t: t.startswith(prefix),
                                    OWNER_VAR))
    needle = (cloud.state_dir + '/').encode()
    mine = _ancestors()
    for entry in os.listdir('/proc'):
        if not entry.isdigit() or int(entry) in mine:
            continue
        try:
            with open('/proc/%s/cmdline' % entry, 'rb') as f:
                if needle in f.read():
                    found.add(int(entry))
        except OSError:
            continue
    return sorted(found - mine)


def down(cloud, echo=print):
    if not cloud.load():
        echo('no cloud in %s' % cloud.state_dir)
        return
    every = services(cloud)
    for svc in every:
        if isinstance(svc, Libvirt):
            names = svc.destroy_domains()
            if names:
                echo('destroyed domains: %s' % ' '.join(names))
    # the services in parallel, then RabbitMQ and MariaDB, which the
    # others use while they stop
    last = [svc for svc in every if isinstance(svc, (RabbitMQ, MariaDB))]
    first = [svc for svc in every if svc not in last]

    def stop(svc):
        if svc.pids():
            t0 = time.time()
            svc.stop()
            echo('%-15s stopped in %.1f s' % (svc.name, time.time() - t0))
    for group in (first, list(reversed(last))):
        with futures.ThreadPoolExecutor(len(group)) as pool:
            for done in [pool.submit(stop, svc) for svc in group]:
                done.result()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        left = strays(cloud)
        for pid in left:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + 10
        while left and time.time() < deadline:
            left = strays(cloud)
            time.sleep(0.2)
    left = strays(cloud)
    if left:
        raise ServiceError('processes survived down: %s' % left)
    for spec in cloud.hosts:
        hosts.Host(cloud, spec).down()
    if cloud.hosts:
        hosts.network_down(cloud)
    for sock in (cloud.export_socket,):
        if os.path.exists(sock):
            os.unlink(sock)


def status(cloud, echo=print):
    if not cloud.load():
        echo('no cloud in %s' % cloud.state_dir)
        return False
    all_up = True
    echo('%-15s %-5s %-22s %s' % ('service', 'state', 'pids', 'endpoint'))
    for svc in services(cloud):
        pids = svc.pids()
        state = 'up' if pids and svc.ready() else 'down'
        all_up = all_up and state == 'up'
        echo('%-15s %-5s %-22s %s' % (
            svc.name, state, ','.join(map(str, pids[:4]))
            + (',...' if len(pids) > 4 else '') or '-',
            svc.endpoint or ''))
    return all_up
