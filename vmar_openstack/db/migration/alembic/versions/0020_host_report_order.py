"""Each host report's place among its host's reports.

A host reports an added or removed export within a second, besides every
report_interval (issue 35): two reports of a host can then be in
vmar-agent's pool at once and be recorded in either order. ``vmar_hosts``
keeps the run of the host's vmar-export and the number of the report
recorded, so that an older report of the same run is not recorded over a
newer one. Hosts of before send neither: NULL.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-28
"""

from alembic import op
import sqlalchemy as sa

revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('vmar_hosts') as batch:
        batch.add_column(sa.Column('report_run', sa.String(36),
                                   nullable=True))
        batch.add_column(sa.Column('report_seq', sa.BigInteger,
                                   nullable=True))
