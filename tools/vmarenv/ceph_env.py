"""A single-node Ceph cluster from Debian's packages, for tests and benches.

One monitor and one OSD (BlueStore on a sparse file), on loopback ports of
their own, cephx on, everything (configuration, keyrings, data, sockets,
logs) under the work directory: nothing of the machine's is touched, and
several clusters can run side by side. No manager: pools, users and RBD
images need none (``ceph health mute MGR_DOWN``).

Users it creates:

* ``client.admin``: everything (the tests' ``ceph`` and ``rbd`` commands);
* ``client.glance``: what glance_store's RBD store needs on the pool
  ``images`` (``profile rbd``);
* ``client.vmar``: what a compute host needs to read bases, no more
  (``profile rbd-read-only``).

Start takes about 15 s. Needs ceph-mon, ceph-osd and ceph-common
(bindep.txt).
"""

import json
import os
import shutil
import signal
import subprocess
import time
import uuid

from tools.vmarenv.process import free_ports
from tools.vmarenv.process import kill_tagged
from tools.vmarenv.process import log_tail
from tools.vmarenv.process import reap_stale
from tools.vmarenv.process import Service
from tools.vmarenv.process import ServiceError

POOL = 'images'
USERS = {
    'glance': ['mon', 'profile rbd', 'osd', 'profile rbd pool=%s' % POOL],
    'vmar': ['mon', 'profile rbd', 'osd',
             'profile rbd-read-only pool=%s' % POOL],
}

CONF = """[global]
fsid = {fsid}
mon host = [v2:127.0.0.1:{v2},v1:127.0.0.1:{v1}]
mon initial members = a
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind port min = {port_min}
ms bind port max = {port_max}
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
auth allow insecure global id reclaim = false
run dir = {d}/run
admin socket = {d}/run/$cluster-$name.asok
pid file = {d}/run/$cluster-$name.pid
log file = {d}/log/$cluster-$name.log
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon warn on pool no redundancy = false
mon data avail warn = 2
mon data avail crit = 1

[mon]
mon data = {d}/mon/$cluster-$id
keyring = $mon_data/keyring

[osd]
osd data = {d}/osd/$cluster-$id
keyring = $osd_data/keyring
osd objectstore = bluestore
bluestore block path = {d}/osd/$cluster-$id.block
bluestore block create = true
bluestore block size = {block_size}
bluestore cache size = 67108864
osd memory target = 536870912
osd op num shards = 1
osd op num threads per shard = 2

[client]
keyring = {d}/$name.keyring
"""


class Ceph(Service):
    """``ceph-mon -i a`` and ``ceph-osd -i 0`` under ``work_dir``."""

    name = 'ceph'

    def __init__(self, work_dir=None, block_gb=4, timeout=120):
        super().__init__(work_dir)
        self.block_size = block_gb << 30
        self.timeout = timeout
        self.fsid = str(uuid.uuid4())
        self.conf = os.path.join(self.work_dir, 'ceph.conf')
        self.osd_proc = None
        self.osd_uuid = None
        self.pool_created = False

    def log_files(self):
        d = os.path.join(self.work_dir, 'log')
        return [os.path.join(d, n) for n in ('mon.out', 'osd.out',
                                             'ceph-mon.a.log',
                                             'ceph-osd.0.log')]

    def keyring(self, user):
        """The keyring file of ``client.<user>``."""
        return os.path.join(self.work_dir, 'client.%s.keyring' % user)

    # -- commands ---------------------------------------------------------

    def run(self, *cmd, check=True, timeout=60, user='admin'):
        """A Ceph command (``ceph``, ``rbd``...) against this cluster."""
        argv = [cmd[0], '--conf', self.conf, '--id', user] + list(cmd[1:])
        r = subprocess.run(argv, capture_output=True, text=True,
                           timeout=timeout, env=self._env(),
                           stdin=subprocess.DEVNULL)
        if check and r.returncode:
            raise ServiceError('%s failed (%d): %s%s' % (
                ' '.join(argv), r.returncode, r.stdout, r.stderr))
        return r

    def _setup(self, *cmd):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                           env=self._env(), stdin=subprocess.DEVNULL)
        if r.returncode:
            self._fail('%s failed (%d): %s%s' % (' '.join(cmd), r.returncode,
                                                 r.stdout, r.stderr))
        return r.stdout

    def _daemon(self, what, log):
        return subprocess.Popen(
            [what[0], '--conf', self.conf, '-f'] + what[1:],
            env=self._env(), stdin=subprocess.DEVNULL,
            stdout=open(os.path.join(self.work_dir, 'log', log), 'ab'),
            stderr=subprocess.STDOUT, start_new_session=True,
            cwd=self.work_dir)

    def _wait(self, what, check):
        deadline = time.time() + self.timeout
        while True:
            try:
                if check():
                    return
            except (subprocess.TimeoutExpired, ServiceError):
                pass
            for p in (self.proc, self.osd_proc):
                if p is not None and p.poll() is not None:
                    self._fail('%s exited (%d) while waiting for %s'
                               % (p.args[0], p.returncode, what))
            if time.time() > deadline:
                self._fail('no %s within %ds' % (what, self.timeout))
            time.sleep(0.3)

    # -- life -------------------------------------------------------------

    def start(self):
        for tool in ('ceph-mon', 'ceph-osd', 'ceph-authtool', 'monmaptool',
                     'ceph', 'rbd'):
            if not shutil.which(tool):
                raise ServiceError(
                    '%s not found; install ceph-mon ceph-osd ceph-common '
                    '(bindep.txt)' % tool)
        reap_stale()
        d = self.work_dir
        for sub in ('run', 'log', 'mon', 'osd/ceph-0'):
            os.makedirs(os.path.join(d, sub), exist_ok=True)
        v2, v1 = free_ports(2)
        # the range the OSD and the manager bind in: ours alone
        ports = free_ports(31, contiguous=True)
        self.mon_ports = (v2, v1)
        with open(self.conf, 'w') as f:
            f.write(CONF.format(fsid=self.fsid, v2=v2, v1=v1, d=d,
                                port_min=ports[0], port_max=ports[-1],
                                block_size=self.block_size))
        mon_seed = os.path.join(d, 'mon.seed.keyring')
        admin = self.keyring('admin')
        self._setup('ceph-authtool', '--create-keyring', mon_seed,
                    '--gen-key', '-n', 'mon.', '--cap', 'mon', 'allow *')
        self._setup('ceph-authtool', '--create-keyring', admin, '--gen-key',
                    '-n', 'client.admin', '--cap', 'mon', 'allow *',
                    '--cap', 'osd', 'allow *', '--cap', 'mds', 'allow *',
                    '--cap', 'mgr', 'allow *')
        self._setup('ceph-authtool', mon_seed, '--import-keyring', admin)
        monmap = os.path.join(d, 'monmap')
        self._setup('monmaptool', '--create', '--fsid', self.fsid,
                    '--addv', 'a', '[v2:127.0.0.1:%d,v1:127.0.0.1:%d]'
                    % (v2, v1), monmap)
        self._setup('ceph-mon', '--conf', self.conf, '--mkfs', '-i', 'a',
                    '--monmap', monmap, '--keyring', mon_seed)
        self.proc = self._daemon(['ceph-mon', '-i', 'a'], 'mon.out')
        self._wait('monitor quorum', lambda: self.run(
            'ceph', 'mon', 'stat', timeout=10).returncode == 0)
        self.run('ceph', 'health', 'mute', 'MGR_DOWN', '--sticky')
        self._start_osd()
        self.run('ceph', 'osd', 'pool', 'create', POOL, '8', '8')
        self.run('rbd', 'pool', 'init', POOL, timeout=120)
        self.pool_created = True
        for user, caps in USERS.items():
            self.run('ceph', 'auth', 'get-or-create', 'client.' + user,
                     *caps, '-o', self.keyring(user))
        return self

    def _start_osd(self):
        osd_dir = os.path.join(self.work_dir, 'osd', 'ceph-0')
        self.osd_uuid = str(uuid.uuid4())
        osd_id = self.run('ceph', 'osd', 'new', self.osd_uuid).stdout.strip()
        if osd_id != '0':
            self._fail('ceph osd new gave id %r' % osd_id)
        keyring = os.path.join(osd_dir, 'keyring')
        self._setup('ceph-authtool', '--create-keyring', keyring,
                    '--gen-key', '-n', 'osd.0')
        self.run('ceph', 'auth', 'add', 'osd.0', 'osd', 'allow *', 'mon',
                 'allow profile osd', '-i', keyring)
        self._setup('ceph-osd', '--conf', self.conf, '-i', '0', '--mkfs',
                    '--osd-uuid', self.osd_uuid, '--no-mon-config')
        self.start_osd()

    def osd_up(self):
        out = self.run('ceph', 'osd', 'dump', '--format', 'json',
                       timeout=10).stdout
        return any(o['up'] for o in json.loads(out)['osds'])

    def start_osd(self):
        """Start the OSD (again); wait until it serves every PG of the pool.

        Up in the OSD map is not enough: its PGs peer after that, and
        reads wait for them. Listing the pool reads from every PG.
        """
        self.osd_proc = self._daemon(['ceph-osd', '-i', '0'], 'osd.out')
        self._wait('OSD up', self.osd_up)
        if self.pool_created:
            self._wait('pool %s readable' % POOL, lambda: self.run(
                'rados', '--pool', POOL, 'ls', '--rados-osd-op-timeout',
                '5', check=False, timeout=20).returncode == 0)

    def kill_osd(self):
        """The OSD dies: reads of the cluster's data wait or time out."""
        if self.osd_proc is not None and self.osd_proc.poll() is None:
            os.killpg(self.osd_proc.pid, signal.SIGKILL)
            self.osd_proc.wait(30)

    def stop(self):
        for p in (self.osd_proc, self.proc):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in (self.osd_proc, self.proc):
            if p is not None:
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(10)
        self.osd_proc = self.proc = None
        kill_tagged(lambda tag: tag == self.tag, var=self.owner_var)

    def tail(self):
        return log_tail(self.log_files())

    # -- Glance's RBD store -----------------------------------------------

    def glance_config(self):
        """glance-api.conf sections of an RBD store on this cluster.

        ``show_image_direct_url`` is how hosts (Nova's RBD backend, and
        VMAR's) learn where an image is in Ceph.
        """
        return {'DEFAULT': {'enabled_backends': 'ceph:rbd',
                            'show_image_direct_url': True},
                'glance_store': {'default_backend': 'ceph'},
                'ceph': {'rbd_store_pool': POOL,
                         'rbd_store_user': 'glance',
                         'rbd_store_ceph_conf': self.conf,
                         'rbd_store_chunk_size': 8}}

    def python_path(self):
        """A directory holding only Debian's Ceph bindings (rados, rbd).

        glance_store's RBD driver imports them; they come as Debian
        packages for the system's Python, which the virtualenv is made
        from.
        """
        d = os.path.join(self.work_dir, 'pylib')
        os.makedirs(d, exist_ok=True)
        src = '/usr/lib/python3/dist-packages'
        for name in os.listdir(src):
            if name.split('.')[0] in ('rados', 'rbd') and name.endswith(
                    '.so') and not os.path.exists(os.path.join(d, name)):
                os.symlink(os.path.join(src, name), os.path.join(d, name))
        return d
