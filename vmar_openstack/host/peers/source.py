"""Runs a mirror misses, read from peer hosts that hold them (issue 34).

A lazy mirror's fetch quorum asks the host's *peer fetcher* first
(nbdkit with :mod:`.nbdkit_peers`, one export per mirrored image,
:func:`reader`), then the store's reader. The fetcher serves the image's
raw content, the bytes peers hold, whatever format the store keeps it in,
and fails a read no peer holds, so the quorum moves on to the store. It
asks a :class:`PeerReader`: the first
peer (the base's holders the export daemon found, :mod:`vmar_openstack.
export.discovery`, best first, then ``[vmar_peers] peers`` in order)
whose peer server
(:mod:`vmar_openstack.host.peers.server`) holds the whole run, by NBD block
status, sends it over NBD with TLS (libnbd, the system Python's
``python3-libnbd``), and every block is checked against the image's
digest list before it is returned. A peer that cannot be reached or does
not hold the run costs nothing but the question; one that sent a block
that fails its digest is not asked again for ``bad_seconds`` and is
logged. ``None`` means "read it from the store".

In a burst no host holds a new image's blocks yet. The holders file then
names the base's *lead* (``"lead": true``), the host vmar-agent told to
fetch first (:meth:`vmar_openstack.db.hosts.HostReports.lead`): a run no
holder has is asked of the lead again, by block status, for up to
``lead_wait`` seconds while the lead fetches it, before the store is.
A lead that did not get a run in that time is not waited for again for
``NO_WAIT_SECONDS``: its guests read elsewhere in the image.

The vmar-mirror driver checks the run again before it writes or serves
it: a peer's bytes are never taken on trust, and a bad peer costs one
more read from the store instead of a failed guest read.
"""

import collections
import hashlib
import json
import os
import threading
import time

from oslo_log import log as logging

from vmar_openstack import fileutils
from vmar_openstack.mapformat import mirror as mirror_format
from vmar_openstack.mapsource import readers
from vmar_openstack import names

LOG = logging.getLogger(__name__)

ZERO_DIGEST = bytes(mirror_format.DIGEST_SIZE)


#: what :attr:`PeerReader.counts` counts: runs and bytes read from peers,
#: blocks that failed their digest, runs no peer held, peers that could not
#: be reached (or refused), peers that did not answer in time, runs waited
#: for at a lead, those of them the lead did not get in time, and the
#: milliseconds of all the waits
COUNTS = ('peer_reads', 'peer_bytes', 'bad_blocks', 'not_held',
          'unreachable', 'timeouts', 'lead_waits', 'lead_misses',
          'lead_wait_ms')
#: seconds the counts file may lag the counts
COUNTS_INTERVAL = 1.0
#: seconds a lead that did not get a run in ``lead_wait`` is not waited for
NO_WAIT_SECONDS = 10.0
#: seconds between two block-status questions to a lead, at first and at most
_POLL_FIRST, _POLL_MAX = 0.002, 0.02
#: seconds before a run that failed its digest is read once more: a peer
#: may be writing it (its block status says data before its bytes are in)
_REREAD_PAUSE = 0.02
#: connections to one peer for one image, shared by the fetcher's threads:
#: a thread per connection would open 16 per image to every peer, and a
#: peer server refuses those beyond [vmar_peers] max_clients
CONNECTIONS = 4


def read_counts(path):
    """The counts a range server's reader last wrote (zeros if none)."""
    out = dict.fromkeys(COUNTS, 0)
    try:
        with open(path) as f:
            got = json.load(f)
    except FileNotFoundError:
        return out
    except (OSError, ValueError) as e:
        LOG.warning('peer read counts in %s unreadable: %s', path, e)
        return out
    out.update((k, int(got[k])) for k in COUNTS
               if isinstance(got.get(k), int))
    return out


def enabled(conf):
    """Whether this host's lazy mirrors read from peers.

    Peers found (``discover``) or configured (``peers``), unless ``fetch``
    turns it off; mirrors are lazy (``base_fetch = lazy``).
    """
    p = conf.vmar_peers
    return bool(p.fetch and (p.discover or p.peers)
                and conf.vmar_host.base_fetch == 'lazy')


def fetch_socket(conf):
    """The unix socket of the host's peer fetcher."""
    return os.path.join(conf.vmar_host.host_dir, names.PEER_FETCH_SOCKET)


def reader(conf, image_id, size):
    """The :mod:`.readers` description of an image's peer fetch export.

    The first child of a mirror's fetch quorum when :func:`enabled`.
    """
    return readers.RangeExport(fetch_socket(conf),
                               names.peer_fetch_export(image_id, size))


class PeerTimeout(Exception):
    """A peer did not answer in time."""


class PeerBusy(Exception):
    """Every connection to a peer for an image stayed lent out."""


class PeerReader:
    """Reads verified runs of images from peer hosts.

    ``peers``: ``host:port`` addresses; ``tls_dir``: the host's x509
    client credentials (``ca-cert.pem``, ``client-cert.pem``,
    ``client-key.pem``); ``digests_path(image_id)``: the path of an
    image's digest list on this host; ``holders_path(image_id)``, if
    given: the path of the file of its holders, asked before ``peers``;
    ``counts_path``, if given: where :attr:`counts` are written, at most
    once a second, within a second of a change, and at once for a bad
    block (:func:`read_counts`). A peer that sent a bad block is not
    asked for ``bad_seconds``; one that could not be reached or did not
    answer in time, for ``down_seconds``. A run no peer holds is waited
    for at the image's lead for up to ``lead_wait`` seconds (0: never).
    """

    def __init__(self, peers, tls_dir, digests_path, bad_seconds=300,
                 clock=time.monotonic, timeout=5.0, holders_path=None,
                 counts_path=None, down_seconds=10, lead_wait=0.0,
                 sleep=time.sleep):
        self.peers = [names.parse_peer_address(p) for p in peers]
        self.holders_path = holders_path
        # image id -> (file mtime, [peer, ...], lead peer or None)
        self._holders = {}
        self.lead_wait = lead_wait
        self.sleep = sleep
        self.no_wait_until = {}     # (peer, image id) -> clock time
        self.timeout = timeout      # seconds for each step of a peer read
        self.tls_dir = tls_dir
        self.digests_path = digests_path
        self.bad_seconds = bad_seconds
        self.down_seconds = down_seconds
        self.clock = clock
        self.bad_until = {}         # peer -> clock time
        self.counts = dict.fromkeys(COUNTS, 0)
        self.counts_path = counts_path
        self._written = None        # when the counts were last written
        self._flush_due = False     # a write is scheduled
        self._write_lock = threading.Lock()
        self._lock = threading.Lock()
        self._digests = {}
        # connections to peers, shared by the fetcher's threads: per
        # (peer, image id), the idle ones and how many are lent out
        self._pool = threading.Condition(threading.Lock())
        self._idle = {}
        self._lent = collections.Counter()

    def read(self, image_id, offset, length):
        """The run's bytes from a peer, verified; None if no peer has it."""
        rows = self._rows(image_id)
        if rows is None:
            return None
        block_size, rows = rows
        if offset % block_size:
            return None
        check = (block_size, rows)
        lead = self.lead(image_id)
        if lead is not None and (
                not self.lead_wait or self.clock() < self.no_wait_until.get(
                    (lead, image_id), 0)):
            lead = None     # not waited for: asked as any other holder
        for peer in self.candidates(image_id):
            if peer == lead:
                continue    # asked last, and waited for
            data = self._verified(peer, image_id, offset, length, check)
            if data is not None:
                return data
        if lead is None:
            return None
        return self._verified(lead, image_id, offset, length, check,
                              wait=self.lead_wait)

    def _verified(self, peer, image_id, offset, length, check, wait=0):
        """The run from ``peer``, every block checked, or None.

        A run that fails its digest is read once more after a pause (the
        peer may have been writing it); failing again, the peer is bad.
        """
        block_size, rows = check
        for attempt in (0, 1):
            if self.clock() < self.bad_until.get(peer, 0):
                return None
            data = self._read_from(peer, image_id, offset, length, wait)
            if data is None:
                return None
            bad = _first_bad(data, offset, block_size, rows)
            if bad is None:
                self._count(peer_reads=1, peer_bytes=length)
                return data
            self._drop(peer, image_id)
            if not attempt:
                self.sleep(_REREAD_PAUSE)
        with self._lock:
            self.bad_until[peer] = self.clock() + self.bad_seconds
        self._count(bad_blocks=1)
        LOG.error('peer %s:%d sent block %d of image %s that does not '
                  'match its digest: not asked again for %d s',
                  peer[0], peer[1], bad, image_id, self.bad_seconds)
        return None

    def _count(self, **incs):
        """Count, and have the file follow within COUNTS_INTERVAL.

        A bad block is written at once.
        """
        with self._lock:
            for k, v in incs.items():
                self.counts[k] += v
            if self.counts_path is None:
                return
            if ('bad_blocks' not in incs and self._written is not None
                    and self.clock() - self._written < COUNTS_INTERVAL):
                if not self._flush_due:
                    self._flush_due = True
                    timer = threading.Timer(COUNTS_INTERVAL, self._flush)
                    timer.daemon = True
                    timer.start()
                return
        self._flush()

    def _flush(self):
        with self._write_lock:      # the file only ever moves forward
            with self._lock:
                self._flush_due = False
                self._written = self.clock()
                body = json.dumps(self.counts).encode()
            try:
                with fileutils.atomic_file(self.counts_path) as f:
                    f.write(body)
            except OSError as e:
                LOG.warning('peer read counts not written to %s: %s',
                            self.counts_path, e)

    def candidates(self, image_id):
        """The peers to ask for ``image_id``'s runs, best first.

        Its holders, as the export daemon last wrote them (re-read when
        the file changes), then the configured peers. A file that is gone
        or unreadable leaves the configured peers.
        """
        found = self._found(image_id)[0]
        return found + [p for p in self.peers if p not in found]

    def lead(self, image_id):
        """The peer named the lead of ``image_id``'s base, or None."""
        return self._found(image_id)[1]

    def _found(self, image_id):
        """``([holder peer, ...], lead peer or None)`` of the file."""
        if self.holders_path is None:
            return [], None
        path = self.holders_path(image_id)
        try:
            mtime = os.stat(path).st_mtime_ns
        except FileNotFoundError:
            return [], None
        cached = self._holders.get(image_id)
        if cached is None or cached[0] != mtime:
            cached = (mtime,) + read_holders(path)
            self._holders[image_id] = cached
        return cached[1], cached[2]

    def _rows(self, image_id):
        with self._lock:
            if image_id not in self._digests:
                path = self.digests_path(image_id)
                if not os.path.exists(path):
                    return None
                hdr, rows = mirror_format.read_digests(path)
                self._digests[image_id] = (hdr.block_size, rows)
            return self._digests[image_id]

    def _borrow(self, key):
        """An idle connection for ``key``, or None: the caller makes one.

        At most CONNECTIONS per ``(peer, image id)`` at once; a thread
        that finds them all lent waits for one, ``timeout`` seconds at
        most (:class:`PeerBusy`).
        """
        deadline = time.monotonic() + self.timeout
        with self._pool:
            while True:
                idle = self._idle.get(key)
                if idle:
                    self._lent[key] += 1
                    return idle.pop()
                if self._lent[key] < CONNECTIONS:
                    self._lent[key] += 1
                    return None
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PeerBusy()
                self._pool.wait(left)

    def _give_back(self, key, h):
        """Return a borrowed connection; None: it is not to be used again."""
        with self._pool:
            self._lent[key] -= 1
            if h is not None:
                self._idle.setdefault(key, []).append(h)
            self._pool.notify()

    def _connect(self, peer, image_id):
        """A new connection to ``peer`` for ``image_id``.

        One that times out is closed when its handle goes.
        """
        import nbd      # python3-libnbd: only where peers are configured
        h = nbd.NBD()
        h.set_tls(nbd.TLS_REQUIRE)
        h.set_tls_certificates(self.tls_dir)
        h.set_export_name(image_id)
        h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
        h.aio_connect_tcp(peer[0], str(peer[1]))
        self._wait(h, h.aio_is_ready)
        return h

    def _wait(self, h, done):
        """Run ``h`` until ``done()``, at most ``timeout`` seconds.

        A peer that stopped answering (a hung host, a full link) is given
        up on, as one that refuses: the store serves the run.
        """
        deadline = time.monotonic() + self.timeout
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                raise PeerTimeout()
            h.poll(max(1, int(left * 1000)))

    def _holds(self, h, nbd, offset, length):
        """Whether the peer's block status says it holds the whole run."""
        holes = []
        covered = [0]

        def extent(context, start, entries, err):
            if context != nbd.CONTEXT_BASE_ALLOCATION:
                return 0
            for n, flags in zip(entries[::2], entries[1::2]):
                if flags & nbd.STATE_HOLE:
                    holes.append(start)
                start += n
                covered[0] += n
            return 0
        done = 0
        while done < length:
            covered[0] = 0
            cookie = h.aio_block_status(length - done, offset + done,
                                        extent)
            self._wait(h, lambda: h.aio_command_completed(cookie))
            if holes or not covered[0]:
                return False
            done += covered[0]
        return True

    def _down(self, peer):
        """Skip ``peer`` for ``down_seconds`` (not past a bad mark)."""
        with self._lock:
            self.bad_until[peer] = max(self.bad_until.get(peer, 0),
                                       self.clock() + self.down_seconds)

    def _drop(self, peer, image_id):
        """Forget a peer's idle connections: closed when their handles go.

        Not shut down: that would wait on a peer that stopped answering.
        """
        with self._pool:
            self._idle.pop((peer, image_id), None)

    def _wait_for(self, peer, image_id, h, nbd, offset, length, wait):
        """Whether the lead ``peer`` gets the run within ``wait`` seconds.

        Asked again by block status, at growing intervals. A lead that does
        not get it is not waited for again for NO_WAIT_SECONDS.
        """
        self._count(lead_waits=1)
        start = self.clock()
        deadline = start + wait
        pause = _POLL_FIRST
        while self.clock() < deadline:
            self.sleep(min(pause, max(0.0, deadline - self.clock())))
            if self._holds(h, nbd, offset, length):
                self._count(lead_wait_ms=int(
                    1000 * (self.clock() - start)))
                return True
            pause = min(2 * pause, _POLL_MAX)
        with self._lock:
            self.no_wait_until[(peer, image_id)] = (self.clock()
                                                    + NO_WAIT_SECONDS)
        self._count(lead_misses=1, lead_wait_ms=int(
            1000 * (self.clock() - start)))
        return False

    def _read_from(self, peer, image_id, offset, length, wait=0):
        import nbd
        key = (peer, image_id)
        try:
            h = self._borrow(key)
        except PeerBusy:
            # every connection to it busy that long: the store, this time
            self._count(not_held=1)
            return None
        keep = None
        try:
            if h is None:
                h = self._connect(peer, image_id)
            held = self._holds(h, nbd, offset, length) or (
                wait and self._wait_for(peer, image_id, h, nbd, offset,
                                        length, wait))
            if not held:
                keep = h
                self._count(not_held=1)
                return None
            buf = nbd.Buffer(length)
            cookie = h.aio_pread(buf, offset)
            self._wait(h, lambda: h.aio_command_completed(cookie))
            keep = h
            return bytes(buf.to_bytearray())
        except PeerTimeout:
            self._count(timeouts=1)
            self._down(peer)
            LOG.warning('peer %s:%d did not answer for image %s within '
                        '%.0f s: not asked for %d s', peer[0], peer[1],
                        image_id, self.timeout, self.down_seconds)
            self._drop(peer, image_id)
            return None
        except nbd.Error as e:
            # not held at all ("export not available"), unreachable,
            # refused: the store instead
            self._count(unreachable=1)
            if not _not_held(e):
                self._down(peer)
            LOG.debug('peer %s:%d, image %s: %s', peer[0], peer[1],
                      image_id, e)
            self._drop(peer, image_id)
            return None
        except Exception:
            # never fail a read the store can serve because of a peer
            self._count(unreachable=1)
            self._down(peer)
            LOG.exception('reading image %s from peer %s:%d failed: not '
                          'asked for %d s', image_id, peer[0], peer[1],
                          self.down_seconds)
            self._drop(peer, image_id)
            return None
        finally:
            self._give_back(key, keep)


def read_holders(path):
    """``([holder peer, ...], lead peer or None)`` of a holders file.

    Peers as ``(host, port)``, best first, as discovery wrote them
    (:mod:`vmar_openstack.host.peers.discovery`). A file that is gone or
    unreadable holds none (unreadable is logged).
    """
    try:
        with open(path) as f:
            holders = json.load(f)['holders']
        found = [names.parse_peer_address(h['peer']) for h in holders]
        lead = [p for p, h in zip(found, holders) if h.get('lead')]
    except FileNotFoundError:
        return [], None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        LOG.warning('holders in %s unreadable: %s', path, e)
        return [], None
    return found, lead[0] if lead else None


def _not_held(error):
    """Whether an NBD error says the peer holds no such image.

    The peer is up: its other images are still worth asking for.
    """
    text = str(error).lower()
    # libnbd's words for NBD_REP_ERR_UNKNOWN to the export's name
    return 'no export named' in text or 'export not available' in text


def _first_bad(data, offset, block_size, rows):
    """The first block of the run that fails its digest, or None."""
    first = offset // block_size
    for i in range(0, len(data), block_size):
        # a partial last block is hashed zero-padded (mirror-format.rst)
        block = data[i:i + block_size].ljust(block_size, b'\0')
        n = first + i // block_size
        if n >= len(rows):
            return n
        want = rows[n].tobytes()
        if want == ZERO_DIGEST:
            ok = not any(block)
        else:
            ok = hashlib.sha256(block).digest() == want
        if not ok:
            return n
    return None
