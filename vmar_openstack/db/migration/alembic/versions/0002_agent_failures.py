"""vmar-agent failure records.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from alembic import op
import sqlalchemy as sa

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        'vmar_agent_failures',
        sa.Column('image_id', sa.String(36), primary_key=True),
        sa.Column('event', sa.String(64), nullable=False),
        sa.Column('attempts', sa.Integer, nullable=False),
        sa.Column('permanent', sa.Boolean, nullable=False),
        sa.Column('last_error', sa.Text, nullable=False),
        sa.Column('updated_at', sa.DateTime, nullable=False),
    )
