"""Fixtures of the security suite: the agent and dispatcher harnesses, and an attacker on the broker.

The attacker is an MQTT client with no credentials and no keys: what anyone who reaches the broker has.
"""

from __future__ import annotations

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
