"""The ``vmar_agent_failures`` table: images the agent could not handle.

One row per image whose last event failed: how often, the last error, and
whether the agent has given up on it (``permanent``: a hostile or
unreadable image at once, anything else after ``[vmar_agent]
max_attempts``).
"""

import sqlalchemy as sa

from vmar_openstack.db import models
from vmar_openstack.db import session as db_session


class Failures:
    """The ``vmar_agent_failures`` table."""

    def __init__(self, conf):
        self.conf = conf

    def get(self, image_id):
        with db_session.reader(self.conf) as s:
            row = s.get(models.AgentFailure, image_id)
            return None if row is None else (row.attempts, row.permanent)

    def record(self, image_id, event, error, permanent):
        with db_session.locked_writer(self.conf) as s:
            row = s.get(models.AgentFailure, image_id)
            if row is None:
                row = models.AgentFailure(image_id=image_id, event=event,
                                          attempts=0, permanent=False,
                                          last_error='')
                s.add(row)
            row.attempts += 1
            row.event = event
            row.last_error = error[:4000]
            row.permanent = permanent or (
                row.attempts >= self.conf.vmar_agent.max_attempts)
            return row.attempts, row.permanent

    def clear(self, image_id):
        with db_session.locked_writer(self.conf) as s:
            s.execute(sa.delete(models.AgentFailure).where(
                models.AgentFailure.image_id == image_id))
