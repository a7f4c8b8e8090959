"""A host's range server (nbdkit with nbdkit_glance.py), started alone.

What ``vmar-export serve`` starts before its daemon
(:meth:`vmar_openstack.export.supervisor.Supervisor.start_fetcher`), for
tests and benches of what it reads: the same command, from a
configuration file.
"""

from oslo_config import cfg

from vmar_openstack import conf as vmar_conf
from vmar_openstack.export import nbdkit_proc
from vmar_openstack.export import peers
from vmar_openstack.mapsource import glance as glance_source


def start(conf_file, log_path, timeout=60):
    """Start the range server of ``conf_file``; (process, socket path)."""
    conf = cfg.ConfigOpts()
    vmar_conf.register_opts(conf)
    conf(['--config-file', conf_file], project='vmar')
    cmd, sock, env = glance_source.GlanceSource(conf).range_server_command()
    cmd += peers.range_server_keys(conf)
    return nbdkit_proc.start(cmd, env, log_path, sock, 'the range server',
                             timeout), sock


def stop(proc):
    proc.terminate()
    proc.wait()
