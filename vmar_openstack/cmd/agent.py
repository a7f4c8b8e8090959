"""``vmar-agent``: the Glance notification agent (see
:mod:`vmar_openstack.glance_hooks.agent`)."""

import faulthandler
import os
import signal
import sys
import threading

from oslo_config import cfg
from oslo_log import log as logging

from vmar_openstack import conf as vmar_conf
from vmar_openstack import exception
from vmar_openstack.glance_hooks import agent
from vmar_openstack.glance_hooks import metrics as agent_metrics
from vmar_openstack.mapsource import glance as gsource
from vmar_openstack import metrics

CONF = vmar_conf.CONF
LOG = logging.getLogger(__name__)


def main(argv=None):
    logging.register_options(CONF)
    CONF(sys.argv[1:] if argv is None else argv, project='vmar',
         prog='vmar-agent')
    logging.setup(CONF, 'vmar')
    # "kill -USR1" dumps every thread's stack to stderr, for a stuck agent
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    stop, started = threading.Event(), threading.Event()

    def _signal(signum, frame):
        if not started.is_set():
            # still connecting (RabbitMQ down?): nothing is in flight
            LOG.info('stopped before the listener started')
            os._exit(0)
        stop.set()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _signal)
    try:
        metrics.serve(CONF, CONF.vmar_agent.metrics_port,
                      agent_metrics.registry(CONF))
        handler = agent.Handler(CONF, gsource.client(CONF))
        clean = agent.run(CONF, handler, stop, started)
    except (cfg.Error, exception.VmarException) as e:
        print('vmar-agent: error: %s' % e, file=sys.stderr)
        return 1
    if not clean:
        LOG.warning('the listener did not stop in time; exiting anyway')
        os._exit(0)
    return 0


if __name__ == '__main__':
    sys.exit(main())
