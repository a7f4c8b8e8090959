"""A private three-node MariaDB Galera cluster on 127.0.0.1.

``Galera`` starts three ``mariadbd`` processes as one Galera cluster, each
with its own data dir, socket, pid file and error log under the work dir,
its own client port, Galera (gcomm) port, IST port and SST port (all free
ports), and its own ``--defaults-file``: nothing of the system MariaDB
(``/etc/mysql``, ``/var/lib/mysql``, ``/run/mysqld``) is read or touched.

Node 1 is initialised (``mariadb-install-db``) and bootstraps the cluster
(``--wsrep-new-cluster``); nodes 2 and 3 start with empty data dirs and
join by SST (rsync, or mariabackup when rsync is missing). Once the cluster
has three members, all Synced, a database and a user are created, and
:meth:`url` gives each node's SQLAlchemy URL.

:meth:`kill` SIGKILLs a node; :meth:`restart` recovers its position
(``--wsrep-recover``, as ``mysqld_safe`` does) and starts it again, so it
rejoins by IST from the others' gcache.

``Galera(size=1, wsrep=False)`` is one plain mariadbd of its own (no
wsrep provider): a server whose buffer pool and memory a benchmark sets
(``bench/bench_lock.py --pool``), apart from the host's.
"""

import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import time

from tools.vmarenv import process

PROVIDERS = ('/usr/lib/galera/libgalera_smm.so', '/usr/lib/libgalera_smm.so',
             '/usr/lib64/galera-4/libgalera_smm.so',
             '/usr/lib64/galera/libgalera_smm.so')


def size_bytes(text):
    """Bytes of a MariaDB/Galera size option: ``64M``, ``1G``, ``4096``."""
    text = str(text).strip().upper()
    scale = {'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30, 'T': 1 << 40}
    if text and text[-1] in scale:
        return int(text[:-1]) * scale[text[-1]]
    return int(text)


def _find(names, hint):
    for name in names:
        path = name if os.path.isabs(name) else shutil.which(name) or (
            shutil.which(name, path='/usr/sbin:/usr/bin:/sbin:/bin'))
        if path and os.path.exists(path):
            return path
    raise process.ServiceError('%s not found; install it: %s'
                               % (names[0], hint))


_APT = ('DEBIAN_FRONTEND=noninteractive apt-get install -y '
        '--no-install-recommends mariadb-server galera-4 rsync')


class Node:
    """One mariadbd of the cluster (its files, ports and process)."""

    def __init__(self, index, work_dir, ports):
        self.index = index
        self.name = 'node%d' % index
        self.dir = os.path.join(work_dir, self.name)
        self.datadir = os.path.join(self.dir, 'data')
        # its own: a mariadbd starting removes the #sql files of its
        # tmpdir, which in /tmp are another server's temporary tables
        # (a restarted node failed the host's MariaDB's statements)
        self.tmpdir = os.path.join(self.dir, 'tmp')
        self.socket = os.path.join(self.dir, 'mysqld.sock')
        self.pid_file = os.path.join(self.dir, 'mysqld.pid')
        self.error_log = os.path.join(self.dir, 'error.log')
        self.out_log = os.path.join(self.dir, 'mariadbd.out')
        self.cnf = os.path.join(self.dir, 'my.cnf')
        self.port, self.gcomm_port, self.ist_port, self.sst_port = ports
        self.proc = None
        self.logfile = None

    def alive(self):
        return self.proc is not None and self.proc.poll() is None


class Galera(process.Service):
    """Three mariadbd processes forming a Galera cluster on 127.0.0.1."""

    name = 'galera'

    def __init__(self, work_dir=None, size=3, database='vmar_galera',
                 user='vmar', password=None, timeout=180, sst_method=None,
                 buffer_pool='64M', gcache='64M', wsrep=True, options=None,
                 **tagging):
        super(Galera, self).__init__(work_dir, **tagging)
        if not wsrep and size != 1:
            raise ValueError('a server without wsrep is one node')
        self.wsrep = wsrep
        # mysqld options over the defaults below: {'innodb_log_file_size':
        # '512M'}
        self.options = dict(options or {})
        # called with each mariadbd's pid once spawned (a memory cgroup's
        # add: before the server touched its buffer pool)
        self.on_spawn = None
        self.size = size
        self.database = database
        self.user = user
        self.password = password or secrets.token_hex(8)
        self.timeout = timeout
        self.sst_method = sst_method
        self.buffer_pool = buffer_pool
        self.gcache = gcache
        self.cluster_name = 'vmar-%s' % secrets.token_hex(4)
        self.nodes = []
        self.startup_seconds = None

    # -- files and commands -------------------------------------------------

    def log_files(self):
        out = []
        for n in self.nodes:
            out += [n.error_log, n.out_log]
        return out

    def _binaries(self):
        self.mariadbd = _find(['mariadbd', 'mysqld', '/usr/sbin/mariadbd'],
                              _APT)
        self.install_db = _find(['mariadb-install-db', 'mysql_install_db'],
                                _APT)
        self.client = _find(['mariadb', 'mysql'], _APT)
        self.provider = _find(PROVIDERS, _APT) if self.wsrep else None
        try:
            pwd.getpwnam('mysql')
            self.run_as = 'mysql' if os.geteuid() == 0 else None
        except KeyError:
            self.run_as = 'root'
        if self.run_as is None:     # not root: run as ourselves
            self.run_as = pwd.getpwuid(os.geteuid()).pw_name
        if self.sst_method is None and self.wsrep:
            if (shutil.which('rsync') and shutil.which('wsrep_sst_rsync')
                    and self.run_as != 'root'):
                self.sst_method = 'rsync'
            elif shutil.which('mariabackup') or shutil.which(
                    'mariadb-backup'):
                self.sst_method = 'mariabackup'
            else:
                raise process.ServiceError(
                    'neither rsync nor mariabackup for SST; ' + _APT)

    def _write_cnf(self, node):
        gcomm = ','.join('127.0.0.1:%d' % n.gcomm_port for n in self.nodes)
        provider_options = ';'.join([
            'gmcast.listen_addr=tcp://127.0.0.1:%d' % node.gcomm_port,
            'ist.recv_addr=127.0.0.1:%d' % node.ist_port,
            'gcache.size=%s' % self.gcache,
            'gcache.dir=%s' % node.datadir,
            # a killed node is noticed within seconds
            'evs.suspect_timeout=PT3S', 'evs.inactive_timeout=PT6S',
            'evs.install_timeout=PT4S',
            'pc.recovery=false',
        ])
        mysqld = [
            ('user', self.run_as), ('datadir', node.datadir),
            ('tmpdir', node.tmpdir), ('socket', node.socket),
            ('pid-file', node.pid_file), ('log-error', node.error_log),
            ('port', node.port), ('bind-address', '127.0.0.1'),
            ('skip-name-resolve', None), ('skip-log-bin', None),
            ('innodb_buffer_pool_size', self.buffer_pool),
            ('innodb_log_file_size', '32M'),
            ('innodb_flush_log_at_trx_commit', 2),
            ('innodb_use_native_aio', 0),
            ('innodb_autoinc_lock_mode', 2),
            ('performance_schema', 'OFF'), ('max_connections', 100),
            ('binlog_format', 'ROW'),
            ('default_storage_engine', 'InnoDB'),
            ('character-set-server', 'utf8mb4'),
            ('collation-server', 'utf8mb4_general_ci')]
        given = dict(self.options)
        mysqld = [(k, given.pop(k, v)) for k, v in mysqld] + sorted(
            given.items())
        with open(node.cnf, 'w') as f:
            f.write('\n'.join(['[mysqld]'] + [
                k if v is None else '%s=%s' % (k, v) for k, v in mysqld]
                + ['', '']))
            if not self.wsrep:
                return
            f.write('\n'.join([
                # mariadb-install-db reads [mysqld] only; wsrep options go
                # in [galera], read by mariadbd itself
                '[galera]',
                'wsrep_on=ON',
                'wsrep_provider=%s' % self.provider,
                'wsrep_provider_options="%s"' % provider_options,
                'wsrep_cluster_name=%s' % self.cluster_name,
                'wsrep_cluster_address=gcomm://%s' % gcomm,
                'wsrep_node_name=%s' % node.name,
                'wsrep_node_address=127.0.0.1',
                'wsrep_node_incoming_address=127.0.0.1:%d' % node.port,
                'wsrep_sst_method=%s' % self.sst_method,
                'wsrep_sst_receive_address=127.0.0.1:%d' % node.sst_port,
                'wsrep_slave_threads=1',
                '',
            ]))

    def _client_cmd(self, node, user='root', password=None, tcp=False):
        cmd = [self.client, '--no-defaults', '-N', '-B', '-u', user]
        if password:
            cmd.append('-p' + password)
        if tcp:
            cmd += ['-h', '127.0.0.1', '-P', str(node.port),
                    '--protocol=TCP']
        else:
            cmd += ['-S', node.socket]
        return cmd

    def sql(self, index, statement, timeout=30, check=True):
        """Run SQL on node ``index`` (1-based) as root, by its socket.

        Returns the output rows as lists of strings.
        """
        node = self.nodes[index - 1]
        r = subprocess.run(self._client_cmd(node) + ['-e', statement],
                           capture_output=True, text=True, timeout=timeout,
                           env=self._env())
        if r.returncode:
            if check:
                raise process.ServiceError('%s: %r failed: %s%s' % (
                    node.name, statement, r.stderr.strip(),
                    self._death(node)))
            return None
        return [line.split('\t') for line in r.stdout.splitlines()]

    @staticmethod
    def _death(node):
        """How ``node`` ended, with its log's tail, if it is not running."""
        if node.proc is None or node.alive():
            return ''
        return '\n%s exited with %s\n%s' % (
            node.name, node.proc.returncode,
            process.log_tail([node.error_log, node.out_log], lines=60))

    def status(self, index):
        """wsrep_% status variables of a node, {} if it does not answer."""
        try:
            rows = self.sql(index, "SHOW STATUS LIKE 'wsrep_%'", timeout=10,
                            check=False)
        except subprocess.TimeoutExpired:
            return {}
        return {r[0]: r[1] if len(r) > 1 else '' for r in rows or ()}

    # -- starting -----------------------------------------------------------

    def _spawn_node(self, node, extra=()):
        node.logfile = open(node.out_log, 'ab')
        cmd = [self.mariadbd, '--defaults-file=%s' % node.cnf] + list(extra)
        node.proc = subprocess.Popen(
            cmd, env=self._env(), stdin=subprocess.DEVNULL,
            stdout=node.logfile, stderr=subprocess.STDOUT,
            start_new_session=True, cwd=node.dir)
        if self.on_spawn is not None:
            self.on_spawn(node.proc.pid)

    def _close_log(self, node):
        if node.logfile:
            node.logfile.close()
            node.logfile = None

    def _wait_synced(self, indexes, size, timeout=None, what='synced'):
        deadline = time.time() + (timeout or self.timeout)
        while True:
            states = {}
            for i in indexes:
                node = self.nodes[i - 1]
                if node.proc is None or node.proc.poll() is not None:
                    self._fail('%s exited with %s while waiting until %s'
                               % (node.name, node.proc and
                                  node.proc.returncode, what))
                st = self.status(i)
                states[i] = (st.get('wsrep_cluster_size'),
                             st.get('wsrep_local_state_comment'),
                             st.get('wsrep_cluster_status'),
                             st.get('wsrep_ready'))
            if all(s == (str(size), 'Synced', 'Primary', 'ON')
                   for s in states.values()):
                return states
            if time.time() > deadline:
                self._fail('not all %s after %ds: %s' % (
                    what, timeout or self.timeout, states))
            time.sleep(0.5)

    def start(self):
        if self.owner_var == process.OWNER_VAR:
            process.reap_stale()
        self._binaries()
        ports = process.free_ports(4 * self.size)
        self.nodes = [Node(i + 1, self.work_dir, ports[4 * i:4 * i + 4])
                      for i in range(self.size)]
        # mariadbd runs as mysql (as root, the joiner's rsync daemon of an
        # SST would write as 'nobody'): it must reach our dirs
        os.chmod(self.work_dir, 0o755)
        for node in self.nodes:
            shutil.rmtree(node.dir, ignore_errors=True)
            os.makedirs(node.datadir)
            os.makedirs(node.tmpdir)
            if self.run_as != 'root':
                for path in (node.dir, node.datadir, node.tmpdir):
                    shutil.chown(path, self.run_as, self.run_as)
            self._write_cnf(node)
        t0 = time.time()
        first = self.nodes[0]
        r = subprocess.run(
            [self.install_db, '--defaults-file=%s' % first.cnf,
             '--user=%s' % self.run_as, '--skip-test-db',
             '--auth-root-authentication-method=socket',
             '--datadir=%s' % first.datadir],
            capture_output=True, text=True, env=self._env(), timeout=300)
        if r.returncode:
            self._fail('mariadb-install-db failed: %s%s'
                       % (r.stdout, r.stderr))
        if not self.wsrep:
            self._spawn_node(first)
            self._wait_answers(first)
        else:
            self._spawn_node(first, ['--wsrep-new-cluster'])
            self._wait_synced([1], 1, what='node1 bootstrapped')
        for node in self.nodes[1:]:
            # one joiner at a time: each SST takes a donor out of Synced
            self._spawn_node(node)
            self._wait_synced(range(1, node.index + 1), node.index,
                              what='%s joined' % node.name)
        self.sql(1, "CREATE DATABASE IF NOT EXISTS {db};"
                    "CREATE USER IF NOT EXISTS '{u}'@'127.0.0.1' "
                    "IDENTIFIED BY '{p}';"
                    "CREATE USER IF NOT EXISTS '{u}'@'localhost' "
                    "IDENTIFIED BY '{p}';"
                    "GRANT ALL ON `{db}`.* TO '{u}'@'127.0.0.1';"
                    "GRANT ALL ON `{db}`.* TO '{u}'@'localhost';"
                    "GRANT ALL ON `{db}\\_%`.* TO '{u}'@'127.0.0.1';"
                 .format(db=self.database, u=self.user, p=self.password))
        self.wait_same_position()
        self.startup_seconds = time.time() - t0
        return self

    def _wait_answers(self, node):
        deadline = time.time() + self.timeout
        while self.sql(node.index, 'SELECT 1', check=False) is None:
            if not node.alive():
                self._fail('%s exited with %s while starting' % (
                    node.name, node.proc.returncode))
            if time.time() > deadline:
                self._fail('%s did not answer within %ds' % (
                    node.name, self.timeout))
            time.sleep(0.5)

    def url(self, index, database=None):
        """The SQLAlchemy URL of node ``index`` (1-based)."""
        return 'mysql+pymysql://%s:%s@127.0.0.1:%d/%s?charset=utf8mb4' % (
            self.user, self.password, self.nodes[index - 1].port,
            database or self.database)

    def urls(self, database=None):
        return [self.url(i + 1, database) for i in range(self.size)]

    def wait_same_position(self, timeout=60):
        """Wait until every live node applied the same last write set."""
        if not self.wsrep:
            return {}
        deadline = time.time() + timeout
        while True:
            seen = {}
            for node in self.nodes:
                if node.alive():
                    seen[node.name] = self.status(node.index).get(
                        'wsrep_last_committed')
            if len(set(seen.values())) == 1 and None not in seen.values():
                return seen
            if time.time() > deadline:
                raise process.ServiceError(
                    'nodes did not converge within %ds: %s'
                    % (timeout, seen))
            time.sleep(0.3)

    # -- failures -----------------------------------------------------------

    def kill(self, index, wait=True):
        """SIGKILL node ``index``; the others go on as a 2-node primary.

        With ``wait``, returns once they have: evicted it and formed a
        primary view of their own, synced. A restart before that finds a
        view the survivors have not settled, and may not join.
        """
        node = self.nodes[index - 1]
        if node.alive():
            try:
                os.killpg(node.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            node.proc.wait(30)
        self._close_log(node)
        if wait:
            live = [n.index for n in self.nodes if n.alive()]
            self._wait_synced(live, len(live),
                              what='the others went on without %s'
                              % node.name)

    def recover_position(self, index):
        """The node's last committed ``uuid:seqno``, by --wsrep-recover."""
        node = self.nodes[index - 1]
        log = os.path.join(node.dir, 'recover.log')
        r = subprocess.run(
            [self.mariadbd, '--defaults-file=%s' % node.cnf,
             '--wsrep-recover', '--log-error=%s' % log],
            capture_output=True, text=True, env=self._env(), timeout=300)
        try:
            with open(log, errors='replace') as f:
                text = f.read()
        except OSError:
            text = ''
        found = re.findall(r'WSREP: Recovered position:\s*(\S+:-?\d+)',
                           text + r.stdout + r.stderr)
        if not found:
            raise process.ServiceError(
                '%s: --wsrep-recover found no position (rc %d): %s'
                % (node.name, r.returncode, (text + r.stderr)[-2000:]))
        return found[-1]

    def restart(self, index, wait=True):
        """Start a killed node again; it rejoins (IST when gcache allows).

        Returns how it rejoined: 'IST', 'SST' or None (unknown).
        """
        node = self.nodes[index - 1]
        if node.alive():
            raise process.ServiceError('%s is running' % node.name)
        position = self.recover_position(index)
        with open(node.error_log, 'a') as f:
            f.write('\n=== vmar: restart at %s ===\n' % position)
        self._spawn_node(node, ['--wsrep-start-position=%s' % position])
        if wait:
            live = [n.index for n in self.nodes if n.alive()]
            self._wait_synced(live, len(live),
                              what='%s rejoined' % node.name)
        with open(node.error_log, errors='replace') as f:
            text = f.read().split('=== vmar: restart at')[-1]
        if 'IST received' in text or 'Receiving IST' in text:
            return 'IST'
        if 'SST received' in text or 'SST succeeded' in text:
            return 'SST'
        return None

    # -- stopping -----------------------------------------------------------

    def stop(self):
        for node in reversed(self.nodes):
            if node.alive():
                node.proc.send_signal(signal.SIGTERM)
        for node in self.nodes:
            if node.proc is not None:
                try:
                    node.proc.wait(60)
                except subprocess.TimeoutExpired:
                    try:
                        os.killpg(node.proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    node.proc.wait(10)
            self._close_log(node)
        # rsync daemons of an SST and anything else carrying our tag
        process.kill_tagged(lambda tag: tag == self.tag, var=self.owner_var)
        if self._own_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)


if __name__ == '__main__':
    import sys
    with Galera(sys.argv[1] if len(sys.argv) > 1 else None) as g:
        print('started in %.1fs' % g.startup_seconds)
        for u in g.urls():
            print(u)
        for i in range(1, g.size + 1):
            print(g.status(i).get('wsrep_cluster_size'),
                  g.status(i).get('wsrep_local_state_comment'))
