"""Initial cluster tables.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from alembic import op
import sqlalchemy as sa

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None

BigInt = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade():
    op.create_table(
        'vmar_images',
        sa.Column('seq', BigInt, primary_key=True, autoincrement=True),
        sa.Column('image_id', sa.String(36), nullable=False, unique=True),
        sa.Column('owner', sa.String(255)),
        sa.Column('visibility', sa.String(16), nullable=False),
        sa.Column('disk_format', sa.String(16), nullable=False),
        sa.Column('virtual_size', sa.BigInteger, nullable=False),
        sa.Column('block_size', sa.Integer, nullable=False),
        sa.Column('algorithm', sa.String(32), nullable=False),
        sa.Column('space_key', sa.BigInteger, nullable=False),
        sa.Column('state', sa.String(16), nullable=False),
        sa.Column('n_blocks', sa.BigInteger, nullable=False),
        sa.Column('zero_blocks', sa.BigInteger, nullable=False),
        sa.Column('content_sha256', sa.String(64), nullable=False),
        sa.Column('map_version', sa.Integer, nullable=False),
        sa.Column('redirected_blocks', sa.BigInteger, nullable=False),
        sa.Column('n_extents', sa.BigInteger, nullable=False),
        sa.Column('created_at', sa.DateTime, nullable=False),
        sa.Column('updated_at', sa.DateTime, nullable=False),
        sqlite_autoincrement=True, mysql_engine='InnoDB')
    op.create_table(
        'vmar_image_digests',
        sa.Column('seq', BigInt, sa.ForeignKey('vmar_images.seq',
                                               ondelete='CASCADE'),
                  primary_key=True),
        sa.Column('chunk', sa.Integer, primary_key=True,
                  autoincrement=False),
        sa.Column('data', sa.LargeBinary(length=2 ** 32 - 1),
                  nullable=False),
        mysql_engine='InnoDB')
    op.create_table(
        'vmar_clusters',
        sa.Column('id', BigInt, primary_key=True, autoincrement=True),
        sa.Column('members_hash', sa.String(64), nullable=False,
                  unique=True),
        sa.Column('n_images', sa.Integer, nullable=False),
        sa.Column('n_fingerprints', sa.BigInteger, nullable=False),
        sqlite_autoincrement=True, mysql_engine='InnoDB')
    op.create_table(
        'vmar_cluster_members',
        sa.Column('cluster_id', BigInt, sa.ForeignKey('vmar_clusters.id',
                                                      ondelete='CASCADE'),
                  primary_key=True),
        sa.Column('seq', BigInt, sa.ForeignKey('vmar_images.seq'),
                  primary_key=True),
        mysql_engine='InnoDB')
    op.create_index('ix_vmar_cluster_members_seq', 'vmar_cluster_members',
                    ['seq'])
    op.create_table(
        'vmar_fingerprints',
        sa.Column('fp_key', BigInt, primary_key=True, autoincrement=False),
        sa.Column('cluster_id', BigInt, sa.ForeignKey('vmar_clusters.id'),
                  nullable=False),
        mysql_engine='InnoDB')
    op.create_index('ix_vmar_fingerprints_cluster_id', 'vmar_fingerprints',
                    ['cluster_id'])
    op.create_table(
        'vmar_maps',
        sa.Column('seq', BigInt, sa.ForeignKey('vmar_images.seq',
                                               ondelete='CASCADE'),
                  primary_key=True),
        sa.Column('version', sa.Integer, primary_key=True,
                  autoincrement=False),
        sa.Column('sha256', sa.String(64), nullable=False),
        sa.Column('size', sa.BigInteger, nullable=False),
        sa.Column('n_extents', sa.BigInteger, nullable=False),
        sa.Column('created_at', sa.DateTime, nullable=False),
        mysql_engine='InnoDB')
    locks = op.create_table(
        'vmar_locks',
        sa.Column('name', sa.String(64), primary_key=True),
        mysql_engine='InnoDB')
    op.bulk_insert(locks, [{'name': 'library'}])
