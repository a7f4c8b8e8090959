"""The peer server: what this host holds, served to the cloud's hosts.

With ``[vmar_peers] listen_address`` set, ``vmar-export serve`` runs nbdkit
on that address with :mod:`.nbdkit_peer`: one read-only NBD export per
image whose base or mirror the host holds, TLS with client certificates
required (the cloud's host CA, ``[vmar_peers] tls_dir``), at most
``max_clients`` connections (nbdkit's ``limit`` filter) sharing
``rate_mib`` (its ``rate`` filter). See doc/source/admin/peers.rst.
"""

import os
import sysconfig

from oslo_log import log as logging

from vmar_openstack import exception
from vmar_openstack.host.exports import hostdir
from vmar_openstack.host.peers import nbdkit_proc
from vmar_openstack.host.peers import source as peer_source
from vmar_openstack import names

LOG = logging.getLogger(__name__)

PLUGIN = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      'nbdkit_peer.py')
# the files nbdkit's --tls-certificates needs of a server
SERVER_FILES = ('ca-cert.pem', 'server-cert.pem', 'server-key.pem')
# Peers wait for the host's own guests: the peer server runs at a lower
# CPU priority and at the lowest best-effort I/O priority (nice and
# ionice exec it: its parent is still the daemon, for --exit-with-parent).
# Measured: a guest's p99 read latency on a host serving three peers was
# 11.6 x that of the same load read from the store without it
# (bench/RESULTS.md, bench_peers_hosts.py).
PRIORITY = ['nice', '-n', '10', 'ionice', '-c', '2', '-n', '7']


def enabled(conf):
    return bool(conf.vmar_peers.listen_address)


def command(conf, pid_file):
    """nbdkit's argv for the peer server; the pid file says it is ready."""
    p = conf.vmar_peers
    missing = [f for f in SERVER_FILES
               if not os.path.isfile(os.path.join(p.tls_dir, f))]
    if missing:
        raise exception.ExportError(
            'the peer server needs %s in [vmar_peers] tls_dir %s'
            % (', '.join(missing), p.tls_dir))
    cmd = PRIORITY + [
        conf.vmar_host.nbdkit, '--foreground', '--exit-with-parent',
        '--ipaddr', p.listen_address, '--port', str(p.listen_port),
        '--pidfile', pid_file, '--tls=require',
        '--tls-certificates=%s' % p.tls_dir, '--tls-verify-peer',
        '--threads', str(max(4, p.max_clients)), '--filter=limit']
    if p.rate_mib:
        cmd += ['--filter=rate']
    cmd += ['python', PLUGIN, 'host-dir=%s' % conf.vmar_host.host_dir,
            'digests=%s' % hostdir.Layout(conf.vmar_host.host_dir).mirror(
                '{}').digests,
            'digests-export=%s' % names.peer_digests_export('{}'),
            'limit=%d' % p.max_clients]
    if p.rate_mib:
        cmd += ['rate=%d' % (p.rate_mib * 8 * 1024 * 1024)]
    return cmd


FETCHER_PLUGIN = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                              'nbdkit_peers.py')


def _system_python_env():
    """nbdkit embeds the system's Python: its PATH, no venv variables."""
    env = dict(os.environ, PATH='/usr/sbin:/usr/bin:/sbin:/bin')
    env.pop('PYTHONHOME', None)
    env.pop('PYTHONPATH', None)
    return env


def fetcher_command(conf):
    """(argv, socket, env) of the host's peer fetcher, or None.

    None unless this host reads from peers (:func:`.mapsource.peers.
    enabled`). The fetcher (nbdkit with :mod:`vmar_openstack.mapsource.
    nbdkit_peers`) is told where this host keeps its mirrors' digest
    lists, which the peers' blocks are checked against, and the files of
    their holders (:mod:`.discovery`), ``{}`` standing for the image id;
    where it counts what it reads from peers. No retry filter: a run no
    peer holds goes to the store at once.
    """
    if not peer_source.enabled(conf):
        return None
    layout = hostdir.Layout(conf.vmar_host.host_dir)
    os.makedirs(os.path.dirname(layout.peer_counts_file()), exist_ok=True)
    sock = peer_source.fetch_socket(conf)
    cmd = [conf.vmar_host.nbdkit, '--foreground', '--exit-with-parent',
           '--unix', sock, '--threads', '16', 'python', FETCHER_PLUGIN,
           'site=%s' % sysconfig.get_paths()['purelib'],
           'digests=%s' % layout.mirror('{}').digests,
           'counts=%s' % layout.peer_counts_file()]
    if conf.vmar_peers.discover:
        cmd.append('holders=%s' % layout.holders_file('{}'))
    cmd += ['config-file=%s' % f for f in conf.config_file or ()]
    return cmd, sock, _system_python_env()


def start_fetcher(conf):
    """Start the peer fetcher; its process once it listens, or None."""
    found = fetcher_command(conf)
    if found is None:
        return None
    cmd, sock, env = found
    proc = nbdkit_proc.start(cmd, env, os.path.join(
        conf.vmar_host.host_dir, 'peer-fetch.log'), sock,
        'the peer fetcher (%s)' % cmd[0])
    LOG.info('peer fetcher %d on %s', proc.pid, sock)
    return proc


def start(conf):
    """Start the peer server; its process once it accepts connections."""
    host_dir = conf.vmar_host.host_dir
    os.makedirs(host_dir, exist_ok=True)
    pid_file = os.path.join(host_dir, 'peers.pid')
    cmd = command(conf, pid_file)
    proc = nbdkit_proc.start(cmd, _system_python_env(),
                             os.path.join(host_dir, 'peers.log'),
                             pid_file, 'the peer server (nbdkit)')
    LOG.info('peer server %d on %s:%d', proc.pid,
             conf.vmar_peers.listen_address, conf.vmar_peers.listen_port)
    return proc
