"""Digest lists read from peer hosts before the store (issue 34).

A host that makes the first mirror of a base needs the base's digest list
(doc/source/reference/mirror-format.rst): 32 bytes per block, 8 MiB per GiB of
the base, from the store, on every host. In a burst on many hosts those lists
are most of what the store serves once the blocks come from peers
(``bench/sim_storm.py --burst``: 28 GB of 29 at 1,000 hosts).

So a host with peers asks first the hosts that hold the base and the host
it waits for in a burst (the holders file discovery writes, :mod:`.
discovery`, then ``[vmar_peers] peers``) for their copy, the peer server's
``<id>.digests`` export (:func:`vmar_openstack.names.peer_digests_export`),
read with qemu-img over NBD with TLS, the client credentials of the
host. A copy is kept only if its SHA-256 is the one vmar-agent published
(the map source's ``digests_sha256``); the caller checks its header
against the map, as for the store's. A lead that has not got the list
yet is asked again for up to ``[vmar_peers] lead_wait`` seconds. None
usable: the store's.
"""

import hashlib
import os
import subprocess
import time

from oslo_log import log as logging

from vmar_openstack import exception
from vmar_openstack import fileutils
from vmar_openstack.host.peers import source as peer_source
from vmar_openstack.mapformat import mirror as mirror_format
from vmar_openstack import names

LOG = logging.getLogger(__name__)

#: seconds between two questions to a lead that lacks the list
_LEAD_POLL = 0.1


def _opt(value):
    """A value in a QEMU option string (commas doubled)."""
    return str(value).replace(',', ',,')


class PeerDigests:
    """Fetches digest lists from peers; counts what it got where.

    ``holders_path(image_id)``: the base's holders file. ``sleep`` and
    ``clock`` are the test's to keep.
    """

    def __init__(self, conf, holders_path, clock=time.monotonic,
                 sleep=time.sleep):
        p = conf.vmar_peers
        self.qemu_img = conf.vmar_host.qemu_img
        self.tls_dir = p.tls_dir
        self.peers = [names.parse_peer_address(a) for a in p.peers]
        self.timeout = 4 * p.read_timeout
        self.lead_wait = p.lead_wait
        self.holders_path = holders_path
        self.clock, self.sleep = clock, sleep
        self.from_peers = 0     # lists read from peers
        self.refused = 0        # copies whose SHA-256 was not the library's

    def fetch(self, image_id, dest, sha256):
        """Whether a peer's copy of the list, verified, is now at ``dest``.

        ``sha256``: the hex digest vmar-agent published.
        """
        found, lead = peer_source.read_holders(self.holders_path(image_id))
        candidates = found + [p for p in self.peers if p not in found]
        for peer in candidates:
            if self._one(peer, image_id, dest, sha256):
                return True
        if lead is None or not self.lead_wait:
            return False
        deadline = self.clock() + self.lead_wait
        while self.clock() < deadline:
            self.sleep(_LEAD_POLL)
            if self._one(lead, image_id, dest, sha256):
                return True
        return False

    def command(self, peer, image_id, dest):
        """qemu-img's argv copying a peer's list to ``dest``."""
        opts = ('driver=raw,read-only=on,file.driver=nbd,'
                'file.server.type=inet,file.server.host=%s,'
                'file.server.port=%d,file.export=%s,file.tls-creds=tls0' % (
                    _opt(peer[0]), peer[1],
                    _opt(names.peer_digests_export(image_id))))
        return [self.qemu_img, 'convert', '-O', 'raw',
                '--object', 'tls-creds-x509,id=tls0,endpoint=client,'
                'dir=%s' % _opt(self.tls_dir), '--image-opts', opts, dest]

    def _one(self, peer, image_id, dest, sha256):
        fileutils.unlink(dest)
        try:
            r = subprocess.run(self.command(peer, image_id, dest),
                               capture_output=True, text=True,
                               stdin=subprocess.DEVNULL,
                               timeout=self.timeout)
        except subprocess.TimeoutExpired:
            LOG.warning('digest list of %s: peer %s:%d did not answer in '
                        '%.0f s', image_id, peer[0], peer[1], self.timeout)
            fileutils.unlink(dest)
            return False
        if r.returncode:
            # not held (yet), unreachable, refused: the next one
            LOG.debug('digest list of %s from %s:%d: %s', image_id,
                      peer[0], peer[1], r.stderr.strip())
            fileutils.unlink(dest)
            return False
        # QEMU's NBD client rounds the export's size up to 512 bytes
        try:
            length = mirror_format.digests_length(dest)
        except exception.MirrorFormatError as e:
            length = None
            LOG.error('digest list of %s from peer %s:%d: %s', image_id,
                      peer[0], peer[1], e)
        if length is not None and 0 <= os.path.getsize(dest) - length < 512:
            os.truncate(dest, length)
        h = hashlib.sha256()
        with open(dest, 'rb') as f:
            for chunk in iter(lambda: f.read(1 << 20), b''):
                h.update(chunk)
        if h.hexdigest() != sha256:
            self.refused += 1
            LOG.error('digest list of %s from peer %s:%d is not the one '
                      'vmar-agent published (SHA-256 %s, not %s): not used',
                      image_id, peer[0], peer[1], h.hexdigest(), sha256)
            fileutils.unlink(dest)
            return False
        self.from_peers += 1
        LOG.info('digest list of %s read from peer %s:%d', image_id,
                 peer[0], peer[1])
        return True
