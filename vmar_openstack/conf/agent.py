"""``[vmar_agent]``: the Glance notification agent, ``vmar-agent``."""

from oslo_config import cfg

GROUP = cfg.OptGroup(
    'vmar_agent', title='vmar-agent',
    help='The Glance notification agent.')

agent_opts = [
    cfg.PortOpt('metrics_port', default=0, deprecated_name='agent_port',
                deprecated_group='vmar_metrics',
                help='Port of vmar-agent\'s Prometheus /metrics.\n\n'
                     'Possible values: a port; 0, no endpoint.\n\n'
                     'Related options: [vmar_metrics] bind_host.'),
    cfg.StrOpt('exchange', default='glance',
               help='Exchange Glance notifications are sent to.'),
    cfg.ListOpt('topics', default=['notifications'],
                help='Notification topics to listen on.'),
    cfg.StrOpt('pool', default='vmar-agent',
               help='Listener pool: every agent of the pool shares one queue, '
                    'so no other consumer (ceilometer) loses messages.'),
    cfg.IntOpt('max_attempts', default=5, min=1,
               help='Attempts at an image before it is recorded as failed '
                    'and not retried.'),
    cfg.StrOpt('local_store_dir',
               help='The directory of a Glance file store on this host '
                    '([fs] filesystem_store_datadir). Images found there, '
                    'with the size Glance reports, are ingested in place '
                    'instead of downloaded.'),
    cfg.IntOpt('resync_interval', default=300, min=0,
               help='Seconds between comparisons of the library with '
                    'Glance\'s active images, which ingest what a lost '
                    'notification missed and remove what is gone. 0: never.'),
    cfg.IntOpt('shutdown_timeout', default=10, min=0,
               help='Seconds to let the notification in hand finish on '
                    'SIGTERM. An unfinished one is redelivered later.'),
    cfg.FloatOpt('retry_delay', default=2.0, min=0,
                 help='Seconds before the first retry; doubled each time.'),
    cfg.IntOpt('report_workers', default=4, min=1,
               help='Compute hosts\' reports (vmar.host.exports) the agent '
                    'records at once. The listener hands every message to '
                    'a thread of its pool ([DEFAULT] '
                    'executor_thread_pool_size, 64 by default), which a '
                    'flood of reports (a restart of many hosts) would fill '
                    'with database writes: the database connections and '
                    'the interpreter would then be theirs, and image '
                    'events, the map GC and the /metrics endpoint would '
                    'wait behind them for seconds. Reports past this many '
                    'wait, not acknowledged, for a slot '
                    '(vmar_agent_reports_waiting).\n\nPossible values: a '
                    'number of reports, under the database pool\'s 15 '
                    'connections; see doc/source/admin/scale.rst for what was '
                    'measured.\n\nRelated options: [vmar_host] '
                    'report_interval.'),
    cfg.IntOpt('publish_claim_timeout', default=300, min=1,
               help='Seconds one agent\'s claim of a hidden Glance image '
                    '(a map version, a digest list, a boot working set, a '
                    'block layout) keeps the other agents from uploading '
                    'it too. Publishers take turns per image through '
                    'vmar_publications, never through the library lock, so '
                    'a publish waits for no ingest and sends none back to '
                    'its lookups. An agent killed while it uploads holds '
                    'its claim this long; then another agent takes it over, '
                    'and resync publishes what such claims left '
                    'unfinished.\n\nPossible values: seconds, longer than '
                    'the upload of the largest digest list takes (32 bytes '
                    'per 4 KiB block: 160 MiB for a 20 GiB image).\n\n'
                    'Related options: resync_interval.'),
    cfg.IntOpt('map_gc_interval', default=3600, min=0,
               help='Seconds between removals of the map versions no '
                    'compute host holds. 0: never.'),
    cfg.IntOpt('map_gc_min_age', default=86400, min=0,
               help='Seconds a map version stays after a newer one '
                    'replaced it, whatever the hosts report. Keep it well '
                    'above the hosts\' [vmar_host] report_interval.'),
    cfg.IntOpt('pending_maps_per_minute', default=120, min=0,
               help='Maps left pending by a change of another image '
                    '([vmar] rewrite_at_once) that the agent rewrites and '
                    'publishes per minute, oldest first; each is a new map '
                    'version the hosts of its image fetch. 0: none (the '
                    'maps read through alternates until an operator runs '
                    '``vmar-manage map rewrite``). A pass every 6 s '
                    'rewrites a tenth of them and stops after the first map '
                    'past 1 s. It builds them in a read snapshot and holds '
                    'the library lock only to install them (a rename and a '
                    'few rows per map), unless another change than an add '
                    'commits while it builds them: then it builds them '
                    'again, and at the third try under the lock.'
                    '\n\nPossible values: maps per '
                    'minute per agent; the pass reaches it when maps take '
                    'under 1 s / (a tenth) each (2 to 5 s per GiB of image '
                    'data were measured, more in larger libraries; see '
                    'doc/source/admin/scale.rst).'
                    '\n\nRelated options: [vmar] rewrite_at_once.'),
    cfg.IntOpt('holder_max_age', default=300, min=1,
               help='Seconds after its last report that a host is still '
                    'named as a holder of blocks to hosts that ask '
                    '([vmar_reports] holders_topic): one that stopped '
                    'reporting may be down.\n\nPossible values: seconds, '
                    'a few times the hosts\' [vmar_host] report_interval.'
                    '\n\nRelated options: [vmar_peers] discover.'),
    cfg.IntOpt('fetch_lead_seconds', default=300, min=0,
               help='How long a burst of a base lasts from the first host '
                    'that asked for the holders of it when nobody held any: '
                    'the hosts that ask after it, in that time, are each '
                    'told a host to wait a moment for (the first, or one '
                    'that asked before them) instead of fetching the runs '
                    'from the store too, so that a burst of servers of a '
                    'new image on many hosts reads it from the store about '
                    'once (doc/source/admin/peers.rst, "Bursts").\n\nPossible '
                    'values: seconds, about as long as a boot storm lasts; '
                    '0 names no lead.\n\nRelated options: '
                    'fetch_lead_fanout, [vmar_peers] lead_wait, discover.'),
    cfg.IntOpt('fetch_lead_fanout', default=8, min=1,
               help='Hosts of a burst that wait for the same host: the '
                    'first host leads the next fetch_lead_fanout to ask, '
                    'each of those the next as many, and so on, so that no '
                    'host serves more than that many others at once.\n\n'
                    'Possible values: a count, at most the hosts\' '
                    '[vmar_peers] max_clients.\n\nRelated options: '
                    'fetch_lead_seconds.'),
]

ALL_OPTS = agent_opts
