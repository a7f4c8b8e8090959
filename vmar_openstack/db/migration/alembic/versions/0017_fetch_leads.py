"""The host that fetches a base from the store first in a burst.

When the servers of a new image start on several hosts at once, no host
holds its blocks yet and each one fetched them from the store (issue 34).
The first host that asks vmar-agent who holds a base nobody holds becomes
its *lead* for ``[vmar_agent] fetch_lead_seconds``: the hosts that ask
after it are told to wait a moment for the runs the lead is fetching
rather than fetch them again (doc/source/peers.rst, "Bursts").

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-28
"""

from alembic import op
import sqlalchemy as sa

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        'vmar_fetch_leads',
        sa.Column('base_id', sa.String(36), primary_key=True),
        sa.Column('host', sa.String(255), nullable=False),
        sa.Column('since', sa.DateTime, nullable=False))
