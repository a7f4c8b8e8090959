"""The ``vmar_publications`` table: who publishes which hidden image.

Two uploads of one Glance image at once leave it in ``saving``, so the
publishers of all agents take turns per hidden image. They do it through
its row here, in short transactions of their own that never take the
library lock (:func:`vmar_openstack.db.session.writer`): a publish waits
for no ingest and moves no generation, so an ingest's snapshot stays good
across any number of publishes (:mod:`vmar_openstack.ingest.ahead`).

A row is :data:`CLAIMED` by one publisher (its ``holder``) while it uploads
outside any transaction, then :data:`DONE`. A claim older than the
caller's timeout is taken over: its publisher was killed or hung, and the
agent's resync lists the unfinished rows (:meth:`Publications.unfinished`)
to publish them again.
"""

import dataclasses
import datetime

import sqlalchemy as sa

from vmar_openstack.db import models
from vmar_openstack.db import session as db_session

CLAIMED, DONE = 'claimed', 'done'
# what Publications.claim answers
TAKEN, BUSY = 'taken', 'busy'


@dataclasses.dataclass(frozen=True)
class Publication:
    object_id: str
    image_id: str
    what: str
    sha256: str
    state: str
    holder: str
    claimed_at: datetime.datetime

    @classmethod
    def of(cls, row):
        return models.as_dataclass(cls, row)


class Publications:
    """The ``vmar_publications`` table, for the publisher ``holder``."""

    def __init__(self, conf, holder):
        self.conf = conf
        self.holder = holder

    def get(self, object_id):
        with db_session.reader(self.conf) as s:
            row = s.get(models.Publication, object_id)
            return None if row is None else Publication.of(row)

    @db_session.retry_conflicts(also=db_session.duplicate)
    def claim(self, object_id, image_id, what, sha256, timeout):
        """Claim the upload of ``object_id``: :data:`TAKEN` or :data:`BUSY`.

        :data:`BUSY` while another holder's claim is younger than
        ``timeout`` seconds. A claim of ours, an older one, or a row
        :data:`DONE` (its hidden image may have gone since: the caller
        checks Glance) is taken.
        """
        now = models.utcnow()
        with db_session.writer(self.conf) as s:
            row = s.get(models.Publication, object_id, with_for_update=True)
            if row is None:
                s.add(models.Publication(
                    object_id=object_id, image_id=image_id, what=what,
                    sha256=sha256, state=CLAIMED, holder=self.holder,
                    claimed_at=now))
                return TAKEN
            if (row.state == CLAIMED and row.holder != self.holder
                    and now - row.claimed_at
                    < datetime.timedelta(seconds=timeout)):
                return BUSY
            row.image_id, row.what, row.sha256 = image_id, what, sha256
            row.state, row.holder, row.claimed_at = CLAIMED, self.holder, now
            return TAKEN

    @db_session.retry_conflicts()
    def done(self, object_id, sha256):
        """Our claim of ``object_id`` is published: whether it was ours.

        A claim another holder took over meanwhile stays theirs.
        """
        with db_session.writer(self.conf) as s:
            row = s.get(models.Publication, object_id, with_for_update=True)
            if row is None or row.holder != self.holder:
                return False
            row.state, row.sha256 = DONE, sha256
            return True

    @db_session.retry_conflicts()
    def release(self, object_id):
        """Give up our claim of ``object_id`` (the upload failed).

        The row goes, so another publisher need not wait for the claim to
        time out; a row another holder took over stays.
        """
        with db_session.writer(self.conf) as s:
            s.execute(sa.delete(models.Publication).where(
                models.Publication.object_id == object_id,
                models.Publication.holder == self.holder,
                models.Publication.state == CLAIMED))

    @db_session.retry_conflicts()
    def forget(self, object_ids):
        """Drop the rows of hidden images that were deleted."""
        ids = sorted(set(object_ids))
        with db_session.writer(self.conf) as s:
            for i in range(0, len(ids), 500):
                s.execute(sa.delete(models.Publication).where(
                    models.Publication.object_id.in_(ids[i:i + 500])))

    def unfinished(self, older_than):
        """Claims not done ``older_than`` seconds after they were made."""
        cutoff = models.utcnow() - datetime.timedelta(seconds=older_than)
        p = models.Publication
        with db_session.reader(self.conf) as s:
            rows = s.execute(sa.select(p).where(
                p.state == CLAIMED, p.claimed_at < cutoff)
                .order_by(p.claimed_at)).scalars()
            return [Publication.of(r) for r in rows]
