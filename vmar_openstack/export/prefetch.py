"""Prefetch of an image's boot working set into the host's mirrors.

When an image's first export on a lazy host is added and ``[vmar]
prefetch`` is on, :meth:`.service.ExportService.add` queues a request
(``host_dir/prefetch/<export name>``) once the image's boot working set
(:mod:`vmar_openstack.mapformat.bootset`) is on the host. ``vmar-export
serve`` works through the queue (:class:`Prefetcher`, polled by the
supervisor): it holds the export as the holder ``prefetch`` and reads the
set's byte ranges through it with ``qemu-io``, sorted and merged into
large reads (``prefetch_gap``, ``prefetch_request``), all queued at once
(the NBD client keeps 16 in flight). The reads go through the image's
vmar node like a guest's, so each block lands once in its canonical
base's mirror, verified, and blocks already there cost nothing. Guests do
not wait for it: their own reads of blocks being prefetched wait for that
one fetch (the mirror driver's once-per-block rule).

A request survives a restart of ``serve`` (it is done again, cheaply); an
export removed meanwhile drops its request.
"""

import os
import subprocess
import threading
import time

from oslo_log import log as logging

from vmar_openstack import exception
from vmar_openstack import fileutils
from vmar_openstack.mapformat import bootset as bootset_format
from vmar_openstack import names

LOG = logging.getLogger(__name__)

HOLDER = 'prefetch'
_DIR = 'prefetch'
# prefetches at once per host
_WORKERS = 2


def queue_dir(host_dir):
    return os.path.join(host_dir, _DIR)


def request(host_dir, export_name):
    """Queue a prefetch of an export (idempotent)."""
    fileutils.write_atomic(os.path.join(queue_dir(host_dir), export_name),
                           b'')


def qemu_io(conf):
    """The patched build's qemu-io, next to its qemu-storage-daemon."""
    return os.path.join(os.path.dirname(conf.vmar.qemu_storage_daemon),
                        'qemu-io')


class Prefetcher:
    """Runs the queued prefetches of a host, a few at a time."""

    def __init__(self, service):
        self.service = service
        self.conf = service.conf
        self.dir = queue_dir(service.host_dir)
        self.running = {}       # export name -> thread

    def poll(self):
        """Start queued prefetches while fewer than the limit run."""
        for name, t in list(self.running.items()):
            if not t.is_alive():
                del self.running[name]
        try:
            queued = sorted(os.listdir(self.dir))
        except FileNotFoundError:
            return
        for name in queued:
            if len(self.running) >= _WORKERS:
                break
            if name in self.running or names.parse_export(name) is None:
                continue
            t = threading.Thread(target=self._run, args=(name,),
                                 name='prefetch-' + name, daemon=True)
            self.running[name] = t
            t.start()

    def _run(self, name):
        try:
            self.prefetch(name)
        except Exception:   # a thread of serve: never take it down
            LOG.exception('prefetch of %s failed', name)
            time.sleep(1)       # retried at the next poll
        else:
            fileutils.unlink(os.path.join(self.dir, name))

    def prefetch(self, name):
        """Read export ``name``'s boot working set through it.

        Returns the bytes read (0 if the export or its set is gone).
        """
        image_id, version, _key = names.parse_export(name)
        path = self.service.files.bootset_file(image_id)
        try:
            bset = bootset_format.read(path, image_id)
        except (OSError, exception.BootsetFormatError) as e:
            LOG.warning('no prefetch of %s: %s', name, e)
            return 0
        try:
            exp = self.service.add(image_id, holder=HOLDER, version=version,
                                   existing_only=True)
        except exception.ExportError as e:
            LOG.info('no prefetch of %s: %s', name, e)
            return 0
        try:
            c = self.conf.vmar
            ranges = bset.byte_ranges(c.prefetch_gap, c.prefetch_request)
            start = time.monotonic()
            cmd = [qemu_io(self.conf), '-r', '-f', 'raw']
            for off, length in ranges:
                cmd += ['-c', 'aio_read -q %d %d' % (off, length)]
            cmd += ['-c', 'aio_flush', self.service.uri(exp, HOLDER)]
            r = subprocess.run(cmd, capture_output=True, text=True,
                               stdin=subprocess.DEVNULL)
            total = sum(length for _o, length in ranges)
            if r.returncode or 'error' in (r.stdout + r.stderr).lower():
                raise exception.ExportError(
                    'prefetch of %s: %s' % (name, (r.stdout + r.stderr)
                                            .strip()[-2000:]))
            LOG.info('prefetched %s: %d bytes in %d reads (%s set of %d '
                     'blocks) in %.1f s', name, total, len(ranges),
                     bset.source, bset.n_blocks, time.monotonic() - start)
            return total
        finally:
            self.service.remove(image_id, holder=HOLDER, version=version)
