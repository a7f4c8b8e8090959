"""``[vmar_peers]``: blocks between compute hosts (issue 34).

The export daemon (``vmar-export serve``) reads it. With
``listen_address`` set it runs a peer server, an NBD server on the host's
management network that serves the blocks its base files and mirrors hold
to other hosts of the cloud, over TLS with client certificates. With
``discover`` (the holders vmar-agent knows from the hosts' reports) or
``peers`` (a fixed list) its range server reads the runs its mirrors miss
from those hosts first, and from the store when none holds them. See
doc/source/admin/peers.rst.
"""

from oslo_config import cfg

GROUP = cfg.OptGroup(
    'vmar_peers', title='VMAR peer server',
    help='What a compute host serves to the other hosts of the cloud.')

ALL_OPTS = [
    cfg.HostAddressOpt(
        'listen_address', default=None,
        help='Address of the peer server: the host\'s address on the '
             'management network, never one guests reach.\n\n'
             'Possible values: an IP address or host name; unset, the host '
             'serves no peer.\n\nRelated options: listen_port, tls_dir.'),
    cfg.PortOpt('listen_port', default=10810,
                help='TCP port of the peer server.\n\nPossible values: a '
                     'port number, the same on every host.\n\nRelated '
                     'options: listen_address.'),
    cfg.StrOpt('tls_dir', default='/etc/vmar/pki',
               help='Directory of the peer TLS credentials, laid out as '
                    'QEMU\'s and nbdkit\'s x509 credentials are: '
                    'ca-cert.pem (the cloud\'s host CA), server-cert.pem '
                    'and server-key.pem (this host as a server), '
                    'client-cert.pem and client-key.pem (this host as a '
                    'client). A peer must present a certificate of that CA: '
                    'only hosts of the cloud can read.\n\nPossible values: '
                    'a directory readable by the export daemon alone.'),
    cfg.IntOpt('rate_mib', default=100, min=0,
               help='Bandwidth the peer server gives all peers together, '
                    'in MiB/s, so that peer traffic never starves the '
                    'host\'s own guests.\n\nPossible values: 0 (no limit) '
                    'or a rate.\n\nRelated options: max_clients.'),
    cfg.ListOpt('peers', default=[],
                help='Peer servers this host reads the blocks its mirrors '
                     'miss from, before the store (base_fetch = lazy), '
                     'asked in this order. Every '
                     'block a peer sends is checked against the image\'s '
                     'digest list.\n\nPossible values: host:port of '
                     'other hosts\' peer servers; empty, the store '
                     'only.\n\nRelated options: tls_dir (the client '
                     'credentials), bad_peer_seconds.'),
    cfg.BoolOpt('fetch', default=True,
                help='Read the blocks lazy mirrors miss from peer hosts '
                     'before the store, from the holders discovery finds '
                     'and the configured peers. False turns the client '
                     'side off whatever discover and peers say (this '
                     'host still serves peers if listen_address is '
                     'set).\n\nPossible values: true or false.\n\n'
                     'Related options: discover, peers.'),
    cfg.BoolOpt('discover', default=False,
                help='Ask vmar-agent which hosts hold the bases this host '
                     'mirrors (their reports, least loaded first) and read '
                     'the blocks the mirrors miss from them before the '
                     'store (base_fetch = lazy). Asked '
                     'when an export of a new mirror is added and then '
                     'every report_interval.\n\nPossible values: true or '
                     'false.\n\nRelated options: peers (asked after the '
                     'holders), [vmar_reports] holders_topic, [vmar_host] '
                     'report_interval, tls_dir.'),
    cfg.IntOpt('max_holders', default=4, min=1,
               help='Holders of a base that discovery keeps, best first: '
                    'the most a missed run is asked of before the '
                    'store.\n\nPossible values: a count.\n\nRelated '
                    'options: discover.'),
    cfg.FloatOpt('read_timeout', default=5.0, min=0.1,
                 help='Seconds a peer has for each step of a read (connect '
                      'with TLS, block status, the read itself) before the '
                      'host gives up on it for that read and asks the '
                      'store: a hung peer never holds a guest\'s read '
                      'longer.\n\nPossible values: seconds.\n\nRelated '
                      'options: peers.'),
    cfg.IntOpt('down_peer_seconds', default=10, min=0,
               help='How long a peer that could not be reached, refused '
                    'the connection or did not answer within read_timeout '
                    'is not asked again: the runs of that time go to the '
                    'next peer or the store at once instead of waiting '
                    'read_timeout each.\n\nPossible values: seconds; 0 '
                    'asks it again at the next run.\n\nRelated options: '
                    'read_timeout, bad_peer_seconds.'),
    cfg.IntOpt('bad_peer_seconds', default=300, min=0,
               help='How long a peer that sent a block failing its digest '
                    'is not asked again.\n\nPossible values: seconds.\n\n'
                    'Related options: peers.'),
    cfg.FloatOpt('lead_wait', default=2.0, min=0,
                 help='Seconds a run that no holder of a base has is '
                      'waited for at the base\'s lead, the host vmar-agent '
                      'named to fetch it from the store first, before this '
                      'host fetches it from the store itself. In a burst '
                      'of servers of a new image on many hosts, this is '
                      'what has the store serve its blocks about once. A '
                      'lead that did not get a run in that time is not '
                      'waited for again for 10 s.\n\nPossible values: '
                      'seconds, a few times a store read of a run; 0 never '
                      'waits.\n\nRelated options: discover, [vmar_agent] '
                      'fetch_lead_seconds.'),
    cfg.IntOpt('max_clients', default=64, min=1,
               help='Peer connections served at once; more are refused '
                    'and their host falls back to the store. A reading '
                    'host keeps up to 4 connections per base it reads '
                    'from a peer; in a burst a host serves up to '
                    '[vmar_agent] fetch_lead_fanout such hosts.\n\n'
                    'Possible values: a count, at least 4 x fanout x the '
                    'bases a burst reads.\n\nRelated options: rate_mib.'),
]
