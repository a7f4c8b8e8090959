#!/usr/bin/env python3
"""The library's database with its digest lists out and in (issue 51).

Ingests the images given on the command line (raw, real size: the
Debian image library's are 2 GiB each) into a fresh library, then
measures the database and the digest list objects as revision 0023 keeps
them (the lists out, named by their SHA-256), then goes back to revision
0022 (the downgrade moves every list back into ``vmar_image_digests``,
as the library kept them before) and measures the database again, then
upgrades and moves them out once more (``vmar-manage db sync``'s move),
timing the move. Both layouts hold the same images, in the same run.

Prints, per layout: database bytes in use (pages or rows' data and
indexes, after the database's own statistics are refreshed), bytes per
image and per GiB of virtual disk, and the objects' bytes; then the
ratio of the database with the lists out to with them in.

Usage: bench_digest_lists.py [--db sqlite|mariadb|postgresql] [--json OUT]
                             NAME=PATH...
"""

import argparse
import json
import os
import shutil
import sqlite3
import sys
import tempfile
import time
import uuid

import sqlalchemy as sa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
from tools.vmarenv import services  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_ingest  # noqa: E402

from vmar_openstack.db import digest_lists  # noqa: E402
from vmar_openstack.db import migration  # noqa: E402
from vmar_openstack.db import session as db_session  # noqa: E402
from vmar_openstack import ingest  # noqa: E402


def db_bytes(conf):
    """Bytes the library's tables take in its database, statistics fresh."""
    engine = db_session.get_engine(conf)
    name = engine.dialect.name
    if name == 'sqlite':
        db_session.wait_for_checkpoints()
        engine.dispose()
        c = sqlite3.connect(engine.url.database)
        try:
            c.execute('PRAGMA wal_checkpoint(TRUNCATE)')
            (page,), = c.execute('PRAGMA page_size')
            (pages,), = c.execute('PRAGMA page_count')
            (free,), = c.execute('PRAGMA freelist_count')
            return (pages - free) * page
        finally:
            c.close()
    with engine.begin() as c:
        tables = [t for t in sa.inspect(c).get_table_names()
                  if t.startswith('vmar_')]
        if name in ('mysql', 'mariadb'):
            for t in tables:
                c.exec_driver_sql('ANALYZE TABLE %s' % t)
            return int(c.execute(sa.text(
                'SELECT SUM(data_length + index_length) FROM '
                'information_schema.tables WHERE table_schema = DATABASE() '
                "AND table_name LIKE 'vmar\\_%'")).scalar())
        return int(sum(c.execute(sa.text(
            'SELECT pg_total_relation_size(:t)'), {'t': t}).scalar()
            for t in tables))


def objects_bytes(conf):
    return sum(os.path.getsize(p) for p in
               digest_lists.DigestLists(conf).objects().values())


def measure(conf, n_images, gib):
    b = db_bytes(conf)
    o = objects_bytes(conf)
    return {'db_bytes': b, 'db_bytes_per_image': b / n_images,
            'db_bytes_per_gib': b / gib, 'object_bytes': o,
            'object_bytes_per_gib': o / gib}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--db', default='sqlite',
                   choices=('sqlite', 'mariadb', 'postgresql'))
    p.add_argument('--json')
    p.add_argument('images', nargs='+', metavar='NAME=PATH')
    args = p.parse_args()
    state = tempfile.mkdtemp(prefix='vmar-digest-lists-')
    try:
        conf = bench_ingest.make_conf(state)
        if args.db != 'sqlite':
            url = (services.mariadb_database if args.db == 'mariadb'
                   else services.postgresql_database)('digest_lists')
            conf.set_override('connection', url, group='vmar_database')
            migration.upgrade('head', conf=conf)
        lib = ingest.Library(conf)
        gib = 0.0
        for spec in args.images:
            name, path = spec.split('=', 1)
            t = time.monotonic()
            image_id = str(uuid.uuid4())
            lib.add(image_id, path, keep_base=False, visibility='public')
            gib += lib.virtual_size(image_id) / (1 << 30)
            print('%-12s added in %.1f s' % (name, time.monotonic() - t))
        n = len(args.images)
        out = {'db': args.db, 'images': n, 'virtual_gib': gib}
        out['lists_out'] = measure(conf, n, gib)
        t = time.monotonic()
        migration.downgrade('0022', conf=conf)
        out['move_in_seconds'] = time.monotonic() - t
        out['lists_in'] = measure(conf, n, gib)
        migration.upgrade('head', conf=conf)
        digest_lists.clear_cache()
        t = time.monotonic()
        moved = lib.move_digest_lists()
        out['move_out_seconds'] = time.monotonic() - t
        assert moved == n, (moved, n)
        out['lists_out_again'] = measure(conf, n, gib)
        out['ratio_db_out_to_in'] = (out['lists_out']['db_bytes']
                                     / out['lists_in']['db_bytes'])
        for k in ('lists_in', 'lists_out', 'lists_out_again'):
            m = out[k]
            print('%-16s database %12d bytes (%9.0f per image, %9.0f per '
                  'GiB), objects %11d bytes' % (
                      k, m['db_bytes'], m['db_bytes_per_image'],
                      m['db_bytes_per_gib'], m['object_bytes']))
        print('database with the lists out / with them in: %.3f'
              % out['ratio_db_out_to_in'])
        print('moving %d lists: in %.1f s, out %.1f s'
              % (n, out['move_in_seconds'], out['move_out_seconds']))
        if args.json:
            with open(args.json, 'w') as f:
                json.dump(out, f, indent=1)
    finally:
        shutil.rmtree(state, ignore_errors=True)


if __name__ == '__main__':
    main()
