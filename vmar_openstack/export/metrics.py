"""Prometheus metrics of a compute host's exports (``vmar-export serve``).

Read at each scrape from :func:`.status.collect`: the read counters of the
daemon's vmar nodes (they restart at zero with the daemon, which Prometheus
counters allow), the host page cache residency of each base file, and the
persistent fetch totals of the host.
"""

from prometheus_client import core
from prometheus_client import registry as prom_registry

from vmar_openstack.export import status


class ExportCollector(prom_registry.Collector):

    def __init__(self, service):
        self.service = service

    def collect(self):
        st = status.collect(self.service)
        yield core.GaugeMetricFamily(
            'vmar_export_daemon_up', 'Whether the export daemon answers.',
            value=int(st.daemon_up))
        yield core.GaugeMetricFamily(
            'vmar_export_exports', 'Exports recorded on the host.',
            value=len(st.exports))
        per_export = (
            ('read_requests', 'Read requests of an export.',
             lambda e: e.requests),
            ('read_bytes', 'Bytes read through an export.',
             lambda e: e.bytes_read + e.bytes_zero),
            ('base_read_bytes', 'Bytes of an export read from base files.',
             lambda e: e.bytes_read),
            ('read_errors', 'Failed read requests of an export.',
             lambda e: e.errors))
        for name, doc, value in per_export:
            m = core.CounterMetricFamily('vmar_export_' + name, doc,
                                         labels=['export', 'image'])
            for e in st.exports:
                m.add_metric([e.name, e.image_id], value(e))
            yield m
        holders = core.GaugeMetricFamily(
            'vmar_export_holders', 'Holders (instances) of an export.',
            labels=['export', 'image'])
        for e in st.exports:
            holders.add_metric([e.name, e.image_id], len(e.holders))
        yield holders
        per_base = (
            ('size_bytes', 'Size of a base file.', lambda b: b.size),
            ('mirror_bytes', 'Bytes a base file takes on disk.',
             lambda b: b.mirror_bytes),
            ('cached_bytes', 'Bytes of a base file in the host page cache.',
             lambda b: b.cached_bytes))
        for name, doc, value in per_base:
            m = core.GaugeMetricFamily('vmar_export_base_' + name, doc,
                                       labels=['base'])
            for b in st.bases:
                m.add_metric([b.image_id], value(b))
            yield m
        f = st.fetched
        yield core.CounterMetricFamily(
            'vmar_export_fetched_bytes', 'Bytes of base files fetched.',
            value=f.bytes)
        yield core.SummaryMetricFamily(
            'vmar_export_fetch_seconds', 'Time to fetch a base file.',
            count_value=f.count, sum_value=f.seconds)


def registry(service):
    reg = prom_registry.CollectorRegistry()
    reg.register(ExportCollector(service))
    return reg
