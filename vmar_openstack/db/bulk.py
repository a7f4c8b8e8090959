"""Set-based statements over large lists of fingerprint keys or clusters.

An ingest touches up to millions of fingerprint keys and thousands of
clusters. Sending them one statement per row costs microseconds of Python
each, so they travel as one JSON array per batch and the database expands
it in C:

* SQLite: ``json_each``;
* PostgreSQL: ``jsonb_array_elements_text``;
* MariaDB/MySQL: ``JSON_TABLE``.

Batches stay under MariaDB's default 16 MiB packet limit.
"""

import itertools
import json

import numpy as np
import sqlalchemy as sa

BATCH = 200000


def source(dialect, alias='j'):
    """(table expression, column) expanding a ``:keys`` JSON array."""
    if dialect == 'sqlite':
        return 'json_each(:keys) AS %s' % alias, '%s.value' % alias
    if dialect == 'postgresql':
        return ('jsonb_array_elements_text(CAST(:keys AS jsonb)) AS %s(v)'
                % alias, 'CAST(%s.v AS BIGINT)' % alias)
    if dialect in ('mysql', 'mariadb'):
        return ("JSON_TABLE(:keys, '$[*]' COLUMNS (v BIGINT PATH '$')) AS %s"
                % alias, '%s.v' % alias)
    raise NotImplementedError('unsupported database dialect %s' % dialect)


def fetch_pairs(session, sql, params=()):
    """Run a query of two non-NULL integer columns; return two int64 arrays.

    See :func:`fetch_columns`.
    """
    return fetch_columns(session, sql, params, 2)


def _cursor_sql(conn, sql):
    if conn.dialect.paramstyle != 'qmark':
        sql = sql.replace('%', '%%').replace('?', '%s')
    return sql


def fetch_rows(session, sql, params=()):
    """Rows of a query as plain tuples, through the DB-API cursor.

    ``sql`` marks parameters with ``?``.
    """
    conn = session.connection()
    cur = conn.connection.cursor()
    try:
        cur.execute(_cursor_sql(conn, sql), tuple(params))
        return cur.fetchall()
    finally:
        cur.close()


def fetch_columns(session, sql, params=(), n=2):
    """Run a query of ``n`` non-NULL integer columns; return int64 arrays.

    Uses the DB-API cursor of the session's connection (same transaction):
    building a SQLAlchemy row object per result row costs more than the
    query itself when an image has a million blocks. ``sql`` marks
    parameters with ``?``.

    On SQLite the rows come back as one ``group_concat`` string per column
    that numpy parses, not as a Python tuple per row (half a million rows:
    0.25 s against 0.45 s). The aggregates see the rows in the same order,
    so the columns stay aligned (``group_concat`` skips NULLs, hence
    non-NULL columns only).
    """
    conn = session.connection()
    sqlite = conn.dialect.name == 'sqlite'
    if sqlite:
        names = ['c%d' % i for i in range(n)]
        sql = ('WITH cols(%s) AS (%s) SELECT %s FROM cols'
               % (', '.join(names), sql,
                  ', '.join('group_concat(%s)' % c for c in names)))
    else:
        sql = _cursor_sql(conn, sql)
    cur = conn.connection.cursor()
    try:
        cur.execute(sql, tuple(params))
        rows = cur.fetchall()
    finally:
        cur.close()
    if sqlite:
        if rows[0][0] is None:
            return [np.empty(0, np.int64) for _ in range(n)]
        cols = [np.fromstring(v, dtype=np.int64, sep=',') for v in rows[0]]
        if len({len(c) for c in cols}) != 1:
            raise RuntimeError('query returned columns of %s values'
                               % [len(c) for c in cols])
        return cols
    flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64,
                       count=n * len(rows))
    return [flat[i::n].copy() for i in range(n)]


def encode(keys):
    """One JSON parameter for :func:`source` (at most BATCH keys)."""
    return json.dumps(np.asarray(keys, dtype=np.int64).tolist())


def _batches(keys):
    keys = np.asarray(keys, dtype=np.int64)
    for i in range(0, len(keys), BATCH):
        yield encode(keys[i:i + BATCH])


def lookup(session, dialect, keys, table='vmar_fingerprints', key='fp_key',
           columns=('cluster_id',)):
    """Rows of ``table`` whose ``key`` is in ``keys``.

    Returns the found keys and then one array per name in ``columns``
    (integer SQL expressions over the row ``f``, never NULL).
    """
    src, col = source(dialect)
    sql = ('SELECT f.%s, %s FROM %s JOIN %s f ON f.%s = %s'
           % (key, ', '.join(columns), src.replace(':keys', '?'), table, key,
              col))
    parts = [[np.empty(0, np.int64)] for _ in range(len(columns) + 1)]
    for batch in _batches(keys):
        for part, values in zip(parts, fetch_columns(
                session, sql, (batch,), len(columns) + 1)):
            part.append(values)
    return [np.concatenate(p) for p in parts]


def set_hashes(session, dialect, ids, hashes, also=''):
    """Set ``members_hash`` of clusters ``ids`` to ``hashes``, one statement.

    ``also``: more assignments (unqualified columns of vmar_clusters).
    One statement instead of one per cluster: ``executemany`` takes the GIL
    back after every row, and waits for it while another thread (the map
    build of an ingest) holds it.
    """
    pairs = json.dumps([{'id': int(i), 'h': h} for i, h in zip(ids, hashes)])
    more = (', ' + also) if also else ''
    if dialect == 'sqlite':
        sql = ("UPDATE vmar_clusters SET members_hash = "
               "json_extract(j.value, '$.h')%s FROM json_each(:pairs) AS j "
               "WHERE vmar_clusters.id = json_extract(j.value, '$.id')"
               % more)
    elif dialect == 'postgresql':
        sql = ('UPDATE vmar_clusters SET members_hash = j.h%s FROM '
               'jsonb_to_recordset(CAST(:pairs AS jsonb)) AS j(id BIGINT, '
               'h TEXT) WHERE vmar_clusters.id = j.id' % more)
    elif dialect in ('mysql', 'mariadb'):
        sql = ("UPDATE vmar_clusters c JOIN JSON_TABLE(:pairs, '$[*]' "
               "COLUMNS (id BIGINT PATH '$.id', h VARCHAR(64) PATH '$.h')) "
               "AS j ON c.id = j.id SET c.members_hash = j.h%s" % more)
    else:
        raise NotImplementedError('unsupported database dialect %s'
                                  % dialect)
    session.execute(sa.text(sql), {'pairs': pairs})


def insert(session, dialect, keys, value, table='vmar_fingerprints',
           columns=('fp_key', 'cluster_id')):
    """Insert one row (key, ``value``) into ``table`` per key."""
    src, col = source(dialect)
    stmt = sa.text('INSERT INTO %s (%s) SELECT %s, :value FROM %s'
                   % (table, ', '.join(columns), col, src))
    for batch in _batches(keys):
        session.execute(stmt, {'keys': batch, 'value': int(value)})


def move(session, dialect, keys, cluster_id):
    """Point the given existing keys at ``cluster_id``."""
    src, col = source(dialect)
    if dialect in ('mysql', 'mariadb'):
        stmt = sa.text('UPDATE vmar_fingerprints f JOIN %s ON f.fp_key = %s '
                       'SET f.cluster_id = :cid' % (src, col))
    elif dialect == 'sqlite':
        # an upsert of rows that all exist: one pass over the keys, without
        # the temporary b-tree SQLite builds for "IN (subquery)" (25 to 40
        # % faster for half a million keys)
        stmt = sa.text('INSERT INTO vmar_fingerprints (fp_key, cluster_id) '
                       'SELECT %s, :cid FROM %s WHERE true '
                       'ON CONFLICT (fp_key) DO UPDATE '
                       'SET cluster_id = excluded.cluster_id' % (col, src))
    else:
        stmt = sa.text('UPDATE vmar_fingerprints SET cluster_id = :cid '
                       'WHERE fp_key IN (SELECT %s FROM %s)' % (col, src))
    for batch in _batches(keys):
        session.execute(stmt, {'keys': batch, 'cid': int(cluster_id)})


def delete(session, dialect, keys):
    src, col = source(dialect)
    if dialect in ('mysql', 'mariadb'):
        stmt = sa.text('DELETE f FROM vmar_fingerprints f JOIN %s '
                       'ON f.fp_key = %s' % (src, col))
    else:
        stmt = sa.text('DELETE FROM vmar_fingerprints WHERE fp_key IN '
                       '(SELECT %s FROM %s)' % (col, src))
    for batch in _batches(keys):
        session.execute(stmt, {'keys': batch})
