"""Alembic environment: runs migrations on the configured engine."""

from alembic import context

from vmar_openstack.db import migration
from vmar_openstack.db import models

config = context.config
engine = config.attributes['engine']
with engine.connect() as connection:
    context.configure(connection=connection,
                      target_metadata=models.Base.metadata,
                      version_table=migration.VERSION_TABLE,
                      render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
    connection.commit()
