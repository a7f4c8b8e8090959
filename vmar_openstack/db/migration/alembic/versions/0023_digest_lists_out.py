"""Digest lists out of the database: each image names an object of its own.

``vmar_image_digests`` kept 32 bytes per block of every image's virtual
size, zero blocks included: nine tenths of the database, 130-250 GB for
10,000 images of real size (issue 51). ``vmar_images`` now names each
list by its SHA-256 and location (``digests_sha256``,
``digests_location``); the lists are objects in ``[vmar]
digest_object_dir`` (vmar_openstack.db.digest_lists).

This revision only adds the two columns (NULL: the list is still in
``vmar_image_digests``, which every reader still reads). ``vmar-manage
db sync`` then moves the lists out one image per transaction, so that a
move killed half way goes on where it stopped when run again.

Downgrade moves every list back into ``vmar_image_digests``, then drops
the columns; the objects stay (remove ``digest_object_dir`` after).

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-02
"""

from alembic import context
from alembic import op
import sqlalchemy as sa

from vmar_openstack.db import digest_lists

revision = '0023'
down_revision = '0022'
branch_labels = None
depends_on = None

CHUNK = 4 << 20


def upgrade():
    with op.batch_alter_table('vmar_images') as batch:
        batch.add_column(sa.Column('digests_sha256', sa.String(64)))
        batch.add_column(sa.Column('digests_location', sa.String(255)))


def downgrade():
    lists = digest_lists.DigestLists(
        context.config.attributes['vmar_conf'])
    bind = op.get_bind()
    rows = bind.execute(sa.text(
        'SELECT seq, image_id, digests_sha256, digests_location, n_blocks, '
        'algorithm FROM vmar_images WHERE digests_location IS NOT NULL '
        'ORDER BY seq')).mappings().all()
    for r in rows:
        raw = lists.load(r['image_id'], r['digests_sha256'],
                         r['digests_location'], r['n_blocks'],
                         digest_lists.digest_size(r['algorithm'])).tobytes()
        bind.execute(sa.text('DELETE FROM vmar_image_digests WHERE seq = :s'),
                     {'s': r['seq']})
        for i in range(0, len(raw), CHUNK):
            bind.execute(sa.text(
                'INSERT INTO vmar_image_digests (seq, chunk, data) '
                'VALUES (:s, :c, :d)'),
                {'s': r['seq'], 'c': i // CHUNK, 'd': raw[i:i + CHUNK]})
    with op.batch_alter_table('vmar_images') as batch:
        batch.drop_column('digests_location')
        batch.drop_column('digests_sha256')
