"""``vmar-manage``: operate the VMAR image library.

Sub-commands: ``db sync|version``, ``image add|update|delete|list|show``,
``map show|verify|gc``, ``hosts list|shares|forget``, ``failures
list|retry|forget``, ``stats`` and ``check``. Options come from
``--config-file`` like any OpenStack service.
"""

import collections
import dataclasses
import hashlib
import json
import os
import sys
import tempfile

import numpy as np
from oslo_log import log as logging
import tqdm

from vmar_openstack import cmd
from vmar_openstack import conf as vmar_conf
from vmar_openstack.db import api as db_api
from vmar_openstack.db import failures as db_failures
from vmar_openstack.db import hosts as db_hosts
from vmar_openstack.db import migration
from vmar_openstack.db import session as db_session
from vmar_openstack.db import store as db_store
from vmar_openstack import exception
from vmar_openstack import fingerprint
from vmar_openstack.fingerprint import keys as fp_keys
from vmar_openstack import ingest
from vmar_openstack.ingest import check as check_mod
from vmar_openstack import mapformat
from vmar_openstack.mapformat import layout as layout_format
from vmar_openstack.mapsource import glance as gsource

CONF = vmar_conf.CONF
LOG = logging.getLogger(__name__)


def _progress(total, desc):
    """A tqdm bar on a terminal, nothing otherwise."""
    return tqdm.tqdm(total=total, desc=desc, unit='B', unit_scale=True,
                     disable=not sys.stderr.isatty(), leave=False)


def _out(text=''):
    print(text)


# -- db ---------------------------------------------------------------------

def db_downgrade():
    migration.downgrade(CONF.category.revision)
    _out('database at revision %s' % migration.current())


def db_sync():
    migration.upgrade('head')
    _out('database at revision %s' % migration.current())
    # digest lists of before revision 0023, out of the tables: one image
    # per transaction, so a sync killed half way goes on where it stopped
    lib = ingest.Library(CONF)

    def progress(n, _image_id):
        if n % 100 == 0:
            _out('moved %d digest lists out of the database' % n)
    moved = lib.move_digest_lists(progress)
    if moved:
        _out('moved the digest lists of %d images out of the database, to '
             '%s' % (moved, CONF.vmar.digest_object_dir))
    # maps written before the per-target counts (the scheduler weigher's)
    recorded, missing = lib.backfill_map_targets()
    if recorded:
        _out('recorded the block counts of %d earlier maps' % recorded)
    for image_id, version in missing:
        _out('map v%d of %s: its file is unreadable here, so no block '
             'counts: the image weighs 0 in the vmar scheduler weigher '
             'until a new map version is written' % (version, image_id))


def db_version():
    _out(migration.current() or 'none')


def db_compact():
    # what every change and vmar-agent's pass do, to the end
    steps = ingest.Library(CONF).compact()
    _out('fingerprint index compacted (%d steps)' % steps)


# -- image ------------------------------------------------------------------

def image_add():
    a = CONF.category
    lib = ingest.Library(CONF)
    size = os.stat(a.path).st_size if os.path.exists(a.path) else 0
    with _progress(size, 'hashing') as bar:
        out = lib.add(a.id, a.path, disk_format=a.format, owner=a.owner,
                      visibility=a.visibility, expected_size=a.size,
                      progress=bar.update)
    _out('added %s: seq %d, map v%d, %.1f%% of data blocks redirected'
         % (out.image_id, out.seq, out.map_version,
            100 * out.shared_fraction))
    _report_regenerated(out)


def image_update():
    a = CONF.category
    lib = ingest.Library(CONF)
    if a.path:
        with _progress(os.stat(a.path).st_size, 'hashing') as bar:
            out = lib.update_content(a.id, a.path, disk_format=a.format,
                                     progress=bar.update)
    if a.owner is not None or a.visibility is not None:
        out = lib.update_metadata(a.id, owner=a.owner,
                                  visibility=a.visibility)
    elif not a.path:
        raise exception.CommandError('nothing to update: give PATH, --owner '
                                     'or --visibility')
    _out('updated %s: map v%d' % (out.image_id, out.map_version))
    _report_regenerated(out)


def _report_regenerated(out):
    for image_id, version in sorted(out.regenerated.items()):
        _out('regenerated map of %s: v%d' % (image_id, version))
    if out.pending:
        _out('%d more maps left for vmar-agent to rewrite ([vmar] '
             'rewrite_at_once; vmar-manage map pending)' % out.pending)


def image_delete():
    out = ingest.Library(CONF).delete(CONF.category.id)
    _out('deleted %s' % out.image_id)
    _report_regenerated(out)


def image_list():
    with db_session.reader() as s:
        rows = [(i.seq, i.image_id, i.owner or '-', i.visibility,
                 i.disk_format, i.virtual_size, i.map_version, i.state)
                for i in db_api.list_images(s)]
    cmd.print_table(('seq', 'id', 'owner', 'visibility', 'format',
                     'virtual size', 'map', 'state'), rows)


def image_show():
    """One image of the library, and what its blocks are."""
    a = CONF.category
    with db_session.reader() as s:
        store = db_store.ClusterStore(s)
        img = store.get_image(a.id)
        if img is None:
            raise exception.CommandError('image %s is not in the library'
                                         % a.id)
        zero = ~store.load_digests(img).any(axis=1)
        info = {'image_id': img.image_id, 'seq': img.seq,
                'owner': img.owner, 'visibility': img.visibility,
                'disk_format': img.disk_format,
                'virtual_size': img.virtual_size,
                'block_size': img.block_size, 'blocks': img.n_blocks,
                'zero_blocks': img.zero_blocks,
                'map_version': img.map_version, 'state': img.state,
                'layout': None}
    bs = info['block_size']
    data = ingest.Library(CONF).layout(info['image_id'])
    if data is not None:
        lay = layout_format.decode(data, info['image_id'])
        codes = lay.kind_codes()
        stored = np.bincount(codes[~zero[:len(codes)]],
                             minlength=len(layout_format.KINDS))
        kinds = {kind: {'blocks': n,
                        'stored_blocks': int(stored[layout_format.CODE[kind]]),
                        'metadata': kind in layout_format.METADATA}
                 for kind, n in lay.counts().items() if n}
        files = sorted(lay.file_blocks().items(), key=lambda kv: -kv[1])
        info['layout'] = {
            'volumes': [dataclasses.asdict(v) for v in lay.volumes],
            'kinds': kinds, 'files': len(lay.files),
            'largest_files': [{'path': p, 'blocks': n}
                              for p, n in files[:a.files]]}
    if a.json:
        _out(json.dumps(info, indent=2))
        return
    for key in ('image_id', 'seq', 'owner', 'visibility', 'disk_format',
                'virtual_size', 'blocks', 'zero_blocks', 'map_version',
                'state'):
        _out('%-13s %s' % (key + ':', info[key]))
    lay = info['layout']
    if lay is None:
        _out('layout:       none (added before block layouts, or its '
             'file is missing: vmar-manage image update rewrites it)')
        return
    _out()
    cmd.print_table(('volume offset', 'size', 'type', 'classified'),
                    [(v['offset'], v['length'], v['type'] or '-',
                      'yes' if v['classified'] else 'no')
                     for v in lay['volumes']])
    _out()

    def row(name, tag, blocks, stored):
        return (name, tag, blocks, '%.1f' % (blocks * bs / 2.0 ** 20),
                '%.1f%%' % (100.0 * blocks / info['blocks']),
                '%.1f' % (stored * bs / 2.0 ** 20))
    rows = [row(k, 'metadata' if v['metadata'] else '', v['blocks'],
                v['stored_blocks']) for k, v in lay['kinds'].items()]
    meta = [v for v in lay['kinds'].values() if v['metadata']]
    rows.append(row('all metadata', '', sum(v['blocks'] for v in meta),
                    sum(v['stored_blocks'] for v in meta)))
    cmd.print_table(('kind', '', 'blocks', 'MiB', 'of image',
                     'MiB not zero'), rows)
    _out()
    _out('files with data: %d' % lay['files'])
    for f in lay['largest_files']:
        _out('  %10.1f MiB  %s' % (f['blocks'] * bs / 2.0 ** 20, f['path']))


# -- map --------------------------------------------------------------------

def _current_map(image_id, version=None):
    with db_session.reader() as s:
        store = db_store.ClusterStore(s)
        img = store.get_image(image_id)
        if img is None:
            raise exception.CommandError('image %s is not in the library'
                                         % image_id)
        version = version or img.map_version
        mv = store.map_version(img.seq, version)
        if mv is None:
            raise exception.CommandError('image %s has no map v%d'
                                         % (image_id, version))
        sha = mv.sha256
    path = ingest.map_path(CONF, image_id, version)
    with open(path, 'rb') as f:
        data = f.read()
    if hashlib.sha256(data).hexdigest() != sha:
        raise exception.CommandError('map %s does not match its recorded '
                                     'checksum' % path)
    return path, mapformat.decode(data)


def map_show():
    a = CONF.category
    path, m = _current_map(a.id, a.version)
    info = {
        'path': path, 'image_id': m.image_id, 'map_version': m.map_version,
        'virtual_size': m.virtual_size, 'block_size': m.block_size,
        'file_size': m.file_size, 'extents': len(m.extents),
        'mapped_blocks': m.mapped_blocks(), 'section_shift': m.section_shift,
        'filter_shift': m.filter_shift,
        'targets': [{'image_id': t.image_id, 'size': t.size,
                     'self': t.is_self} for t in m.targets]}
    if a.extents:
        info['extent_list'] = [
            {'src': int(e['src']), 'length': int(e['length']),
             'target': m.targets[int(e['target'])].image_id,
             'target_block': int(e['target_block'])} for e in m.extents]
    _out(json.dumps(info, indent=2))


def map_verify():
    a = CONF.category
    path, m = _current_map(a.id)
    source = a.source or ingest.base_path(CONF, a.id)
    fmt = a.format
    with fingerprint.raw_view(source, fmt, qemu_img=CONF.vmar.qemu_img,
                              work_dir=CONF.vmar.work_dir) as raw:
        os.makedirs(CONF.vmar.work_dir, exist_ok=True)
        with tempfile.TemporaryFile(dir=CONF.vmar.work_dir) as out:
            mapformat.reconstruct(
                m, lambda tid: ingest.base_path(CONF, tid), out)
            out.flush()
            bad = _first_difference(raw, out.fileno(), m.virtual_size)
    if bad is not None:
        raise exception.CommandError('map v%d of %s differs from %s at byte '
                                     '%d' % (m.map_version, a.id, source, bad))
    _out('map v%d of %s reconstructs %s byte for byte (%d bytes)'
         % (m.map_version, a.id, source, m.virtual_size))


def _first_difference(path, fd2, size, chunk=8 << 20):
    with open(path, 'rb') as f:
        if os.fstat(f.fileno()).st_size != size:
            return min(size, os.fstat(f.fileno()).st_size)
        with _progress(size, 'verifying') as bar:
            for off in range(0, size, chunk):
                a = os.pread(f.fileno(), chunk, off)
                b = os.pread(fd2, chunk, off)
                if a != b:
                    n = min(len(a), len(b))
                    diff = np.flatnonzero(np.frombuffer(a[:n], np.uint8)
                                          != np.frombuffer(b[:n], np.uint8))
                    return off + (int(diff[0]) if len(diff) else n)
                bar.update(len(a))
    return None


def _agent_handler():
    # imported here: oslo.messaging (through the agent) pulls in eventlet,
    # whose deprecation warning every other sub-command would print
    from vmar_openstack.glance_hooks import agent
    return agent, agent.Handler(CONF, gsource.client(CONF))


def map_gc():
    # what the agent does every [vmar_agent] map_gc_interval
    a = CONF.category
    agent, handler = _agent_handler()
    plan = agent.collect_garbage(CONF, handler, dry_run=a.dry_run,
                                 min_age=a.min_age)
    verb = 'would delete' if a.dry_run else 'deleted'
    for sv in plan.deletable:
        _out('%s map v%d of %s' % (verb, sv.version, sv.image_id))
    for (image_id, version), why in sorted(plan.kept.items()):
        _out('kept map v%d of %s: %s' % (version, image_id, why))


def map_pending():
    for p in ingest.Library(CONF).pending_maps():
        _out('%s  since %s  (after a change of %s)'
             % (p.image_id, p.since.isoformat(sep=' ', timespec='seconds'),
                p.cause))


def map_rewrite():
    # what the agent does, [vmar_agent] pending_maps_per_minute at a time
    agent, handler = _agent_handler()
    total = 0
    while True:
        n = agent.rewrite_pending(CONF, handler, CONF.category.batch)
        total += n
        if n < CONF.category.batch or (CONF.category.limit is not None
                                       and total >= CONF.category.limit):
            break
    _out('rewrote and published %d pending maps' % total)


# -- hosts -------------------------------------------------------------------

def hosts_list():
    hosts = db_hosts.HostReports(CONF).list()
    if CONF.category.json:
        _out(json.dumps([{'host': h.host,
                          'reported_at': h.reported_at.isoformat(),
                          'exports': [list(e) for e in h.exports],
                          'holds': [list(b) for b in h.holds],
                          'complete': list(h.complete),
                          'peer': h.peer_address,
                          'load_per_cpu': h.load_per_cpu}
                         for h in hosts], indent=2))
        return
    cmd.print_table(('host', 'last report (UTC)', 'exports', 'bases held',
                     'complete', 'peer server', 'load/CPU'),
                    [(h.host, h.reported_at.strftime('%Y-%m-%d %H:%M:%S'),
                      len(h.exports), len(h.holds),
                      ' '.join(h.complete) or '-', h.peer_address or '-',
                      '-' if h.load_per_cpu is None
                      else '%.2f' % h.load_per_cpu) for h in hosts])


def hosts_shares():
    """What the scheduler's vmar weigher sees of an image."""
    shares = db_hosts.HostReports(CONF).shares(CONF.category.image_id)
    cmd.print_table(('host', 'share of the image held'),
                    [(h, '%.3f' % v) for h, v in
                     sorted(shares.items(), key=lambda kv: -kv[1])])


def hosts_forget():
    host = CONF.category.host
    if not db_hosts.HostReports(CONF).forget(host):
        raise exception.CommandError('no report of host %s is recorded'
                                     % host)
    _out('forgot host %s: the map versions it held may now be removed'
         % host)


# -- failures -----------------------------------------------------------------

def failures_list():
    rows = [(f.image_id, f.event, f.state, f.attempts,
             f.updated_at.strftime('%Y-%m-%d %H:%M:%S'), f.last_error)
            for f in db_failures.Failures(CONF).list(CONF.category.state)]
    if CONF.category.json:
        keys = ('image_id', 'event', 'state', 'attempts', 'updated_at',
                'last_error')
        _out(json.dumps([dict(zip(keys, r)) for r in rows], indent=2))
        return
    cmd.print_table(('image', 'event', 'state', 'attempts',
                     'updated (UTC)', 'last error'), rows)


def _failure(image_id):
    f = db_failures.Failures(CONF).get(image_id)
    if f is None:
        raise exception.CommandError('no failure is recorded for %s'
                                     % image_id)
    return f


def failures_retry():
    # as vmar-agent would, with its [vmar_glance] credentials
    f = _failure(CONF.category.id)
    agent, handler = _agent_handler()
    again = agent.retry(handler, agent.Endpoint(CONF, handler), f)
    if again is not None:
        raise exception.CommandError('%s of %s failed again (%s, attempt '
                                     '%d): %s' % (
                                         again.event, again.image_id,
                                         again.state, again.attempts,
                                         again.last_error))
    _out('%s of %s succeeded; its failure is cleared' % (f.event,
                                                         f.image_id))


def failures_forget():
    f = _failure(CONF.category.id)
    db_failures.Failures(CONF).clear(f.image_id)
    _out('forgot the failure of %s (%s); vmar-agent handles the image '
         'again at its next event or resync' % (f.image_id, f.state))


# -- stats and check ----------------------------------------------------------

def collect_stats(conf=None):
    conf = conf or CONF
    out = {'images': [], 'clusters': 0}
    with db_session.reader(conf) as s:
        store = db_store.ClusterStore(s)
        images = store.list_images()
        out['clusters'] = store.cluster_count()
        blocks = {}
        for img in images:
            d = store.load_digests(img)
            mask = fp_keys.shareable_mask(d, img.virtual_size, img.block_size)
            blocks[img.seq] = fp_keys.block_keys(d[mask], img.space_key)
        # distinct fingerprints by the number of images holding them (the
        # paper's Fig. 12b), from the digest lists: a cluster's members are
        # not all its holders (shadow holders, vmar_openstack.db.store)
        keys, holders = np.unique(np.concatenate(
            [np.empty(0, np.int64)] + [fp_keys.unique(b)
                                       for b in blocks.values()]),
            return_counts=True)
        by_holders = collections.Counter(holders.tolist())
        out['fingerprints_by_images'] = dict(sorted(by_holders.items()))
        for img in images:
            bkeys = blocks[img.seq]
            single = holders[np.searchsorted(keys, bkeys)] == 1
            mv = store.map_version(img.seq, img.map_version)
            data_blocks = img.n_blocks - img.zero_blocks
            gib = img.virtual_size / float(1 << 30)
            out['images'].append({
                'seq': img.seq, 'image_id': img.image_id,
                'virtual_size': img.virtual_size,
                'blocks': img.n_blocks, 'zero_blocks': img.zero_blocks,
                'data_blocks': data_blocks,
                'unique_blocks': int(single.sum()),
                'redirected_blocks': img.redirected_blocks,
                'redirected_fraction': (img.redirected_blocks / data_blocks
                                        if data_blocks else 0.0),
                'extents': img.n_extents,
                'map_version': img.map_version,
                'map_bytes': mv.size if mv else 0,
                'map_mb_per_gib': (mv.size / 1e6 / gib) if mv else 0.0,
            })
    imgs = out['images']
    out['total_map_bytes'] = sum(i['map_bytes'] for i in imgs)
    total_gib = sum(i['virtual_size'] for i in imgs) / float(1 << 30)
    out['map_mb_per_gib'] = (out['total_map_bytes'] / 1e6 / total_gib
                             if total_gib else 0.0)
    data = sum(i['data_blocks'] for i in imgs)
    out['data_blocks'] = data
    out['redirected_fraction'] = (sum(i['redirected_blocks'] for i in imgs)
                                  / data if data else 0.0)
    return out


def stats():
    st = collect_stats()
    if CONF.category.json:
        _out(json.dumps(st, indent=2))
        return
    rows = [(i['seq'], i['image_id'][:8], i['blocks'], i['zero_blocks'],
             i['unique_blocks'], i['redirected_blocks'],
             '%.1f%%' % (100 * i['redirected_fraction']), i['extents'],
             i['map_bytes'], '%.3f' % i['map_mb_per_gib'])
            for i in st['images']]
    cmd.print_table(('seq', 'image', 'blocks', 'zero', 'unique',
                     'redirected', 'redir %', 'extents', 'map bytes',
                     'MB/GiB'), rows)
    _out('clusters: %d  map bytes: %d (%.3f MB per GiB)  redirected: %.1f%% '
         'of data blocks' % (st['clusters'], st['total_map_bytes'],
                             st['map_mb_per_gib'],
                             100 * st['redirected_fraction']))
    total = sum(st['fingerprints_by_images'].values())
    if total:
        _out('distinct fingerprints by number of images holding them: '
             + ', '.join('%d: %d (%.1f%%)' % (k, v, 100.0 * v / total)
                         for k, v in st['fingerprints_by_images'].items()))


def check():
    problems, warnings = check_mod.check(CONF)
    for w in warnings:
        _out('warning: %s' % w)
    for p in problems:
        _out('problem: %s' % p)
    if problems:
        raise exception.CommandError('%d problems found' % len(problems))
    _out('library consistent')


# -- argument parsing ---------------------------------------------------------

def add_command_parsers(subparsers):
    db = subparsers.add_parser('db', help='database schema')
    dbs = db.add_subparsers(dest='action')
    dbs.add_parser('sync', help='create or upgrade the cluster tables'
                   ).set_defaults(func=db_sync)
    dbs.add_parser('version', help='print the schema revision'
                   ).set_defaults(func=db_version)
    p = dbs.add_parser('downgrade', help='back to an earlier revision (only '
                       'those whose release note says how; stop every '
                       'service of this release first)')
    p.add_argument('revision', help='the revision to go back to')
    p.set_defaults(func=db_downgrade)
    dbs.add_parser('compact', help='write the fingerprint runs and '
                   'overrides into the row tiers now (outside the library '
                   'lock; before a downgrade past 0025)'
                   ).set_defaults(func=db_compact)

    image = subparsers.add_parser('image', help='images in the library')
    imgs = image.add_subparsers(dest='action')
    p = imgs.add_parser('add', help='fingerprint an image and map it')
    p.add_argument('--id', required=True, help='Glance image id (UUID)')
    p.add_argument('--owner', help='owning project id')
    p.add_argument('--visibility', default='private',
                   choices=db_api.VISIBILITIES)
    p.add_argument('--format', default='raw', help='disk format (pinned)')
    p.add_argument('--size', type=int,
                   help='expected file size in bytes (detects truncation)')
    p.add_argument('path')
    p.set_defaults(func=image_add)
    p = imgs.add_parser('update', help='new content, owner or visibility')
    p.add_argument('id')
    p.add_argument('--owner')
    p.add_argument('--visibility', choices=db_api.VISIBILITIES)
    p.add_argument('--format', default='raw')
    p.add_argument('path', nargs='?')
    p.set_defaults(func=image_update)
    p = imgs.add_parser('delete', help='remove an image')
    p.add_argument('id')
    p.set_defaults(func=image_delete)
    imgs.add_parser('list', help='list images').set_defaults(func=image_list)
    p = imgs.add_parser('show', help='an image and what its blocks are '
                        '(file-system metadata by kind, file data, free)')
    p.add_argument('id')
    p.add_argument('--files', type=int, default=10,
                   help='how many of the largest files to name')
    p.add_argument('--json', action='store_true')
    p.set_defaults(func=image_show)

    mp = subparsers.add_parser('map', help='block maps')
    mps = mp.add_subparsers(dest='action')
    p = mps.add_parser('show', help='describe a map')
    p.add_argument('id')
    p.add_argument('--version', type=int)
    p.add_argument('--extents', action='store_true')
    p.set_defaults(func=map_show)
    p = mps.add_parser('verify', help='reconstruct an image through its map '
                       'and compare byte for byte')
    p.add_argument('id')
    p.add_argument('--source', help='original image (default: its base file)')
    p.add_argument('--format', default='raw')
    p.set_defaults(func=map_verify)

    p = mps.add_parser('gc', help='remove the superseded map versions no '
                       'compute host holds')
    p.add_argument('--min-age', type=int, metavar='SECONDS',
                   help='default: [vmar_agent] map_gc_min_age')
    p.add_argument('--dry-run', action='store_true')
    p.set_defaults(func=map_gc)
    mps.add_parser('pending', help='maps a change of another image left for '
                   'vmar-agent to rewrite').set_defaults(func=map_pending)
    p = mps.add_parser('rewrite', help='rewrite and publish the pending maps '
                       'now, a batch per transaction')
    p.add_argument('--batch', type=int, default=50,
                   help='maps per transaction (the library lock is held '
                   'for each)')
    p.add_argument('--limit', type=int, help='stop after about this many')
    p.set_defaults(func=map_rewrite)

    hs = subparsers.add_parser('hosts', help='compute hosts, as they '
                               'reported their exports')
    hss = hs.add_subparsers(dest='action')
    p = hss.add_parser('list', help='list the hosts\' last reports')
    p.add_argument('--json', action='store_true')
    p.set_defaults(func=hosts_list)
    p = hss.add_parser('shares', help='the share of an image\'s canonical '
                       'blocks each host holds (what the vmar scheduler '
                       'weigher sees)')
    p.add_argument('image_id')
    p.set_defaults(func=hosts_shares)
    p = hss.add_parser('forget', help='drop the report of a host that is '
                       'gone for good')
    p.add_argument('host')
    p.set_defaults(func=hosts_forget)

    fl = subparsers.add_parser('failures', help='images vmar-agent could '
                               'not handle')
    fls = fl.add_subparsers(dest='action')
    p = fls.add_parser('list', help='list recorded failures')
    p.add_argument('--state', choices=('retrying', 'parked', 'failed'))
    p.add_argument('--json', action='store_true')
    p.set_defaults(func=failures_list)
    p = fls.add_parser('retry', help='handle an image again now')
    p.add_argument('id')
    p.set_defaults(func=failures_retry)
    p = fls.add_parser('forget', help='drop an image\'s failure record')
    p.add_argument('id')
    p.set_defaults(func=failures_forget)

    p = subparsers.add_parser('stats', help='dedup and map figures')
    p.add_argument('--json', action='store_true')
    p.set_defaults(func=stats)
    subparsers.add_parser('check', help='verify the library invariants'
                          ).set_defaults(func=check)


def main(argv=None):
    # ValueError: an argument the library refuses (an image id that is no
    # UUID, an unknown visibility); OSError: a file that cannot be read
    return cmd.run(CONF, 'vmar-manage', add_command_parsers,
                   (ValueError, OSError), argv)


if __name__ == '__main__':
    sys.exit(main())
