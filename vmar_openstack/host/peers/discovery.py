"""Which hosts hold the bases this host mirrors, asked of vmar-agent.

With ``[vmar_peers] discover`` the export daemon asks vmar-agent (RPC on
``[vmar_reports] holders_topic``, over the bus of its reports,
:mod:`vmar_openstack.bus`) which other hosts hold blocks of each base it
mirrors: the agent answers from the hosts' reports, best first (a whole
base, then the least loaded, :meth:`.db.hosts.HostReports.holders`). The
answer goes to ``<host_dir>/peers/<base id>.json``::

    {"base_id": "<uuid>", "asked_at": <unix time>,
     "holders": [{"host": "<name>", "peer": "<address>:<port>",
                  "blocks": <blocks held, null for a whole base>}, ...]}

where the range server's :class:`~vmar_openstack.host.peers.source.
PeerReader` finds it: it asks those hosts for a run before the store, and
checks by NBD block status which runs each one has. The daemon asks for a
mirror when an export that reads it is added (before its prefetch reads)
and for every mirror each ``[vmar_host] report_interval``, as fresh as the
reports the agent answers from. An agent that does not answer leaves the
last answer in place; the store serves whatever no peer does. Seed 001's
alternative, hosts advertising their chunks to neighbours, would keep a
second, weaker copy of the catalog the reports already are
(doc/source/admin/peers.rst, "Discovery").
"""

import json
import os
import time

from oslo_log import log as logging

from vmar_openstack import bus
from vmar_openstack import fileutils
from vmar_openstack.host.exports import hostdir
from vmar_openstack import names
from vmar_openstack import periodic

LOG = logging.getLogger(__name__)

#: seconds vmar-agent has to answer; the add path waits this long at most
ASK_TIMEOUT = 5


def start(conf, host_dir):
    """A started :class:`Discovery`, or None (not asked for, or no bus)."""
    if not conf.vmar_peers.discover:
        return None
    transport = bus.rpc_transport(conf)
    if transport is None:
        LOG.warning('[vmar_peers] discover is set but no transport_url: '
                    'no peer is found')
        return None
    import oslo_messaging
    client = oslo_messaging.get_rpc_client(
        transport, bus.holders_target(conf), timeout=ASK_TIMEOUT)
    return Discovery(conf, host_dir, client).start()


class Discovery(periodic.Periodic):
    """Keeps ``peers/<base id>.json`` of the host's mirrors current."""

    name = 'vmar-peer-discovery'

    def __init__(self, conf, host_dir, client):
        super().__init__(conf.vmar_host.report_interval or 60)
        self.host = conf.vmar_host.host
        self.limit = conf.vmar_peers.max_holders
        self.layout = hostdir.Layout(host_dir)
        self.client = client
        self.asked = 0          # answers written
        self.failed = 0         # questions the agent did not answer
        self.silent_since = None    # monotonic time of the last failure

    def step(self):
        mirrors = sorted(b for b, n in self.layout.holdings().items()
                         if n is not None)
        self.refresh(mirrors)
        self._prune(set(mirrors))

    def ensure(self, base_ids):
        """Ask for the bases whose answer is missing or out of date.

        For an export being added: its reads are about to start. Out of
        date: older than the interval. Not asked while the agent has been
        silent within the interval: an add waits for it once, not once per
        export (the periodic step asks again).
        """
        if self.silent_since is not None and (
                time.monotonic() - self.silent_since < self.interval):
            return
        now = time.time()
        stale = []
        for base_id in base_ids:
            try:
                age = now - os.stat(self.layout.holders_file(base_id)).st_mtime
            except FileNotFoundError:
                age = None
            if age is None or age > self.interval:
                stale.append(base_id)
        self.refresh(stale)

    def refresh(self, base_ids):
        """Ask for each base's holders; write the answers. Never raises.

        The first question the agent does not answer ends the round: the
        others would wait as long for nothing.
        """
        for base_id in base_ids:
            try:
                found = self.client.call({}, 'holders', base_id=base_id,
                                         host=self.host, limit=self.limit)
            except Exception as e:   # the agent or the bus away: keep the
                self.failed += 1     # last answers; the store serves
                self.silent_since = time.monotonic()
                LOG.warning('who holds %s: vmar-agent did not answer: %s',
                            base_id, e)
                return
            self.silent_since = None
            try:
                holders = [_holder(h) for h in found]
            except (KeyError, TypeError, ValueError) as e:
                self.failed += 1
                LOG.warning('who holds %s: malformed answer of vmar-agent '
                            'dropped: %s', base_id, e)
                continue
            self._write(base_id, holders)
            self.asked += 1
            LOG.debug('holders of %s: %s', base_id,
                      ', '.join(h['host'] for h in holders) or 'none')

    def _write(self, base_id, holders):
        path = self.layout.holders_file(base_id)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        body = {'base_id': base_id, 'asked_at': time.time(),
                'holders': holders}
        with fileutils.atomic_file(path) as f:
            f.write(json.dumps(body).encode())

    def _prune(self, keep):
        """Remove the files of bases the host no longer mirrors.

        Not those asked for within the interval: an export being added
        asks before it makes its mirrors.
        """
        now = time.time()
        for base_id, path in _answers(self.layout):
            if base_id in keep:
                continue
            try:
                if now - os.stat(path).st_mtime < self.interval:
                    continue
            except FileNotFoundError:
                continue
            fileutils.unlink(path)


def _answers(layout):
    """``(base id, path)`` of each answer written on the host."""
    d = os.path.dirname(layout.holders_file('x'))
    for name in (os.listdir(d) if os.path.isdir(d) else ()):
        base_id = name[:-len('.json')]
        if name == names.holders_file(base_id) and names.is_uuid(base_id):
            yield base_id, os.path.join(d, name)


def holders(layout):
    """``{base id: [host, ...]}`` of the answers on the host, best first."""
    out = {}
    for base_id, path in _answers(layout):
        try:
            with open(path) as f:
                out[base_id] = [h['host'] for h in json.load(f)['holders']]
        except (OSError, ValueError, KeyError, TypeError):
            continue        # pruned or being replaced: the next status
    return out


def _holder(h):
    """One holder of the agent's answer, checked.

    :raises ValueError, TypeError, KeyError: malformed.
    """
    host, port = names.parse_peer_address(h['peer'])
    blocks = h.get('blocks')
    if blocks is not None and type(blocks) is not int:
        raise ValueError('blocks %r' % (blocks,))
    out = {'host': str(h['host']), 'peer': names.peer_address(host, port),
           'blocks': blocks}
    if h.get('lead') is True:
        out['lead'] = True
    return out
