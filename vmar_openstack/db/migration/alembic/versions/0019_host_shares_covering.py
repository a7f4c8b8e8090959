"""Each base's holders, read from the index alone.

The scheduler's weigher reads every host's share of an image's bases
(``vmar_host_shares`` by ``base_id``); at a thousand hosts a popular base
has a thousand rows, and each was a read of the table besides the index
(issue 35, bench/bench_scale.py hosts). The index on ``base_id`` becomes
one on ``(base_id, host, share)``.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-28
"""

from alembic import op

revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None


def upgrade():
    op.create_index('ix_vmar_host_shares_base_id_host_share',
                    'vmar_host_shares', ['base_id', 'host', 'share'])
    op.drop_index('ix_vmar_host_shares_base_id', 'vmar_host_shares')
