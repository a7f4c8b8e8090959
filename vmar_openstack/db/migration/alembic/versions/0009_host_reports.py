"""What each compute host exports, as it last reported.

vmar-export reports the map versions its host holds; vmar-agent keeps the
last report of every host here and removes an old map version only once
no host holds it (see doc/source/admin/operations.rst).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23
"""

from alembic import op
import sqlalchemy as sa

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        'vmar_hosts',
        sa.Column('host', sa.String(255), primary_key=True),
        sa.Column('reported_at', sa.DateTime, nullable=False),
    )
    op.create_table(
        'vmar_host_exports',
        sa.Column('host', sa.String(255),
                  sa.ForeignKey('vmar_hosts.host', ondelete='CASCADE'),
                  primary_key=True),
        sa.Column('image_id', sa.String(36), primary_key=True),
        sa.Column('map_version', sa.Integer, primary_key=True,
                  autoincrement=False),
    )
