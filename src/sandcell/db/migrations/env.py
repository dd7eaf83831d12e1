"""Alembic's environment: migrations run on the connection :mod:`sandcell.db.migrate` opened
(inside its transaction, under its advisory lock); there is no ini file and no offline mode."""

from alembic import context

from sandcell.db.migrate import VERSION_SCHEMA

connection = context.config.attributes["connection"]
context.configure(connection=connection, version_table_schema=VERSION_SCHEMA)
with context.begin_transaction():
    context.run_migrations()
