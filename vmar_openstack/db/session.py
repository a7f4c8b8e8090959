"""Engines, transactions and the library lock.

Every mutation of the library runs in one transaction that first takes the
library lock, so two ingests never interleave their cluster updates:

* SQLite: the transaction starts with ``BEGIN IMMEDIATE`` (one writer);
* MariaDB/MySQL: ``SELECT ... FOR UPDATE`` on the library's
  ``vmar_locks`` row, with a lock wait timeout;
* PostgreSQL: ``LOCK TABLE vmar_locks IN EXCLUSIVE MODE``, with a lock
  timeout.

Every statement of a locked transaction then sees the library as it was
when the lock was taken. A compaction of the fingerprint index commits
beside it (:mod:`vmar_openstack.db.bulk`: it takes no library lock), and
moves keys from runs to row tiers between two statements of one lookup:
a transaction that saw the tiers before and the runs after would find
such a key nowhere. InnoDB's REPEATABLE READ takes its snapshot at the
first plain read, after the lock; SQLite's writer excludes compactions.
PostgreSQL's locked transactions run in REPEATABLE READ too, whose
snapshot is taken at the first query: so the lock is taken by a
statement that is no query (``LOCK TABLE``; ``SELECT ... FOR UPDATE``
would take the snapshot before it waits, and every waiter would then
fail on the lock row its predecessor updated). Plain reads of the table
(the counters) do not wait for that lock.

Hashing happens before the lock is taken, so only the short cluster update is
serialised.
"""

import contextlib
import functools
import os
import sqlite3
import threading
import time
import urllib.parse

from oslo_config import cfg
from oslo_db import api as oslo_db_api
from oslo_log import log as logging
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy import orm

from vmar_openstack import conf
from vmar_openstack import exception

LOG = logging.getLogger(__name__)

LIBRARY_LOCK = 'library'


@functools.lru_cache(maxsize=None)
def _engine(url, debug, lock_timeout):
    kwargs = {'echo': debug, 'future': True}
    u = sa.engine.make_url(url)
    if u.get_backend_name() == 'sqlite':
        kwargs['connect_args'] = {'timeout': lock_timeout,
                                  'check_same_thread': False}
        if u.database and u.database != ':memory:':
            os.makedirs(os.path.dirname(os.path.abspath(u.database)),
                        exist_ok=True)
    else:
        kwargs['pool_pre_ping'] = True
    engine = sa.create_engine(url, **kwargs)
    if u.get_backend_name() == 'sqlite':
        @event.listens_for(engine, 'connect')
        def _sqlite_connect(dbapi_conn, record):
            # Let SQLAlchemy, not pysqlite, decide when transactions begin.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute('PRAGMA journal_mode=WAL')
            cur.execute('PRAGMA synchronous=NORMAL')
            cur.execute('PRAGMA foreign_keys=ON')
            cur.execute('PRAGMA cache_size=-262144')
            cur.execute('PRAGMA mmap_size=%d' % (1 << 34))
            # checkpoints run after commits, off the writer's path
            # (_Checkpointer); a connection that closes last still
            # checkpoints and removes the WAL
            cur.execute('PRAGMA wal_autocheckpoint=0')
            # the WAL's file shrinks back when a writer restarts it from
            # its start, so that its size says how far checkpoints lag
            # (_Checkpointer.MAX_WAL), not how large it once grew
            cur.execute('PRAGMA journal_size_limit=%d'
                        % _Checkpointer.WAL_KEPT)
            cur.close()

        @event.listens_for(engine, 'begin')
        def _sqlite_begin(conn):
            if conn.get_execution_options().get('vmar_readonly'):
                conn.exec_driver_sql('BEGIN')
            else:
                conn.exec_driver_sql('BEGIN IMMEDIATE')
    return engine


class _Checkpointer:
    """Copies an SQLite database's WAL back into it, in a thread.

    With automatic checkpoints, the commit that fills the WAL past 1000
    pages also copies them back and syncs the database file: most of the
    commit time of an ingest into a large library. Here a thread of its own
    does it (passive: it never waits for, or blocks, readers and writers)
    after each commit, and the committing thread does it itself only when
    the WAL has grown past :attr:`MAX_WAL` because the thread lags (the
    file is cut back to :attr:`WAL_KEPT` whenever a writer restarts the
    WAL: without that, a WAL once past it stayed so, and every commit
    after checkpointed in its committing thread). It never
    creates a database: one removed meanwhile is left alone.
    """

    MAX_WAL = 256 << 20
    # what a restarted WAL keeps of its file (PRAGMA journal_size_limit)
    WAL_KEPT = 16 << 20

    def __init__(self, path):
        self.path = path
        self.wal = path + '-wal'
        self.cond = threading.Condition()
        self.pending = False
        self.busy = False
        self.thread = None
        # the last checkpoint left frames behind (a reader's snapshot
        # needed them): the next reader to end queues another
        self.behind = False

    def committed(self):
        try:
            big = os.stat(self.wal).st_size > self.MAX_WAL
        except FileNotFoundError:
            return
        if big:
            self.checkpoint()
            return
        self._queue()

    def released(self):
        """A read transaction of this process ended.

        A checkpoint copies only the frames no open snapshot needs, and the
        WAL starts again from its beginning only after one copied them all:
        while readers overlap commits (an ingest's snapshot lives through
        its hashing), a checkpoint after each commit alone never does, and
        the WAL grows without end. A reader's end is when one can.
        """
        if self.behind:
            self._queue()

    def _queue(self):
        with self.cond:
            self.pending = True
            self.cond.notify_all()
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(
                    target=self._run, name='vmar-sqlite-checkpoint',
                    daemon=True)
                self.thread.start()

    def checkpoint(self):
        if not os.path.exists(self.path):
            return
        conn = sqlite3.connect('file:%s?mode=rw' % urllib.parse.quote(
            self.path), uri=True, timeout=60)
        try:
            _busy, frames, copied = conn.execute(
                'PRAGMA wal_checkpoint(PASSIVE)').fetchone()
            self.behind = copied < frames
        finally:
            conn.close()

    def wait_idle(self, timeout):
        with self.cond:
            return self.cond.wait_for(
                lambda: not self.pending and not self.busy, timeout)

    def _run(self):
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.pending)
                self.pending, self.busy = False, True
            try:
                self.checkpoint()
            except sqlite3.Error:
                pass   # the next commit tries again
            finally:
                with self.cond:
                    self.busy = False
                    self.cond.notify_all()


_CHECKPOINTERS = {}
_CHECKPOINTERS_LOCK = threading.Lock()


def _checkpointer(path):
    with _CHECKPOINTERS_LOCK:
        cp = _CHECKPOINTERS.get(path)
        if cp is None:
            cp = _CHECKPOINTERS[path] = _Checkpointer(path)
        return cp


def wait_for_checkpoints(timeout=60):
    """Wait until no background checkpoint is queued or running.

    For a caller about to remove or copy a library's SQLite files.
    Returns False if one was still busy after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    with _CHECKPOINTERS_LOCK:
        checkpointers = list(_CHECKPOINTERS.values())
    ok = True
    for cp in checkpointers:
        ok &= cp.wait_idle(max(0.0, deadline - time.monotonic()))
    return ok


def _sqlite_file(engine):
    """The database file of an SQLite engine, else None."""
    u = engine.url
    if u.get_backend_name() == 'sqlite' and u.database not in (None, '',
                                                               ':memory:'):
        return os.path.abspath(u.database)
    return None


def _committed(engine):
    path = _sqlite_file(engine)
    if path:
        _checkpointer(path).committed()


def _released(engine):
    path = _sqlite_file(engine)
    if path:
        _checkpointer(path).released()


def configured(conf_obj=None):
    """Whether ``[vmar_database] connection`` is set, not its default.

    Nova's services that read the library (nova-scheduler's weigher,
    nova-api's checks) run without it unless the operator points them at
    it.
    """
    c = conf_obj or conf.CONF
    loc = c.get_location('connection', 'vmar_database')
    return loc is not None and loc.location != cfg.Locations.opt_default


def get_engine(conf_obj=None):
    c = conf_obj or conf.CONF
    return _engine(c.vmar_database.connection,
                   c.vmar_database.connection_debug,
                   c.vmar_database.lock_timeout)


def dialect(session):
    return session.get_bind().dialect.name


def _info(conf_obj):
    """A session's ``info``: the configuration it was opened with.

    :class:`vmar_openstack.db.store.ClusterStore` finds the library's
    digest list objects through it.
    """
    return {'vmar_conf': conf_obj or conf.CONF}


def library_conf(session):
    """The configuration a session of this module was opened with."""
    return session.info.get('vmar_conf') or conf.CONF


@contextlib.contextmanager
def reader(conf_obj=None, snapshot=False):
    """A read-only session (its transaction is rolled back).

    ``snapshot``: every statement sees the library as the first did
    (REPEATABLE READ on PostgreSQL, whose default is READ COMMITTED;
    InnoDB's default and SQLite's WAL readers already do).
    """
    engine = get_engine(conf_obj).execution_options(vmar_readonly=True)
    if snapshot and engine.dialect.name == 'postgresql':
        engine = engine.execution_options(isolation_level='REPEATABLE READ')
    with orm.Session(engine, info=_info(conf_obj)) as s:
        try:
            yield s
        finally:
            s.rollback()
    _released(engine)


@contextlib.contextmanager
def writer(conf_obj=None):
    """One transaction that does not take the library lock; commits.

    For rows no ingest, map or cluster reads: compute hosts' reports.
    They do not wait for an ingest's commit, nor count in the lock row's
    generation, so they never send an ingest that prepared its work in a
    snapshot (:mod:`vmar_openstack.ingest.ahead`) back to doing it again
    under the lock. On SQLite, writers still take turns (``BEGIN
    IMMEDIATE``).
    """
    engine = get_engine(conf_obj)
    bind = engine
    if engine.dialect.name in ('mysql', 'mariadb'):
        # InnoDB's REPEATABLE READ locks the gaps a locking read or a
        # delete finds empty: two hosts' first reports would deadlock on
        # them (PostgreSQL reads committed by default)
        bind = engine.execution_options(isolation_level='READ COMMITTED')
    with orm.Session(bind, info=_info(conf_obj)) as s:
        with s.begin():
            yield s
    _committed(engine)


def duplicate(error):
    """Whether ``error`` is two first inserts of one key, at once.

    For a writer (:func:`writer`) that inserts a row it found missing:
    run it again (:func:`retry_conflicts` ``also``), and it finds the row.
    """
    return isinstance(error, sa.exc.IntegrityError)


# MySQL/MariaDB: deadlock, which is also how Galera reports a failed
# certification; PostgreSQL: deadlock, serialization failure
_MYSQL_CONFLICTS = (1213,)
_PG_CONFLICTS = ('40P01', '40001')
_DRIVERS = ('pymysql', 'MySQLdb', 'psycopg2', 'psycopg')


def conflict(error):
    """Whether ``error`` is a transaction another one made fail.

    A deadlock, a Galera certification failure or a serialization
    failure: the transaction did nothing, and running it again is the
    cure (what oslo.db's ``wrap_db_retry`` does with ``retry_on_deadlock``,
    for errors oslo.db's own engines translate).
    """
    if isinstance(error, sa.exc.DBAPIError):
        orig = error.orig
    elif type(error).__module__.split('.')[0] in _DRIVERS:
        # the driver's own error, from a DB-API cursor used directly
        # (db/bulk.py): SQLAlchemy never saw it to wrap it
        orig = error
    else:
        return False
    if orig is None:
        return False
    if getattr(orig, 'pgcode', None) in _PG_CONFLICTS:
        return True
    args = getattr(orig, 'args', ())
    return bool(args) and args[0] in _MYSQL_CONFLICTS


# Runs of a transaction that lost a conflict. On Galera every library
# mutation conflicts with every other that overlaps it on another node
# (the lock row): with a writer on each of three nodes, five runs lost in
# a row failed 3 of 200 uploads (bench_scale writers). The pause grows to
# a second, with jitter, so the losers spread out: about 20 s in all.
CONFLICT_RETRIES = 20


def retry_conflicts(also=None, max_retries=CONFLICT_RETRIES):
    """A decorator: run the function again after :func:`conflict` errors.

    ``also(error)``: more errors worth another run. With a short growing
    pause, at most ``max_retries`` times (oslo.db's ``wrap_db_retry``).
    """
    def check(error):
        return conflict(error) or bool(also and also(error))
    return oslo_db_api.wrap_db_retry(
        max_retries=max_retries, retry_interval=0.05, inc_retry_interval=True,
        max_retry_interval=1, jitter=True, exception_checker=check)


@contextlib.contextmanager
def locked_writer(conf_obj=None, content=False):
    """One transaction holding the library lock; commits on success.

    The transaction counts itself in the lock row's generation; the count
    it found is in ``session.info['vmar_generation']``. ``content``: it
    may change the clusters (an add, an update, a delete), and counts in
    the content generation too (found: ``vmar_content_generation``);
    :mod:`vmar_openstack.db.content_log` says what it changed.
    """
    c = conf_obj or conf.CONF
    engine = get_engine(c)
    bind = engine
    if engine.dialect.name == 'postgresql':
        # one snapshot, taken after the lock (see the module's docstring)
        bind = engine.execution_options(isolation_level='REPEATABLE READ')
    with orm.Session(bind, info=_info(c)) as s:
        with s.begin():
            _take_lock(s, c.vmar_database.lock_timeout)
            s.info['vmar_lock_taken'] = time.monotonic()
            s.info['vmar_generation'] = generation(s)
            s.info['vmar_content_generation'] = content_generation(s)
            s.execute(sa.text(
                'UPDATE vmar_locks SET generation = generation + 1%s '
                'WHERE name = :n' % (
                    ', content_generation = content_generation + 1'
                    if content else '')), {'n': LIBRARY_LOCK})
            s.info['vmar_content'] = content
            try:
                yield s
            except BaseException:
                _held(s, content, False)
                raise
        _held(s, content, True)
    _committed(engine)


# Callables ``(seconds, content, committed)``, called after each locked
# transaction with the time it held the library lock (metrics, benches).
LOCK_HOLD_OBSERVERS = []


def _held(session, content, committed):
    seconds = time.monotonic() - session.info['vmar_lock_taken']
    LOG.debug('library lock held %.3f s (%s, %s)', seconds,
              'content' if content else 'maps only',
              'committed' if committed else 'rolled back')
    for observe in LOCK_HOLD_OBSERVERS:
        observe(seconds, content, committed)


def generation(session):
    """Library mutations committed so far, as this transaction sees it.

    A snapshot that reads the same count as a later locked transaction saw
    the same library: every mutation commits an increment.
    """
    return _lock_row(session, 'generation')


def content_generation(session):
    """Committed mutations that changed the clusters, as this one sees it.

    A snapshot whose count a later locked transaction finds again saw the
    same clusters, members, fingerprint keys and images' scopes: only map
    versions may have changed since (a pending map rewritten, a GC).
    """
    return _lock_row(session, 'content_generation')


def maps_epoch(session):
    """The library's maps epoch, as this transaction sees it.

    A plain read: it waits for no lock (reports read it beside an ingest
    that holds the library lock).
    """
    return _lock_row(session, 'maps_epoch')


def _lock_row(session, column):
    """A counter of the library's lock row (a plain read)."""
    value = session.execute(sa.text(
        'SELECT %s FROM vmar_locks WHERE name = :n' % column),
        {'n': LIBRARY_LOCK}).scalar()
    if value is None:
        raise exception.DatabaseNotReady(what='vmar_locks row')
    return value


def maps_changed(session):
    """Count a change to what the hosts' shares are computed from.

    A current map version replaced, a map version or an image forgotten,
    per-target counts recorded late: each host's next report is then
    written whole (:meth:`vmar_openstack.db.hosts.HostReports.record`).
    In the library's transaction, whose lock row this is.
    """
    session.execute(sa.text('UPDATE vmar_locks SET maps_epoch = '
                            'maps_epoch + 1 WHERE name = :n'),
                    {'n': LIBRARY_LOCK})


def _take_lock(session, timeout):
    name = dialect(session)
    if name in ('mysql', 'mariadb'):
        session.execute(sa.text('SET SESSION innodb_lock_wait_timeout = %d'
                                % int(timeout)))
    elif name == 'postgresql':
        session.execute(sa.text("SET LOCAL lock_timeout = '%ds'"
                                % int(timeout)))
    try:
        if name == 'sqlite':
            # BEGIN IMMEDIATE (the engine's 'begin' event) makes us the
            # only writer: it waits here, up to the busy timeout, for the
            # writer before (a compaction step, a report), and not in
            # the first statement, inside the time the lock is held
            session.connection()
            return
        if name == 'postgresql':
            # no query before it: the snapshot comes after the lock
            session.execute(sa.text(
                'LOCK TABLE vmar_locks IN EXCLUSIVE MODE'))
            row = session.execute(sa.text(
                'SELECT name FROM vmar_locks WHERE name = :n'),
                {'n': LIBRARY_LOCK}).first()
        else:
            row = session.execute(sa.text(
                'SELECT name FROM vmar_locks WHERE name = :n FOR UPDATE'),
                {'n': LIBRARY_LOCK}).first()
    except sa.exc.OperationalError as e:
        if conflict(e):
            # a Galera node aborted us for a replicated write set (a
            # brute-force abort) while we waited: not a busy lock; the
            # caller's retry_conflicts runs the transaction again
            raise
        raise exception.LockTimeout('library lock busy for %ds: %s'
                                    % (timeout, e))
    if row is None:
        raise exception.DatabaseNotReady(what='vmar_locks row')
