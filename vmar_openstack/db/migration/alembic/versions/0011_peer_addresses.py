"""Where each compute host serves its peers, and how busy it is.

A host that runs a peer server (``[vmar_peers] listen_address``) says in
its reports where (``host:port``) and its load (the one-minute load
average per CPU), so that vmar-agent can tell other hosts who holds the
blocks they miss, least loaded first (doc/source/admin/peers.rst). Hosts of
earlier releases report neither: both stay NULL and nobody is sent to
them.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27
"""

from alembic import op
import sqlalchemy as sa

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('vmar_hosts') as batch:
        batch.add_column(sa.Column('peer_address', sa.String(255),
                                   nullable=True))
        batch.add_column(sa.Column('load_per_cpu', sa.Float, nullable=True))
