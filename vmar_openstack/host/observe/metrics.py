"""Prometheus metrics of a compute host's exports (``vmar-export serve``).

Read at each scrape from :func:`.status.collect`: the read counters of the
daemon's vmar nodes (they restart at zero with the daemon, which Prometheus
counters allow), the host page cache residency of each base file, and the
persistent fetch totals of the host.
"""

from prometheus_client import core
from prometheus_client import registry as prom_registry

from vmar_openstack.host.observe import status


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
        export_labels = (['export', 'image'], lambda e: [e.name, e.image_id])
        base_labels = (['base'], lambda b: [b.image_id])
        labelled = (
            # family, name, help, items, labels, value
            (core.CounterMetricFamily, 'read_requests',
             'Read requests of an export.', st.exports, export_labels,
             lambda e: e.requests),
            (core.CounterMetricFamily, 'read_bytes',
             'Bytes read through an export.', st.exports, export_labels,
             lambda e: e.bytes_read + e.bytes_zero),
            (core.CounterMetricFamily, 'base_read_bytes',
             'Bytes of an export read from base files.', st.exports,
             export_labels, lambda e: e.bytes_read),
            (core.CounterMetricFamily, 'read_errors',
             'Failed read requests of an export.', st.exports,
             export_labels, lambda e: e.errors),
            (core.GaugeMetricFamily, 'holders',
             'Holders (instances) of an export.', st.exports,
             export_labels, lambda e: len(e.holders)),
            (core.GaugeMetricFamily, 'prefetch_queued',
             'Whether the prefetch of an export is still queued.',
             st.exports, export_labels, lambda e: int(e.prefetch_queued)),
            (core.GaugeMetricFamily, 'fill_queued',
             'Whether the fill of an export is still queued (it '
             'needs the store until it is done).', st.exports,
             export_labels, lambda e: int(e.fill_due is not None)),
            (core.GaugeMetricFamily, 'base_size_bytes',
             'Size of a base file.', st.bases, base_labels,
             lambda b: b.size),
            (core.GaugeMetricFamily, 'base_mirror_bytes',
             'Bytes a base file takes on disk.', st.bases, base_labels,
             lambda b: b.mirror_bytes),
            (core.GaugeMetricFamily, 'base_cached_bytes',
             'Bytes of a base file in the host page cache.', st.bases,
             base_labels, lambda b: b.cached_bytes),
            (core.CounterMetricFamily, 'base_fetched_bytes',
             'Bytes of a base fetched from the store, whole copies and '
             'mirror fills.', st.bases, base_labels,
             lambda b: b.fetched_bytes))
        for family, name, doc, items, (labels, of), value in labelled:
            m = family('vmar_export_' + name, doc, labels=labels)
            for x in items:
                m.add_metric(of(x), value(x))
            yield m
        f = st.fetched
        yield core.CounterMetricFamily(
            'vmar_export_fetched_bytes', 'Bytes of base data fetched from '
            'the store: whole copies and mirror fills.', value=f.bytes)
        fetched = core.CounterMetricFamily(
            'vmar_export_fetched_by_kind_bytes', 'Bytes of base data '
            'fetched from the store, by kind (copy, fill).',
            labels=['kind'])
        fetched.add_metric(['copy'], f.copy_bytes)
        fetched.add_metric(['fill'], f.fill_bytes)
        yield fetched
        yield core.SummaryMetricFamily(
            'vmar_export_fetch_seconds', 'Time to fetch a base file.',
            count_value=f.count, sum_value=f.seconds)
        if st.guest_cache is not None:
            yield from _guest_metrics(st.guest_cache)
        if st.warm is not None:
            yield from _warm_metrics(st.warm)
        if st.peers is not None:
            yield from _peer_metrics(st.peers)


#: the range server's peer read counts (mapsource.peers.COUNTS), as metrics
_PEER_COUNTS = (
    ('peer_reads', 'vmar_peer_reads', 'Runs read from peer hosts, every '
     'block verified.'),
    ('peer_bytes', 'vmar_peer_read_bytes', 'Bytes read from peer hosts.'),
    ('bad_blocks', 'vmar_peer_bad_blocks', 'Blocks a peer sent that failed '
     'their digest (the peer is not asked again for bad_peer_seconds).'),
    ('not_held', 'vmar_peer_not_held', 'Runs a peer asked did not hold '
     'whole (its block status).'),
    ('unreachable', 'vmar_peer_unreachable', 'Peer reads that could not '
     'connect or were refused.'),
    ('timeouts', 'vmar_peer_timeouts', 'Peer reads given up after '
     '[vmar_peers] read_timeout.'),
    ('lead_waits', 'vmar_peer_lead_waits', 'Runs no holder had, waited for '
     'at the base\'s lead (a burst).'),
    ('lead_misses', 'vmar_peer_lead_misses', 'Runs waited for at a lead '
     'that it did not get within [vmar_peers] lead_wait (the store read '
     'them).'),
    ('lead_wait_ms', 'vmar_peer_lead_wait_milliseconds', 'Time spent '
     'waiting for runs at leads.'))


def _peer_metrics(peers):
    """Blocks between hosts (doc/source/admin/peers.rst)."""
    for key, name, doc in _PEER_COUNTS:
        yield core.CounterMetricFamily(name, doc, value=peers.reads[key])
    yield core.CounterMetricFamily(
        'vmar_peer_discovery_answers', 'Answers of vmar-agent to "who '
        'holds this base".', value=peers.answers)
    yield core.CounterMetricFamily(
        'vmar_peer_discovery_unanswered', 'Questions vmar-agent did not '
        'answer (or answered malformed).', value=peers.unanswered)
    held = core.GaugeMetricFamily(
        'vmar_peer_holders', 'Hosts vmar-agent named as holders of a base '
        'this host mirrors.', labels=['base'])
    for base, hosts in sorted(peers.holders.items()):
        held.add_metric([base], len(hosts))
    yield held


def _warm_metrics(warm):
    """The metadata the daemon keeps in memory (:mod:`.warm`)."""
    for name, doc, value in (
            ('locked_bytes', 'Bytes of base metadata locked in the page '
             'cache.', warm.locked_bytes),
            ('wanted_bytes', 'Bytes of the metadata of the exported images, '
             'before the budget.', warm.wanted_bytes),
            ('budget_bytes', '[vmar_host] warm_metadata_mb, in bytes.',
             warm.budget_bytes),
            ('images_without_layout', 'Exported images the host has no '
             'block layout of.', len(warm.without_layout))):
        yield core.GaugeMetricFamily('vmar_warm_metadata_' + name, doc,
                                     value=value)


def _guest_metrics(gc):
    """The guest-private caching of the host's servers (:mod:`.guests`)."""
    yield core.GaugeMetricFamily(
        'vmar_guest_cache_auto_private', 'Whether the host asks its '
        'vmar:guest_cache=auto servers for guest-private caching now.',
        value=int(gc.auto_mode == 'private'))
    if gc.some_avg10 is not None:
        yield core.GaugeMetricFamily(
            'vmar_guest_cache_memory_pressure', 'The memory pressure the '
            'auto policy sees (PSI some avg10, percent).',
            value=gc.some_avg10)
    labels = ['instance', 'flavor_mode']
    per = (
        (core.GaugeMetricFamily, 'private', 'Whether the server\'s guest '
         'runs guest-private now (as it last said).',
         lambda g: int(g.mode == 'private')),
        (core.GaugeMetricFamily, 'resident_bytes', 'Guest RAM of the '
         'server the host holds (its QEMU\'s RAM mappings, resident).',
         lambda g: g.resident_bytes),
        (core.GaugeMetricFamily, 'returned_bytes', 'Guest RAM the server '
         'gave back since its peak (free page reporting).',
         lambda g: g.returned_bytes),
        (core.CounterMetricFamily, 'dropped_bytes', 'Base data vmar-guest '
         'dropped from the guest\'s cache.', lambda g: g.dropped_bytes),
        (core.CounterMetricFamily, 'switches', 'Mode changes of the guest '
         'at run time.', lambda g: g.switches))
    for family, name, doc, value in per:
        m = family('vmar_guest_' + name, doc, labels=labels)
        for g in gc.guests:
            v = value(g)
            if v is not None:
                m.add_metric([g.instance, g.flavor_mode], v)
        yield m


def registry(service):
    reg = prom_registry.CollectorRegistry()
    reg.register(ExportCollector(service))
    return reg
