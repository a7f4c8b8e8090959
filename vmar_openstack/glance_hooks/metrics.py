"""Prometheus metrics of ``vmar-agent`` (``[vmar_agent] metrics_port``).

Counters and histograms are updated where the work happens
(:mod:`.agent`); the failure records are counted from the database at each
scrape.
"""

import prometheus_client
from prometheus_client import core
from prometheus_client import registry as prom_registry

from vmar_openstack.db import failures as db_failures
from vmar_openstack.db import session as db_session
from vmar_openstack.db import store as db_store

# registered by registry(), not on prometheus_client's global registry

EVENTS = prometheus_client.Counter(
    'vmar_agent_events', 'Image events handled, by outcome (done, retry, '
    'parked, failed, skipped).', ['event', 'outcome'], registry=None)
DOWNLOAD_SECONDS = prometheus_client.Histogram(
    'vmar_agent_download_seconds', 'Time to stream an image from Glance.',
    buckets=(1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000),
    registry=None)
INGEST_SECONDS = prometheus_client.Histogram(
    'vmar_agent_ingest_seconds', 'Time to fingerprint an image and write '
    'its map.', buckets=(0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500),
    registry=None)
INGESTED_BYTES = prometheus_client.Counter(
    'vmar_agent_ingested_bytes', 'Bytes of image files ingested.',
    registry=None)
REPORT_SECONDS = prometheus_client.Histogram(
    'vmar_agent_report_seconds', 'Time to record a compute host\'s report '
    '(vmar.host.exports) in the database; its count is the reports '
    'recorded.', buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                          1, 2.5, 5), registry=None)
REPORTS_WAITING = prometheus_client.Gauge(
    'vmar_agent_reports_waiting', 'Compute hosts\' reports the agent holds '
    'and has not started to record: all [vmar_agent] report_workers are '
    'busy.', registry=None)
REPORTS = prometheus_client.Counter(
    'vmar_agent_reports', 'Compute hosts\' reports handled, by outcome: '
    'written, unchanged (the same as the host\'s last: its row moved '
    'alone), older (a later one was recorded), failed (redelivered).',
    ['outcome'], registry=None)
PENDING_REWRITTEN = prometheus_client.Counter(
    'vmar_agent_pending_maps_rewritten', 'Maps left pending by a change '
    'of another image that the agent rewrote and published '
    '([vmar_agent] pending_maps_per_minute).', registry=None)
LOCK_HOLD_SECONDS = prometheus_client.Histogram(
    'vmar_agent_library_lock_hold_seconds', 'Time the agent\'s locked '
    'transactions held the library lock, by kind: content (an add, '
    'update or delete) or maps (a pending map rewritten, a GC).',
    ['kind'], buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                       10), registry=None)
SNAPSHOT_MISMATCH = prometheus_client.Counter(
    'vmar_agent_snapshot_mismatch', 'Snapshots built from a delta whose '
    'stored bytes were not the image built (entry dropped, ingested '
    'whole).', registry=None)


class FailureCollector(prom_registry.Collector):
    """The ``vmar_agent_failures`` records, by state."""

    def __init__(self, conf):
        self.failures = db_failures.Failures(conf)

    def collect(self):
        by_state = dict.fromkeys(('retrying', 'parked', 'failed'), 0)
        for f in self.failures.list():
            by_state[f.state] += 1
        m = core.GaugeMetricFamily(
            'vmar_agent_failures', 'Images the agent could not handle, by '
            'state.', labels=['state'])
        for state, n in sorted(by_state.items()):
            m.add_metric([state], n)
        yield m


class PendingCollector(prom_registry.Collector):
    """``vmar_agent_pending_maps``: maps waiting for the agent."""

    def __init__(self, conf):
        self.conf = conf

    def collect(self):
        with db_session.reader(self.conf) as s:
            n = db_store.ClusterStore(s).pending_count()
        yield core.GaugeMetricFamily(
            'vmar_agent_pending_maps', 'Maps a change of another image left '
            'for the agent to rewrite ([vmar] rewrite_at_once).', value=n)


def registry(conf):
    """The agent's metrics, with the failure records of ``conf``."""
    reg = prom_registry.CollectorRegistry()
    for m in (EVENTS, DOWNLOAD_SECONDS, INGEST_SECONDS, INGESTED_BYTES,
              REPORT_SECONDS, REPORTS_WAITING, REPORTS, PENDING_REWRITTEN,
              SNAPSHOT_MISMATCH, LOCK_HOLD_SECONDS, FailureCollector(conf),
              PendingCollector(conf)):
        reg.register(m)
    if _observe_lock_hold not in db_session.LOCK_HOLD_OBSERVERS:
        db_session.LOCK_HOLD_OBSERVERS.append(_observe_lock_hold)
    return reg


def _observe_lock_hold(seconds, content, _committed):
    LOCK_HOLD_SECONDS.labels('content' if content else 'maps').observe(
        seconds)
