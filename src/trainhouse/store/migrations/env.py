"""Alembic environment: runs migrations on the connection trainhouse hands it."""

from alembic import context

from trainhouse.store.tables import metadata

config = context.config
connection = config.attributes.get("connection")
if connection is None:  # `alembic` CLI use: build an engine from the configured URL
    from sqlalchemy import create_engine

    connection = create_engine(config.get_main_option("sqlalchemy.url") or "").connect()

context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
