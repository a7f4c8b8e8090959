"""Reports of a host's exports to vmar-agent.

Every ``[vmar_host] report_interval`` seconds, and ``[vmar_host]
report_change_delay`` seconds after an export is added or removed,
``vmar-export serve`` sends the map versions its host exports as an
oslo.messaging notification, ``vmar.host.exports`` on ``[vmar_reports]
report_topic``::

    {"host": "<[vmar] host>", "exports": [["<image id>", <version>], ...],
     "holds": [["<base image id>", <blocks or null>], ...],
     "complete": ["<image id>", ...],
     "peer": "<address>:<port>", "load": <load average per CPU>,
     "run": "<id of this start of the daemon>", "seq": <report number>}

The agent keeps each host's last report and removes an old map version
only when no report lists it (:mod:`vmar_openstack.glance_hooks.gc`).
A change is reported at once because the weigher places the next servers
of a burst by what the hosts reported: at the next periodic report (60 s
by default) a whole burst would be placed as if no host held the image.
``holds`` names every base the host keeps, whole (``null``) or as a
mirror holding that many blocks; the scheduler's ``vmar`` weigher reads
it (:mod:`vmar_openstack.nova_scheduler.weigher`,
doc/source/admin/scheduling.rst). ``complete`` names the mirrors of
exported images that hold every block only that image has (their fill is done,
:meth:`.hostdir.Layout.complete_mirrors`): with a peer server, the host
can serve them to a server's new host once the image is deleted from the
store (nova-api's check, :mod:`vmar_openstack.nova_api.checks`).
``run`` and ``seq`` order a daemon's reports: the agent's pool may take
two of them at once, and does not record the older over the newer
(:meth:`vmar_openstack.db.hosts.HostReports.record`).
``peer`` and ``load`` are there when the host runs a
peer server (``[vmar_peers] listen_address``): the agent tells other
hosts to read what it holds from there (:mod:`.discovery`).

With the same notifier, each boot working set the host recorded (a vmar
node whose ``record-window`` closed, see
:meth:`.service.ExportService.recorded_bootsets`) goes once as
``vmar.host.bootset``::

    {"host": "<[vmar] host>", "image_id": "<uuid>",
     "bootset": "<the set's file, doc/source/reference/mirror-format.rst>"}

and the agent publishes the first one of an image.
Notifications need no new connection on a compute host: it already talks
to RabbitMQ for nova-compute. The alternatives were worse: hosts writing
into the library database (compute hosts hold no database credentials in
OpenStack since Nova's conductor) or tagging map images in Glance (it
would take write access to images the agent owns).
"""

import os
import uuid

from oslo_log import log as logging

from vmar_openstack import bus
from vmar_openstack.host.exports import hostdir
from vmar_openstack.host.exports import state as export_state
from vmar_openstack import names
from vmar_openstack import periodic

LOG = logging.getLogger(__name__)


def start(conf, host_dir, bootsets=None):
    """A started :class:`Reporter`, or None.

    ``bootsets()``, if given, yields the recorded boot working sets not
    sent yet, as ``(image id, file bytes, done)``: ``done()`` once sent.
    None when ``[vmar_host] report_interval`` is 0 or no transport is
    configured.
    """
    if not conf.vmar_host.report_interval:
        return None
    # imported here: oslo.messaging brings eventlet, whose deprecation
    # warning every vmar-export sub-command would print
    import oslo_messaging
    transport = bus.notification_transport(conf)
    if transport is None:
        LOG.info('no transport_url: the exports are not reported')
        return None
    # retry=1: a report RabbitMQ cannot take is dropped, the next one
    # tries again (by default the thread would wait for RabbitMQ forever)
    notifier = oslo_messaging.Notifier(
        transport, publisher_id='vmar-export.%s' % conf.vmar_host.host,
        driver='messagingv2', topics=[conf.vmar_reports.report_topic], retry=1)
    return Reporter(conf, host_dir, notifier, bootsets).start()


def payload(conf, host_dir):
    with export_state.State(host_dir) as state:
        held = sorted({(e.image_id, e.map_version)
                       for e in state.exports.values()})
    out = {'host': conf.vmar_host.host, 'exports': [list(e) for e in held]}
    layout = hostdir.Layout(host_dir)
    try:
        holds = layout.holdings()
        complete = layout.complete_mirrors(held)
    except OSError as e:
        # the exports protect map versions: send them anyway; the agent
        # keeps what the host last said it holds
        LOG.warning('the bases held are left out of the report: %s', e)
    else:
        out['holds'] = [list(h) for h in sorted(holds.items())]
        out['complete'] = sorted(complete)
    p = conf.vmar_peers
    if p.listen_address:
        # where other hosts read what it holds, and how busy it is: the
        # agent names the least loaded holders first (.discovery)
        out['peer'] = names.peer_address(p.listen_address, p.listen_port)
        out['load'] = round(os.getloadavg()[0] / (os.cpu_count() or 1), 3)
    return out


class Reporter(periodic.Periodic):
    """A thread sending the reports until :meth:`stop`."""

    name = 'vmar-report'

    def __init__(self, conf, host_dir, notifier, bootsets=None):
        super().__init__(conf.vmar_host.report_interval,
                         settle=conf.vmar_host.report_change_delay)
        self.conf = conf
        self.host_dir = host_dir
        self.notifier = notifier
        self.bootsets = bootsets
        self.run = uuid.uuid4().hex
        self.seq = 0

    def changed(self):
        """Exports were added or removed: report them soon."""
        if self.settle:
            self.wake()

    def step(self):
        self.send()

    def send(self):
        body = payload(self.conf, self.host_dir)
        self.seq += 1
        body.update(run=self.run, seq=self.seq)
        # oslo.messaging logs a notification it cannot send, and drops it
        self.notifier.info({}, names.HOST_EXPORTS_EVENT, body)
        LOG.debug('reported %d exports', len(body['exports']))
        for image_id, data, done in (self.bootsets() if self.bootsets
                                     else ()):
            self.notifier.info({}, names.HOST_BOOTSET_EVENT, {
                'host': self.conf.vmar_host.host, 'image_id': image_id,
                'bootset': data.decode()})
            done()
            LOG.info('reported the boot working set recorded for %s',
                     image_id)
