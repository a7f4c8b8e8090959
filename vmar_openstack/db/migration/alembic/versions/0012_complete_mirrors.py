"""Which mirrors hold every block only their own image has.

A host says in its reports which of its exported images' mirrors are
complete: their present bits cover every block the exported map versions
read from the image itself (the fill is done). With a peer server, such a
host can serve those blocks once the image is deleted from the store, so
nova-api may move the image's servers (doc/source/admin/peers.rst). Reports of
earlier releases say nothing: their mirrors stay not complete.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27
"""

from alembic import op
import sqlalchemy as sa

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('vmar_host_bases') as batch:
        batch.add_column(sa.Column('complete', sa.Boolean, nullable=False,
                                   server_default=sa.false()))
