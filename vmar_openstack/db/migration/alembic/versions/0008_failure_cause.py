"""Why vmar-agent failed on an image: the image itself, or an outage.

The agent used to give up for good on any image it failed 5 times, so a
Glance or database outage longer than its backoff left images without
maps. ``cause`` tells a bad image (``image``: retried only by an
operator) from everything else (``outage``: retried by the agent once
the outage is over). Existing rows are classified by their error.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23
"""

from alembic import op
import sqlalchemy as sa

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade():
    op.add_column('vmar_agent_failures', sa.Column(
        'cause', sa.String(8), nullable=False, server_default='outage'))
    failures = sa.table('vmar_agent_failures', sa.column('cause'),
                        sa.column('last_error'))
    op.execute(failures.update().where(
        failures.c.last_error.like('ImageUnusable:%')).values(cause='image'))
