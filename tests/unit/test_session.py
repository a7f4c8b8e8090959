"""The library's SQLite engine: checkpoints off the commit path."""

import os
import threading
import time

import fixtures

from tests import base
from vmar_openstack.db import session as db_session


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

    def test_connections_do_not_checkpoint_on_commit(self):
        engine = db_session.get_engine(self.conf)
        with engine.connect() as c:
            self.assertEqual(0, c.exec_driver_sql(
                'PRAGMA wal_autocheckpoint').scalar())


def mockpatch(name, new):
    return fixtures.MockPatchObject(db_session._Checkpointer, name, new)
