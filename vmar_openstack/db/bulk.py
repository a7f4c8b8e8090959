"""Set-based statements over large lists of fingerprint keys or clusters.

An ingest touches up to millions of fingerprint keys and thousands of
clusters. Sending them one statement per row costs microseconds of Python
each, so they travel as one JSON array per batch and the database expands
it in C:

* SQLite: ``json_each``;
* PostgreSQL: ``jsonb_array_elements_text``;
* MariaDB/MySQL: ``JSON_TABLE``.

Batches stay under MariaDB's default 16 MiB packet limit.

The fingerprint index has three parts:

* **Runs** (``vmar_fingerprint_runs``): the new keys of an add, all in
  the cluster the add made for them, as blobs of sorted keys (8 bytes a
  key), in pieces of :data:`COMPACT_KEYS`. An add's locked transaction
  writes its run and nothing per key.
* **Overrides** (``vmar_fingerprint_overrides``): every move and delete
  of a locked transaction, one row per key: the key's cluster now, or 0
  for a key gone from the row tiers and from the runs whose id is below
  the row's ``hides``.
* **Row tiers** (a two-level LSM tree): ``vmar_fingerprints`` and the
  small ``vmar_fingerprints_recent``. A key is in one tier only. Only a
  compaction writes them.

A key's cluster is its override's, if it has one (a key gone: the newest
run above ``hides`` that holds it, if any); else its row's; else that of
the newest run holding it. Without an override a key is in a row tier or
in a run, not both: a compaction writes a piece's keys into the tiers
and deletes the piece in one transaction. No run row is ever updated:
with Galera's full row images an update replicates the blob twice.

A compaction (:meth:`BulkSQL.compact_step`) takes no library lock: it
changes where a key's cluster is written, never what it is, so no
ingest's snapshot goes stale for it. Compactions take turns through the
row of ``vmar_compaction``, fold the oldest run first, a
piece a transaction, with the overrides of those keys (read with a lock,
so that a locked transaction's new override is either folded or left,
never lost); then the overrides no run holds;
then one of :data:`SLICES` key ranges of the small tier moves into the
large one (each page of that range written once for many keys). A locked
transaction that read a run before a compaction folded it writes an
override, which wins over the row the compaction wrote.

Only :class:`vmar_openstack.db.store.ClusterStore` uses this module.
"""

import itertools
import json
import typing

import numpy as np
import sqlalchemy as sa

from vmar_openstack.db import session as db_session

BATCH = 200000

FINGERPRINTS = 'vmar_fingerprints'
RECENT = 'vmar_fingerprints_recent'
RUNS = 'vmar_fingerprint_runs'
OVERRIDES = 'vmar_fingerprint_overrides'
# a run's id: the content generation of its add, shifted, and its place
# among the runs of that transaction
RUN_BITS = 10
# keys of a run's piece: what a compaction writes into the row tiers per
# transaction
COMPACT_KEYS = 1 << 16
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


class Run(typing.NamedTuple):
    """A piece of a run not compacted yet (``keys``, sorted int64)."""
    id: int
    piece: int
    cluster_id: int
    keys: np.ndarray


def _distinct_sorted(keys):
    """``keys`` as a sorted int64 array of distinct keys.

    Most callers pass them so already (an image's key set, a set
    difference): checked in one pass, sorted only if not.
    """
    keys = np.asarray(keys, dtype=np.int64)
    if len(keys) > 1 and not (keys[1:] > keys[:-1]).all():
        keys = np.unique(keys)
    return keys


def _members(q, keys):
    """Mask of the sorted ``q`` found in the sorted ``keys``."""
    if not len(keys) or not len(q):
        return np.zeros(len(q), bool)
    at = np.minimum(np.searchsorted(keys, q), len(keys) - 1)
    return keys[at] == q


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
        fingerprint index, each key's cluster as the module docstring
        resolves it (overrides, row tiers, runs), keys sorted.
        """
        if table != FINGERPRINTS:
            return self._lookup(keys, table, key, columns)
        q = _distinct_sorted(keys)
        return self._resolve(q, *self._lookup_tiers(q))

    def _lookup(self, keys, table, key, columns, lock=False):
        """Rows of ``table`` by ``key``: the key, then ``columns``.

        ``lock``: lock the rows read (``FOR UPDATE``; SQLite has one
        writer at a time).
        """
        src, col = self.source()
        sql = ('SELECT f.%s, %s FROM %s JOIN %s f ON f.%s = %s'
               % (key, ', '.join(columns), src.replace(':keys', '?'), table,
                  key, col))
        if lock and self.dialect != 'sqlite':
            sql += (' FOR UPDATE OF f' if self.dialect == 'postgresql'
                    else ' FOR UPDATE')
        parts = [[np.empty(0, np.int64)] for _ in range(len(columns) + 1)]
        for batch in _batches(keys):
            for part, values in zip(parts, self.fetch_columns(
                    sql, (batch,), len(columns) + 1)):
                part.append(values)
        return [np.concatenate(p) for p in parts]

    def _lookup_tiers(self, keys):
        """(keys, clusters) of the row tiers' rows of ``keys``."""
        found = self._lookup(keys, FINGERPRINTS, 'fp_key', ('cluster_id',))
        if self.has_recent() and len(found[0]) < len(keys):
            rest = keys[~np.isin(keys, found[0], assume_unique=True)]
            more = self._lookup(rest, RECENT, 'fp_key', ('cluster_id',))
            found = [np.concatenate(p) for p in zip(found, more)]
        return found

    def _resolve(self, q, tier_k, tier_c, overrides=None):
        """(keys, clusters) of the sorted distinct keys ``q`` found.

        ``tier_k``, ``tier_c``: the row tiers' rows among ``q``;
        ``overrides``: their ``(keys, clusters, hides)``, read if None.
        """
        cluster = np.full(len(q), -1, np.int64)
        cluster[np.searchsorted(q, tier_k)] = tier_c
        run_id = np.full(len(q), -1, np.int64)
        run_c = np.full(len(q), -1, np.int64)
        for run in self.runs():           # oldest first: the newest wins
            hit = _members(q, run.keys)
            run_id[hit] = run.id
            run_c[hit] = run.cluster_id
        cluster = np.where((cluster < 0) & (run_id >= 0), run_c, cluster)
        if overrides is None and self.has_overrides():
            overrides = self.lookup_overrides(q)
        if overrides is not None and len(overrides[0]):
            ok, oc, oh = overrides
            at = np.searchsorted(q, ok)
            live = run_id[at] >= oh
            cluster[at] = np.where(oc > 0, oc,
                                   np.where(live, run_c[at], -1))
        found = cluster >= 0
        return [q[found], cluster[found]]

    def lookup_overrides(self, keys, lock=False):
        """``(keys, clusters, hides)`` of the overrides of ``keys``."""
        return self._lookup(keys, OVERRIDES, 'fp_key',
                            ('cluster_id', 'hides'), lock)

    def runs(self):
        """The runs' pieces not compacted yet, oldest first (cached).

        The cache holds the pieces this transaction read and wrote.
        """
        runs = self.session.info.get('vmar_runs')
        if runs is None:
            runs = [Run(int(rid), int(piece), int(cid),
                        np.frombuffer(bytes(blob), '<i8').astype(np.int64))
                    for rid, piece, cid, blob in self.fetch_rows(
                        'SELECT id, piece, cluster_id, key_blob FROM %s '
                        'ORDER BY id, piece' % RUNS)]
            self.session.info['vmar_runs'] = runs
        return runs

    def has_recent(self):
        """Whether the small fingerprint tier has rows (cached)."""
        return self._has('vmar_recent', RECENT)

    def has_overrides(self):
        """Whether any override is left (cached)."""
        return self._has('vmar_overrides', OVERRIDES)

    def _has(self, name, table):
        value = self.session.info.get(name)
        if value is None:
            value = self.session.execute(sa.text(
                'SELECT 1 FROM %s LIMIT 1' % table)).first() is not None
            self.session.info[name] = value
        return value

    def tiers(self):
        """The row tiers that may hold a key."""
        return (FINGERPRINTS, RECENT) if self.has_recent() else (
            FINGERPRINTS,)

    def scan_fingerprints(self, page=1 << 20):
        """Every (key, cluster) of the index, sorted by key, as int64 arrays.

        The row tiers read in pages along the primary key; for a caller
        about to look up about as many keys as the index holds, for which
        a scan costs a third of the lookups (vmar_openstack.ingest.ahead).
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
        tier_k, tier_c = np.concatenate(keys), np.concatenate(clusters)
        overrides = self.all_overrides()
        q = np.unique(np.concatenate(
            [tier_k, overrides[0]] + [r.keys for r in self.runs()]))
        return self._resolve(q, tier_k, tier_c, overrides)

    def all_overrides(self):
        """``(keys, clusters, hides)`` of every override."""
        if not self.has_overrides():
            return [np.empty(0, np.int64)] * 3
        return self.fetch_columns(
            'SELECT fp_key, cluster_id, hides FROM %s' % OVERRIDES, (), 3)

    def tier_rows(self):
        """``(large, small)``: each row tier's (keys, clusters)."""
        return tuple(self.fetch_columns(
            'SELECT fp_key, cluster_id FROM %s' % t) for t in
            (FINGERPRINTS, RECENT))

    # -- writes of locked transactions ----------------------------------

    def _next_run_id(self):
        """The id the next run of this transaction gets."""
        info = self.session.info
        if not info.get('vmar_content'):
            raise RuntimeError('fingerprint keys change only in a content '
                               'transaction (session.locked_writer)')
        made = info.get('vmar_runs_made', 0)
        if made >= 1 << RUN_BITS:
            raise RuntimeError('more than %d runs in one transaction'
                               % (1 << RUN_BITS))
        return ((info['vmar_content_generation'] + 1) << RUN_BITS) | made

    def add_fingerprints(self, keys, cluster_id):
        """Record new fingerprint keys (in no run or tier), in one cluster.

        One run: a row per piece of :data:`COMPACT_KEYS` sorted keys.
        """
        keys = _distinct_sorted(keys)
        if not len(keys):
            return
        runs = self.runs()
        rid = self._next_run_id()
        pieces = [Run(rid, i, int(cluster_id), keys[lo:lo + COMPACT_KEYS])
                  for i, lo in enumerate(range(0, len(keys), COMPACT_KEYS))]
        self.session.execute(
            sa.text('INSERT INTO %s (id, piece, cluster_id, n_keys, '
                    'key_blob) VALUES (:id, :piece, :cid, :n, :keys)'
                    % RUNS),
            [{'id': rid, 'piece': p.piece, 'cid': p.cluster_id,
              'n': len(p.keys), 'keys': p.keys.astype('<i8').tobytes()}
             for p in pieces])
        self.session.info['vmar_runs_made'] = (
            self.session.info.get('vmar_runs_made', 0) + 1)
        runs.extend(pieces)

    def move(self, keys, cluster_id):
        """Point the given existing keys at ``cluster_id`` (overrides)."""
        keys = np.asarray(keys, dtype=np.int64)
        self.moved.append(keys)
        self._override(keys, int(cluster_id))

    def delete(self, keys):
        """Forget the given fingerprint keys (overrides of cluster 0)."""
        self._override(np.asarray(keys, dtype=np.int64), 0)

    def _override(self, keys, cluster_id):
        if not len(keys):
            return
        self.runs()     # the runs the new override must hide: read first
        src, col = self.source()
        head = ('INSERT INTO %s (fp_key, cluster_id, hides) SELECT %s, '
                ':cid, :hides FROM %s' % (OVERRIDES, col, src))
        if self.dialect in ('mysql', 'mariadb'):
            sql = (head + ' ON DUPLICATE KEY UPDATE cluster_id = '
                   'VALUES(cluster_id), hides = VALUES(hides)')
        else:
            # SQLite needs a WHERE to read ON CONFLICT after a SELECT
            sql = (head + (' WHERE true' if self.dialect == 'sqlite'
                           else '') + ' ON CONFLICT (fp_key) DO UPDATE SET '
                   'cluster_id = excluded.cluster_id, hides = '
                   'excluded.hides')
        params = {'cid': cluster_id, 'hides': self._next_run_id()}
        for batch in _batches(keys):
            params['keys'] = batch
            self.session.execute(sa.text(sql), params)
        self.session.info['vmar_overrides'] = True

    # -- compaction (no library lock) -----------------------------------

    def compact_step(self, limit=None):
        """One transaction's share of the compaction; False: nothing left.

        In a session of :func:`session.writer` (no library lock). Folds
        the oldest run's first piece into the row tiers, or else up to
        ``limit`` overrides no run holds, or else moves one key range of
        the small tier into the large one.
        """
        turn = self._take_compaction_turn()
        runs = self.runs()
        if runs:
            # a run of more than one piece is large: into the large tier
            self._fold_piece(runs[0], large=runs[0].piece > 0 or (
                len(runs) > 1 and runs[1].id == runs[0].id))
            return True
        if self.has_overrides() and self._fold_orphans(
                limit or COMPACT_KEYS):
            return True
        if self.has_recent():
            self.merge_slice(turn % SLICES)
        return False

    def _take_compaction_turn(self):
        self.session.execute(sa.text(
            'UPDATE vmar_compaction SET turn = turn + 1 WHERE id = 1'))
        turn = self.session.execute(sa.text(
            'SELECT turn FROM vmar_compaction WHERE id = 1')).scalar()
        if turn is None:
            raise RuntimeError('no row in vmar_compaction: run '
                               'vmar-manage db sync')
        return turn

    def _fold_piece(self, run, large):
        part = run.keys
        ok, oc, oh = self.lookup_overrides(part, lock=True)
        plain = part[~np.isin(part, ok, assume_unique=True)]
        # an override of a key of this run: folded, unless it hides the
        # run (the key went after the run was written; a newer run may
        # hold it again, and a row may be stale: the orphan pass ends it)
        fold = (oc > 0) | (oh <= run.id)
        target = np.where(oc > 0, oc, run.cluster_id)[fold]
        # a large run's keys go straight to the large tier: through the
        # small one each key is written three times (Galera replicates
        # each write)
        self._put_rows(plain, np.full(len(plain), run.cluster_id, np.int64),
                       fresh=True, large=large)
        self._put_rows(ok[fold], target, fresh=False, large=large)
        self._drop_overrides(ok[fold])
        self.session.execute(sa.text(
            'DELETE FROM %s WHERE id = :id AND piece = :piece' % RUNS),
            {'id': run.id, 'piece': run.piece})

    def _fold_orphans(self, limit):
        """Fold up to ``limit`` overrides of keys no run holds; how many."""
        ok, oc, _oh = self.fetch_columns(
            'SELECT fp_key, cluster_id, hides FROM %s ORDER BY fp_key '
            'LIMIT %d' % (OVERRIDES, int(limit)), (), 3)
        if not len(ok):
            return 0
        # lock them: a locked transaction may be writing one now
        ok, oc, _oh = self.lookup_overrides(ok, lock=True)
        live = oc > 0
        self._put_rows(ok[live], oc[live], fresh=False)
        self._delete_rows(ok[~live])
        self._drop_overrides(ok)
        return len(ok)

    def _put_rows(self, keys, clusters, fresh, large=False):
        """Write rows ``(key, cluster)`` into the row tiers.

        ``fresh``: no tier holds these keys; otherwise a row of either
        tier is replaced. ``large``: into the large tier, whatever the
        small one holds.
        """
        if not len(keys):
            return
        if not fresh:
            self._delete_rows(keys)
        held = MERGE_ROWS if large else 0
        if not large and self.has_recent() and len(keys) <= MERGE_ROWS:
            held = self.session.execute(sa.text(
                'SELECT COUNT(*) FROM %s' % RECENT)).scalar()
        table = RECENT if held + len(keys) <= MERGE_ROWS else FINGERPRINTS
        order = np.argsort(clusters, kind='stable')
        keys, clusters = keys[order], clusters[order]
        starts = np.flatnonzero(np.diff(clusters, prepend=clusters[0] - 1))
        for lo, hi in zip(starts, np.append(starts[1:], len(keys))):
            self._insert(np.sort(keys[lo:hi]), int(clusters[lo]), table)
        if table == RECENT:
            self.session.info['vmar_recent'] = True

    def _delete_rows(self, keys):
        """Delete the row tiers' rows of ``keys``."""
        self._delete_keys(self.tiers(), keys)

    def _drop_overrides(self, keys):
        self._delete_keys((OVERRIDES,), keys)
        self.session.info.pop('vmar_overrides', None)

    def _delete_keys(self, tables, keys):
        """Delete the rows of ``keys`` (by ``fp_key``) from ``tables``."""
        if not len(keys):
            return
        src, col = self.source()
        stmts = []
        for t in tables:
            if self.dialect in ('mysql', 'mariadb'):
                stmts.append('DELETE f FROM %s f JOIN %s ON f.fp_key = %s'
                             % (t, src, col))
            else:
                stmts.append('DELETE FROM %s WHERE fp_key IN '
                             '(SELECT %s FROM %s)' % (t, col, src))
        for batch in _batches(keys):
            for stmt in stmts:
                self.session.execute(sa.text(stmt), {'keys': batch})

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
        self.session.info.pop('vmar_recent', None)

    def _insert(self, keys, cluster_id, table):
        """Insert one row (key, ``cluster_id``) into ``table`` per key."""
        src, col = self.source()
        stmt = sa.text('INSERT INTO %s (fp_key, cluster_id) SELECT %s, :cid '
                       'FROM %s' % (table, col, src))
        for batch in _batches(keys):
            self.session.execute(stmt, {'keys': batch,
                                        'cid': int(cluster_id)})

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
