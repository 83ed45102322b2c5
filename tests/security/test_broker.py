"""The shipped broker configuration (deploy/broker) under attack, on a private Mosquitto.

worker-1's credentials must not publish as worker-2 nor read worker-2's Commands; nobody connects
without a password or without TLS. Skipped where the mosquitto binary is absent.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest

from federation.errors import FederationError, Permanent
from federation.mqtt import MqttLink
from federation.settings import MqttSettings
from tests.security.mosquitto import MOSQUITTO, MOSQUITTO_PASSWD, PrivateBroker, private_mosquitto, shipped

pytestmark = pytest.mark.skipif(not (MOSQUITTO and MOSQUITTO_PASSWD),
                                reason="the mosquitto and mosquitto_passwd binaries are not installed")
ROOT = "mkd/v1"
DISPATCHER = "mkd-dispatcher"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> PrivateBroker:
    """One private broker for the module (each test uses fresh clients on it)."""
    with private_mosquitto(tmp_path_factory.mktemp("broker"), [DISPATCHER, "worker-1", "worker-2"]) as b:
        yield b  # type: ignore[misc]


@contextlib.asynccontextmanager
async def client(b: PrivateBroker, user: str | None, *, plaintext: bool = False) -> AsyncIterator[MqttLink]:
    url = f"mqtt://127.0.0.1:{b.port}" if plaintext else b.url()
    settings = MqttSettings(url=url, username=user, password=b.passwords.get(user or ""),
                            tls_ca=None if plaintext else b.ca, publish_timeout=3)
    async with MqttLink(settings, client_id=f"{user or 'anon'}-{uuid.uuid4().hex[:6]}", persistent=False) as link:
        yield link


async def received(link: MqttLink, within: float = 0.7) -> list[tuple[str, bytes]]:
    got: list[tuple[str, bytes]] = []
    it = link.messages()
    with contextlib.suppress(TimeoutError):
        while True:
            m = await asyncio.wait_for(anext(it), within)
            got.append((m.topic, m.payload))
    return got


def test_shipped_service_is_cluster_ip_and_tls_only() -> None:
    docs = shipped()
    services = [d for k, d in docs.items() if k.startswith("Service/")]
    assert services and all(d["spec"].get("type", "ClusterIP") == "ClusterIP" for d in services)
    conf = docs["ConfigMap/mosquitto"]["data"]["mosquitto.conf"]
    assert "allow_anonymous false" in conf and "listener 1883" not in conf and "acl_file" in conf


async def test_anonymous_and_plaintext_clients_are_refused(broker: PrivateBroker) -> None:
    async with client(broker, "worker-1"):
        pass  # the genuine way in works
    with pytest.raises(FederationError):
        async with client(broker, None):
            pass
    with pytest.raises(FederationError):
        async with client(broker, "worker-1", plaintext=True):
            pass


async def test_worker_1_cannot_read_worker_2_commands(broker: PrivateBroker) -> None:
    async with client(broker, "worker-1") as spy, client(broker, DISPATCHER) as dispatcher:
        try:
            await spy.subscribe(f"{ROOT}/worker-2/commands", f"{ROOT}/+/commands", f"{ROOT}/#")
        except Permanent:
            pass  # refused outright: as good
        await dispatcher.publish(f"{ROOT}/worker-2/commands", b'{"secret": "place for worker-2"}')
        await dispatcher.publish(f"{ROOT}/worker-1/commands", b'{"for": "worker-1"}')
        got = await received(spy)
        assert all("worker-2" not in topic for topic, _ in got), got


async def test_worker_1_cannot_publish_as_worker_2(broker: PrivateBroker) -> None:
    async with client(broker, DISPATCHER) as dispatcher, client(broker, "worker-1") as impostor:
        await dispatcher.subscribe(f"{ROOT}/+/reports", f"{ROOT}/+/presence")
        for channel in ("reports", "presence"):
            with contextlib.suppress(FederationError):  # MQTT 3.1.1 brokers drop denied publishes silently
                await impostor.publish(f"{ROOT}/worker-2/{channel}", b'{"forged": true}')
        with contextlib.suppress(FederationError):
            await impostor.publish(f"{ROOT}/worker-2/commands", b'{"forged": true}')
        await impostor.publish(f"{ROOT}/worker-1/reports", b'{"genuine": true}')  # its own: allowed
        got = await received(dispatcher)
        assert [t for t, _ in got] == [f"{ROOT}/worker-1/reports"], got
