"""A host's range server or peer fetcher (nbdkit), started alone.

What ``vmar-export serve`` starts before its daemon
(:meth:`vmar_openstack.host.supervisor.Supervisor.start_fetcher`: the
range server, nbdkit with nbdkit_glance.py; and
:func:`vmar_openstack.host.peers.server.start_fetcher`: the peer fetcher,
nbdkit with nbdkit_peers.py), for tests and benches of what they read:
the same commands, from a configuration file.
"""

from vmar_openstack import conf as vmar_conf
from vmar_openstack.host.peers import nbdkit_proc
from vmar_openstack.host.peers import server as peers
from vmar_openstack.mapsource import glance as glance_source


def start(conf_file, log_path, timeout=60):
    """Start the range server of ``conf_file``; (process, socket path)."""
    cmd, sock, env = glance_source.GlanceSource(
        vmar_conf.from_files([conf_file])).range_server_command()
    return nbdkit_proc.start(cmd, env, log_path, sock, 'the range server',
                             timeout), sock


def start_peer_fetcher(conf_file, log_path, timeout=60):
    """Start the peer fetcher of ``conf_file``; (process, socket path)."""
    cmd, sock, env = peers.fetcher_command(vmar_conf.from_files([conf_file]))
    return nbdkit_proc.start(cmd, env, log_path, sock, 'the peer fetcher',
                             timeout), sock


def stop(proc):
    proc.terminate()
    proc.wait()
