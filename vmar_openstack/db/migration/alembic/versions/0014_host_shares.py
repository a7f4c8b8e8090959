"""What each host holds of each base, computed once per report.

The weigher's lookup summed, at every request, each host's mirrors and
each map its exports read: at a thousand hosts that took 6 ms at the
median and 31 ms at p99 on MariaDB (issue 35, ``bench/bench_scale.py
hosts``). Each report now writes its host's share of each base it holds
or reads (``vmar_host_shares``), and the lookup sums those. The table
starts empty: every host's next report (``[vmar_host] report_interval``,
60 s) fills its rows, and until then the weigher weighs it 0.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27
"""

from alembic import op
import sqlalchemy as sa

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        'vmar_host_shares',
        sa.Column('host', sa.String(255),
                  sa.ForeignKey('vmar_hosts.host', ondelete='CASCADE'),
                  primary_key=True),
        sa.Column('base_id', sa.String(36), primary_key=True),
        sa.Column('share', sa.Float, nullable=False))
    op.create_index('ix_vmar_host_shares_base_id', 'vmar_host_shares',
                    ['base_id'])
