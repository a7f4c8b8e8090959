"""A host report's digest, and the library's maps epoch.

A thousand hosts report every report_interval, and most reports say what
the host's last one said (issue 35: vmar-agent fell behind six times the
real rate on a slow machine, writing about twenty statements a report).
``vmar_hosts.report_digest`` keeps what the rows of the host's last
report say, with the library's maps epoch then; ``vmar_locks.maps_epoch``
counts the changes the hosts' shares depend on (a map version replaced
or forgotten, an image deleted). Hosts of before have no digest: their
next report is written whole.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-29
"""

from alembic import op
import sqlalchemy as sa

revision = '0021'
down_revision = '0020'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('vmar_hosts') as batch:
        batch.add_column(sa.Column('report_digest', sa.String(64),
                                   nullable=True))
    with op.batch_alter_table('vmar_locks') as batch:
        batch.add_column(sa.Column('maps_epoch', sa.BigInteger,
                                   nullable=False, server_default='0'))
