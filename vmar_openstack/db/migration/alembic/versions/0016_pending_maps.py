"""Maps left for vmar-agent to rewrite after a change of another image.

Deleting the image canonical for the blocks every image holds rewrote
every map of the library in the delete's transaction, under the library
lock: at 10,000 images it did not finish (issue 35). A change now
rewrites ``[vmar] rewrite_at_once`` maps itself and records the others
here; vmar-agent rewrites them in the background
(``[vmar_agent] pending_maps_per_minute``).

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27
"""

from alembic import op
import sqlalchemy as sa

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None

BigInt = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade():
    op.create_table(
        'vmar_pending_maps',
        sa.Column('seq', BigInt,
                  sa.ForeignKey('vmar_images.seq', ondelete='CASCADE'),
                  primary_key=True),
        sa.Column('cause', sa.String(36), nullable=False),
        sa.Column('since', sa.DateTime, nullable=False))
