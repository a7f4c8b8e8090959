"""The ``vmar_content_log`` table: what each change of the clusters was.

An ingest looks its keys up and builds its map in a read snapshot while
it hashes (:mod:`vmar_openstack.ingest.ahead`). When its locked
transaction finds that changes of the clusters committed since (the
lock row's content generation moved), it asks this log what they were,
instead of looking every key up again:

* an add (``'add'``) inserted the keys of one filter, moved those of
  another to other clusters, and joined the clusters it lists (their
  member sets changed; ids before it): the ingest's answers stand but for
  its keys the filters may hold (looked up again exactly: those really
  inserted or moved, and a few others), and its map stands unless a key
  it was its own target for is in a cluster listed, or another add
  inserted one of its keys;
* anything else (``'other'``: an update, a delete), or a generation the
  log no longer holds (``[vmar] content_log_seconds``): it cannot tell,
  and every key is looked up again.

Each content mutation writes its row, and removes the rows past their
time, in its own locked transaction.
"""

import dataclasses
import datetime

import numpy as np
import sqlalchemy as sa

from vmar_openstack.db import models
from vmar_openstack.fingerprint import keyfilter

ADD, OTHER = 'add', 'other'


@dataclasses.dataclass(frozen=True)
class Changes:
    """The adds committed between two content generations."""

    inserted: list        # a KeyFilter of each add's inserted keys
    moved: list           # a KeyFilter of each add's moved keys
    clusters: np.ndarray  # sorted ids of the clusters they joined


def record(session, generation, kind, new_keys=None, moved_keys=None,
           clusters=None, keep_seconds=3600, new_filter=None):
    """Log content generation ``generation``; forget what is too old.

    ``new_filter``: the :class:`KeyFilter` of ``new_keys``, if the caller
    made it before the lock.
    """
    now = models.utcnow()
    session.execute(sa.delete(models.ContentChange).where(
        models.ContentChange.created_at
        < now - datetime.timedelta(seconds=keep_seconds)))
    if not keep_seconds:
        return
    row = models.ContentChange(generation=generation, kind=kind,
                               created_at=now)
    if kind == ADD:
        if new_filter is None:
            new_filter = keyfilter.KeyFilter.of(new_keys)
        row.key_filter = new_filter.to_bytes()
        row.moved_filter = keyfilter.KeyFilter.of(moved_keys).to_bytes()
        row.clusters = np.ascontiguousarray(clusters, '<i8').tobytes()
    session.add(row)


def only_adds(session, first, last):
    """Whether generations ``first + 1`` to ``last`` were all adds.

    False when the log no longer holds one of them. The kinds only: no
    filter is read.
    """
    if last == first:
        return True
    cc = models.ContentChange
    adds = session.execute(sa.select(sa.func.count()).where(
        cc.generation > first, cc.generation <= last,
        cc.kind == ADD)).scalar()
    return adds == last - first


def since(session, first, last):
    """:class:`Changes` of generations ``first + 1`` to ``last``, or None.

    None: one was not an add, or the log no longer holds it.
    """
    rows = session.execute(sa.select(
        models.ContentChange.kind, models.ContentChange.key_filter,
        models.ContentChange.moved_filter,
        models.ContentChange.clusters).where(
            models.ContentChange.generation > first,
            models.ContentChange.generation <= last)).all()
    if len(rows) != last - first or any(r.kind != ADD for r in rows):
        return None
    load = keyfilter.KeyFilter.from_bytes
    clusters = np.unique(np.concatenate(
        [np.empty(0, np.int64)]
        + [np.frombuffer(r.clusters, '<i8') for r in rows]))
    return Changes([load(r.key_filter) for r in rows],
                   [load(r.moved_filter) for r in rows], clusters)
