"""Cluster member lists move into the cluster rows.

``vmar_clusters.members`` holds the member seqs as ascending runs,
comma-separated (``1-57,59,61-200``; see
vmar_openstack.db.members.parse_members); the ``vmar_cluster_members`` table
goes. An add makes the new image a member
of hundreds or thousands of clusters: with one member row per pair, that
inserted one row per cluster into random places of two indexes, and the
commit wrote each page touched. Appending to the cluster row, which the
add rewrites anyway (its members hash changes), costs nothing more.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-22
"""

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import mysql

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None

MembersText = sa.Text().with_variant(mysql.MEDIUMTEXT(), 'mysql', 'mariadb')


def _run(a, b):
    return '%d' % a if a == b else '%d-%d' % (a, b)


def upgrade():
    with op.batch_alter_table('vmar_clusters') as batch:
        batch.add_column(sa.Column('members', MembersText, nullable=False,
                                   server_default=''))
    bind = op.get_bind()
    runs = {}
    for cid, seq in bind.execute(sa.text(
            'SELECT cluster_id, seq FROM vmar_cluster_members '
            'ORDER BY cluster_id, seq')):
        r = runs.setdefault(cid, [])
        if r and r[-1][1] + 1 == seq:
            r[-1][1] = seq
        else:
            r.append([seq, seq])
    if runs:
        bind.execute(sa.text(
            'UPDATE vmar_clusters SET members = :m WHERE id = :id'),
            [{'id': cid, 'm': ','.join(_run(a, b) for a, b in r)}
             for cid, r in runs.items()])
    op.drop_table('vmar_cluster_members')
