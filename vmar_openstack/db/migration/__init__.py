"""Schema migrations (alembic, version table ``vmar_alembic_version``)."""

import os

from alembic import command
from alembic import config as alembic_config

from vmar_openstack.db import session as db_session

VERSION_TABLE = 'vmar_alembic_version'


def _config(engine):
    cfg = alembic_config.Config()
    cfg.set_main_option('script_location', os.path.join(
        os.path.dirname(__file__), 'alembic'))
    cfg.attributes['engine'] = engine
    return cfg


def upgrade(revision='head', conf=None):
    command.upgrade(_config(db_session.get_engine(conf)), revision)


def current(conf=None):
    from alembic import migration
    with db_session.get_engine(conf).connect() as conn:
        ctx = migration.MigrationContext.configure(
            conn, opts={'version_table': VERSION_TABLE})
        return ctx.get_current_revision()
