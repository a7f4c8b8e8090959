"""Reading image rows.

The queries on vmar_images that services outside the library (the Glance
hooks, the commands) make with a session of their own. Everything else on
the tables goes through :class:`vmar_openstack.db.store.ClusterStore`.
"""

import sqlalchemy as sa

from vmar_openstack.db import models

VISIBILITIES = ('public', 'private', 'shared', 'community')


def get_image(session, image_id):
    stmt = sa.select(models.Image).where(models.Image.image_id == image_id)
    return session.execute(stmt).scalar_one_or_none()


def images_by_seq(session, seqs):
    seqs = [int(s) for s in seqs]
    out = {}
    for i in range(0, len(seqs), 500):
        for img in session.execute(sa.select(models.Image).where(
                models.Image.seq.in_(seqs[i:i + 500]))).scalars():
            out[img.seq] = img
    return out


def image_rows(session):
    """Every image as a read-only row (attributes as on the model)."""
    return session.execute(sa.select(*models.Image.__table__.c)).all()


def list_images(session):
    return session.execute(sa.select(models.Image).order_by(
        models.Image.seq)).scalars().all()
