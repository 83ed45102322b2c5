"""Fixtures of the security suite: the agent and dispatcher harnesses, and an attacker on the broker.

The attacker is an MQTT client with no credentials and no keys: what anyone who reaches the broker has.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

from federation.mqtt import MqttLink
from federation.settings import MqttSettings
from tests.agent.conftest import harness  # noqa: F401  (fixture)
from tests.dispatcher.conftest import db_url, kube, manager  # noqa: F401  (fixtures)


@contextlib.asynccontextmanager
async def attacker(mqtt_url: str) -> AsyncIterator[MqttLink]:
    """An anonymous client on the broker the federation uses."""
    async with MqttLink(MqttSettings(url=mqtt_url), client_id=f"attacker-{uuid.uuid4().hex[:8]}",
                        persistent=False) as link:
        yield link


@contextlib.asynccontextmanager
async def sniffing(mqtt_url: str, topic_filter: str) -> AsyncIterator[list[bytes]]:
    """Every payload an anonymous subscriber to ``topic_filter`` receives while inside (a broker reader)."""
    seen: list[bytes] = []
    async with attacker(mqtt_url) as reader:
        await reader.subscribe(topic_filter)

        async def sniff() -> None:
            async for message in reader.messages():
                seen.append(message.payload)
        task = asyncio.create_task(sniff())
        try:
            yield seen
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
