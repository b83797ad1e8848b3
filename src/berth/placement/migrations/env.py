"""Alembic environment: runs on the connection handed in by ``berth.placement.db``."""

from __future__ import annotations

from alembic import context

from berth.placement.db import metadata

target_metadata = metadata


def run_migrations() -> None:
    """Run the pending revisions on the caller's connection, or on a URL from the config."""
    connection = context.config.attributes.get("connection")
    if connection is None:
        import sqlalchemy as sa

        url = context.config.get_main_option("sqlalchemy.url")
        engine = sa.create_engine(str(url))
        with engine.begin() as conn:
            context.configure(connection=conn, target_metadata=target_metadata)
            with context.begin_transaction():
                context.run_migrations()
        return
    context.configure(connection=connection, target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()


run_migrations()
