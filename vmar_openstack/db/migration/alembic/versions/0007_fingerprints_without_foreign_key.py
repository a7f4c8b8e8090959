"""Drop the foreign key from vmar_fingerprints.cluster_id.

The database checked it for every fingerprint inserted or moved: a lookup
in the cluster table per row, a quarter of the cost of those statements
(SQLite, 512 Ki rows: moves 0.46 s with it and 0.33 s without, inserts
0.39 s and 0.30 s). Every mutation points fingerprints at clusters it
created or read in the same transaction, and ``vmar-manage check`` reports
a fingerprint whose cluster is missing. MariaDB/MySQL also drop the index
that InnoDB needed for the key (see 0003).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-22
"""

from alembic import op
import sqlalchemy as sa

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

# names for the constraints SQLite keeps unnamed, so batch mode can drop one
NAMES = {'fk': 'fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s'}


def upgrade():
    bind = op.get_bind()
    if bind.dialect.name == 'sqlite':
        with op.batch_alter_table('vmar_fingerprints', recreate='always',
                                  naming_convention=NAMES) as batch:
            batch.drop_constraint(
                'fk_vmar_fingerprints_cluster_id_vmar_clusters',
                type_='foreignkey')
        return
    for fk in sa.inspect(bind).get_foreign_keys('vmar_fingerprints'):
        op.drop_constraint(fk['name'], 'vmar_fingerprints',
                           type_='foreignkey')
    if bind.dialect.name in ('mysql', 'mariadb'):
        op.drop_index('ix_vmar_fingerprints_cluster_id', 'vmar_fingerprints')
