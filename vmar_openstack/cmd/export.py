"""``vmar-export``: the per-host NBD export service of VMAR views.

``serve`` runs the daemon: it supervises the patched qemu-storage-daemon
and owns the host's exports. ``add UUID``, ``remove UUID``, ``release
HOLDER``, ``list`` and ``status`` ask it over its host API
(:mod:`vmar_openstack.hostapi`); they change nothing themselves.
"""

import json
import sys
import time

from oslo_log import log as logging

from vmar_openstack import cmd
from vmar_openstack import conf as vmar_conf
from vmar_openstack import exception
from vmar_openstack.host import daemon
from vmar_openstack.host.exports import state as export_state
from vmar_openstack.host import service as host_service
from vmar_openstack import hostapi

CONF = vmar_conf.CONF
LOG = logging.getLogger(__name__)


def _client():
    return hostapi.Client.from_host_conf(CONF)


def serve():
    daemon.serve(host_service.ExportService(CONF))


def add():
    a = CONF.category
    exp = _client().add(a.id, host_cache=a.host_cache, holder=a.holder,
                        version=a.map_version, whole=a.own_blocks)
    print('exported %s map v%d (host_cache=%s) for %s: %s'
          % (exp['image_id'], exp['map_version'], exp['host_cache'],
             a.holder, exp['uri']))


def remove():
    a = CONF.category
    left = _client().remove(a.id, holder=a.holder, version=a.map_version)
    for exp in left:
        print('export %s kept for %s' % (exp['name'],
                                         ', '.join(exp['holders'])))
    if not left:
        print('removed %s\'s exports of %s' % (a.holder, a.id))


def release():
    names = _client().release(CONF.category.holder)
    print('released %d exports' % len(names))


def list_exports():
    listing = _client().list()
    cmd.print_table(
        ('image', 'map', 'host_cache', 'state', 'holders'),
        [(exp['image_id'], exp['map_version'], exp['host_cache'],
          'MISSING' if exp['state'] == 'missing' else exp['state'],
          ','.join(exp['holders']))
         for exp in listing['exports']])


def _size(n):
    for unit in ('B', 'KiB', 'MiB', 'GiB'):
        if n < 1024 or unit == 'GiB':
            return ('%d %s' if unit == 'B' else '%.1f %s') % (n, unit)
        n /= 1024.0


def status():
    st = _client().status()
    if CONF.category.json:
        print(json.dumps(st, indent=2, sort_keys=True))
        return
    print('daemon: %s, socket %s' % ('up' if st['daemon_up'] else 'DOWN',
                                     st['socket']))
    f = st['fetched']
    print('fetched since the first export: %d base files, %s in %.1f s; '
          'mirror fills %s; %s in all'
          % (f['count'], _size(f['copy_bytes']), f['seconds'],
             _size(f['fill_bytes']), _size(f['bytes'])))
    print()
    cmd.print_table(
        ('base', 'size', 'mirror', 'fetched', 'page cache', 'exports',
         'holders'),
        [(b['image_id'], _size(b['size']), _size(b['mirror_bytes']),
          _size(b['fetched_bytes']), _size(b['cached_bytes']),
          len(b['exports']), len(b['holders']))
         for b in st['bases']])
    print()
    cmd.print_table(
        ('export', 'state', 'host_cache', 'holders', 'reads', 'bytes',
         'errors', 'fetches', 'queued'),
        [(e['name'], e['state'], e['host_cache'], len(e['holders']),
          e['requests'], _size(e['bytes_read'] + e['bytes_zero']),
          e['errors'], e['fetches'], _queued(e)) for e in st['exports']])
    warm = st.get('warm')
    if warm:
        print()
        print('metadata kept warm: %s locked in %d ranges, of %s wanted '
              '(budget %s)%s' % (
                  _size(warm['locked_bytes']), warm['ranges'],
                  _size(warm['wanted_bytes']), _size(warm['budget_bytes']),
                  '; ' + warm['error'] if warm['error'] else ''))
        for base, n in sorted(warm['bases'].items()):
            print('  %s  %s' % (base, _size(n)))
        if warm['without_layout']:
            print('  images without a block layout: %s'
                  % ', '.join(warm['without_layout']))
    gc = st.get('guest_cache')
    if gc:
        _guest_cache(gc)
    peers = st.get('peers')
    if peers:
        _peers(peers)


def _peers(p):
    """What the host serves its peers and read from them (``status``)."""
    r = p['reads']
    print()
    print('peers: %s; read from peers %d runs, %s; bad blocks %d, runs not '
          'held %d, unreachable %d, timeouts %d; waited for a lead %d '
          '(in vain %d); vmar-agent answered %d, not %d' % (
              'serving on %s' % p['serving'] if p['serving']
              else 'serving none', r['peer_reads'], _size(r['peer_bytes']),
              r['bad_blocks'], r['not_held'], r['unreachable'],
              r['timeouts'], r['lead_waits'], r['lead_misses'],
              p['answers'], p['unanswered']))
    for base, hosts in sorted(p['holders'].items()):
        print('  %s  held by %s' % (base, ', '.join(hosts) or 'no other host'))


def _guest_cache(gc):
    """The guest-private and auto servers' table of ``status``."""
    print()
    print('guest cache: auto servers %s; memory pressure %s %%, '
          'MemAvailable %s' % (
              'guest-private' if gc['auto_mode'] == 'private'
              else 'on their own', gc['some_avg10'],
              '-' if gc['available_bytes'] is None
              else _size(gc['available_bytes'])))
    cmd.print_table(
        ('server', 'flavor', 'mode', 'asked', 'why', 'guest RAM',
         'returned', 'dropped', 'switches', 'heard'),
        [(g['instance'], g['flavor_mode'], g['mode'] or '-',
          g['wanted'] or '-', g['reason'] or '-',
          '-' if g['resident_bytes'] is None
          else _size(g['resident_bytes']),
          '-' if g['returned_bytes'] is None
          else _size(g['returned_bytes']),
          _size(g['dropped_bytes']), g['switches'],
          '-' if g['heard_ago'] is None else '%.0f s ago' % g['heard_ago'])
         for g in gc['guests']])


def _queued(e):
    """An export's background work still to do, for the status table."""
    out = ['prefetch'] if e['prefetch_queued'] else []
    if e['fill_due'] is not None:
        out.append('fill %s' % time.strftime(
            '%H:%M:%S', time.localtime(e['fill_due'])))
    return ','.join(out) or '-'


def add_command_parsers(subparsers):
    subparsers.add_parser('serve', help='run the export daemon'
                          ).set_defaults(func=serve)
    p = subparsers.add_parser('add', help='export an image')
    p.add_argument('id')
    p.add_argument('--host-cache', default='base',
                   choices=export_state.HOST_CACHE)
    p.add_argument('--holder', default='cli',
                   help='who holds this reference (e.g. an instance uuid)')
    p.add_argument('--map-version', type=int,
                   help='export this map version (default: the current)')
    p.add_argument('--own-blocks', action='store_true',
                   help='hold every block only this image holds before '
                   'returning (it is about to be deleted from Glance, as '
                   'a shelved snapshot after unshelve)')
    p.set_defaults(func=add)
    p = subparsers.add_parser('remove', help='drop a reference to an export')
    p.add_argument('id')
    p.add_argument('--holder', default='cli')
    p.add_argument('--map-version', type=int,
                   help='only this map version (default: all)')
    p.set_defaults(func=remove)
    p = subparsers.add_parser(
        'release', help='drop every reference of a holder')
    p.add_argument('holder')
    p.set_defaults(func=release)
    subparsers.add_parser('list', help='list exports'
                          ).set_defaults(func=list_exports)
    p = subparsers.add_parser('status', help='bases, page cache, exports '
                              'and their read counters')
    p.add_argument('--json', action='store_true')
    p.set_defaults(func=status)


def main(argv=None):
    return cmd.run(CONF, 'vmar-export', add_command_parsers,
                   (exception.VmarException, ValueError, OSError), argv)


if __name__ == '__main__':
    sys.exit(main())
