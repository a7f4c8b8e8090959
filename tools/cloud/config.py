"""The cloud's settings and the configuration files rendered from them.

Settings (ports, passwords, the libvirt host UUID) are chosen on the first
``up`` and kept in ``<state_dir>/cloud.json``, so every later ``up``
renders the same files. The files are the templates in ``etc/cloud``
(``@name@`` placeholders) rendered into ``<state_dir>/etc``; the paste
files the packages ship are copied next to them, as an operator's packages
put them in /etc.
"""

import json
import os
import re
import secrets
import shutil
import socket
import sys
import uuid

from tools.vmarenv import process

TOP = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
TEMPLATES = os.path.join(TOP, 'etc', 'cloud')
DEFAULT_STATE_DIR = '/var/lib/vmar-cloud'
REGION = 'RegionOne'
# --computes N > 1: the control plane listens on the bridge's address and
# compute host i (1..N) is NETWORK.(10+i) in a network namespace of its
# own (tools/cloud/hosts.py)
NETWORK = '10.254.77'
BRIDGE = 'vmarbr0'
# --computes N > 1: the hosts' peer servers (issue 34). The cloud's host CA
# is <state_dir>/PEER_CA; each host's credentials are in its own vmar
# directory, <state_dir>/hosts/<name>/vmar/PEER_TLS, which the host sees at
# <state_dir>/vmar/PEER_TLS (tools/cloud/hosts.py)
PEER_CA = 'peer-ca'
PEER_TLS = 'pki'

PORTS = ('mysql', 'rabbit', 'rabbit_dist', 'rabbit_epmd', 'keystone',
         'glance_api', 'placement', 'nova_api', 'neutron')
# service users in project "service" (Keystone users of the same name)
SERVICE_USERS = ('glance', 'nova', 'placement', 'neutron', 'vmar')
DATABASES = {  # MariaDB user -> its databases
    'keystone': ('keystone',),
    'glance': ('glance',),
    'placement': ('placement',),
    'neutron': ('neutron',),
    'nova': ('nova_api', 'nova_cell0', 'nova_cell1'),
    'vmar': ('vmar',),
}

# template -> where it is rendered, relative to state_dir
FILES = (
    ('my.cnf.in', 'etc/mysql/my.cnf'),
    ('keystone.conf.in', 'etc/keystone/keystone.conf'),
    ('keystone-uwsgi.ini.in', 'etc/keystone/keystone-uwsgi.ini'),
    ('placement.conf.in', 'etc/placement/placement.conf'),
    ('placement-uwsgi.ini.in', 'etc/placement/placement-uwsgi.ini'),
    ('glance-api.conf.in', 'etc/glance/glance-api.conf'),
    ('glance-image-import.conf.in', 'etc/glance/glance-image-import.conf'),
    ('glance-api-uwsgi.ini.in', 'etc/glance/glance-api-uwsgi.ini'),
    ('neutron.conf.in', 'etc/neutron/neutron.conf'),
    ('ml2_conf.ini.in', 'etc/neutron/plugins/ml2/ml2_conf.ini'),
    ('neutron-uwsgi.ini.in', 'etc/neutron/neutron-uwsgi.ini'),
    ('nova.conf.in', 'etc/nova/nova.conf'),
    ('nova-scheduler.conf.in', 'etc/nova/nova-scheduler.conf'),
    ('nova-api.conf.in', 'etc/nova/nova-api.conf'),
    ('nova-api-uwsgi.ini.in', 'etc/nova/nova-api-uwsgi.ini'),
    ('vmar.conf.in', 'etc/vmar/vmar.conf'),
    ('vmar-export.conf.in', 'etc/vmar/vmar-export.conf'),
    ('libvirtd.conf.in', 'libvirt/etc/libvirtd.conf'),
    ('qemu.conf.in', 'libvirt/etc/qemu.conf'),
    ('virtlogd.conf.in', 'libvirt/etc/virtlogd.conf'),
)
# per compute host (--computes N > 1), relative to its directory
# <state_dir>/hosts/<name>; the host's vmar-export reads its
# etc/vmar-export.conf after the cloud's (its peer server, PEER_TLS)
HOST_FILES = (
    ('nova-compute-host.conf.in', 'etc/nova-compute.conf'),
    ('vmar-export-host.conf.in', 'etc/vmar-export.conf'),
    ('libvirtd.conf.in', 'libvirt/etc/libvirtd.conf'),
    ('qemu.conf.in', 'libvirt/etc/qemu.conf'),
    ('virtlogd.conf.in', 'libvirt/etc/virtlogd.conf'),
)
# paste files shipped in the venv's etc/ -> state_dir
PASTE = (
    ('glance/glance-api-paste.ini', 'etc/glance/glance-api-paste.ini'),
    ('neutron/api-paste.ini', 'etc/neutron/api-paste.ini'),
    ('nova/api-paste.ini', 'etc/nova/api-paste.ini'),
)


def _render(template, variables):
    """The template's text with its @name@ placeholders filled in."""
    def substitute(match):
        key = match.group(1)
        if key not in variables:
            raise KeyError('unknown placeholder @%s@ in %s' % (key, template))
        return str(variables[key])

    with open(os.path.join(TEMPLATES, template)) as f:
        return re.sub(r'@([a-z0-9_]+)@', substitute, f.read())


class Cloud(object):
    """Paths, settings and rendered files of one cloud (one state_dir)."""

    def __init__(self, state_dir=None, qemu_prefix=None):
        self.state_dir = os.path.abspath(
            state_dir or os.environ.get('VMAR_CLOUD_STATE')
            or DEFAULT_STATE_DIR)
        self.venv = os.path.dirname(os.path.dirname(sys.executable))
        self.bin_dir = os.path.join(self.venv, 'bin')
        self.log_dir = self.path('log')
        self.settings_file = self.path('cloud.json')
        self.qemu_prefix = qemu_prefix
        self.settings = None

    def path(self, *parts):
        return os.path.join(self.state_dir, *parts)

    def bin(self, name):
        return os.path.join(self.bin_dir, name)

    def etc(self, *parts):
        return self.path('etc', *parts)

    # -- settings -------------------------------------------------------

    def load(self, create=False, computes=None):
        """Read cloud.json; with ``create``, choose and write it if absent.

        ``computes`` is the number of compute hosts a new cloud gets (one:
        nova-compute on this machine as it is; more: each in namespaces of
        its own); an existing cloud keeps the number it was made with.
        """
        if os.path.exists(self.settings_file):
            with open(self.settings_file) as f:
                self.settings = json.load(f)
            made = self.settings.get('computes', 1)
            if computes is not None and computes != made:
                raise process.ServiceError(
                    'the cloud in %s has %d compute host(s), not %d: '
                    'tools/cloud.sh down --purge first'
                    % (self.state_dir, made, computes))
        elif create:
            computes = computes or 1
            if computes < 1:
                raise process.ServiceError('--computes must be >= 1')
            os.makedirs(self.state_dir, exist_ok=True)
            os.chmod(self.state_dir, 0o755)  # QEMU (libvirt-qemu) traverses
            ports = process.free_ports(len(PORTS))
            self.settings = {
                'ports': dict(zip(PORTS, ports)),
                'passwords': {name: secrets.token_hex(12) for name in (
                    ('admin', 'rabbit') + SERVICE_USERS
                    + tuple('%s_db' % u for u in DATABASES))},
                'libvirt_host_uuid': str(uuid.uuid4()),
                'rabbit_node': 'vmarcloud_%s@localhost' % secrets.token_hex(3),
                'computes': computes,
                'address': ('127.0.0.1' if computes == 1
                            else NETWORK + '.1'),
                'hosts': [{'name': 'compute-%d' % i,
                           'address': '%s.%d' % (NETWORK, 10 + i),
                           'libvirt_host_uuid': str(uuid.uuid4())}
                          for i in range(1, computes + 1)
                          if computes > 1],
            }
            if self.qemu_prefix:
                self.settings['qemu_prefix'] = self.qemu_prefix
            tmp = self.settings_file + '.tmp'
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                              0o600), 'w') as f:
                json.dump(self.settings, f, indent=2, sort_keys=True)
            os.rename(tmp, self.settings_file)
        else:
            return False
        if self.qemu_prefix and self.settings.get(
                'qemu_prefix') != self.qemu_prefix:
            self.settings['qemu_prefix'] = self.qemu_prefix
            with open(self.settings_file, 'w') as f:
                json.dump(self.settings, f, indent=2, sort_keys=True)
        self.qemu_prefix = self.settings.get('qemu_prefix')
        return True

    @property
    def address(self):
        """Where the control plane listens (and this machine reaches it)."""
        return self.settings.get('address', '127.0.0.1')

    @property
    def hosts(self):
        """The compute hosts in namespaces (none: one compute, in place)."""
        return self.settings.get('hosts', [])

    def port(self, name):
        return self.settings['ports'][name]

    def password(self, name):
        return self.settings['passwords'][name]

    def url(self, service):
        return 'http://%s:%d' % (self.address, self.port(service))

    @property
    def keystone_url(self):
        return self.url('keystone') + '/v3'

    @property
    def transport_url(self):
        return 'rabbit://vmar:%s@%s:%d/' % (
            self.password('rabbit'), self.address, self.port('rabbit'))

    @property
    def export_socket(self):
        return self.path('run', 'vmar-nbd.sock')

    @property
    def api_socket(self):
        """The export daemon's host API: beside its NBD socket."""
        return self.path('run', 'api.sock')

    @property
    def libvirt_uri(self):
        return 'qemu:///system?socket=%s' % self.path(
            'libvirt', 'run', 'libvirt-sock')

    def db_url(self, user, database):
        return 'mysql+pymysql://%s:%s@%s:%d/%s?charset=utf8mb4' % (
            user, self.password(user + '_db'), self.address,
            self.port('mysql'), database)

    def variables(self):
        v = {
            'state_dir': self.state_dir,
            'address': self.address,
            'top': TOP,
            'log_dir': self.log_dir,
            'venv': self.venv,
            'keystone_url': self.keystone_url,
            'glance_url': self.url('glance_api'),
            'transport_url': self.transport_url,
            'vmar_state_dir': self.path('vmar'),
            'peer_tls_dir': self.path('vmar', PEER_TLS),
            'export_socket': self.export_socket,
            'api_socket': self.api_socket,
            'qemu_img': '/usr/bin/qemu-img',
            'qemu_prefix': self.qemu_prefix or '',
            'libvirt_host_uuid': self.settings['libvirt_host_uuid'],
            # the compute host's own (HOST_FILES): a single compute is
            # this machine, at the control plane's address
            'host_name': socket.gethostname(),
            'host_address': self.address,
            'host_dir': self.state_dir,
            # Nova's default; the user-path test runs it every few seconds
            'image_cache_interval': os.environ.get(
                'VMAR_CLOUD_IMAGE_CACHE_INTERVAL', '2400'),
        }
        for name, port in self.settings['ports'].items():
            v['%s_port' % name] = port
        for name, password in self.settings['passwords'].items():
            v['%s_password' % name] = password
        return v

    # -- files ----------------------------------------------------------

    def host_variables(self, host):
        v = self.variables()
        v.update({'host_name': host['name'],
                  'host_address': host['address'],
                  'host_dir': self.host_path(host),
                  'libvirt_host_uuid': host['libvirt_host_uuid']})
        return v

    def host_path(self, host, *parts):
        return self.path('hosts', host['name'], *parts)

    def render(self):
        """Write every configuration file; return the paths written."""
        variables = self.variables()
        written = [self._write(dest, _render(template, variables))
                   for template, dest in FILES]
        if self.hosts:
            written.append(self._write('etc/ssh/sshd_config', _render(
                'sshd_config.in', variables)))
            written.append(self._write('etc/hosts', ''.join(
                '%s %s\n' % pair for pair in
                [('127.0.0.1', 'localhost'), (self.address, 'controller')]
                + [(h['address'], h['name']) for h in self.hosts])))
        for host in self.hosts:
            hv = self.host_variables(host)
            rel = os.path.relpath(self.host_path(host), self.state_dir)
            for template, dest in HOST_FILES:
                written.append(self._write(os.path.join(rel, dest),
                                           _render(template, hv)))
        for src, dest in PASTE:
            with open(os.path.join(self.venv, 'etc', src)) as f:
                written.append(self._write(dest, f.read()))
        return written

    def _write(self, dest, text):
        path = self.path(dest)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + '.tmp'
        # passwords inside: readable by root only
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                          0o640), 'w') as f:
            f.write(text)
        os.rename(tmp, path)
        return path

    def write_openrc(self):
        path = self.path('openrc')
        text = ''.join('export %s=%s\n' % kv for kv in (
            ('OS_AUTH_URL', self.keystone_url),
            ('OS_AUTH_TYPE', 'password'),
            ('OS_IDENTITY_API_VERSION', '3'),
            ('OS_USERNAME', 'admin'),
            ('OS_PASSWORD', self.password('admin')),
            ('OS_PROJECT_NAME', 'admin'),
            ('OS_USER_DOMAIN_NAME', 'Default'),
            ('OS_PROJECT_DOMAIN_NAME', 'Default'),
            ('OS_REGION_NAME', REGION),
            ('OS_INTERFACE', 'public'),
        ))
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                          0o600), 'w') as f:
            f.write(text)
        return path

    def clean(self):
        """Remove the state directory (``down --purge``)."""
        shutil.rmtree(self.state_dir, ignore_errors=True)
