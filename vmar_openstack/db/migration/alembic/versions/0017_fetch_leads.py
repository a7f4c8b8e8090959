"""Hosts' places in a burst of a base: whom each waits for.

When the servers of a new image start on several hosts at once, no host
holds its blocks yet and each one fetched them from the store (issue 34).
Hosts now take places in the order they ask vmar-agent who holds a base,
from the first one, who asked when nobody held any of it, for
``[vmar_agent] fetch_lead_seconds``: the first fetches from the store,
each other waits a moment for the runs of the host at its place's lead,
``[vmar_agent] fetch_lead_fanout`` hosts to a lead (doc/source/admin/peers.rst,
"Bursts").

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
        sa.Column('seq', sa.Integer, primary_key=True, autoincrement=False),
        sa.Column('host', sa.String(255), nullable=False),
        sa.Column('since', sa.DateTime, nullable=False),
        sa.UniqueConstraint('base_id', 'host',
                            name='uq_vmar_fetch_leads_base_id_host'))
