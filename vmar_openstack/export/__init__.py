"""The export service of a compute host: ``vmar-export``.

It owns one patched ``qemu-storage-daemon`` per host and, through QMP (the
``qemu.qmp`` library), keeps in it:

* one read-only ``file`` node per base image file, named ``vb<id>`` (buffered,
  the host-cache-for-base policy) or ``vd<id>`` (O_DIRECT, for images
  exported with ``host_cache=none``), where ``<id>`` is the image UUID in 22
  characters of base64url; base nodes are shared by every VMAR node that
  reads from them and deleted when the last one goes;
* one ``vmar`` node per exported image, reading its map;
* one NBD export per image, named by the image id, on the unix socket
  ``[vmar] export_socket``.

The set of exports is persisted in ``<host_dir>/exports.json`` (written
atomically, under a file lock). ``vmar-export serve`` supervises the daemon:
when it dies it is restarted and every export is restored before the NBD
socket appears again, so a reconnecting client never finds a missing export.

Maps and base files come from the configured map source
(:mod:`vmar_openstack.mapsource`) and are copied into ``[vmar] host_dir``, a
vmar-owned directory that Nova's image cache manager never touches.
"""

import asyncio
import base64
import contextlib
import dataclasses
import fcntl
import grp
import json
import os
import signal
import subprocess
import time
import uuid

from oslo_log import log as logging
from qemu.qmp import QMPClient
from qemu.qmp import QMPError

from vmar_openstack import fileutils
from vmar_openstack import mapformat
from vmar_openstack import mapsource

LOG = logging.getLogger(__name__)

HOST_CACHE = ('base', 'none')


class ExportError(RuntimeError):
    """An export cannot be created, restored or removed."""


def b64id(image_id):
    return base64.urlsafe_b64encode(
        uuid.UUID(image_id).bytes).decode().rstrip('=')


def base_node(image_id, host_cache):
    return ('vb' if host_cache == 'base' else 'vd') + b64id(image_id)


def vmar_node(image_id, version):
    # node names are at most 31 characters: 'vm' + 22 + '.' + 6 digits
    return 'vm%s.%d' % (b64id(image_id), version)


def export_name(image_id, version):
    """The NBD export name of one map version of an image."""
    return '%s.%d' % (image_id, version)


def export_id(name):
    """QMP ids must start with a letter; the NBD name is the bare name."""
    return 'vmar-' + name


def nbd_uri(name, socket):
    return 'nbd+unix:///%s?socket=%s' % (name, socket)


# -- persistent state -----------------------------------------------------

MAX_MAP_VERSION = 999999


@dataclasses.dataclass
class Export:
    """One map version of one image, served as NBD export ``name``.

    Exports are immutable: a new map version of an image is a new export
    next to the old one, which stays until its last holder (a running
    instance) lets it go.
    """
    image_id: str
    map_version: int
    host_cache: str
    holders: list
    targets: list          # [(image_id, size)]

    @property
    def name(self):
        return export_name(self.image_id, self.map_version)


class State:
    """``exports.json`` under an exclusive lock while in use."""

    def __init__(self, host_dir):
        self.host_dir = host_dir
        self.path = os.path.join(host_dir, 'exports.json')
        self.exports = {}
        self._lockf = None

    def __enter__(self):
        os.makedirs(self.host_dir, exist_ok=True)
        self._lockf = open(os.path.join(self.host_dir, 'exports.lock'), 'a')
        fcntl.flock(self._lockf, fcntl.LOCK_EX)
        try:
            with open(self.path) as f:
                raw = json.load(f)
        except FileNotFoundError:
            raw = {'exports': {}}
        exports = [Export(v['image_id'], v['map_version'], v['host_cache'],
                          v['holders'], [tuple(t) for t in v['targets']])
                   for v in raw['exports'].values()]
        self.exports = {e.name: e for e in exports}
        return self

    def save(self):
        data = {'exports': {k: dataclasses.asdict(v)
                            for k, v in sorted(self.exports.items())}}
        fileutils.write_atomic(self.path, json.dumps(
            data, indent=1, sort_keys=True).encode())

    def __exit__(self, *exc):
        fcntl.flock(self._lockf, fcntl.LOCK_UN)
        self._lockf.close()


# -- QMP ------------------------------------------------------------------

class Monitor:
    """A synchronous face on ``qemu.qmp.QMPClient``."""

    def __init__(self, path, timeout=30):
        self.path = path
        self.timeout = timeout
        self._loop = asyncio.new_event_loop()
        self._qmp = QMPClient('vmar-export')
        self._run(self._qmp.connect(path))

    def _run(self, coro):
        return self._loop.run_until_complete(
            asyncio.wait_for(coro, self.timeout))

    def execute(self, cmd, args=None):
        try:
            return self._run(self._qmp.execute(cmd, args or {}))
        except QMPError as e:
            raise ExportError('%s failed: %s' % (cmd, e))

    def close(self):
        with contextlib.suppress(Exception):
            self._run(self._qmp.disconnect())
        self._loop.close()


class _Adopted:
    """A daemon this process did not start: poll it through /proc."""

    def __init__(self, pid):
        self.pid = pid
        self.returncode = None

    def poll(self):
        if self.returncode is None and not os.path.exists(
                '/proc/%d' % self.pid):
            self.returncode = -1
        return self.returncode

    def wait(self, timeout=None):
        deadline = time.monotonic() + (timeout or 1e9)
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired('qemu-storage-daemon',
                                                timeout)
            time.sleep(0.05)
        return self.returncode

    def kill(self):
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


# -- the service ----------------------------------------------------------

class ExportService:

    def __init__(self, conf, source=None):
        self.conf = conf
        c = conf.vmar
        self.host_dir = c.host_dir
        self.socket = c.export_socket
        self.qmp_socket = os.path.join(c.host_dir, 'qsd-qmp.sock')
        self.pid_file = os.path.join(c.host_dir, 'qsd.pid')
        self.source = source or mapsource.get_source(conf)
        if (c.map_source == 'dir' and os.path.realpath(c.map_source_dir)
                == os.path.realpath(c.host_dir)):
            # host_dir is pruned of unreferenced files: never the library
            raise ExportError('[vmar] host_dir must not be map_source_dir')

    # paths
    def map_file(self, image_id, version):
        return os.path.join(self.host_dir, 'maps', '%s.%d.vmap'
                            % (image_id, version))

    def base_file(self, image_id):
        return os.path.join(self.host_dir, 'bases', image_id)

    # fetching
    @staticmethod
    def _fetch(func, *args):
        try:
            return func(*args)
        except mapsource.SourceError as e:
            raise ExportError(str(e))

    def _ensure_files(self, image_id, version):
        path = self.map_file(image_id, version)
        if not os.path.exists(path):
            self._fetch(self.source.fetch_map, image_id, version, path)
        try:
            bmap = mapformat.read(path)
        except mapformat.MapFormatError as e:
            os.unlink(path)
            raise ExportError('map v%d of %s rejected: %s'
                              % (version, image_id, e))
        if bmap.image_id != image_id or bmap.map_version != version:
            raise ExportError('map file %s describes %s v%d'
                              % (path, bmap.image_id, bmap.map_version))
        for t in bmap.targets:
            base = self.base_file(t.image_id)
            if not os.path.exists(base):
                self._fetch(self.source.fetch_base, t.image_id, base)
            size = os.path.getsize(base)
            if size != t.size:
                raise ExportError('base %s is %d bytes, map v%d of %s says '
                                  '%d' % (t.image_id, size, version,
                                          image_id, t.size))
        return bmap

    # QMP state of the daemon
    def _nodes(self, mon):
        return {n['node-name'] for n in mon.execute('query-named-block-nodes',
                                                    {'flat': True})}

    def _add_to_daemon(self, mon, exp, nodes):
        for tid, _size in exp.targets:
            name = base_node(tid, exp.host_cache)
            if name in nodes:
                continue
            mon.execute('blockdev-add', {
                'driver': 'file', 'node-name': name,
                'filename': self.base_file(tid), 'read-only': True,
                'cache': {'direct': exp.host_cache == 'none'},
                'aio': self._aio(exp.host_cache)})
            nodes.add(name)
        name = vmar_node(exp.image_id, exp.map_version)
        if name not in nodes:
            mon.execute('blockdev-add', {
                'driver': 'vmar', 'node-name': name, 'read-only': True,
                'file': {'driver': 'file', 'read-only': True,
                         'filename': self.map_file(exp.image_id,
                                                   exp.map_version)},
                'base-node-prefix': 'vb' if exp.host_cache == 'base'
                else 'vd',
                'gather-gap': self.conf.vmar.read_gather_gap})
            nodes.add(name)

    def _aio(self, host_cache):
        aio = self.conf.vmar.base_aio
        if aio == 'native' and host_cache != 'none':
            return 'threads'    # Linux AIO needs O_DIRECT
        return aio

    def _export_to_daemon(self, mon, exp):
        exports = {e['id'] for e in mon.execute('query-block-exports')}
        if export_id(exp.name) not in exports:
            mon.execute('block-export-add', {
                'type': 'nbd', 'id': export_id(exp.name),
                'node-name': vmar_node(exp.image_id, exp.map_version),
                'name': exp.name, 'writable': False})

    def _gc_nodes(self, mon, state):
        """Delete base nodes that no export references any more."""
        wanted = set()
        for exp in state.exports.values():
            wanted.add(vmar_node(exp.image_id, exp.map_version))
            for tid, _size in exp.targets:
                wanted.add(base_node(tid, exp.host_cache))
        # vmar nodes first: they hold the base nodes
        for kinds in (('vm',), ('vb', 'vd')):
            for name in sorted(self._nodes(mon)):
                if name[:2] in kinds and name not in wanted:
                    mon.execute('blockdev-del', {'node-name': name})

    def _prune_files(self, state):
        """Delete maps and bases that no export references any more.

        A base file stays while any export's map reads from it, whatever
        happened to its image elsewhere (deleted in Glance, say).
        """
        maps = {os.path.basename(self.map_file(e.image_id, e.map_version))
                for e in state.exports.values()}
        bases = {tid for e in state.exports.values() for tid, _s in e.targets}
        for sub, keep in (('maps', maps), ('bases', bases)):
            d = os.path.join(self.host_dir, sub)
            for name in os.listdir(d) if os.path.isdir(d) else ():
                if name not in keep and not name.startswith('.'):
                    LOG.info('deleting unreferenced %s/%s', sub, name)
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(d, name))

    def monitor(self):
        try:
            return Monitor(self.qmp_socket)
        except (OSError, asyncio.TimeoutError, QMPError) as e:
            raise ExportError('the export daemon is not running (%s); start '
                              '"vmar-export serve"' % e)

    # public operations
    def uri(self, exp):
        """The NBD URI a QEMU client opens for ``exp`` (format raw)."""
        return nbd_uri(exp.name, self.socket)

    def add(self, image_id, host_cache='base', holder='cli', version=None):
        """Export a map version of an image (the current one by default).

        Idempotent per holder. Returns the :class:`Export`.
        """
        image_id = str(uuid.UUID(image_id))
        if host_cache not in HOST_CACHE:
            raise ExportError('host_cache must be one of %s'
                              % ', '.join(HOST_CACHE))
        if version is None:
            version = self._fetch(self.source.current_version, image_id)
        if not 0 < version <= MAX_MAP_VERSION:
            raise ExportError('map version %r out of range' % (version,))
        with State(self.host_dir) as state:
            exp = state.exports.get(export_name(image_id, version))
            if exp is not None and exp.host_cache != host_cache:
                raise ExportError('image %s v%d is exported with '
                                  'host_cache=%s' % (image_id, version,
                                                     exp.host_cache))
            if exp is None:
                bmap = self._ensure_files(image_id, version)
                exp = Export(image_id, version, host_cache, [],
                             [(t.image_id, t.size) for t in bmap.targets])
            mon = self.monitor()
            try:
                self._add_to_daemon(mon, exp, self._nodes(mon))
                self._export_to_daemon(mon, exp)
            finally:
                mon.close()
            if holder not in exp.holders:
                exp.holders.append(holder)
            state.exports[exp.name] = exp
            state.save()
        return exp

    def remove(self, image_id, holder='cli', version=None):
        """Drop ``holder``'s reference on the exports of an image.

        Only the given map version if ``version`` is set. An export goes
        with its last holder, and files with the last export reading them.
        Returns the exports that remain (with their holders).
        """
        image_id = str(uuid.UUID(image_id))
        with State(self.host_dir) as state:
            mine = [e for e in state.exports.values()
                    if e.image_id == image_id
                    and (version is None or e.map_version == version)]
            if not mine:
                raise ExportError('image %s is not exported' % image_id)
            if not any(holder in e.holders for e in mine):
                raise ExportError('%s holds no export of image %s'
                                  % (holder, image_id))
            return self._drop(state, mine, holder)

    def release(self, holder):
        """Drop every reference ``holder`` has (an instance was deleted)."""
        with State(self.host_dir) as state:
            held = [e for e in state.exports.values() if holder in e.holders]
            if held:
                self._drop(state, held, holder)
            return [e.name for e in held]

    def holders(self):
        """holder -> names of the exports it holds."""
        with State(self.host_dir) as state:
            out = {}
            for e in state.exports.values():
                for h in e.holders:
                    out.setdefault(h, []).append(e.name)
            return out

    def _drop(self, state, exports, holder):
        gone = []
        for exp in exports:
            if holder in exp.holders:
                exp.holders.remove(holder)
            if not exp.holders:
                gone.append(exp)
        if gone:
            mon = self.monitor()
            try:
                live = {e['id'] for e in mon.execute('query-block-exports')}
                for exp in gone:
                    if export_id(exp.name) in live:
                        mon.execute('block-export-del',
                                    {'id': export_id(exp.name)})
                for exp in gone:
                    self._wait_export_gone(mon, exp.name)
                    del state.exports[exp.name]
                self._gc_nodes(mon, state)
            finally:
                mon.close()
            self._prune_files(state)
        state.save()
        return [e for e in exports if e.holders]

    def _wait_export_gone(self, mon, name, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if export_id(name) not in {e['id'] for e in mon.execute(
                    'query-block-exports')}:
                return
            time.sleep(0.05)
        raise ExportError('export %s still has clients after %ds'
                          % (name, timeout))

    def list(self):
        """(name -> Export, set of live names or None if the daemon is down)"""
        with State(self.host_dir) as state:
            exports = dict(state.exports)
        try:
            mon = Monitor(self.qmp_socket, timeout=5)
        except (OSError, asyncio.TimeoutError, QMPError):
            live = None
        else:
            try:
                live = {e['id'][len('vmar-'):] for e in mon.execute(
                    'query-block-exports')}
            finally:
                mon.close()
        return exports, live

    # supervision
    def _running_daemon(self):
        """A daemon left by an earlier ``serve`` that still answers QMP."""
        try:
            with open(self.pid_file) as f:
                pid = int(f.read().strip())
            with open('/proc/%d/cmdline' % pid, 'rb') as f:
                if b'qemu-storage-daemon' not in f.read():
                    return None
        except (OSError, ValueError):
            return None
        try:
            Monitor(self.qmp_socket, timeout=5).close()
        except (OSError, asyncio.TimeoutError, QMPError):
            return None
        return _Adopted(pid)

    def _start_daemon(self):
        c = self.conf.vmar
        os.makedirs(self.host_dir, exist_ok=True)
        adopted = self._running_daemon()
        if adopted:
            LOG.info('adopting running qemu-storage-daemon %d', adopted.pid)
            return adopted
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.qmp_socket)
        cmd = [c.qemu_storage_daemon,
               '--chardev', 'socket,id=qmp0,path=%s,server=on,wait=off'
               % self.qmp_socket,
               '--monitor', 'chardev=qmp0', '--pidfile', self.pid_file]
        log = open(os.path.join(self.host_dir, 'qsd.log'), 'ab')
        proc = subprocess.Popen(cmd, stdout=log, stderr=log,
                                stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + 30
        while not os.path.exists(self.qmp_socket):
            if proc.poll() is not None:
                raise ExportError('%s exited with %d; see %s/qsd.log'
                                  % (c.qemu_storage_daemon, proc.returncode,
                                     self.host_dir))
            if time.monotonic() > deadline:
                proc.kill()
                raise ExportError('qemu-storage-daemon did not start')
            time.sleep(0.02)
        return proc

    def _nbd_running(self, mon):
        """Whether an adopted daemon already serves NBD."""
        try:
            mon.execute('nbd-server-start', {
                'addr': {'type': 'unix', 'data': {
                    'path': self.socket + '.probe'}}})
        except ExportError as e:
            if 'already running' in str(e):
                return True
            raise
        mon.execute('nbd-server-stop')
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket + '.probe')
        return False

    def restore(self):
        """Re-create every persisted export, then publish the NBD socket."""
        tmp_sock = self.socket + '.starting'
        with State(self.host_dir) as state:
            mon = self.monitor()
            try:
                nodes = self._nodes(mon)
                for exp in state.exports.values():
                    self._ensure_files(exp.image_id, exp.map_version)
                    self._add_to_daemon(mon, exp, nodes)
                os.makedirs(os.path.dirname(self.socket), exist_ok=True)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp_sock)
                if not self._nbd_running(mon):
                    mon.execute('nbd-server-start', {
                        'addr': {'type': 'unix',
                                 'data': {'path': tmp_sock}}})
                else:
                    tmp_sock = None
                for exp in state.exports.values():
                    self._export_to_daemon(mon, exp)
            finally:
                mon.close()
        if tmp_sock:
            group = self.conf.vmar.export_socket_group
            if group:
                os.chown(tmp_sock, -1, grp.getgrnam(group).gr_gid)
            os.chmod(tmp_sock, 0o660)
            os.rename(tmp_sock, self.socket)
        LOG.info('restored %d exports on %s', len(state.exports), self.socket)
        return len(state.exports)

    def serve(self, stop_event=None, max_backoff=10):
        """Run and supervise the daemon until SIGTERM/SIGINT."""
        stopping = []

        def _stop(signum, frame):
            stopping.append(signum)
        if stop_event is None:
            signal.signal(signal.SIGTERM, _stop)
            signal.signal(signal.SIGINT, _stop)
        backoff = 0.5
        while not stopping and not (stop_event and stop_event.is_set()):
            started = time.monotonic()
            proc = self._start_daemon()
            try:
                self.restore()
            except ExportError as e:
                LOG.error('restoring exports failed: %s', e)
                proc.kill()
                proc.wait()
                time.sleep(backoff)
                backoff = min(max_backoff, backoff * 2)
                continue
            while proc.poll() is None:
                if stopping or (stop_event and stop_event.is_set()):
                    self._quit(proc)
                    break
                time.sleep(0.1)
            else:
                LOG.error('qemu-storage-daemon exited with %d; restarting',
                          proc.returncode)
                if time.monotonic() - started > 30:
                    backoff = 0.5
                else:
                    time.sleep(backoff)
                    backoff = min(max_backoff, backoff * 2)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket)

    def _quit(self, proc):
        with contextlib.suppress(ExportError, OSError):
            mon = self.monitor()
            try:
                mon.execute('quit')
            except ExportError:
                pass
            finally:
                mon.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
