"""Set-based statements over large lists of fingerprint keys or clusters.

An ingest touches up to millions of fingerprint keys and thousands of
clusters. Sending them one statement per row costs microseconds of Python
each, so they travel as one JSON array per batch and the database expands
it in C:

* SQLite: ``json_each``;
* PostgreSQL: ``jsonb_array_elements_text``;
* MariaDB/MySQL: ``JSON_TABLE``.

Batches stay under MariaDB's default 16 MiB packet limit.

The fingerprint table has two tiers (a two-level LSM tree):
``vmar_fingerprints`` and the small ``vmar_fingerprints_recent``. An add
that brings few new keys inserts them into the small table, whose pages
are few; an insert into the large one dirties about one page per key, since
keys are hashes, and the commit writes every dirty page. Every add then
moves one of :data:`SLICES` key ranges of the small table into the large
one, each page of that range written once for many keys. A key is in one
tier only; :meth:`BulkSQL.lookup`, :meth:`~BulkSQL.move` and
:meth:`~BulkSQL.delete` cover both, and :meth:`~BulkSQL.add_fingerprints`
picks the tier.

Only :class:`vmar_openstack.db.store.ClusterStore` uses this module.
"""

import itertools
import json

import numpy as np
import sqlalchemy as sa

from vmar_openstack.db import session as db_session

BATCH = 200000

FINGERPRINTS = 'vmar_fingerprints'
RECENT = 'vmar_fingerprints_recent'
CLUSTERS = 'vmar_clusters'
# rows the small tier holds at most: 64 Ki keys and their cluster ids fill
# a few hundred pages
MERGE_ROWS = 1 << 16
# key ranges of the small tier, one merged into the large tier per add
SLICES = 32


def encode(keys):
    """One JSON parameter for :meth:`BulkSQL.source` (at most BATCH keys)."""
    return json.dumps(np.asarray(keys, dtype=np.int64).tolist())


def _batches(keys):
    keys = np.asarray(keys, dtype=np.int64)
    for i in range(0, len(keys), BATCH):
        yield encode(keys[i:i + BATCH])


def _cursor_sql(conn, sql):
    if conn.dialect.paramstyle != 'qmark':
        sql = sql.replace('%', '%%').replace('?', '%s')
    return sql


class BulkSQL:
    """The set-based statements of one session, in its database's dialect.

    Sessions here last one transaction; only this class changes the small
    tier, and it keeps the answer of :meth:`has_recent` (cached in the
    session) right.
    """

    def __init__(self, session):
        self.session = session
        self.dialect = db_session.dialect(session)
        # the key arrays this transaction moved to another cluster
        self.moved = []

    def source(self, alias='j'):
        """(table expression, column) expanding a ``:keys`` JSON array."""
        if self.dialect == 'sqlite':
            return 'json_each(:keys) AS %s' % alias, '%s.value' % alias
        if self.dialect == 'postgresql':
            return ('jsonb_array_elements_text(CAST(:keys AS jsonb)) AS %s(v)'
                    % alias, 'CAST(%s.v AS BIGINT)' % alias)
        if self.dialect in ('mysql', 'mariadb'):
            return ("JSON_TABLE(:keys, '$[*]' COLUMNS (v BIGINT PATH '$')) "
                    "AS %s" % alias, '%s.v' % alias)
        raise NotImplementedError('unsupported database dialect %s'
                                  % self.dialect)

    def fetch_rows(self, sql, params=()):
        """Rows of a query as plain tuples, through the DB-API cursor.

        ``sql`` marks parameters with ``?``.
        """
        conn = self.session.connection()
        cur = conn.connection.cursor()
        try:
            cur.execute(_cursor_sql(conn, sql), tuple(params))
            return cur.fetchall()
        finally:
            cur.close()

    def fetch_columns(self, sql, params=(), n=2):
        """Run a query of ``n`` non-NULL integer columns; return int64 arrays.

        Uses the DB-API cursor of the session's connection (same
        transaction): building a SQLAlchemy row object per result row costs
        more than the query itself when an image has a million blocks.
        ``sql`` marks parameters with ``?``.

        On SQLite the rows come back as one ``group_concat`` string per
        column that numpy parses, not as a Python tuple per row (half a
        million rows: 0.25 s against 0.45 s). The aggregates see the rows in
        the same order, so the columns stay aligned (``group_concat`` skips
        NULLs, hence non-NULL columns only).
        """
        conn = self.session.connection()
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
            cols = [np.fromstring(v, dtype=np.int64, sep=',')
                    for v in rows[0]]
            if len({len(c) for c in cols}) != 1:
                raise RuntimeError('query returned columns of %s values'
                                   % [len(c) for c in cols])
            return cols
        flat = np.fromiter(itertools.chain.from_iterable(rows),
                           dtype=np.int64, count=n * len(rows))
        return [flat[i::n].copy() for i in range(n)]

    # -- fingerprint keys --------------------------------------------------

    def lookup(self, keys, table=FINGERPRINTS, key='fp_key',
               columns=('cluster_id',)):
        """Rows of ``table`` whose ``key`` is in ``keys``.

        Returns the found keys and then one array per name in ``columns``
        (integer SQL expressions over the row ``f``, never NULL). For the
        fingerprint table, both tiers: the small one for the keys the large
        one does not hold.
        """
        found = self._lookup(keys, table, key, columns)
        if table == FINGERPRINTS and self.has_recent() and (
                len(found[0]) < len(keys)):
            rest = np.asarray(keys, dtype=np.int64)
            rest = rest[~np.isin(rest, found[0], assume_unique=True)]
            more = self._lookup(rest, RECENT, key, columns)
            found = [np.concatenate(p) for p in zip(found, more)]
        return found

    def _lookup(self, keys, table, key, columns):
        src, col = self.source()
        sql = ('SELECT f.%s, %s FROM %s JOIN %s f ON f.%s = %s'
               % (key, ', '.join(columns), src.replace(':keys', '?'), table,
                  key, col))
        parts = [[np.empty(0, np.int64)] for _ in range(len(columns) + 1)]
        for batch in _batches(keys):
            for part, values in zip(parts, self.fetch_columns(
                    sql, (batch,), len(columns) + 1)):
                part.append(values)
        return [np.concatenate(p) for p in parts]

    def rows_by_id(self, ids, columns):
        """Rows ``(id, *columns)`` of the clusters ``ids``, as tuples.

        ``columns``: column names of vmar_clusters.
        """
        src, col = self.source()
        sql = ('SELECT c.id, %s FROM %s JOIN %s c ON c.id = %s'
               % (', '.join('c.%s' % c for c in columns),
                  src.replace(':keys', '?'), CLUSTERS, col))
        ids = np.asarray([int(c) for c in ids], dtype=np.int64)
        rows = []
        for i in range(0, len(ids), BATCH):
            rows.extend(self.fetch_rows(sql, (encode(ids[i:i + BATCH]),)))
        return rows

    def count_fingerprints_at_most(self):
        """An upper bound of the fingerprint keys in the library.

        The images' non-zero blocks: one row per image to read, where an
        exact count reads every cluster row or key.
        """
        return int(self.session.execute(sa.text(
            'SELECT COALESCE(SUM(n_blocks - zero_blocks), 0) '
            'FROM vmar_images')).scalar())

    def scan_fingerprints(self, page=1 << 20):
        """Every (key, cluster) of both tiers, sorted by key, as int64 arrays.

        Read in pages along the primary key; for a caller about to look up
        about as many keys as the table holds, for which a scan costs a
        third of the lookups (vmar_openstack.ingest.ahead).
        """
        keys, clusters = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
        for table in self.tiers():
            last = None
            while True:
                where = '' if last is None else 'WHERE fp_key > ? '
                k, c = self.fetch_columns(
                    'SELECT fp_key, cluster_id FROM %s %sORDER BY '
                    'fp_key LIMIT %d' % (table, where, page),
                    () if last is None else (last,))
                keys.append(k)
                clusters.append(c)
                if len(k) < page:
                    break
                last = int(k[-1])
        keys, clusters = np.concatenate(keys), np.concatenate(clusters)
        if self.has_recent():   # two sorted runs: one sort
            order = np.argsort(keys, kind='stable')
            keys, clusters = keys[order], clusters[order]
        return keys, clusters

    def tiers(self):
        """The fingerprint tables that may hold a key."""
        return (FINGERPRINTS, RECENT) if self.has_recent() else (
            FINGERPRINTS,)

    def has_recent(self):
        """Whether the small fingerprint tier has rows (cached)."""
        value = self.session.info.get('vmar_recent')
        if value is None:
            value = self.session.execute(sa.text(
                'SELECT 1 FROM %s LIMIT 1' % RECENT)).first() is not None
            self.session.info['vmar_recent'] = value
        return value

    def add_fingerprints(self, keys, cluster_id):
        """Insert new fingerprint keys (in neither tier), all in one cluster.

        Into the small tier while it stays under :data:`MERGE_ROWS` rows,
        otherwise into the large one. Then one of :data:`SLICES` key ranges
        of the small tier moves to the large one, a different range each
        mutation (by the lock row's generation): each add writes the pages
        of 1/SLICES of the large table, and no add pays for a whole merge.
        """
        held = 0
        if self.has_recent() and len(keys) <= MERGE_ROWS:
            held = self.session.execute(sa.text(
                'SELECT COUNT(*) FROM %s' % RECENT)).scalar()
        if held + len(keys) <= MERGE_ROWS:
            self._insert(keys, cluster_id, RECENT)
            self.session.info['vmar_recent'] = held + len(keys) > 0
        else:
            self._insert(keys, cluster_id, FINGERPRINTS)
        if self.has_recent():
            self.merge_slice(
                self.session.info.get('vmar_generation', 0) % SLICES)

    def merge_slice(self, i):
        """Move the small tier's keys in key range ``i`` to the large tier."""
        width = (1 << 64) // SLICES
        lo = -(1 << 63) + i * width
        bounds = {'lo': lo, 'hi': lo + width - 1}
        self.session.execute(sa.text(
            'INSERT INTO %s (fp_key, cluster_id) SELECT fp_key, cluster_id '
            'FROM %s WHERE fp_key BETWEEN :lo AND :hi ORDER BY fp_key'
            % (FINGERPRINTS, RECENT)), bounds)
        self.session.execute(sa.text(
            'DELETE FROM %s WHERE fp_key BETWEEN :lo AND :hi' % RECENT),
            bounds)

    def _insert(self, keys, cluster_id, table):
        """Insert one row (key, ``cluster_id``) into ``table`` per key."""
        src, col = self.source()
        stmt = sa.text('INSERT INTO %s (fp_key, cluster_id) SELECT %s, :cid '
                       'FROM %s' % (table, col, src))
        for batch in _batches(keys):
            self.session.execute(stmt, {'keys': batch,
                                        'cid': int(cluster_id)})

    def move(self, keys, cluster_id):
        """Point the given existing keys (either tier) at ``cluster_id``."""
        self.moved.append(np.asarray(keys, dtype=np.int64))
        src, col = self.source()
        recent = self.has_recent()
        stmts = []
        if self.dialect in ('mysql', 'mariadb'):
            for t in self.tiers():
                stmts.append('UPDATE %s f JOIN %s ON f.fp_key = %s '
                             'SET f.cluster_id = :cid' % (t, src, col))
        elif self.dialect == 'sqlite':
            if recent:
                stmts.append('UPDATE %s SET cluster_id = :cid WHERE fp_key '
                             'IN (SELECT %s FROM %s)' % (RECENT, col, src))
            # an upsert of rows that all exist: one pass over the keys,
            # without the temporary b-tree SQLite builds for "IN (subquery)"
            # (25 to 40 % faster for half a million keys); keys of the small
            # tier are left out, or the upsert would copy them into the
            # large one
            stmts.append('INSERT INTO %s (fp_key, cluster_id) '
                         'SELECT %s, :cid FROM %s WHERE %s '
                         'ON CONFLICT (fp_key) DO UPDATE '
                         'SET cluster_id = excluded.cluster_id'
                         % (FINGERPRINTS, col, src,
                            'NOT EXISTS (SELECT 1 FROM %s r WHERE r.fp_key '
                            '= %s)' % (RECENT, col) if recent else 'true'))
        else:
            for t in self.tiers():
                stmts.append('UPDATE %s SET cluster_id = :cid WHERE fp_key '
                             'IN (SELECT %s FROM %s)' % (t, col, src))
        for batch in _batches(keys):
            for stmt in stmts:
                self.session.execute(sa.text(stmt),
                                     {'keys': batch, 'cid': int(cluster_id)})

    def delete(self, keys):
        """Delete the given fingerprint keys, from either tier."""
        src, col = self.source()
        stmts = []
        for t in self.tiers():
            if self.dialect in ('mysql', 'mariadb'):
                stmts.append('DELETE f FROM %s f JOIN %s ON f.fp_key = %s'
                             % (t, src, col))
            else:
                stmts.append('DELETE FROM %s WHERE fp_key IN '
                             '(SELECT %s FROM %s)' % (t, col, src))
        for batch in _batches(keys):
            for stmt in stmts:
                self.session.execute(sa.text(stmt), {'keys': batch})

    # -- cluster rows ------------------------------------------------------

    def set_members(self, rows, also=''):
        """Set the member sets of clusters.

        ``rows``: dicts of ``id``, ``members_hash``, ``base_id`` (None:
        no base), ``added`` and ``removed``. One statement for all of
        them. ``also``: more assignments (unqualified columns of
        vmar_clusters). One statement instead of one per cluster:
        ``executemany`` takes the GIL back after every row, and waits for
        it while another thread (the map build of an ingest) holds it.
        """
        # base ids start at 1: 0 stands for none (NULL in JSON_TABLE is
        # not read alike by every dialect)
        rows = json.dumps([{'id': int(r['id']), 'h': r['members_hash'],
                            'b': int(r['base_id'] or 0), 'a': r['added'],
                            'r': r['removed']} for r in rows])
        more = (', ' + also) if also else ''
        if self.dialect == 'sqlite':
            sql = ("UPDATE vmar_clusters SET members_hash = "
                   "json_extract(j.value, '$.h'), base_id = "
                   "NULLIF(json_extract(j.value, '$.b'), 0), added = "
                   "json_extract(j.value, '$.a'), removed = "
                   "json_extract(j.value, '$.r')%s FROM json_each(:rows) "
                   "AS j WHERE vmar_clusters.id = "
                   "json_extract(j.value, '$.id')" % more)
        elif self.dialect == 'postgresql':
            sql = ('UPDATE vmar_clusters SET members_hash = j.h, base_id = '
                   'NULLIF(j.b, 0), added = j.a, removed = j.r%s FROM '
                   'jsonb_to_recordset(CAST(:rows AS jsonb)) AS j(id BIGINT, '
                   'h TEXT, b BIGINT, a TEXT, r TEXT) WHERE vmar_clusters.id '
                   '= j.id' % more)
        elif self.dialect in ('mysql', 'mariadb'):
            sql = ("UPDATE vmar_clusters c JOIN JSON_TABLE(:rows, '$[*]' "
                   "COLUMNS (id BIGINT PATH '$.id', h VARCHAR(64) PATH "
                   "'$.h', b BIGINT PATH '$.b', a TEXT PATH '$.a', "
                   "r TEXT PATH '$.r')) AS j ON c.id = j.id "
                   "SET c.members_hash = j.h, c.base_id = NULLIF(j.b, 0), "
                   "c.added = j.a, c.removed = j.r%s" % more)
        else:
            raise NotImplementedError('unsupported database dialect %s'
                                      % self.dialect)
        self.session.execute(sa.text(sql), {'rows': rows})
