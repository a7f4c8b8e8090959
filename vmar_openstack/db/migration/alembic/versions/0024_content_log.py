"""A content generation and a change log, for ingests' stale snapshots.

Every locked transaction moved ``vmar_locks.generation``, and an ingest
whose snapshot was older than the lock's generation looked every key up
again and built its map again, under the lock (issue 51). Most locked
transactions change no cluster: a pending map rewritten, a map GC, a
remap. ``content_generation`` counts only those that change the clusters
(an add, an update, a delete), and ``vmar_content_log`` keeps a row per
such change for a while: for an add, filters of the keys it inserted
and moved, and the clusters it joined, so that a stale ingest finds
which of its own keys changed without probing the table for each
(vmar_openstack.db.content_log).

Downgrade drops both; ingests compare ``generation`` again.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-02
"""

from alembic import op
import sqlalchemy as sa

revision = '0024'
down_revision = '0023'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('vmar_locks') as batch:
        batch.add_column(sa.Column('content_generation', sa.BigInteger,
                                   nullable=False, server_default='0'))
    op.create_table(
        'vmar_content_log',
        sa.Column('generation', sa.BigInteger, primary_key=True,
                  autoincrement=False),
        sa.Column('kind', sa.String(8), nullable=False),
        sa.Column('created_at', sa.DateTime, nullable=False),
        sa.Column('key_filter', sa.LargeBinary(length=2 ** 32 - 1)),
        sa.Column('moved_filter', sa.LargeBinary(length=2 ** 32 - 1)),
        sa.Column('clusters', sa.LargeBinary(length=2 ** 32 - 1)))
    op.create_index('ix_vmar_content_log_created_at', 'vmar_content_log',
                    ['created_at'])


def downgrade():
    op.drop_index('ix_vmar_content_log_created_at', 'vmar_content_log')
    op.drop_table('vmar_content_log')
    with op.batch_alter_table('vmar_locks') as batch:
        batch.drop_column('content_generation')
