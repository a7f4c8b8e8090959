"""Alembic environment: runs migrations on the configured engine."""

from alembic import context

from vmar_openstack.db import migration
from vmar_openstack.db import models

config = context.config
engine = config.attributes['engine']
with engine.connect() as connection:
    sqlite = engine.dialect.name == 'sqlite'
    if sqlite:
        # A batch migration on SQLite copies a table and drops the old
        # one, and dropping it with foreign keys on deletes the rows that
        # reference it (ON DELETE CASCADE: an image's digest list went with
        # a column dropped from vmar_images). Set outside any transaction,
        # where SQLite takes it.
        connection.connection.dbapi_connection.execute(
            'PRAGMA foreign_keys=OFF')
    try:
        context.configure(connection=connection,
                          target_metadata=models.Base.metadata,
                          version_table=migration.VERSION_TABLE,
                          render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()
    finally:
        if sqlite:
            connection.connection.dbapi_connection.execute(
                'PRAGMA foreign_keys=ON')
