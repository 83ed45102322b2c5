"""Alembic environment: runs the revisions on a connection handed in by ``dispatcher.db``.

``dispatcher.db`` opens an async engine, and inside ``connection.run_sync`` puts the sync
connection into ``config.attributes["connection"]``; this file then only configures the context.
Run from the alembic CLI instead (``-x url=...``), it opens its own engine the same way.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from dispatcher.db.models import metadata

config = context.config


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",  # ALTER on SQLite needs batch mode
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_own_engine(url: str) -> None:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            await conn.run_sync(_configure)
            await conn.commit()
    finally:
        await engine.dispose()


if context.is_offline_mode():
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    context.configure(url=url, target_metadata=metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    given = config.attributes.get("connection")
    if given is not None:
        _configure(given)
    else:
        asyncio.run(_run_own_engine(context.get_x_argument(as_dictionary=True)["url"]))
