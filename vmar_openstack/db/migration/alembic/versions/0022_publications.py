"""Publications: who publishes which hidden image, outside the library lock.

Publishing a map version, a digest list, a boot working set or a block
layout to Glance took the library lock (one publisher at a time, across
agents) and so counted in its generation: every publish sent the ingests
that had prepared their work in a snapshot back to doing it again under
the lock (issue 51). ``vmar_publications`` has one row per hidden image,
claimed by one publisher at a time. The table starts empty: an image
published before has no row, and its next publish (the agent's resync)
finds it active in Glance and records it.

Downgrade drops the table; the agents of before take the library lock
again.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-02
"""

from alembic import op
import sqlalchemy as sa

revision = '0022'
down_revision = '0021'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        'vmar_publications',
        sa.Column('object_id', sa.String(36), primary_key=True),
        sa.Column('image_id', sa.String(36), nullable=False),
        sa.Column('what', sa.String(32), nullable=False),
        sa.Column('sha256', sa.String(64), nullable=False),
        sa.Column('state', sa.String(8), nullable=False),
        sa.Column('holder', sa.String(255), nullable=False),
        sa.Column('claimed_at', sa.DateTime, nullable=False))
    op.create_index('ix_vmar_publications_image_id', 'vmar_publications',
                    ['image_id'])


def downgrade():
    op.drop_index('ix_vmar_publications_image_id', 'vmar_publications')
    op.drop_table('vmar_publications')
