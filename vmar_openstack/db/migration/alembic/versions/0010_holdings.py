"""What each map reads from each base, and what each host holds of them.

A map version's block count per target (``vmar_map_targets``) and a
host's blocks of each base it holds (``vmar_host_bases``, from its
reports) let the scheduler weigh hosts by the share of an image's
canonical blocks they already hold (doc/source/admin/scheduling.rst). Map
versions written before this revision have no target rows: the weigher
treats their images as unknown (weight 0 on every host).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25
"""

from alembic import op
import sqlalchemy as sa

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None

BigInt = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade():
    op.create_table(
        'vmar_map_targets',
        sa.Column('seq', BigInt,
                  sa.ForeignKey('vmar_images.seq', ondelete='CASCADE'),
                  primary_key=True),
        sa.Column('version', sa.Integer, primary_key=True,
                  autoincrement=False),
        sa.Column('target_id', sa.String(36), primary_key=True),
        sa.Column('blocks', sa.BigInteger, nullable=False),
    )
    op.create_table(
        'vmar_host_bases',
        sa.Column('host', sa.String(255),
                  sa.ForeignKey('vmar_hosts.host', ondelete='CASCADE'),
                  primary_key=True),
        sa.Column('base_id', sa.String(36), primary_key=True),
        sa.Column('blocks', sa.BigInteger, nullable=True),
    )
    op.create_index('ix_vmar_host_bases_base_id', 'vmar_host_bases',
                    ['base_id'])
