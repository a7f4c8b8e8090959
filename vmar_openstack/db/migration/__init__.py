"""Schema migrations (alembic, version table ``vmar_alembic_version``)."""

import os

from alembic import command
from alembic import config as alembic_config
from alembic import script as alembic_script

from vmar_openstack import conf as vmar_conf
from vmar_openstack.db import session as db_session
from vmar_openstack import exception

VERSION_TABLE = 'vmar_alembic_version'


def _config(conf):
    cfg = alembic_config.Config()
    cfg.set_main_option('script_location', os.path.join(
        os.path.dirname(__file__), 'alembic'))
    cfg.attributes['engine'] = db_session.get_engine(conf)
    # for a revision that moves data out of the tables or back (0023)
    cfg.attributes['vmar_conf'] = conf or vmar_conf.CONF
    return cfg


def upgrade(revision='head', conf=None):
    command.upgrade(_config(conf), revision)


def downgrade(revision, conf=None):
    """Back to ``revision``; only revisions that say how can be undone.

    :raises IrreversibleMigration: a revision on the way has no
        ``downgrade`` (nothing is changed then).
    """
    cfg = _config(conf)
    now = current(conf)
    script = alembic_script.ScriptDirectory.from_config(cfg)
    floor = now
    for rev in script.iterate_revisions(now, revision):
        if not hasattr(rev.module, 'downgrade'):
            raise exception.IrreversibleMigration(
                revision=rev.revision, current=now, floor=floor)
        floor = rev.down_revision
    command.downgrade(cfg, revision)


def current(conf=None):
    from alembic import migration
    with db_session.get_engine(conf).connect() as conn:
        ctx = migration.MigrationContext.configure(
            conn, opts={'version_table': VERSION_TABLE})
        return ctx.get_current_revision()
