"""The library's SQLite engine: checkpoints off the commit path."""

import os
import threading
import time

import fixtures
import sqlalchemy as sa
import testtools

from tests import base
from vmar_openstack.db import session as db_session
from vmar_openstack import exception


class TestCheckpoints(base.LibraryTestCase):

    def _spy(self):
        calls = []
        real = db_session._Checkpointer.checkpoint

        def checkpoint(obj):
            calls.append(threading.current_thread() is
                         threading.main_thread())
            return real(obj)
        self.useFixture(mockpatch('checkpoint', checkpoint))
        return calls

    def _add(self):
        self.lib.add('00000001-0000-4000-8000-000000000001',
                     self.image('a', [1, 2]), visibility='public')

    def test_a_thread_checkpoints_after_commit(self):
        calls = self._spy()
        self._add()
        deadline = time.monotonic() + 10
        while not calls:
            self.assertLess(time.monotonic(), deadline,
                            'the checkpoint thread never ran')
            time.sleep(0.02)
        self.assertFalse(calls[0], 'checkpointed in the committing thread')

    def test_large_wal_is_checkpointed_by_the_committer(self):
        calls = self._spy()
        self.useFixture(mockpatch('MAX_WAL', 0))
        self._add()
        self.assertIn(True, calls)

    def test_a_removed_database_is_not_recreated(self):
        self._add()
        self.assertTrue(db_session.wait_for_checkpoints(10))
        path = '%s/vmar.sqlite' % self.tmp
        db_session.get_engine(self.conf).dispose()
        for suffix in ('', '-wal', '-shm'):
            if os.path.exists(path + suffix):
                os.unlink(path + suffix)
        db_session._checkpointer(path).checkpoint()
        self.assertFalse(os.path.exists(path))

    def test_the_wal_shrinks_back_once_a_reader_ends(self):
        # commits while a snapshot is open: no checkpoint copies their
        # frames, and the WAL grows past what it keeps
        wal = '%s/vmar.sqlite-wal' % self.tmp
        with db_session.writer(self.conf) as s:
            s.execute(sa.text('CREATE TABLE filler (b BLOB)'))
            s.execute(sa.text('CREATE TABLE small (a INTEGER)'))
        with db_session.reader(self.conf, snapshot=True) as r:
            r.execute(sa.text('SELECT COUNT(*) FROM vmar_images')).scalar()
            for _ in range(6):
                with db_session.writer(self.conf) as s:
                    s.execute(sa.text('INSERT INTO filler VALUES (:b)'),
                              {'b': os.urandom(4 << 20)})
            self.assertTrue(db_session.wait_for_checkpoints(30))
        grown = os.stat(wal).st_size
        self.assertGreater(grown, db_session._Checkpointer.WAL_KEPT)
        # the reader's end let a checkpoint copy every frame: the next
        # writer starts the WAL again and cuts its file back
        self.assertTrue(db_session.wait_for_checkpoints(30))
        with db_session.writer(self.conf) as s:
            s.execute(sa.text('INSERT INTO small VALUES (1)'))
        self.assertLessEqual(os.stat(wal).st_size,
                             db_session._Checkpointer.WAL_KEPT)
        self.assertLess(os.stat(wal).st_size, grown)

    def test_connections_do_not_checkpoint_on_commit(self):
        engine = db_session.get_engine(self.conf)
        with engine.connect() as c:
            self.assertEqual(0, c.exec_driver_sql(
                'PRAGMA wal_autocheckpoint').scalar())


def mockpatch(name, new):
    return fixtures.MockPatchObject(db_session._Checkpointer, name, new)


class _Orig(Exception):
    """A DB-API error as the drivers raise them.

    pymysql: ``args[0]`` is the error number; psycopg2: ``pgcode``.
    """

    def __init__(self, *args, pgcode=None):
        super().__init__(*args)
        self.pgcode = pgcode


def _error(kind, orig):
    return kind('SELECT 1', {}, orig)


class TestConflicts(base.LibraryTestCase):

    def test_deadlocks_and_serialization_failures_are_conflicts(self):
        for e in (_error(sa.exc.OperationalError,
                         _Orig(1213, 'Deadlock found')),
                  _error(sa.exc.OperationalError, _Orig(pgcode='40P01')),
                  _error(sa.exc.InternalError, _Orig(pgcode='40001'))):
            self.assertTrue(db_session.conflict(e), e)
        for e in (_error(sa.exc.OperationalError,
                         _Orig(1205, 'Lock wait timeout')),
                  _error(sa.exc.IntegrityError, _Orig(1062, 'Duplicate')),
                  _error(sa.exc.OperationalError, _Orig(pgcode='57014')),
                  ValueError('no')):
            self.assertFalse(db_session.conflict(e), e)

    def test_the_drivers_own_errors_too(self):
        # db/bulk.py reads through the DB-API cursor: SQLAlchemy never
        # wraps what it raises
        # (the class of PyMySQL's own, not imported: Nova 33's venv has
        # no PyMySQL)
        class OperationalError(Exception):
            pass
        OperationalError.__module__ = 'pymysql.err'
        self.assertTrue(db_session.conflict(
            OperationalError(1213, 'Deadlock found')))
        self.assertFalse(db_session.conflict(
            OperationalError(1205, 'Lock wait timeout')))
        OperationalError.__module__ = 'elsewhere'
        self.assertFalse(db_session.conflict(
            OperationalError(1213, 'Deadlock found')))

    def test_a_conflict_runs_the_function_again(self):
        calls = []

        @db_session.retry_conflicts()
        def work():
            calls.append(1)
            if len(calls) < 3:
                raise _error(sa.exc.OperationalError, _Orig(1213, 'dl'))
            return 'done'
        self.assertEqual('done', work())
        self.assertEqual(3, len(calls))

    def test_other_errors_and_too_many_conflicts_are_raised(self):
        calls = []

        @db_session.retry_conflicts(max_retries=2)
        def work(kind, orig):
            calls.append(1)
            raise _error(kind, orig)
        self.assertRaises(sa.exc.IntegrityError, work,
                          sa.exc.IntegrityError, _Orig(1062, 'dup'))
        self.assertEqual(1, len(calls))
        self.assertRaises(sa.exc.OperationalError, work,
                          sa.exc.OperationalError, _Orig(1213, 'dl'))
        self.assertEqual(1 + 3, len(calls))


class TestLibraryLock(base.LibraryTestCase):
    """The library lock, and the time it is held."""

    def _hold_another_writer(self):
        """A writer transaction (a compaction's, a report's) in a thread.

        Returns ``(release, ended)``: set ``release`` to commit it;
        ``ended`` then holds the time it committed.
        """
        inside, release, ended = (threading.Event(), threading.Event(),
                                  [])

        def hold():
            with db_session.writer(self.conf) as s:
                s.execute(sa.text('UPDATE vmar_compaction SET turn = '
                                  'turn + 1'))
                inside.set()
                release.wait(30)
            ended.append(time.monotonic())
        t = threading.Thread(target=hold)
        t.start()
        self.addCleanup(t.join)
        self.addCleanup(release.set)
        self.assertTrue(inside.wait(30))
        return release, ended

    def test_the_hold_starts_once_sqlite_made_it_the_writer(self):
        if db_session.get_engine(self.conf).dialect.name != 'sqlite':
            self.skipTest('the lock of the other databases is a statement')
        release, ended = self._hold_another_writer()
        # the other writer commits while this one waits for it
        threading.Timer(0.2, release.set).start()
        with db_session.locked_writer(self.conf) as s:
            taken = s.info['vmar_lock_taken']
        self.assertEqual(1, len(ended))
        self.assertGreaterEqual(taken, ended[0])

    def test_a_busy_lock_is_a_lock_timeout(self):
        if db_session.get_engine(self.conf).dialect.name != 'sqlite':
            self.skipTest('the lock of the other databases is a statement')
        self.conf.set_override('lock_timeout', 1, group='vmar_database')
        self._hold_another_writer()
        with testtools.ExpectedException(exception.LockTimeout,
                                         'library lock busy for 1s'):
            with db_session.locked_writer(self.conf):
                pass
