"""Start the real database servers the functional tests use.

The functional suite needs MariaDB and PostgreSQL. Debian installs them
(tools/install-deps.sh --test) but, without systemd, nothing starts them, so
the harness does: ``mysqld_safe`` for MariaDB and ``pg_ctlcluster`` for
PostgreSQL, then creates a ``vmar`` role and a ``vmar_test`` database in each.
Starting is idempotent; servers are left running for the rest of the run.

Two test runs beside each other (tools/run-tests.sh runs the daemon's tests
on the other QEMUs beside the last functional tests) share the servers but
not the databases: ``$VMAR_TEST_DATABASE`` names the run's database and the
prefix of the ones it creates (``vmar_test`` when unset).

Each server is checked and started under a lock of the machine's
(:func:`machine_lock`): two chains that both find it down start it once.

What the harness starts (these servers, and libvirtd/virtlogd in
:mod:`qemu_env`) it records in the file ``$VMAR_TEST_STARTED`` names, if set.
``tools/run-tests.sh`` sets it and, when the run ends, stops exactly those
(``python -m tools.vmarenv.services stop FILE``); servers that were
already running are not recorded and are left alone.
"""

import contextlib
import fcntl
import functools
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import sqlalchemy as sa

USER = 'vmar'
PASSWORD = 'vmar-test'
DATABASE = os.environ.get('VMAR_TEST_DATABASE') or 'vmar_test'
if not re.fullmatch(r'[a-z][a-z0-9_]{0,40}', DATABASE):
    raise ValueError('VMAR_TEST_DATABASE=%r: lower-case letters, digits '
                     'and _, at most 41' % DATABASE)


class Unavailable(RuntimeError):
    pass


def _wait(check, what, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise Unavailable('%s did not come up within %ds' % (what, timeout))


LOCK_DIR = '/run/lock'


@contextlib.contextmanager
def machine_lock(name):
    """An exclusive flock on ``/run/lock/vmar-<name>.lock``, for a block.

    For what every chain CI runs at once shares on this machine (a system
    server started when it is down): the first checks and starts it, the
    others wait and find it up.
    """
    os.makedirs(LOCK_DIR, exist_ok=True)
    with open(os.path.join(LOCK_DIR, 'vmar-%s.lock' % name), 'a') as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _ok(cmd):
    return subprocess.run(cmd, capture_output=True).returncode == 0


def record_started(*words):
    """Note a server this run started, for ``stop`` at the end of the run."""
    path = os.environ.get('VMAR_TEST_STARTED')
    if path:
        with open(path, 'a') as f:
            f.write(' '.join(words) + '\n')


def _stop_pidfile(path, timeout=30):
    try:
        with open(path) as f:
            pid = int(f.read().split()[0])
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError, IndexError):
        return
    _wait(lambda: not os.path.exists('/proc/%d' % pid), path, timeout)


_STOP = {
    'mariadb': lambda: subprocess.run(['mysqladmin', 'shutdown'],
                                      capture_output=True),
    'postgresql': lambda version: subprocess.run(
        ['pg_ctlcluster', version, 'main', 'stop'], capture_output=True),
    'libvirtd': lambda: _stop_pidfile('/run/libvirtd.pid'),
    'virtlogd': lambda: _stop_pidfile('/run/virtlogd.pid'),
}


def stop_started(path):
    """Stop what ``record_started`` noted in ``path``, newest first."""
    try:
        with open(path) as f:
            entries = [line.split() for line in f if line.strip()]
    except FileNotFoundError:
        return
    done = set()
    for name, *args in reversed(entries):
        if name in done or name not in _STOP:
            continue
        done.add(name)
        print('stopping %s (started by the tests)' % name)
        _STOP[name](*args)
    os.unlink(path)


@functools.lru_cache(maxsize=None)
def mariadb_url():
    if not shutil.which('mysqld_safe'):
        raise Unavailable('MariaDB is not installed; run '
                          'tools/install-deps.sh --test')
    with machine_lock('mariadb'):
        if not _ok(['mysqladmin', 'ping']):
            os.makedirs('/run/mysqld', exist_ok=True)
            shutil.chown('/run/mysqld', 'mysql', 'mysql')
            subprocess.Popen(['mysqld_safe', '--skip-syslog'],
                             stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL,
                             start_new_session=True)
            record_started('mariadb')
            _wait(lambda: _ok(['mysqladmin', 'ping']), 'MariaDB')
    sql = ("CREATE DATABASE IF NOT EXISTS {db};"
           "CREATE USER IF NOT EXISTS '{u}'@'localhost' IDENTIFIED BY '{p}';"
           "GRANT ALL ON {db}.* TO '{u}'@'localhost';"
           "GRANT ALL ON `{db}_%`.* TO '{u}'@'localhost';"
           ).format(db=DATABASE, u=USER, p=PASSWORD)
    subprocess.run(['mysql', '-e', sql], check=True, capture_output=True)
    return 'mysql+pymysql://%s:%s@localhost/%s?charset=utf8mb4' % (
        USER, PASSWORD, DATABASE)


def mariadb_database(suffix):
    """URL of a new, empty MariaDB database ``<DATABASE>_<suffix>``."""
    url = mariadb_url()
    db = '%s_%s' % (DATABASE, suffix)
    subprocess.run(['mysql', '-e', 'DROP DATABASE IF EXISTS %s; '
                    'CREATE DATABASE %s' % (db, db)],
                   check=True, capture_output=True)
    return url.replace('/%s?' % DATABASE, '/%s?' % db)


def _psql(sql, db='postgres'):
    return subprocess.run(['runuser', '-u', 'postgres', '--', 'psql', '-d',
                           db, '-tAc', sql], capture_output=True, text=True)


@functools.lru_cache(maxsize=None)
def postgresql_url():
    clusters = glob.glob('/etc/postgresql/*/main')
    if not clusters or not shutil.which('pg_ctlcluster'):
        raise Unavailable('PostgreSQL is not installed; run '
                          'tools/install-deps.sh --test')
    version = os.path.basename(os.path.dirname(sorted(clusters)[-1]))
    with machine_lock('postgresql'):
        if not _ok(['pg_isready', '-q']):
            subprocess.run(['pg_ctlcluster', version, 'main', 'start'],
                           check=True, capture_output=True)
            record_started('postgresql', version)
            _wait(lambda: _ok(['pg_isready', '-q']), 'PostgreSQL')
    if _psql("SELECT 1 FROM pg_roles WHERE rolname='%s'" % USER
             ).stdout.strip() != '1':
        _psql("CREATE ROLE %s LOGIN PASSWORD '%s'" % (USER, PASSWORD))
    if _psql("SELECT 1 FROM pg_database WHERE datname='%s'" % DATABASE
             ).stdout.strip() != '1':
        _psql('CREATE DATABASE %s OWNER %s' % (DATABASE, USER))
    return 'postgresql+psycopg2://%s:%s@localhost/%s' % (
        USER, PASSWORD, DATABASE)


def postgresql_database(suffix):
    """URL of a new, empty PostgreSQL database ``<DATABASE>_<suffix>``."""
    url = postgresql_url()
    db = '%s_%s' % (DATABASE, suffix)
    _psql('DROP DATABASE IF EXISTS %s WITH (FORCE)' % db)
    r = _psql('CREATE DATABASE %s OWNER %s' % (db, USER))
    if r.returncode:
        raise Unavailable('cannot create %s: %s' % (db, r.stderr.strip()))
    return url.rsplit('/', 1)[0] + '/' + db


def reset(url):
    """Drop every table of the test database."""
    engine = sa.create_engine(url)
    try:
        meta = sa.MetaData()
        meta.reflect(engine)
        meta.drop_all(engine)
    finally:
        engine.dispose()


if __name__ == '__main__':
    if len(sys.argv) != 3 or sys.argv[1] != 'stop':
        sys.exit('usage: python -m tools.vmarenv.services stop FILE')
    stop_started(sys.argv[2])
