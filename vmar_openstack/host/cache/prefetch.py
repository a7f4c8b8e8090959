"""Prefetch of an image's boot working set into the host's mirrors.

When an image's first export on a lazy host is added and ``[vmar_host]
prefetch`` is on, :meth:`.service.ExportService.add` queues a request
(``host_dir/prefetch/<export name>``) once the image's boot working set
(:mod:`vmar_openstack.mapformat.bootset`) is on the host. ``vmar-export
serve`` works through the queue (:class:`Prefetcher`, polled by the
supervisor). The set is in the image's blocks; through the export's map
it becomes, for each mirrored base, the sorted canonical blocks the boot
will read there (:func:`base_ranges`: merged up to ``prefetch_gap``,
reads of at most ``prefetch_request`` bytes). Each base's ranges are
read with ``qemu-io`` through a short-lived read-only NBD export of the
base's mirror node, all queued at once (the NBD client keeps 16 in
flight), so each block lands once in the mirror, verified, and blocks
already there cost nothing. The reads stay below the image's vmar node:
they are no guest's reads. Guests do not wait for the prefetch; a guest
reading a block being prefetched waits for that one fetch (the mirror
driver's once-per-block rule).

A request survives a restart of ``serve`` (it is done again, cheaply); an
export removed meanwhile drops its request, and removing the last export
of a base cuts off a prefetch reading it. A prefetch that fails (the
store away) is logged and not tried again: the guest's own reads fetch
what it needs.

The *fill* of an export (``[vmar_host] fill``) reads every block its map
reads that its mirrors miss (their present bits): queued
(``host_dir/fill/<export name>``, due ``fill_delay`` seconds after the
image's first export was added, the file's mtime), one at a time, base by
base in offset order, with synchronous reads through QEMU's ``throttle``
filter (``fill_rate``) on the client side. Once done, the export's
guests no longer need the store: its image may be deleted from Glance,
its own blocks with it. A fill that fails is queued again at least a
minute later; one whose export is gone is dropped. ``restore`` queues
the fill of every lazy export that has none queued (a filled one then
reads nothing).
"""

import contextlib
import os
import subprocess
import threading
import time

import numpy as np
from oslo_log import log as logging

from vmar_openstack import exception
from vmar_openstack import fileutils
from vmar_openstack.host.exports import graph
from vmar_openstack.host.exports import state as export_state
from vmar_openstack import mapformat
from vmar_openstack.mapformat import alternate
from vmar_openstack.mapformat import bootset as bootset_format
from vmar_openstack.mapformat import mirror as mirror_format
from vmar_openstack import names

LOG = logging.getLogger(__name__)

_DIR = 'prefetch'
_FILL_DIR = 'fill'
# prefetches and fills at once per host
_WORKERS = 2
_FILL_WORKERS = 1
# bytes one qemu-io of a fill reads (its process, its NBD connection)
_FILL_BATCH = 256 << 20
# seconds at least before a failed fill is tried again
_FILL_RETRY = 60


def queue_dir(host_dir):
    return os.path.join(host_dir, _DIR)


def request(host_dir, export_name):
    """Queue a prefetch of an export (idempotent)."""
    fileutils.write_atomic(os.path.join(queue_dir(host_dir), export_name),
                           b'')


def fill_dir(host_dir):
    return os.path.join(host_dir, _FILL_DIR)


def request_fill(host_dir, export_name, delay):
    """Queue the fill of an export, due ``delay`` seconds from now.

    The due time is set before the request appears (a poll in between
    would find it due at once).
    """
    path = os.path.join(fill_dir(host_dir), export_name)
    tmp = fileutils.write_temp(path, b'')
    due = time.time() + delay
    os.utime(tmp, (due, due))
    fileutils.install(tmp, path)


def pending(host_dir):
    """What is queued: (export names to prefetch, {export name: fill due}).

    A fill's due time is seconds since the epoch; one past is running or
    about to.
    """
    def listing(d):
        try:
            return [n for n in os.listdir(d) if names.parse_export(n)]
        except FileNotFoundError:
            return []
    fills = {}
    for name in listing(fill_dir(host_dir)):
        with contextlib.suppress(FileNotFoundError):
            fills[name] = os.stat(os.path.join(fill_dir(host_dir),
                                               name)).st_mtime
    return set(listing(queue_dir(host_dir))), fills


def qemu_io(conf):
    """The patched build's qemu-io, next to its qemu-storage-daemon."""
    return os.path.join(os.path.dirname(conf.vmar_host.qemu_storage_daemon),
                        'qemu-io')


def base_ranges(bmap, bset, gap=0, limit=None):
    """What the boot working set ``bset`` reads through ``bmap``.

    Returns ``{target image id: [(offset, length)]}``: for each target the
    map reads from, the sorted byte ranges of the canonical blocks the
    set's image blocks are, merged up to ``gap`` bytes apart and split
    into reads of at most ``limit`` bytes. Zero blocks read nothing.
    """
    want = np.zeros(bmap.n_blocks, dtype=bool)
    for first, n in bset.extents:
        want[first:first + n] = True
    out = {}
    for i, t in enumerate(bmap.targets):
        base, image = alternate.block_pairs(bmap, i)
        blocks = np.unique(base[want[image]])
        if len(blocks):
            runs = bootset_format.merge(blocks.tolist())
            out[t.image_id] = bootset_format.Bootset(
                t.image_id, t.size, bmap.block_size, bset.source,
                tuple(runs)).byte_ranges(gap, limit)
    return out


def missing_ranges(bmap, i, present, limit):
    """Byte ranges of target ``i``'s blocks ``bmap`` reads, not ``present``.

    Sorted, runs that touch merged, reads of at most ``limit`` bytes.
    """
    t = bmap.targets[i]
    base, _image = alternate.block_pairs(bmap, i)
    blocks = np.unique(base)
    blocks = blocks[~present[blocks]]
    if not len(blocks):
        return []
    return bootset_format.Bootset(
        t.image_id, t.size, bmap.block_size, 'map',
        tuple(bootset_format.merge(blocks.tolist()))).byte_ranges(0, limit)


class Prefetcher:
    """Runs the queued prefetches of a host, a few at a time."""

    def __init__(self, service):
        self.service = service
        self.conf = service.conf
        self.dir = queue_dir(service.host_dir)
        self.fill_dir = fill_dir(service.host_dir)
        self.running = {}       # (queue, export name) -> thread

    def poll(self):
        """Start queued prefetches and due fills, up to their limits."""
        for key, t in list(self.running.items()):
            if not t.is_alive():
                del self.running[key]
        self._start(self.dir, _WORKERS, self._run)
        if self.conf.vmar_host.fill:
            self._start(self.fill_dir, _FILL_WORKERS, self._run_fill,
                        due=time.time())

    def _start(self, queue, workers, target, due=None):
        try:
            queued = sorted(os.listdir(queue))
        except FileNotFoundError:
            return
        for name in queued:
            if sum(q == queue for q, _n in self.running) >= workers:
                break
            if ((queue, name) in self.running
                    or names.parse_export(name) is None):
                continue
            if due is not None:
                with contextlib.suppress(FileNotFoundError):
                    if os.stat(os.path.join(queue, name)).st_mtime > due:
                        continue
            t = threading.Thread(target=target, args=(name,),
                                 name='%s-%s' % (os.path.basename(queue),
                                                 name), daemon=True)
            self.running[(queue, name)] = t
            t.start()

    def _run(self, name):
        try:
            self.prefetch(name)
        except Exception:   # a thread of serve: never take it down
            # best effort: the guest's own reads fetch what it needs
            LOG.exception('prefetch of %s failed; not tried again', name)
        fileutils.unlink(os.path.join(self.dir, name))

    def _run_fill(self, name):
        path = os.path.join(self.fill_dir, name)
        try:
            self.fill(name)
        except Exception as e:  # a thread of serve: never take it down
            if not self._exported(name):    # removed while it ran
                LOG.info('fill of %s stopped: no longer exported', name)
            else:
                delay = max(_FILL_RETRY, self.conf.vmar_host.fill_delay)
                LOG.warning('fill of %s failed (%s); queued again in %d s',
                            name, e, delay)
                with contextlib.suppress(FileNotFoundError):
                    due = time.time() + delay
                    os.utime(path, (due, due))
                return
        fileutils.unlink(path)

    def _exported(self, name):
        with export_state.State(self.service.host_dir) as state:
            return any(e.name == name for e in state.exports.values())

    def fill(self, name, only=None):
        """Read every block export ``name``'s map reads into its mirrors.

        ``only``: from that base alone, at full speed (the caller waits).
        Returns the bytes read (0 if the export is gone).
        """
        image_id, version, _key = names.parse_export(name)
        if not self._exported(name):
            LOG.info('no fill of %s: no longer exported', name)
            return 0
        files = self.service.files
        bmap = mapformat.read(files.map_file(image_id, version))
        c = self.conf.vmar_host
        start, total = time.monotonic(), 0
        rate = 0 if only else c.fill_rate * 1000000
        for i, t in enumerate(bmap.targets):
            if (not files.is_mirror(t.image_id)
                    or only not in (None, t.image_id)):
                continue
            ranges = missing_ranges(bmap, i, mirror_format.read_present(
                files.mirror(t.image_id).present)[1], c.prefetch_request)
            if ranges:
                total += self._read_mirror(name, t.image_id, ranges,
                                           rate=rate)
        LOG.info('filled %s: %d bytes read in %.1f s (%d MB/s at most)',
                 name, total, time.monotonic() - start, c.fill_rate)
        return total

    def prefetch(self, name):
        """Read export ``name``'s boot working set into its mirrors.

        Returns the bytes read (0 if the export or its set is gone).
        """
        image_id, version, _key = names.parse_export(name)
        files = self.service.files
        try:
            bset = bootset_format.read(files.bootset_file(image_id),
                                       image_id)
            bmap = mapformat.read(files.map_file(image_id, version))
        except (OSError, exception.BootsetFormatError,
                exception.MapFormatError) as e:
            LOG.info('no prefetch of %s: %s', name, e)
            return 0
        c = self.conf.vmar_host
        start, total, reads = time.monotonic(), 0, 0
        for base_id, ranges in sorted(base_ranges(
                bmap, bset, c.prefetch_gap, c.prefetch_request).items()):
            if files.is_mirror(base_id):
                total += self._read_mirror(name, base_id, ranges)
                reads += len(ranges)
        LOG.info('prefetched %s: %d bytes in %d reads (%s set of %d '
                 'blocks) in %.1f s', name, total, reads, bset.source,
                 bset.n_blocks, time.monotonic() - start)
        return total

    def _read_mirror(self, name, base_id, ranges, rate=None):
        """Read ``ranges`` of a base's mirror node; the bytes read.

        ``rate`` None: all at once (a prefetch: the NBD client keeps 16
        in flight); else in order, at most ``rate`` bytes/s (0: no
        limit), in batches of :data:`_FILL_BATCH` bytes.
        """
        what = 'prefetch' if rate is None else 'fill'
        node = graph.base_node(base_id, 'base')
        with self.service.monitor() as mon:
            if node not in graph.nodes(mon):
                if rate is not None:    # not done: queued again
                    raise exception.ExportError(
                        'fill of %s: base %s is not served' % (name,
                                                               base_id))
                LOG.info('prefetch of %s: base %s is no longer served',
                         name, base_id)
                return 0
            export = graph.add_prefetch_export(mon, node, names.new_key())
        try:
            if rate is None:
                self._qemu_io(what, name, base_id, export, [
                    'aio_read -q %d %d' % r for r in ranges] + ['aio_flush'])
            else:
                batch, size = [], 0
                for r in ranges + [None]:
                    if batch and (r is None or size + r[1] > _FILL_BATCH):
                        self._qemu_io(what, name, base_id, export, batch,
                                      rate)
                        batch, size = [], 0
                    if r is not None:
                        batch.append('read -q %d %d' % r)
                        size += r[1]
        finally:
            with self.service.monitor() as mon:
                graph.del_prefetch_exports(mon, names=[export])
        return sum(length for _o, length in ranges)

    def _qemu_io(self, what, name, base_id, export, commands, rate=None):
        """The patched qemu-io's ``commands`` on a prefetch export.

        ``rate``: through QEMU's throttle filter, client side.
        """
        cmd = [qemu_io(self.conf), '-r']
        for c in commands:
            cmd += ['-c', c]
        if rate:
            sock = self.service.socket
            cmd[1:1] = ['--object', 'throttle-group,id=fill,x-bps-read=%d'
                        % rate, '--image-opts']
            cmd.append('driver=throttle,throttle-group=fill,'
                       'file.driver=nbd,file.server.type=unix,'
                       'file.server.path=%s,file.export=%s'
                       % (sock.replace(',', ',,'), export))
        else:
            cmd += ['-f', 'raw', names.nbd_uri(export, self.service.socket)]
        r = subprocess.run(cmd, capture_output=True, text=True,
                           stdin=subprocess.DEVNULL)
        out = (r.stdout + r.stderr).strip()
        if r.returncode or 'error' in out.lower():
            raise exception.ExportError('%s of %s from base %s: %s'
                                        % (what, name, base_id, out[-2000:]))
