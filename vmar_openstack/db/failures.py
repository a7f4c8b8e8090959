"""The ``vmar_agent_failures`` table: images the agent could not handle.

One row per image whose last event failed: how often, the last error, and
why (:data:`CAUSES`). Its :attr:`Failure.state`:

``retrying``
    the event is being redelivered, with backoff (``[vmar_agent]
    retry_delay``);
``parked``
    an outage (Glance, the database) outlasted ``[vmar_agent]
    max_attempts``: the agent retries the image once the outage is over;
``failed``
    the image itself is unusable (hostile, unreadable): only an operator
    retries it (``vmar-manage failures retry``).
"""

import dataclasses
import datetime

import sqlalchemy as sa

from vmar_openstack.db import models
from vmar_openstack.db import session as db_session

IMAGE, OUTAGE = 'image', 'outage'
CAUSES = (IMAGE, OUTAGE)


@dataclasses.dataclass(frozen=True)
class Failure:
    image_id: str
    event: str
    attempts: int
    permanent: bool
    cause: str
    last_error: str
    updated_at: datetime.datetime

    @property
    def state(self):
        if self.cause == IMAGE:
            return 'failed'
        return 'parked' if self.permanent else 'retrying'

    @classmethod
    def of(cls, row):
        return models.as_dataclass(cls, row)


class Failures:
    """The ``vmar_agent_failures`` table.

    Its transactions take the image's row, never the library lock
    (:func:`vmar_openstack.db.session.writer`): a failure recorded moves
    no generation, so it sends no ingest back to its lookups.
    """

    def __init__(self, conf):
        self.conf = conf

    def get(self, image_id):
        with db_session.reader(self.conf) as s:
            row = s.get(models.AgentFailure, image_id)
            return None if row is None else Failure.of(row)

    def list(self, state=None):
        with db_session.reader(self.conf) as s:
            rows = s.execute(sa.select(models.AgentFailure).order_by(
                models.AgentFailure.updated_at)).scalars()
            out = [Failure.of(r) for r in rows]
        return [f for f in out if state is None or f.state == state]

    @db_session.retry_conflicts(also=db_session.duplicate)
    def record(self, image_id, event, error, cause, park=False,
               recorded=False):
        """Count a failed attempt; returns the :class:`Failure`.

        The image is no longer retried on redelivery (``permanent``) when
        ``cause`` is :data:`IMAGE`, when ``park`` is set, or after
        ``[vmar_agent] max_attempts``.

        ``recorded``: the attempt was a retry of the image's recorded
        failure. If that record is gone (an operator's retry succeeded,
        or the failure was forgotten), nothing is recorded: None.
        """
        assert cause in CAUSES, cause
        with db_session.writer(self.conf) as s:
            row = s.get(models.AgentFailure, image_id, with_for_update=True)
            if row is None and recorded:
                return None
            if row is None:
                row = models.AgentFailure(image_id=image_id, event=event,
                                          attempts=0, permanent=False,
                                          last_error='')
                s.add(row)
            row.attempts += 1
            row.event = event
            row.cause = cause
            row.last_error = error[:4000]
            row.permanent = (park or cause == IMAGE or row.attempts
                             >= self.conf.vmar_agent.max_attempts)
            s.flush()
            return Failure.of(row)

    @db_session.retry_conflicts()
    def clear(self, image_id):
        """Forget an image's failure; whether there was one."""
        with db_session.writer(self.conf) as s:
            return s.execute(sa.delete(models.AgentFailure).where(
                models.AgentFailure.image_id == image_id)).rowcount > 0
