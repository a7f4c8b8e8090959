"""Drop the index on vmar_fingerprints.cluster_id.

Every query now reaches fingerprint rows by key; keeping the index up to
date doubled the cost of inserting and moving fingerprints. MariaDB/MySQL
keep it: InnoDB needs an index on a foreign-key column.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade():
    if op.get_bind().dialect.name in ('mysql', 'mariadb'):
        return
    op.drop_index('ix_vmar_fingerprints_cluster_id', 'vmar_fingerprints')
