"""Smallest members per cluster; a generation count on the library lock.

``vmar_clusters.min_seq`` is the smallest sequence id among a cluster's
members and ``min_public_seq`` the smallest among its public members (NULL
if none). Map generation takes a cluster's canonical target from them
instead of reading the cluster's member list, whose length grows with the
library.

``vmar_locks.generation`` counts committed library mutations. An ingest
looks its fingerprints up while it hashes, outside the lock, and uses
those answers only if the count has not moved when it takes the lock.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from alembic import op
import sqlalchemy as sa

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('vmar_clusters') as batch:
        batch.add_column(sa.Column('min_seq', sa.BigInteger, nullable=False,
                                   server_default='0'))
    op.execute('UPDATE vmar_clusters SET min_seq = (SELECT MIN(m.seq) FROM '
               'vmar_cluster_members m WHERE m.cluster_id = vmar_clusters.id)'
               ' WHERE EXISTS (SELECT 1 FROM vmar_cluster_members m WHERE '
               'm.cluster_id = vmar_clusters.id)')
    with op.batch_alter_table('vmar_clusters') as batch:
        batch.add_column(sa.Column('min_public_seq', sa.BigInteger))
    op.execute("UPDATE vmar_clusters SET min_public_seq = (SELECT MIN(m.seq) "
               "FROM vmar_cluster_members m JOIN vmar_images i ON i.seq = "
               "m.seq WHERE m.cluster_id = vmar_clusters.id AND "
               "i.visibility = 'public')")
    with op.batch_alter_table('vmar_locks') as batch:
        batch.add_column(sa.Column('generation', sa.BigInteger,
                                   nullable=False, server_default='0'))
