"""The exports of a host, as recorded in ``<host_dir>/exports.json``.

The file is the service's memory across daemon restarts: ``vmar-export
serve`` restores every export it lists. Only that daemon writes it
(:mod:`vmar_openstack.hostapi`), whole and atomically, and its threads
read and write it under one in-process lock per host directory; anyone
else may read it and finds the last complete version.
"""

import contextlib
import dataclasses
import json
import os

from vmar_openstack import exception
from vmar_openstack import fileutils
from vmar_openstack.host.exports import locks
from vmar_openstack import names

# How an export's base files are cached on the host (names.HOST_CACHE)
HOST_CACHE = names.HOST_CACHE

_FILE = 'exports.json'
# the lock file of releases before the host API (nothing takes it now)
OLD_LOCK = 'exports.lock'
# the daemon's threads take turns at a host directory's record
_TURNS = locks.Keyed()


@dataclasses.dataclass
class Export:
    """One map version of one image, and who reads it.

    Exports are immutable: a new map version of an image is a new export
    next to the old one, which stays until its last holder (a running
    instance) lets it go. Each holder reads it through an NBD export of
    its own, whose name carries the holder's key (:attr:`keys`); the daemon
    lists no export, so a QEMU opens only the names it was given. A holder
    recorded before keys existed has none, and is served under the
    record's :attr:`name`.
    """
    image_id: str
    map_version: int
    host_cache: str
    holders: list
    targets: list          # [(image_id, size)]
    # base files fetched from the map source for this export
    fetches: int = 0
    fetched_bytes: int = 0
    keys: dict = dataclasses.field(default_factory=dict)   # holder -> key

    @property
    def name(self):
        """The record's name (and the NBD name of holders without key)."""
        return names.export(self.image_id, self.map_version)

    def holder_name(self, holder):
        """The NBD export name ``holder`` opens."""
        return names.export(self.image_id, self.map_version,
                            self.keys.get(holder))

    def nbd_names(self):
        """Every NBD export name the daemon serves for this record."""
        return sorted({self.holder_name(h) for h in self.holders})

    def served(self, live):
        """Whether ``live`` (names the daemon serves) has all of ours."""
        return set(self.nbd_names()) <= live


@dataclasses.dataclass
class Fetched:
    """Every byte of base data this host fetched, since its first export.

    Whole copies (``count`` of them, in ``seconds``) and mirror fills
    alike: ``bytes`` is their sum, ``bases`` the bytes of each base
    (image id -> bytes), which stay counted after the base is evicted.
    """
    count: int = 0
    bytes: int = 0
    seconds: float = 0.0
    copy_bytes: int = 0
    fill_bytes: int = 0
    bases: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def from_record(cls, raw):
        """From ``exports.json``.

        A record of before fills were counted holds copies alone.
        """
        fields = {f.name for f in dataclasses.fields(cls)}
        out = cls(**{k: v for k, v in raw.items() if k in fields})
        if 'copy_bytes' not in raw:
            out.copy_bytes = out.bytes
        return out

    def _count(self, image_id, n):
        self.bytes += n
        self.bases[image_id] = self.bases.get(image_id, 0) + n

    def add(self, fetches):
        """Count :class:`vmar_openstack.host.exports.hostdir.Fetch` records."""
        for f in fetches:
            self.count += 1
            self.seconds += f.seconds
            self.copy_bytes += f.size
            self._count(f.image_id, f.size)

    def add_fill(self, image_id, n):
        """Count ``n`` bytes a mirror of ``image_id`` fetched."""
        self.fill_bytes += n
        self._count(image_id, n)


class State:
    """``exports.json``, this thread's alone while in use."""

    def __init__(self, host_dir):
        self.host_dir = host_dir
        self.path = os.path.join(host_dir, _FILE)
        self.exports = {}
        self.fetched = Fetched()
        self._turn = None

    def __enter__(self):
        os.makedirs(self.host_dir, exist_ok=True)
        self._turn = contextlib.ExitStack()
        self._turn.enter_context(_TURNS(os.path.realpath(self.host_dir)))
        try:
            self._load()
        except BaseException:
            self._turn.close()
            raise
        return self

    def _load(self):
        try:
            with open(self.path) as f:
                raw = json.load(f)
        except FileNotFoundError:
            raw = {'exports': {}}
        except ValueError as e:
            raise exception.ExportError('%s is not JSON (%s): restore it '
                                        'from a backup' % (self.path, e))
        fields = {f.name for f in dataclasses.fields(Export)}
        exports = [Export(**dict({k: x for k, x in v.items() if k in fields},
                                 targets=[tuple(t) for t in v['targets']]))
                   for v in raw['exports'].values()]
        self.exports = {e.name: e for e in exports}
        self.fetched = Fetched.from_record(raw.get('fetched', {}))

    def save(self):
        data = {'exports': {k: dataclasses.asdict(v)
                            for k, v in sorted(self.exports.items())},
                'fetched': dataclasses.asdict(self.fetched)}
        # the holders' keys are secrets: root's (the service's) alone
        fileutils.write_atomic(self.path, json.dumps(
            data, indent=1, sort_keys=True).encode(), mode=0o600)

    def __exit__(self, *exc):
        self._turn.close()
