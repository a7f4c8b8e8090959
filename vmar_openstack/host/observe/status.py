"""What a host serves, read on demand: ``vmar-export status`` and metrics.

Per base file: its size, the bytes it takes on disk (its mirror), the bytes
of it in the host page cache (``mincore``, through util-linux
``fincore``), the bytes of it fetched from the store (whole copies and
mirror fills, since the host's first export) and the exports and holders
that read it. Per export: its holders, whether the daemon serves it, and
its read counters (the vmar driver's, since the daemon started), the base
files copied whole for it, the bytes fetched of the bases it reads, and
whether its prefetch or its fill (:mod:`.prefetch`) is still queued.
Per guest-private or auto server (:mod:`.guests`): the mode its guest
runs in, what the host asks of it, and the memory it gave back. With
peers (doc/source/admin/peers.rst): where the host serves them, what its range
server read from them, and the holders vmar-agent named per base.
"""

import dataclasses
import os
import subprocess

from vmar_openstack.host.cache import pagecache
from vmar_openstack.host.cache import prefetch
from vmar_openstack.host.exports import hostdir
from vmar_openstack.host.peers import discovery
from vmar_openstack.host.peers import source as peer_source
from vmar_openstack import names


@dataclasses.dataclass
class BaseStatus:
    image_id: str
    size: int
    mirror_bytes: int          # allocated on disk
    cached_bytes: int          # in the host page cache
    fetched_bytes: int         # fetched from the store, copies and fills
    exports: list
    holders: list


@dataclasses.dataclass
class ExportStatus:
    name: str
    image_id: str
    map_version: int
    host_cache: str
    holders: list
    state: str                 # up, missing (not served), down (no daemon)
    requests: int
    bytes_read: int
    bytes_zero: int
    target_reads: int
    errors: int
    fetches: int               # base files copied whole for it
    fetched_bytes: int         # fetched of the bases it reads (a base
    #                            read by several exports counts in each)
    prefetch_queued: bool
    fill_due: object           # seconds since the epoch; None: none queued


@dataclasses.dataclass
class PeersStatus:
    serving: str               # this host's peer server, or None
    reads: dict                # what the range server read from peers
    #                            (mapsource.peers.COUNTS), since it started
    holders: dict              # base id -> hosts vmar-agent named
    answers: int               # of vmar-agent, since the daemon started
    unanswered: int


@dataclasses.dataclass
class HostStatus:
    socket: str
    daemon_up: bool
    bases: list
    exports: list
    fetched: object            # export.state.Fetched
    guest_cache: object        # export.guests.GuestCacheStatus, or None
    warm: object               # export.warm.WarmStatus, or None
    peers: object = None       # PeersStatus, or None: no peers

    def as_dict(self):
        return dataclasses.asdict(self)


def _resident(paths):
    try:
        return pagecache.resident_bytes(paths)
    except subprocess.CalledProcessError:  # a file pruned meanwhile
        out = {}
        for p in paths:
            try:
                out.update(pagecache.resident_bytes([p]))
            except subprocess.CalledProcessError:
                pass
        return out


_COUNTERS = ('requests', 'bytes_read', 'bytes_zero', 'target_reads',
             'errors')


def collect(service):
    """The :class:`HostStatus` of an :class:`ExportService`'s host."""
    exports, fetched, counters = service.snapshot()
    prefetches, fills = prefetch.pending(service.host_dir)
    out = []
    for name, e in sorted(exports.items()):
        c = None if counters is None else counters.get(name)
        state = ('down' if counters is None
                 else 'missing' if name not in counters else 'up')
        out.append(ExportStatus(
            name, e.image_id, e.map_version, e.host_cache, list(e.holders),
            state, **{k: (c or {}).get(k, 0) for k in _COUNTERS},
            fetches=e.fetches,
            fetched_bytes=sum(fetched.bases.get(t, 0) for t, _s in e.targets),
            prefetch_queued=name in prefetches, fill_due=fills.get(name)))
    paths = {b: service.base_file(b) for b in service.files.bases()}
    cached = _resident(list(paths.values()))
    bases = []
    for b, path in sorted(paths.items()):
        try:
            st = os.stat(path)
        except FileNotFoundError:          # pruned meanwhile
            continue
        readers = [e for e in exports.values()
                   if b in {t for t, _s in e.targets}]
        bases.append(BaseStatus(
            b, st.st_size, st.st_blocks * 512, cached.get(path, 0),
            fetched.bases.get(b, 0),
            sorted(e.name for e in readers),
            sorted({h for e in readers for h in e.holders})))
    return HostStatus(service.socket, counters is not None, bases, out,
                      fetched, service.guests.snapshot()
                      if service.guests else None,
                      service.warm.snapshot() if service.warm else None,
                      _peers(service))


def _peers(service):
    p = service.conf.vmar_peers
    if not (p.listen_address or peer_source.enabled(service.conf)):
        return None
    layout = hostdir.Layout(service.host_dir)
    found = service.discovery
    return PeersStatus(
        names.peer_address(p.listen_address, p.listen_port)
        if p.listen_address else None,
        peer_source.read_counts(layout.peer_counts_file()),
        discovery.holders(layout), found.asked if found else 0,
        found.failed if found else 0)
