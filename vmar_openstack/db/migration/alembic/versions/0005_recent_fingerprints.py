"""A small second tier of the fingerprint table.

``vmar_fingerprints_recent`` has the columns of ``vmar_fingerprints`` and
takes the new keys of adds that bring few, until it is merged into the
large table in key order (see vmar_openstack.db.bulk). A key is in one of
the two tables, never in both.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22
"""

from alembic import op
import sqlalchemy as sa

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

BigInt = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade():
    op.create_table(
        'vmar_fingerprints_recent',
        sa.Column('fp_key', BigInt, primary_key=True, autoincrement=False),
        # no foreign key: see migration 0007
        sa.Column('cluster_id', BigInt, nullable=False),
        mysql_engine='InnoDB')
