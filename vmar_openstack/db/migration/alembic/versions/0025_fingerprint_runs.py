"""Fingerprint runs and overrides: an add's new keys as one blob.

An add inserted each of its new keys as a row of the fingerprint table
under the library lock: a base of 700,000 new blocks held the lock 5 to
12 s and replicated about 56 bytes of Galera write set per key (issue
51). ``vmar_fingerprint_runs`` keeps an add's new keys as one sorted
blob (8 bytes a key), in pieces that a compaction writes into the row
tiers later, outside the lock, a piece at a time;
``vmar_fingerprint_overrides`` keeps the keys moved or gone since
(vmar_openstack.db.bulk). The row of ``vmar_compaction`` makes
compactions take turns: not a row of ``vmar_locks``, which PostgreSQL
locks as a table while a locked transaction runs (db.session).

Downgrade: refused while a run or an override is left; run ``vmar-manage
db compact`` first (with no writer running), then downgrade.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-03
"""

from alembic import op
import sqlalchemy as sa

from vmar_openstack import exception

revision = '0025'
down_revision = '0024'
branch_labels = None
depends_on = None

BigInt = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade():
    op.create_table(
        'vmar_fingerprint_runs',
        sa.Column('id', sa.BigInteger, primary_key=True,
                  autoincrement=False),
        sa.Column('piece', sa.Integer, primary_key=True,
                  autoincrement=False),
        sa.Column('cluster_id', sa.BigInteger, nullable=False),
        sa.Column('n_keys', sa.Integer, nullable=False),
        sa.Column('key_blob', sa.LargeBinary(length=2 ** 32 - 1),
                  nullable=False))
    op.create_table(
        'vmar_fingerprint_overrides',
        sa.Column('fp_key', BigInt, primary_key=True, autoincrement=False),
        sa.Column('cluster_id', sa.BigInteger, nullable=False),
        sa.Column('hides', sa.BigInteger, nullable=False))
    op.create_table(
        'vmar_compaction',
        sa.Column('id', sa.Integer, primary_key=True, autoincrement=False),
        sa.Column('turn', sa.BigInteger, nullable=False))
    op.execute('INSERT INTO vmar_compaction (id, turn) VALUES (1, 0)')


def downgrade():
    bind = op.get_bind()
    left = sum(bind.execute(sa.text('SELECT COUNT(*) FROM %s' % t)).scalar()
               for t in ('vmar_fingerprint_runs',
                         'vmar_fingerprint_overrides'))
    if left:
        raise exception.DowngradeRefused(
            revision=revision,
            reason='%d fingerprint runs and overrides are not compacted '
            '(run "vmar-manage db compact" with no writer running, then '
            'downgrade again)' % left)
    op.drop_table('vmar_compaction')
    op.drop_table('vmar_fingerprint_overrides')
    op.drop_table('vmar_fingerprint_runs')
