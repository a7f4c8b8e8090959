"""Compute hosts of ``tools/cloud.sh up --computes N``, on this machine.

Each host is a mount, UTS and network namespace of its own:

* **network**: ``ip netns`` ``vmar<id>-<name>``, a veth pair whose outer
  end is on the bridge ``config.BRIDGE`` (``config.NETWORK``.1, where the
  control plane listens) and whose inner end ``eth0`` has the host's
  address, ``config.NETWORK``.(10+i). The hosts reach each other and the
  control plane on that bridge, and nothing else.
* **UTS**: the host name (``compute-i``), which libvirt reports as the
  hypervisor's name.
* **mount**: the host's own directories under ``<state_dir>/hosts/<name>``
  mounted where a real host keeps them: libvirt's five directories, and
  ``<state_dir>/{nova,vmar,run}`` (Nova's state and instances, the vmar
  host directory, the export socket). So every host reads the same
  nova.conf and vmar.conf at the same paths, and an overlay copied to
  another host names the export socket of the host it is on, as on real
  machines. ``/root/.ssh`` is the cloud's ssh client key, ``/etc/hosts``
  names the hosts.

Each host runs a peer server on its address and reads what its mirrors miss
from the others (``[vmar_peers]`` in its own ``etc/vmar-export.conf``):
:func:`peer_ca` makes the cloud's host CA once, :meth:`Host.peer_tls` the
host's server and client certificates in its own vmar directory.

The mount and UTS namespaces are kept by bind mounts on files in
``<name>/ns`` (``unshare --mount=FILE``), the network namespace by ``ip
netns``; every service of the host runs under ``nsenter`` into all three.
The services of a host (libvirtd and virtlogd with their own ``host_uuid``,
listening on the host's address for live migration; sshd for Nova's
cold-migration copies; vmar-export; vmar-nova-compute) are in
:mod:`tools.cloud.stack`.
"""

import filecmp
import hashlib
import os
import shutil
import signal
import subprocess
import time

from tools.cloud import config
from tools.cloud.services import ServiceError
from tools.vmarenv import pki

# what a host's mount namespace mounts over what (host dir relative parts)
LIBVIRT_DIRS = (('etc', '/etc/libvirt'), ('run', '/run/libvirt'),
                ('lib', '/var/lib/libvirt'), ('cache', '/var/cache/libvirt'),
                ('log', '/var/log/libvirt'))
OWN_DIRS = ('nova', 'vmar', 'run')
# a host's peer credentials, as [vmar_peers] tls_dir wants them
PEER_TLS_FILES = ('ca-cert.pem', 'server-cert.pem', 'server-key.pem',
                  'client-cert.pem', 'client-key.pem')
# the cloud's CA and the hosts' certificates live as long as the cloud
PEER_DAYS = 3650

# what peer_exports runs on a host: the system Python's libnbd (as the
# range server's peer reader), a TLS client with the host's credentials
LIST_EXPORTS = r'''import sys
import nbd
h = nbd.NBD()
h.set_tls(nbd.TLS_REQUIRE)
h.set_tls_certificates(sys.argv[1])
h.set_opt_mode(True)
h.connect_tcp(sys.argv[2], sys.argv[3])
names = []
h.opt_list(lambda name, description: names.append(name))
h.opt_abort()
print('\n'.join(names))
'''

MOUNT_SCRIPT = r'''set -e
hostname "$1"
shift
while [ $# -gt 0 ]; do
    mount --bind "$1" "$2"
    shift 2
done
'''


def _ip(*args, check=True):
    result = subprocess.run(['ip'] + list(args), capture_output=True,
                            text=True, stdin=subprocess.DEVNULL, timeout=30)
    if check and result.returncode:
        raise ServiceError('ip %s failed: %s' % (' '.join(args),
                                                 result.stderr.strip()))
    return result


def _mounted(path):
    with open('/proc/self/mountinfo') as f:
        return any(line.split()[4] == path for line in f)


def _cloud_id(cloud):
    return hashlib.sha1(cloud.state_dir.encode()).hexdigest()[:5]


def network_up(cloud):
    """The bridge the control plane listens on (idempotent)."""
    if _ip('link', 'show', config.BRIDGE, check=False).returncode:
        _ip('link', 'add', config.BRIDGE, 'type', 'bridge')
    addr = '%s/24' % cloud.address
    if addr not in _ip('-o', 'addr', 'show', 'dev', config.BRIDGE).stdout:
        _ip('addr', 'add', addr, 'dev', config.BRIDGE)
    _ip('link', 'set', config.BRIDGE, 'up')


def network_down(cloud):
    if not _ip('link', 'show', config.BRIDGE, check=False).returncode:
        _ip('link', 'del', config.BRIDGE)


class Host(object):
    """One compute host's namespaces and directories."""

    def __init__(self, cloud, host):
        self.cloud = cloud
        self.name = host['name']
        self.address = host['address']
        self.spec = host
        self.dir = cloud.host_path(host)
        self.ns_dir = os.path.join(self.dir, 'ns')
        self.netns = 'vmar%s-%s' % (_cloud_id(cloud), self.name)
        # the cloud's file, then the host's own ([vmar_peers])
        self.export_conf = [cloud.etc('vmar', 'vmar-export.conf'),
                            self.path('etc', 'vmar-export.conf')]
        # an interface name has at most 15 characters
        self.veth = 'vh%s%s' % (_cloud_id(cloud), self.name.split('-')[-1])

    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    def nsenter(self):
        """The command prefix that runs a program on this host."""
        return ['nsenter', '--mount=%s' % os.path.join(self.ns_dir, 'mnt'),
                '--uts=%s' % os.path.join(self.ns_dir, 'uts'),
                '--net=/run/netns/%s' % self.netns, '--']

    def vmar_export(self, *args):
        """``vmar-export ARGS`` on this host (its output)."""
        conf = []
        for path in self.export_conf:
            conf += ['--config-file', path]
        return subprocess.run(
            self.nsenter() + [self.cloud.bin('vmar-export')] + conf
            + list(args), capture_output=True, text=True,
            stdin=subprocess.DEVNULL, timeout=120, check=True).stdout

    def peer_tls(self):
        """The host's peer credentials (idempotent); their directory.

        ``<host dir>/vmar/pki``, which the host sees at the ``tls_dir`` of
        its ``vmar-export.conf``: the cloud's CA certificate, a server
        certificate for the host's address and a client certificate, keys
        0600 in a 0700 directory (root's: vmar-export runs as root). Made
        again only when a file is missing or the cloud's CA changed.
        """
        ca = peer_ca(self.cloud)
        d = self.path('vmar', config.PEER_TLS)
        if all(os.path.exists(os.path.join(d, f)) for f in PEER_TLS_FILES) \
                and filecmp.cmp(os.path.join(ca, 'ca-cert.pem'),
                                os.path.join(d, 'ca-cert.pem'), False):
            return d
        tmp = d + '.tmp'
        shutil.rmtree(tmp, ignore_errors=True)
        pki.make_cert(ca, tmp, 'server', self.name,
                      san='IP:%s' % self.address, days=PEER_DAYS)
        pki.make_cert(ca, tmp, 'client', self.name, days=PEER_DAYS)
        shutil.rmtree(d, ignore_errors=True)
        os.rename(tmp, d)
        return d

    def peer_exports(self, address, port=10810, tls_dir=None):
        """The export names of the peer server at ``address``.

        As this host sees them: a TLS client with its own client
        certificate (or those in ``tls_dir``), in its network namespace.
        """
        result = subprocess.run(
            self.nsenter() + ['/usr/bin/python3', '-c', LIST_EXPORTS,
                              tls_dir or self.cloud.path('vmar',
                                                         config.PEER_TLS),
                              address, str(port)],
            capture_output=True, text=True, stdin=subprocess.DEVNULL,
            timeout=60)
        if result.returncode:
            raise ServiceError('%s: listing the exports of %s:%d: %s' % (
                self.name, address, port, result.stderr.strip()))
        return result.stdout.split()

    def is_up(self):
        return (_mounted(os.path.join(self.ns_dir, 'mnt'))
                and os.path.exists('/run/netns/%s' % self.netns))

    def up(self):
        """Make the host's namespaces if they are not there (idempotent)."""
        self._directories()
        if not os.path.exists('/run/netns/%s' % self.netns):
            _ip('netns', 'add', self.netns)
        if _ip('link', 'show', self.veth, check=False).returncode:
            _ip('link', 'add', self.veth, 'type', 'veth', 'peer', 'name',
                'eth0', 'netns', self.netns)
        _ip('link', 'set', self.veth, 'master', config.BRIDGE, 'up')
        inner = ['netns', 'exec', self.netns, 'ip']
        if self.address not in _ip(*inner, '-o', 'addr').stdout:
            _ip(*inner, 'addr', 'add', '%s/24' % self.address, 'dev', 'eth0')
        _ip(*inner, 'link', 'set', 'eth0', 'up')
        _ip(*inner, 'link', 'set', 'lo', 'up')
        if _mounted(os.path.join(self.ns_dir, 'mnt')):
            return
        # a namespace is kept by a bind mount on a private mount only
        if not _mounted(self.ns_dir):
            subprocess.run(['mount', '--bind', self.ns_dir, self.ns_dir],
                           check=True)
        subprocess.run(['mount', '--make-private', self.ns_dir], check=True)
        for ns in ('mnt', 'uts'):
            open(os.path.join(self.ns_dir, ns), 'a').close()
        pairs = []
        for part, target in LIBVIRT_DIRS:
            pairs += [self.path('libvirt', part), target]
        for part in OWN_DIRS:
            pairs += [self.path(part), self.cloud.path(part)]
        pairs += [self.cloud.path('ssh', 'client'), '/root/.ssh',
                  self.cloud.etc('hosts'), '/etc/hosts']
        result = subprocess.run(
            ['unshare', '--mount=%s' % os.path.join(self.ns_dir, 'mnt'),
             '--uts=%s' % os.path.join(self.ns_dir, 'uts'),
             '--propagation', 'private', '--', 'sh', '-c', MOUNT_SCRIPT,
             'host-ns', self.name] + pairs,
            capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if result.returncode:
            self.down()
            raise ServiceError('%s: namespaces: %s' % (
                self.name, result.stderr.strip()))

    def _directories(self):
        for part, _ in LIBVIRT_DIRS:
            os.makedirs(self.path('libvirt', part), exist_ok=True)
        os.makedirs(self.path('libvirt', 'etc', 'qemu'), exist_ok=True)
        for part in OWN_DIRS + ('ns',):
            os.makedirs(self.path(part), exist_ok=True)
        for part in ('instances', 'lock'):
            os.makedirs(self.path('nova', part), exist_ok=True)
        os.chmod(self.dir, 0o755)
        os.chmod(self.path('run'), 0o755)
        # the mount points in the host's namespace (/run is a tmpfs:
        # /run/libvirt is not there on a machine whose libvirtd never ran)
        for _, target in LIBVIRT_DIRS:
            os.makedirs(target, exist_ok=True)
        for part in OWN_DIRS:
            os.makedirs(self.cloud.path(part), exist_ok=True)
        os.makedirs('/root/.ssh', mode=0o700, exist_ok=True)
        ssh_keys(self.cloud)

    def pids(self):
        """Every process in the host's mount namespace."""
        path = os.path.join(self.ns_dir, 'mnt')
        if not _mounted(path):
            return []
        want = 'mnt:[%d]' % os.stat(path).st_ino
        found = []
        for entry in os.listdir('/proc'):
            if entry.isdigit():
                try:
                    if os.readlink('/proc/%s/ns/mnt' % entry) == want:
                        found.append(int(entry))
                except OSError:
                    pass
        return found

    def kill(self):
        """Kill the host: SIGKILL every process on it, guests included.

        What a power cut leaves: libvirt's domain definitions, Nova's
        instance directories and the export state on the host's disk.
        """
        for _ in range(10):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.5)
        raise ServiceError('%s: processes survived SIGKILL: %s'
                           % (self.name, self.pids()))

    def down(self):
        """Remove the namespaces (after every process in them is gone)."""
        for ns in ('mnt', 'uts'):
            path = os.path.join(self.ns_dir, ns)
            if _mounted(path):
                subprocess.run(['umount', path], check=True)
        if _mounted(self.ns_dir):
            subprocess.run(['umount', self.ns_dir], check=True)
        if os.path.exists('/run/netns/%s' % self.netns):
            _ip('netns', 'del', self.netns)
        _ip('link', 'del', self.veth, check=False)


def peer_ca(cloud):
    """The cloud's host CA, made on first use; its directory.

    ``<state_dir>/peer-ca``: ``ca-cert.pem`` and ``ca-key.pem`` (0600, in a
    0700 directory: root's alone). ``down --purge`` removes it with the
    rest of the state.
    """
    d = cloud.path(config.PEER_CA)
    if all(os.path.exists(os.path.join(d, f))
           for f in ('ca-cert.pem', 'ca-key.pem')):
        return d
    tmp = d + '.tmp'
    shutil.rmtree(tmp, ignore_errors=True)
    pki.make_ca(tmp, 'vmar cloud %s host CA' % _cloud_id(cloud),
                days=PEER_DAYS)
    shutil.rmtree(d, ignore_errors=True)
    os.rename(tmp, d)
    return d


def ssh_keys(cloud):
    """The cloud's ssh host key and root's client key (once)."""
    d = cloud.path('ssh')
    client = os.path.join(d, 'client')
    os.makedirs(client, mode=0o700, exist_ok=True)
    host_key = os.path.join(d, 'ssh_host_ed25519_key')
    if not os.path.exists(host_key):
        subprocess.run(['ssh-keygen', '-q', '-t', 'ed25519', '-N', '',
                        '-f', host_key], check=True)
    key = os.path.join(client, 'id_ed25519')
    if not os.path.exists(key):
        subprocess.run(['ssh-keygen', '-q', '-t', 'ed25519', '-N', '',
                        '-C', 'nova@vmar-cloud', '-f', key], check=True)
    with open(key + '.pub') as f:
        pub = f.read()
    with open(os.path.join(d, 'authorized_keys'), 'w') as f:
        f.write(pub)
    with open(os.path.join(client, 'config'), 'w') as f:
        # the hosts' keys are the cloud's own, made above
        f.write('Host *\n    StrictHostKeyChecking no\n'
                '    UserKnownHostsFile /dev/null\n    LogLevel ERROR\n'
                '    BatchMode yes\n')
    # sshd's privilege separation directory (/run is a tmpfs)
    os.makedirs('/run/sshd', mode=0o755, exist_ok=True)
