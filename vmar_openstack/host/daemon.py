"""``vmar-export serve``: the one place that wires the host's daemon.

It builds nothing of its own. It starts, around one
:class:`~.service.ExportService`, the metrics server
(:mod:`.observe.metrics`), the host reporter (:mod:`.observe.report`), the
guest channels (:mod:`.guests.channels`), the metadata kept warm
(:mod:`.cache.warm`), the holders' discovery (:mod:`.peers.discovery`) and
the host API server (:mod:`.api`), then runs the supervisor
(:mod:`.supervisor`) until SIGTERM or SIGINT, and stops them all in turn.
The parts know nothing of each other: each gets what it needs here.
"""

import grp
import os

from vmar_openstack import fileutils
from vmar_openstack.host import api
from vmar_openstack.host.cache import warm
from vmar_openstack.host.exports import state
from vmar_openstack.host.guests import channels
from vmar_openstack.host.observe import metrics as host_metrics
from vmar_openstack.host.observe import report
from vmar_openstack.host.peers import discovery
from vmar_openstack.host import supervisor
from vmar_openstack import metrics


def serve(svc, stop_event=None, max_backoff=10):
    """Run and supervise the daemon of ``svc`` until SIGTERM/SIGINT.

    ``stop_event`` (a :class:`threading.Event`) ends it too; the
    supervisor restarts a dead qemu-storage-daemon with a backoff of at
    most ``max_backoff`` seconds (see :class:`.supervisor.Supervisor`).
    """
    conf = svc.conf
    metrics.serve(conf, conf.vmar_host.metrics_port,
                  host_metrics.registry(svc))
    svc.reporter = report.start(conf, svc.host_dir, svc.recorded_bootsets)
    # nobody takes the lock files of before the host API any more
    svc.files.drop_old_locks()
    fileutils.unlink(os.path.join(svc.host_dir, state.OLD_LOCK))
    group = conf.vmar_host.export_socket_group
    svc.guests = channels.start(
        conf, grp.getgrnam(group).gr_gid if group else None)
    svc.warm = warm.start(conf, svc.files, svc.host_dir)
    svc.discovery = discovery.start(conf, svc.host_dir)
    server = api.ApiServer(svc).start()
    try:
        supervisor.Supervisor(svc).serve(stop_event, max_backoff)
    finally:
        server.stop()
        for thread in (svc.discovery, svc.warm, svc.reporter, svc.guests):
            if thread:
                thread.stop()
