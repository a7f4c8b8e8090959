"""The export service: which exports a host has, and who holds them.

:class:`ExportService` keeps the record (:mod:`.exports.state`), the
files (:mod:`.exports.hostdir`) and the daemon (:mod:`.exports.graph`, over
:mod:`.exports.qmp`) in step.
It lives in ``vmar-export serve`` (:mod:`.daemon` wires it to its
threads), the one process that changes the host's exports; the host API
(:mod:`.api`) calls it from a thread per
connection. Each public operation runs under the state's in-process lock,
and the map source's I/O for one image outside it, so many callers can be
served at once.
"""

import contextlib
import functools
import os
import threading
import uuid

import numpy as np
from oslo_log import log as logging

from vmar_openstack import exception
from vmar_openstack import fileutils
from vmar_openstack.host.cache import prefetch
from vmar_openstack.host.exports import graph
from vmar_openstack.host.exports import hostdir
from vmar_openstack.host.exports import qmp
from vmar_openstack.host.exports import state as export_state
from vmar_openstack.host.peers import digests as peer_digests
from vmar_openstack.host.peers import source as peer_source
from vmar_openstack import mapformat
from vmar_openstack.mapformat import bootset as bootset_format
from vmar_openstack import mapsource
from vmar_openstack import names

LOG = logging.getLogger(__name__)


class ExportService:

    def __init__(self, conf, source=None):
        self.conf = conf
        c = conf.vmar_host
        self.host_dir = c.host_dir
        self.socket = c.export_socket
        self.qmp_socket = os.path.join(c.host_dir, 'qsd-qmp.sock')
        self.pid_file = os.path.join(c.host_dir, 'qsd.pid')
        self.source = source or mapsource.get_source(conf)
        self.files = hostdir.HostDir(
            c.host_dir, self.source, c.mirror_cache_gb << 30,
            peers=peer_digests.PeerDigests(
                conf, hostdir.Layout(c.host_dir).holders_file)
            if peer_source.enabled(conf) else None)
        # exports the last restore could not re-create (tried again)
        self.unrestored = 0
        # set while the daemon runs with every export it could restore
        self.ready = threading.Event()
        # the daemon's threads, while it serves (set by :mod:`..daemon`)
        self.guests = None      # guests.channels.Guests
        self.warm = None        # cache.warm.Warm
        self.discovery = None   # peers.discovery.Discovery
        self.reporter = None    # observe.report.Reporter
        # base id -> bytes_fetched of its mirror node when last counted
        self._fills_seen = {}
        if (c.map_source == 'dir' and os.path.realpath(c.map_source_dir)
                == os.path.realpath(c.host_dir)):
            # host_dir is pruned of unreferenced files: never the library
            raise exception.ExportError(
                '[vmar_host] host_dir must not be map_source_dir')

    # paths
    def map_file(self, image_id, version):
        return self.files.map_file(image_id, version)

    def base_file(self, image_id):
        return self.files.base_file(image_id)

    def monitor(self, timeout=30):
        """An open :class:`.qmp.Monitor` of the daemon (a context manager).

        :raises ExportDaemonDown: the daemon does not answer.
        """
        return qmp.Monitor(self.qmp_socket, timeout=timeout)

    def aio(self, host_cache):
        """The aio mode of the base nodes of an export."""
        aio = self.conf.vmar_host.base_aio
        if aio == 'native' and host_cache != 'none':
            return 'threads'    # Linux AIO needs O_DIRECT
        return aio

    def lazy(self, host_cache):
        """Whether an export's missing bases become mirrors, not copies.

        Mirrors are read through the host page cache: an O_DIRECT export
        (host_cache=none) copies whole bases.
        """
        return (self.conf.vmar_host.base_fetch == 'lazy'
                and host_cache == 'base')

    def base_spec(self, image_id, host_cache):
        """The blockdev-add options of a base node, but its name."""
        aio = self.aio(host_cache)
        if host_cache == 'base' and self.files.is_mirror(image_id):
            children = [n for n, _spec, child
                        in self.fetch_nodes(image_id, host_cache) if child]
            if not children:
                raise exception.ExportError(
                    'mirror of %s: nothing to fetch its blocks from (no '
                    'reader of it, no alternate)' % image_id)
            return graph.mirror_options(
                image_id, self.files.mirror(image_id),
                self.conf.vmar_host.mirror_readahead, aio, children)
        return graph.whole_base_options(self.base_file(image_id),
                                        host_cache == 'none', aio)

    def fetch_nodes(self, image_id, host_cache):
        """``(name, blockdev-add options, child)`` of a mirror's sources.

        In the order its fetch quorum tries them: the host's peer fetcher
        when it reads from peers (peers first, store last), the reader of
        the base's own data, then each alternate (a ``vmar`` node over the
        reader of an image holding blocks of the base), each after the
        reader it reads. ``child``: the quorum reads it. Empty if not a
        mirror.
        """
        if not (host_cache == 'base' and self.files.is_mirror(image_id)):
            return []
        out = []
        if peer_source.enabled(self.conf):
            peers = peer_source.reader(self.conf, image_id,
                                       self.files.mirror_size(image_id))
            out.append((graph.peer_node(image_id),
                        graph.reader_options(peers), True))
        if self.files.has_reader(image_id):
            out.append((graph.fetch_node(image_id),
                        graph.reader_options(self.files.reader(image_id)),
                        True))
        for alt in self.files.alternates(image_id):
            reader = graph.fetch_node(alt.image_id)
            out.append((reader,
                        graph.reader_options(self.files.reader(alt.image_id)),
                        False))
            out.append((graph.alt_node(image_id, alt.image_id, alt.version),
                        graph.alternate_options(alt.path, reader), True))
        return out

    def _add_nodes(self, mon, exp, have):
        for tid, _size in exp.targets:
            if graph.base_node(tid, exp.host_cache) not in have:
                # a new node's counters start at zero
                self._fills_seen.pop(tid, None)
        graph.add_nodes(mon, exp, have, self.map_file, self.base_spec,
                        self.conf.vmar_host.read_gather_gap, self.fetch_nodes,
                        self._record_window)

    def _record_window(self, exp):
        """Seconds a new vmar node of ``exp`` records its reads.

        While the image has no recorded boot working set and this host has
        not sent one: the boot of the first server is the set.
        """
        window = self.conf.vmar_host.bootset_record_window
        if not (window and self.lazy(exp.host_cache)):
            return 0
        if self.files.bootset_source(exp.image_id) == 'recorded' or \
                self.files.bootset_sent(exp.image_id):
            return 0
        return window

    def recorded_bootsets(self):
        """The boot working sets vmar nodes recorded and nobody sent.

        Yields ``(image id, file bytes, done)`` (see
        :func:`.report.start`); ``done()`` marks the set sent.
        """
        with export_state.State(self.host_dir) as state:
            exports = {graph.vmar_node(e.image_id, e.map_version): e
                       for e in state.exports.values()}
        try:
            with self.monitor(timeout=5) as mon:
                found = graph.recorded(mon)
        except exception.ExportDaemonDown:
            return
        for node, bits in sorted(found.items()):
            exp = exports.get(node)
            if exp is None or self.files.bootset_sent(exp.image_id):
                continue
            try:
                bmap = mapformat.read(self.map_file(exp.image_id,
                                                    exp.map_version))
            except (OSError, exception.MapFormatError) as e:
                LOG.warning('recorded boot working set of %s dropped: %s',
                            node, e)
                continue
            blocks = np.flatnonzero(np.unpackbits(
                np.frombuffer(bits, dtype=np.uint8),
                bitorder='little')[:bmap.n_blocks])
            if not len(blocks):
                continue
            data = bootset_format.encode(bootset_format.Bootset(
                exp.image_id, bmap.virtual_size, bmap.block_size,
                'recorded', tuple(bootset_format.merge(blocks.tolist()))))
            yield (exp.image_id, data,
                   functools.partial(self.files.mark_bootset_sent,
                                     exp.image_id))

    def wait_ready(self, timeout=60):
        """Wait until the daemon is up with its exports restored.

        :raises ExportDaemonDown: not within ``timeout`` seconds (the
            daemon keeps failing to start: see its log).
        """
        if not self.ready.wait(timeout):
            raise exception.ExportDaemonDown(
                reason='qemu-storage-daemon not restored within %d s; see '
                '%s/qsd.log' % (timeout, self.host_dir))

    def virtual_size(self, exp):
        """The virtual size of an exported image, from its map."""
        return mapformat.read(self.map_file(exp.image_id,
                                            exp.map_version)).virtual_size

    # public operations
    def uri(self, exp, holder='cli'):
        """The NBD URI ``holder``'s QEMU opens for ``exp`` (format raw)."""
        return names.nbd_uri(exp.holder_name(holder), self.socket)

    def add(self, image_id, host_cache='base', holder='cli', version=None,
            key=None, whole=False):
        """Export a map version of an image (the current one by default).

        Idempotent per holder. A new holder gets a new key (the secret part
        of the name its QEMU opens) unless ``key`` gives it the one its
        overlay already names. ``whole``: the image is about to be deleted
        from the source: before this returns, the host holds every block
        its map reads from the image itself (the blocks no other image
        holds): on a lazy host those blocks are read into its mirror, not
        the whole image copied; elsewhere the image's base is copied.
        Returns the :class:`.state.Export`.
        """
        image_id = str(uuid.UUID(image_id))
        if host_cache not in export_state.HOST_CACHE:
            raise exception.ExportError(
                'host_cache must be one of %s'
                % ', '.join(export_state.HOST_CACHE))
        if version is None:
            version = self.files.fetch(self.source.current_version,
                                       image_id)
        if not 0 < version <= names.MAX_MAP_VERSION:
            raise exception.ExportError('map version %r out of range'
                                        % (version,))
        with export_state.State(self.host_dir) as state:
            known = _existing(state, image_id, version, host_cache)
        own_blocks = (whole and self.lazy(host_cache)
                      and self.files.can_mirror())
        with contextlib.ExitStack() as held:
            # the map source's I/O, outside the host-wide state lock: other
            # images' exports go on meanwhile
            ask = (known is None and self.discovery is not None
                   and self.lazy(host_cache))
            bmap, fetched = self.files.ensure(
                image_id, version, self.lazy(host_cache), hold=held,
                whole=(image_id,) if whole and not own_blocks else (),
                # who holds its mirrors' blocks, before the first reads
                # and the digest lists
                on_map=self._ask_holders if ask else None)
            boot = (self.conf.vmar_host.prefetch and self.lazy(host_cache)
                    and known is None
                    and self.files.ensure_bootset(image_id))
            if self.conf.vmar_host.warm_metadata_mb and host_cache == 'base':
                self.files.ensure_layout(image_id)
            with export_state.State(self.host_dir) as state:
                new = _existing(state, image_id, version, host_cache) is None
                exp = self._add(state, bmap, fetched, host_cache, holder,
                                key)
                if new and boot:
                    prefetch.request(self.host_dir, exp.name)
                if new and self.lazy(host_cache) and self.conf.vmar_host.fill:
                    prefetch.request_fill(self.host_dir, exp.name,
                                          self.conf.vmar_host.fill_delay)
                if new:
                    self._changed()
            if own_blocks and self.files.is_mirror(image_id):
                prefetch.Prefetcher(self).fill(exp.name, only=image_id)
            return exp

    def _changed(self):
        """Exports were added or removed: the threads that follow them."""
        for thread in (self.warm, self.reporter):
            if thread:
                thread.changed()

    def _ask_holders(self, bmap):
        """Ask vmar-agent who holds the bases ``bmap`` reads lazily."""
        self.discovery.ensure(t.image_id for t in bmap.targets
                              if not self.files.is_whole(t.image_id))

    def digest_list(self, image_id, version):
        """The path of an image's digest list, fetched if missing.

        The host must hold map v``version`` of the image (a server's).
        """
        image_id = str(uuid.UUID(image_id))
        with contextlib.ExitStack() as held:
            self.files.hold(image_id, held)
            try:
                bmap = mapformat.read(self.map_file(image_id, version))
            except (OSError, exception.MapFormatError) as e:
                raise exception.ExportError(
                    'map v%s of %s is not on this host: %s'
                    % (version, image_id, e))
            return self.files.ensure_digests(
                mapformat.Target(image_id, bmap.virtual_size))

    def _add(self, state, bmap, fetched, host_cache, holder, key):
        image_id, version = bmap.image_id, bmap.map_version
        exp = _existing(state, image_id, version, host_cache)
        if exp is None:
            state.fetched.add(fetched)
            exp = export_state.Export(
                image_id, version, host_cache, [],
                [(t.image_id, t.size) for t in bmap.targets],
                fetches=len(fetched),
                fetched_bytes=sum(f.size for f in fetched))
        before = set(exp.nbd_names())
        if holder not in exp.holders:
            exp.holders.append(holder)
            exp.keys[holder] = key or names.new_key()
        elif key:
            exp.keys[holder] = key
        with self.monitor() as mon:
            self._add_nodes(mon, exp, graph.nodes(mon))
            graph.add_export(mon, exp)
            graph.del_names(mon, sorted(before - set(exp.nbd_names())))
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
        with export_state.State(self.host_dir) as state:
            mine = [e for e in state.exports.values()
                    if e.image_id == image_id
                    and (version is None or e.map_version == version)]
            if not mine:
                raise exception.ExportError('image %s is not exported'
                                            % image_id)
            if not any(holder in e.holders for e in mine):
                raise exception.ExportError('%s holds no export of image %s'
                                            % (holder, image_id))
            return self._drop(state, mine, holder)

    def release(self, holder):
        """Drop every reference ``holder`` has (an instance was deleted)."""
        with export_state.State(self.host_dir) as state:
            held = [e for e in state.exports.values() if holder in e.holders]
            if held:
                self._drop(state, held, holder)
            return [e.name for e in held]

    def holders(self):
        """holder -> names of the exports it holds."""
        with export_state.State(self.host_dir) as state:
            out = {}
            for e in state.exports.values():
                for h in e.holders:
                    out.setdefault(h, []).append(e.name)
            return out

    def _count_fills(self, state, mon):
        """Add what mirror nodes fetched since the last count to ``state``.

        Returns whether anything was added (the caller saves). What a node
        fetched after the last count is lost if the daemon dies before
        the next one: the supervisor counts every few seconds.
        """
        added = False
        for base_id, n in graph.mirror_fetched(mon).items():
            seen = self._fills_seen.get(base_id, 0)
            if n < seen:        # reopened since: its counter started anew
                seen = 0
            if n > seen:
                state.fetched.add_fill(base_id, n - seen)
                added = True
            self._fills_seen[base_id] = n
        return added

    def count_fills(self):
        """Count mirror fills into the record (the supervisor's loop)."""
        with export_state.State(self.host_dir) as state:
            try:
                with self.monitor(timeout=5) as mon:
                    if self._count_fills(state, mon):
                        state.save()
            except exception.ExportDaemonDown:
                pass

    def _drop(self, state, exports, holder):
        stale, gone = [], []
        for exp in exports:
            before = set(exp.nbd_names())
            if holder in exp.holders:
                exp.holders.remove(holder)
                exp.keys.pop(holder, None)
            stale += sorted(before - set(exp.nbd_names()))
            if not exp.holders:
                gone.append(exp)
        if gone:
            with self.monitor() as mon:
                self._count_fills(state, mon)   # before nodes go
                graph.del_names(mon, stale)
                for exp in gone:
                    del state.exports[exp.name]
                graph.del_unused_nodes(mon, state.exports.values(),
                                       self.fetch_nodes)
            self.files.prune(state.exports.values())
            self._changed()
        elif stale:
            # other holders keep the node: only the holder's own NBD export
            # goes, and a daemon that is down will not restore it anyway
            try:
                with self.monitor() as mon:
                    graph.del_names(mon, stale)
            except exception.ExportDaemonDown as e:
                LOG.info('export daemon down (%s): %s goes with the record '
                         'only', e, ', '.join(stale))
        state.save()
        return [e for e in exports if e.holders]

    def list(self):
        """(name -> Export, set of live names or None if the daemon is down)"""
        with export_state.State(self.host_dir) as state:
            exports = dict(state.exports)
        try:
            with self.monitor(timeout=5) as mon:
                live = graph.exported(mon)
        except exception.ExportDaemonDown:
            live = None
        return exports, live

    def snapshot(self):
        """What :mod:`.status` reports, read under the state lock.

        Returns the exports, the fetch totals, and the read counters of
        each served export (None if the daemon is down).
        """
        with export_state.State(self.host_dir) as state:
            exports, fetched = dict(state.exports), state.fetched
            try:
                with self.monitor(timeout=5) as mon:
                    live = graph.exported(mon)
                    counters = graph.read_counters(mon)
                    if self._count_fills(state, mon):
                        state.save()
            except exception.ExportDaemonDown:
                live = counters = None
        if counters is not None:
            counters = {name: counters.get(graph.vmar_node(
                e.image_id, e.map_version)) for name, e in exports.items()
                if e.served(live)}
        return exports, fetched, counters

    def restore(self):
        """Re-create every persisted export, then publish the NBD socket.

        Idempotent. An export that cannot be re-created now (its map
        source is unreachable and it needs it: a base to copy, a qcow2
        header to read) does not hold back the others; it is counted in
        :attr:`unrestored` and re-created by a later call. Returns the
        number of exports served.
        """
        tmp_sock = self.socket + '.starting'
        with export_state.State(self.host_dir) as state:
            recorded = list(state.exports.values())
        with contextlib.ExitStack() as held:
            # the map source's I/O, outside the state lock
            prepared = {}     # name -> Fetches, None: not restored yet
            for exp in recorded:
                try:
                    prepared[exp.name] = self.files.ensure(
                        exp.image_id, exp.map_version,
                        self.lazy(exp.host_cache), hold=held)[1]
                except exception.ExportError as e:
                    prepared[exp.name] = None
                    LOG.error('export of %s v%d not restored yet: %s',
                              exp.image_id, exp.map_version, e)
            return self._restore(prepared, tmp_sock)

    def _restore(self, prepared, tmp_sock):
        with export_state.State(self.host_dir) as state:
            with self.monitor() as mon:
                have = graph.nodes(mon)
                refetched = False
                ready = []
                for exp in state.exports.values():
                    if exp.name in prepared and prepared[exp.name] is None:
                        continue
                    try:
                        fetched = prepared.get(exp.name)
                        if fetched is None:     # recorded since
                            fetched = self.files.ensure(
                                exp.image_id, exp.map_version,
                                self.lazy(exp.host_cache))[1]
                        state.fetched.add(fetched)
                        refetched = refetched or bool(fetched)
                        self._add_nodes(mon, exp, have)
                    except exception.ExportError as e:
                        LOG.error('export of %s v%d not restored yet: %s',
                                  exp.image_id, exp.map_version, e)
                    else:
                        ready.append(exp)
                os.makedirs(os.path.dirname(self.socket), exist_ok=True)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp_sock)
                if not graph.nbd_running(mon, self.socket):
                    graph.start_nbd(mon, tmp_sock)
                else:
                    tmp_sock = None
                for exp in ready:
                    graph.add_export(mon, exp)
            if refetched:
                state.save()
            self.unrestored = len(state.exports) - len(ready)
        if tmp_sock:
            fileutils.publish_socket(tmp_sock, self.socket,
                                     self.conf.vmar_host.export_socket_group)
        LOG.info('restored %d of %d exports on %s', len(ready),
                 len(state.exports), self.socket)
        if self.conf.vmar_host.fill:
            # exports of before an upgrade, or of while fill was off, and
            # fills cut off by the restart; a filled one reads nothing
            queued = prefetch.pending(self.host_dir)[1]
            for exp in ready:
                if self.lazy(exp.host_cache) and exp.name not in queued:
                    prefetch.request_fill(self.host_dir, exp.name,
                                          self.conf.vmar_host.fill_delay)
        return len(ready)

    def reload_config(self):
        """Take the new values of the mutable options (SIGHUP).

        Only options marked mutable change ([vmar_guest_cache]'s
        thresholds); oslo.config logs any other change, which needs a
        restart.
        """
        LOG.info('SIGHUP: reloading the configuration files')
        self.conf.mutate_config_files()


def _existing(state, image_id, version, host_cache):
    """The record of an export, None if new; its cache mode must match."""
    exp = state.exports.get(names.export(image_id, version))
    if exp is not None and exp.host_cache != host_cache:
        raise exception.ExportError(
            'image %s v%d is exported with host_cache=%s'
            % (image_id, version, exp.host_cache))
    return exp
