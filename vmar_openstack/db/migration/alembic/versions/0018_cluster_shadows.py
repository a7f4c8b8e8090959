"""Shadow holders of clusters, and images by owner.

An image added with keys that a public image before it holds no longer
joins (and splits) those keys' clusters: it is recorded as a shadow holder
of them, and joins them only when no such public member is left (issue
35: the clusters an add touched grew with every snapshot of the library,
and with them the time of an add). Existing libraries keep their clusters
as they are: every member is a holder, and no shadow is needed.

Map generation reads the owner's private images by owner, not the whole
image table.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-28
"""

from alembic import op
import sqlalchemy as sa

revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None

BigInt = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade():
    op.create_table(
        'vmar_cluster_shadows',
        sa.Column('cluster_id', BigInt, primary_key=True,
                  autoincrement=False),
        sa.Column('seq', BigInt, primary_key=True, autoincrement=False))
    op.create_index('ix_vmar_cluster_shadows_seq', 'vmar_cluster_shadows',
                    ['seq'])
    op.create_index('ix_vmar_images_owner', 'vmar_images', ['owner'])
