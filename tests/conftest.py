"""Shared fixtures: real PostgreSQL and Mosquitto when reachable, SQLite and the embedded broker otherwise.

Which one a run used is printed in the pytest header, so a green run on a machine without the
services says so. ``MKD_TEST_MQTT_URL`` / ``MKD_TEST_DATABASE_URL`` override the detection;
``MKD_TEST_NO_SERVICES=1`` forces the fallbacks.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

POSTGRES_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/test"
MOSQUITTO = ("127.0.0.1", 1883)


def _reachable(host: str, port: int) -> bool:
    if os.environ.get("MKD_TEST_NO_SERVICES"):
        return False
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def postgres_available() -> bool:
    return "MKD_TEST_DATABASE_URL" in os.environ or _reachable("127.0.0.1", 5432)


def mosquitto_available() -> bool:
    return "MKD_TEST_MQTT_URL" in os.environ or _reachable(*MOSQUITTO)


def pytest_report_header(config: pytest.Config) -> list[str]:
    db = "PostgreSQL 127.0.0.1:5432" if postgres_available() else "SQLite (PostgreSQL not reachable)"
    mq = "Mosquitto 127.0.0.1:1883" if mosquitto_available() else "embedded amqtt broker (Mosquitto not reachable)"
    return [f"mkd services: database={db}; mqtt={mq}"]


@pytest.fixture
def topic_root() -> str:
    """A topic root unique to one test, so tests sharing one broker never hear each other."""
    return f"mkd-test-{uuid.uuid4().hex[:10]}/v1"


@pytest.fixture
async def mqtt_url() -> AsyncIterator[str]:
    """Mosquitto on 127.0.0.1:1883 when reachable, else an embedded amqtt broker for this test."""
    if "MKD_TEST_MQTT_URL" in os.environ:
        yield os.environ["MKD_TEST_MQTT_URL"]
    elif mosquitto_available():
        yield f"mqtt://{MOSQUITTO[0]}:{MOSQUITTO[1]}"
    else:
        from federation.embedded_broker import EmbeddedBroker

        async with EmbeddedBroker() as broker:
            yield broker.url


@pytest.fixture
async def database_url(tmp_path: Path) -> AsyncIterator[str]:
    """A fresh, empty database for one test: a new PostgreSQL database when reachable, else SQLite."""
    if "MKD_TEST_DATABASE_URL" in os.environ:
        yield os.environ["MKD_TEST_DATABASE_URL"]
        return
    if not postgres_available():
        yield f"sqlite+aiosqlite:///{tmp_path / 'mkd.db'}"
        return
    import asyncpg

    name = f"mkd_test_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(POSTGRES_ADMIN_DSN)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    try:
        yield f"postgresql+asyncpg://postgres@127.0.0.1:5432/{name}"
    finally:
        admin = await asyncpg.connect(POSTGRES_ADMIN_DSN)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> Iterator[str]:
    """Always SQLite, for tests that must cover the default backend whatever is reachable."""
    yield f"sqlite+aiosqlite:///{tmp_path / 'mkd-sqlite.db'}"
