"""Shared test fixtures: a private library (config, state dir, database)."""

import os
import random
import shutil
import tempfile

import fixtures
from oslo_config import cfg
import testtools

from tests import disk_fixture
from vmar_openstack import conf as vmar_conf
from vmar_openstack.db import migration
from vmar_openstack.db import session as db_session
from vmar_openstack import ingest
from vmar_openstack import mapgen

BS = 4096
VECTORS = os.path.join(os.path.dirname(__file__), 'vectors')


def block(seed, size=BS):
    """Deterministic, incompressible block content for a seed."""
    return random.Random(seed).randbytes(size)


def write_image(path, seeds, tail=b''):
    """Write a raw image: one block per seed, None for a zero block."""
    with open(path, 'wb') as f:
        for s in seeds:
            f.write(bytes(BS) if s is None else block(s))
        f.write(tail)
    return path


SOCKET_ROOT = '/run/vmar-test'


def socket_dir(test, prefix):
    """A fresh directory for a test's sockets, removed after the test.

    Under /run (a socket's path must stay short), readable by QEMU's user,
    and of this run alone: the test chains of run-tests.sh run the same
    test on two QEMUs at once, and a directory named after the test was
    one socket for both.
    """
    os.makedirs(SOCKET_ROOT, exist_ok=True)
    os.chmod(SOCKET_ROOT, 0o755)
    d = tempfile.mkdtemp(prefix=prefix, dir=SOCKET_ROOT)
    os.chmod(d, 0o755)
    test.addCleanup(shutil.rmtree, d, True)
    return d


def new_conf():
    """vmar's options, registered and parsed from no file."""
    conf = cfg.ConfigOpts()
    vmar_conf.register_opts(conf)
    conf([], project='vmar', default_config_files=[])
    return conf


class LibraryTestCase(testtools.TestCase):
    """A test with its own configuration and library database.

    The database is a SQLite file in the test's temporary directory;
    functional tests override :meth:`database_url` to run the same tests on
    MariaDB and PostgreSQL.
    """

    def database_url(self):
        return 'sqlite:///%s/vmar.sqlite' % self.tmp

    def make_tmp(self):
        """The test's directory: library, host and images live in it.

        On a disk of its own (:mod:`tests.disk_fixture`) for a test that
        sets or asserts the disk's knobs.
        """
        if disk_fixture.wants_own_disk(self):
            return self.useFixture(disk_fixture.OwnBlockDevice()).path
        return self.useFixture(fixtures.TempDir()).path

    def setUp(self):
        super().setUp()
        self.tmp = self.make_tmp()
        # before the directory goes: no checkpoint thread may still use it
        self.addCleanup(db_session.wait_for_checkpoints)
        self.conf = new_conf()
        self.conf.set_override('state_dir', self.tmp, group='vmar')
        self.conf.set_override('hash_workers', 2, group='vmar')
        # how many maps a change rewrites is the count's alone, however
        # slow the machine (test_pending sets the time)
        self.conf.set_override('rewrite_seconds', 3600, group='vmar')
        # a host of the test's own, reading this library
        self.conf.set_override('host_dir', os.path.join(self.tmp, 'host'),
                               group='vmar_host')
        self.conf.set_override('map_source_dir', self.tmp,
                               group='vmar_host')
        self.conf.set_override('connection', self.database_url(),
                               group='vmar_database')
        migration.upgrade('head', conf=self.conf)
        # the library's connections closed before its directory goes
        self.addCleanup(lambda: db_session.get_engine(self.conf).dispose())
        self.lib = ingest.Library(self.conf)
        mapgen.clear_cache()
        self.addCleanup(mapgen.clear_cache)
        self.images = os.path.join(self.tmp, 'src')
        os.makedirs(self.images)

    def write_conf_file(self, vmar_extra='', connection=None,
                        host_extra=''):
        """A config file for the console scripts, naming this library.

        Its host (``[vmar_host]``) is the test's own, reading the library.
        """
        path = os.path.join(self.tmp, 'vmar.conf')
        with open(path, 'w') as f:
            f.write('[DEFAULT]\nlog_file = %s/cli.log\n'
                    '[vmar]\nstate_dir = %s\n%s'
                    '[vmar_database]\nconnection = %s\n'
                    '[vmar_host]\nhost_dir = %s\nmap_source_dir = %s\n%s'
                    % (self.tmp, self.tmp, vmar_extra,
                       connection or self.conf.vmar_database.connection,
                       self.conf.vmar_host.host_dir,
                       self.conf.vmar_host.map_source_dir, host_extra))
        return path

    def image(self, name, seeds, tail=b''):
        return write_image(os.path.join(self.images, name), seeds, tail)

    def scratch(self):
        return tempfile.mkdtemp(dir=self.tmp)
