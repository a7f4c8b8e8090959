"""Engines, transactions and the library lock.

Every mutation of the library runs in one transaction that first takes the
library lock, so two ingests never interleave their cluster updates:

* SQLite: the transaction starts with ``BEGIN IMMEDIATE`` (one writer);
* MariaDB/MySQL and PostgreSQL: ``SELECT ... FOR UPDATE`` on the single
  ``vmar_locks`` row, with a lock wait timeout.

Hashing happens before the lock is taken, so only the short cluster update is
serialised.
"""

import contextlib
import functools

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy import orm

from vmar_openstack import conf

LIBRARY_LOCK = 'library'


class LockTimeout(RuntimeError):
    """The library lock stayed busy for longer than the lock timeout."""


@functools.lru_cache(maxsize=None)
def _engine(url, debug, lock_timeout):
    kwargs = {'echo': debug, 'future': True}
    u = sa.engine.make_url(url)
    if u.get_backend_name() == 'sqlite':
        kwargs['connect_args'] = {'timeout': lock_timeout,
                                  'check_same_thread': False}
        if u.database and u.database != ':memory:':
            import os
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
            cur.close()

        @event.listens_for(engine, 'begin')
        def _sqlite_begin(conn):
            if conn.get_execution_options().get('vmar_readonly'):
                conn.exec_driver_sql('BEGIN')
            else:
                conn.exec_driver_sql('BEGIN IMMEDIATE')
    return engine


def get_engine(conf_obj=None):
    c = conf_obj or conf.CONF
    return _engine(c.vmar_database.connection,
                   c.vmar_database.connection_debug,
                   c.vmar_database.lock_timeout)


def dialect(session):
    return session.get_bind().dialect.name


@contextlib.contextmanager
def reader(conf_obj=None):
    """A read-only session (its transaction is rolled back)."""
    engine = get_engine(conf_obj).execution_options(vmar_readonly=True)
    with orm.Session(engine) as s:
        try:
            yield s
        finally:
            s.rollback()


@contextlib.contextmanager
def locked_writer(conf_obj=None):
    """One transaction holding the library lock; commits on success.

    The transaction counts itself in the lock row's generation; the count
    it found is in ``session.info['vmar_generation']``.
    """
    c = conf_obj or conf.CONF
    with orm.Session(get_engine(c)) as s:
        with s.begin():
            _take_lock(s, c.vmar_database.lock_timeout)
            s.info['vmar_generation'] = generation(s)
            s.execute(sa.text('UPDATE vmar_locks SET generation = '
                              'generation + 1 WHERE name = :n'),
                      {'n': LIBRARY_LOCK})
            yield s


def generation(session):
    """Library mutations committed so far, as this transaction sees it.

    A snapshot that reads the same count as a later locked transaction saw
    the same library: every mutation commits an increment.
    """
    value = session.execute(sa.text(
        'SELECT generation FROM vmar_locks WHERE name = :n'),
        {'n': LIBRARY_LOCK}).scalar()
    if value is None:
        raise RuntimeError('the vmar_locks row is missing; run '
                           '"vmar-manage db sync"')
    return value


def _take_lock(session, timeout):
    name = dialect(session)
    if name == 'sqlite':
        return  # BEGIN IMMEDIATE already made us the only writer
    if name in ('mysql', 'mariadb'):
        session.execute(sa.text('SET SESSION innodb_lock_wait_timeout = %d'
                                % int(timeout)))
    elif name == 'postgresql':
        session.execute(sa.text("SET LOCAL lock_timeout = '%ds'"
                                % int(timeout)))
    try:
        row = session.execute(sa.text(
            'SELECT name FROM vmar_locks WHERE name = :n FOR UPDATE'),
            {'n': LIBRARY_LOCK}).first()
    except sa.exc.OperationalError as e:
        raise LockTimeout('library lock busy for %ds: %s' % (timeout, e))
    if row is None:
        raise RuntimeError('the vmar_locks row is missing; run '
                           '"vmar-manage db sync"')
