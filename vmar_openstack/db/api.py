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


def database_bytes(session):
    """``{table: bytes}`` of the library's tables, data and indexes.

    What the database server says it uses (PostgreSQL, MariaDB); SQLite
    keeps one file, so only ``{'*': its size}`` (issue 35's size per
    image, doc/source/admin/scale.rst).
    """
    name = session.get_bind().dialect.name
    if name == 'postgresql':
        rows = session.execute(sa.text(
            "SELECT relname, pg_total_relation_size(c.oid) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE "
            "c.relkind = 'r' AND n.nspname = current_schema() AND "
            "relname LIKE 'vmar%'")).all()
    elif name in ('mysql', 'mariadb'):
        # InnoDB's sizes are estimates refreshed by its statistics
        for (t,) in session.execute(sa.text(
                "SELECT table_name FROM information_schema.tables WHERE "
                "table_schema = DATABASE() AND table_name LIKE 'vmar%'")):
            session.execute(sa.text('ANALYZE TABLE `%s`' % t))
        rows = session.execute(sa.text(
            "SELECT table_name, data_length + index_length FROM "
            "information_schema.tables WHERE table_schema = DATABASE() AND "
            "table_name LIKE 'vmar%'")).all()
    else:
        rows = session.execute(sa.text(
            'SELECT page_count * page_size FROM pragma_page_count(), '
            'pragma_page_size()')).all()
        rows = [('*', rows[0][0])]
    return {t: int(n) for t, n in rows}


def row_counts(session, tables):
    """``{table: rows}`` of the library's ``tables`` (bench and stats)."""
    return {t: session.execute(sa.text('SELECT COUNT(*) FROM %s' % t))
            .scalar() for t in tables
            if t in sa.inspect(session.get_bind()).get_table_names()}


def largest_cluster(session):
    """Holders of the cluster most images share (0 without clusters).

    Its members and its shadow holders.
    """
    sh = models.ClusterShadow
    shadows = (sa.select(sh.cluster_id, sa.func.count().label('n'))
               .group_by(sh.cluster_id).subquery())
    c = models.Cluster
    return session.execute(
        sa.select(sa.func.max(c.n_images + sa.func.coalesce(shadows.c.n, 0)))
        .select_from(c).outerjoin(shadows, shadows.c.cluster_id == c.id)
    ).scalar() or 0
