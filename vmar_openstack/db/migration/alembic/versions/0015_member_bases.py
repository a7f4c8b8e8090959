"""Cluster member sets become deltas against shared, immutable bases.

A cluster's members were one text column (revision 0006), rewritten
whole by every add that joined the cluster and copied whole by every
split. In a library of 10,000 images, where a cluster of a popular base
has thousands of scattered members, that made an add five times slower
at #10,000 than at #1,000, and ``vmar_clusters`` 13 GB of rewritten rows
(issue 35, ``bench/bench_scale.py library``). Each cluster now names a
base set (``vmar_member_bases``, written once, shared by the clusters
split from each other) and keeps what changed since in ``added`` and
``removed`` (vmar_openstack.db.members). Every existing member list
becomes a base of its own cluster.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-27
"""

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import mysql

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None

BigInt = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')
MembersText = sa.Text().with_variant(mysql.MEDIUMTEXT(), 'mysql', 'mariadb')


def upgrade():
    op.create_table(
        'vmar_member_bases',
        sa.Column('id', BigInt, primary_key=True, autoincrement=True),
        sa.Column('members_hash', sa.String(64), nullable=False,
                  unique=True),
        sa.Column('members', MembersText, nullable=False),
        sqlite_autoincrement=True)
    op.execute("INSERT INTO vmar_member_bases (members_hash, members) "
               "SELECT members_hash, members FROM vmar_clusters "
               "WHERE members <> ''")
    with op.batch_alter_table('vmar_clusters') as batch:
        batch.add_column(sa.Column('base_id', BigInt))
        batch.add_column(sa.Column('added', sa.Text, nullable=False,
                                   server_default=''))
        batch.add_column(sa.Column('removed', sa.Text, nullable=False,
                                   server_default=''))
    op.execute('UPDATE vmar_clusters SET base_id = (SELECT b.id FROM '
               'vmar_member_bases b WHERE b.members_hash = '
               'vmar_clusters.members_hash)')
    with op.batch_alter_table('vmar_clusters') as batch:
        batch.drop_column('members')
        batch.create_index('ix_vmar_clusters_base_id', ['base_id'])
