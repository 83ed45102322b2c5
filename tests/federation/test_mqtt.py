"""federation.mqtt against a real broker: Mosquitto (when reachable) and the embedded amqtt broker."""

from __future__ import annotations

import asyncio
import ipaddress
import random
import socket
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from pydantic import ValidationError

from federation.clock import FakeClock
from federation.embedded_broker import EmbeddedBroker
from federation.errors import Permanent, Transport
from federation.mqtt import LinkClosed, LinkHealth, Message, MqttLink, Will, parse_url
from federation.settings import MqttSettings
from tests.conftest import MOSQUITTO, mosquitto_available

TIMEOUT = 5.0


@pytest.fixture(params=["mosquitto", "embedded"])
async def broker_url(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    if request.param == "mosquitto":
        if not mosquitto_available():
            pytest.skip("Mosquitto not reachable on 127.0.0.1:1883")
        yield f"mqtt://{MOSQUITTO[0]}:{MOSQUITTO[1]}"
    else:
        async with EmbeddedBroker() as broker:
            yield broker.url


def cid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def next_message(link: MqttLink, it: AsyncIterator[Message] | None = None) -> Message:
    it = it or link.messages()
    return await asyncio.wait_for(anext(it), TIMEOUT)


async def test_qos1_round_trip(broker_url: str, topic_root: str) -> None:
    settings = MqttSettings(url=broker_url)
    async with MqttLink(settings, client_id=cid("sub"), persistent=False) as sub, \
            MqttLink(settings, client_id=cid("pub"), persistent=False) as pub:
        await sub.subscribe(f"{topic_root}/+/commands")
        await pub.publish(f"{topic_root}/c1/commands", b'{"x":1}')
        await pub.publish(f"{topic_root}/c1/other", b"not for us")
        await pub.publish(f"{topic_root}/c2/commands", b"second")
        it = sub.messages()
        first, second = await next_message(sub, it), await next_message(sub, it)
    assert first == Message(f"{topic_root}/c1/commands", b'{"x":1}', False)
    assert second.payload == b"second"


async def test_many_concurrent_publishes_all_arrive(broker_url: str, topic_root: str) -> None:
    settings = MqttSettings(url=broker_url)
    n = 300
    async with MqttLink(settings, client_id=cid("sub"), persistent=False) as sub, \
            MqttLink(settings, client_id=cid("pub"), persistent=False) as pub:
        await sub.subscribe(f"{topic_root}/#")
        await asyncio.wait_for(
            asyncio.gather(*(pub.publish(f"{topic_root}/load", str(i).encode()) for i in range(n))), 30)
        it = sub.messages()
        got = {int((await next_message(sub, it)).payload) for _ in range(n)}
    assert got == set(range(n))


async def test_retained_presence_reaches_late_subscriber(broker_url: str, topic_root: str) -> None:
    settings = MqttSettings(url=broker_url)
    topic = f"{topic_root}/c1/presence"
    async with MqttLink(settings, client_id=cid("agent"), persistent=False) as agent:
        await agent.publish(topic, b"online", retain=True)
    async with MqttLink(settings, client_id=cid("late"), persistent=False) as late:
        await late.subscribe(f"{topic_root}/+/presence")
        msg = await next_message(late)
        # clear the retained message so the broker keeps nothing from this test
        await late.publish(topic, b"", retain=True)
    assert msg == Message(topic, b"online", True)


async def test_will_published_on_unclean_disconnect_only(broker_url: str, topic_root: str) -> None:
    settings = MqttSettings(url=broker_url)
    topic = f"{topic_root}/c1/presence"
    will = Will(topic, b"offline", retain=False)
    async with MqttLink(settings, client_id=cid("watch"), persistent=False) as watcher:
        await watcher.subscribe(topic)
        it = watcher.messages()
        # a clean close sends DISCONNECT: no will
        async with MqttLink(settings, client_id=cid("agent"), will=will, persistent=False) as agent:
            await agent.publish(topic, b"online")
        assert (await next_message(watcher, it)).payload == b"online"
        async with MqttLink(settings, client_id=cid("agent"), will=will, persistent=False) as agent:
            await agent.publish(topic, b"online-2")
            agent.drop()
        assert (await next_message(watcher, it)).payload == b"online-2"
        assert (await next_message(watcher, it)).payload == b"offline"


async def test_persistent_session_delivers_what_was_queued_while_away(broker_url: str, topic_root: str) -> None:
    settings = MqttSettings(url=broker_url)
    agent_id = cid("agent")
    topic = f"{topic_root}/c1/commands"
    async with MqttLink(settings, client_id=agent_id) as agent:
        await agent.subscribe(topic)
    async with MqttLink(settings, client_id=cid("disp"), persistent=False) as dispatcher:
        for i in range(3):
            await dispatcher.publish(topic, f"cmd-{i}".encode())
    try:
        async with MqttLink(settings, client_id=agent_id) as agent:
            # no subscribe: the session remembers it
            it = agent.messages()
            got = [(await next_message(agent, it)).payload for _ in range(3)]
    finally:
        # a clean-session connect discards the stored session
        async with MqttLink(settings, client_id=agent_id, persistent=False):
            pass
    assert got == [b"cmd-0", b"cmd-1", b"cmd-2"]


async def test_messages_raise_transport_when_the_link_drops(broker_url: str, topic_root: str) -> None:
    settings = MqttSettings(url=broker_url)
    async with MqttLink(settings, client_id=cid("sub"), persistent=False) as link:
        await link.subscribe(f"{topic_root}/#")
        it = link.messages()
        link.drop()
        with pytest.raises(Transport):
            await asyncio.wait_for(anext(it), TIMEOUT)
        with pytest.raises(LinkClosed):
            await link.publish(f"{topic_root}/x", b"after drop")


async def test_messages_received_before_the_link_drops_come_before_the_error(broker_url: str, topic_root: str) -> None:
    """paho acknowledged them as it handed them over: the broker will not send them again, so they must not be lost."""
    settings = MqttSettings(url=broker_url)
    async with MqttLink(settings, client_id=cid("pub"), persistent=False) as pub, \
            MqttLink(settings, client_id=cid("sub"), persistent=False) as sub:
        await sub.subscribe(f"{topic_root}/#")
        it = sub.messages()
        received = asyncio.Event()  # the three are in the link, not read yet
        paho: Any = sub._client._client  # type: ignore[union-attr]
        handed_over = paho.on_message

        def counted(client: Any, userdata: Any, message: Any) -> None:
            handed_over(client, userdata, message)
            if sub._inbox.qsize() == 3:
                received.set()
        paho.on_message = counted
        for i in range(3):
            await pub.publish(f"{topic_root}/x", b"m%d" % i)
        await asyncio.wait_for(received.wait(), TIMEOUT)
        sub.drop()
        assert [(await next_message(sub, it)).payload for _ in range(3)] == [b"m0", b"m1", b"m2"]
        with pytest.raises(Transport):
            await asyncio.wait_for(anext(it), TIMEOUT)
        with pytest.raises(Transport):  # and again: the end stays
            await asyncio.wait_for(anext(it), TIMEOUT)


async def test_link_state_errors(broker_url: str) -> None:
    link = MqttLink(MqttSettings(url=broker_url), client_id=cid("state"), persistent=False)
    assert link.state == "new"
    with pytest.raises(RuntimeError, match="before"):
        await link.publish("a/b", b"")
    async with link:
        assert link.state == "open"
    assert link.state == "closed"
    with pytest.raises(LinkClosed, match="closed"):
        await link.publish("a/b", b"")
    with pytest.raises(RuntimeError, match="entered once"):
        await link.__aenter__()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_connect_refused_is_transport() -> None:
    with pytest.raises(Transport):
        async with MqttLink(MqttSettings(url=f"mqtt://127.0.0.1:{free_port()}"), client_id="x"):
            pass


def test_parse_url() -> None:
    a = parse_url(MqttSettings(url="mqtts://us%40er:p%3Ass@broker.example:9999"))
    assert (a.host, a.port, a.tls, a.username, a.password) == ("broker.example", 9999, True, "us@er", "p:ss")
    b = parse_url(MqttSettings(url="mqtt://h", username="u", password="pw"))
    assert (b.port, b.tls, b.username, b.password) == (1883, False, "u", "pw")
    assert parse_url(MqttSettings(url="mqtts://h")).port == 8883
    for bad, what in (("http://h", "scheme"), ("mqtt://h:99999", "port"), ("mqtt://", "no host")):
        with pytest.raises(ValidationError, match=what):  # refused when the settings are read
            MqttSettings(url=bad)
        with pytest.raises(Permanent, match=what):  # and by the link, for settings built unchecked
            parse_url(MqttSettings.model_construct(url=bad))


async def test_tls_files_missing_is_permanent() -> None:
    settings = MqttSettings(url="mqtts://127.0.0.1:1", tls_ca="/nonexistent/ca.pem")  # type: ignore[arg-type]
    with pytest.raises(Permanent, match="TLS"):
        async with MqttLink(settings, client_id="tls"):
            pass


def test_backoff_figures() -> None:
    clock = FakeClock()
    health = LinkHealth(MqttSettings(backoff_initial=0.5, backoff_max=30), clock, jitter=0.0)
    delays = []
    for _ in range(9):
        health.failed(Transport("refused"))
        delays.append(health.next_delay())
        clock.advance(delays[-1])
    assert delays == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]
    assert health.lost_for() == sum(delays)  # lost_since kept across failed retries
    jittery = LinkHealth(MqttSettings(), clock, jitter=0.2, rng=random.Random(1))
    for _ in range(3):
        jittery.failed(Transport("x"))
    assert all(1.6 <= jittery.next_delay() <= 2.0 for _ in range(50))
    health.connected_now()
    assert (health.connected, health.lost_since, health.failed_attempts, health.next_delay()) == (True, None, 0, 0)


async def test_reconnect_loop_with_fake_clock() -> None:
    """The caller's reconnect loop backs off on a FakeClock until the broker appears, then connects."""
    clock = FakeClock()
    port = free_port()
    settings = MqttSettings(url=f"mqtt://127.0.0.1:{port}", backoff_initial=1, backoff_max=4)
    health = LinkHealth(settings, clock, jitter=0.0)
    connected = asyncio.Event()
    delays: list[float] = []

    async def loop() -> None:
        while True:
            try:
                async with MqttLink(settings, client_id=cid("loop"), persistent=False):
                    health.connected_now()
                    connected.set()
                    return
            except Transport as exc:
                health.failed(exc)
                delays.append(health.next_delay())
                await clock.sleep(delays[-1])

    task = asyncio.create_task(loop())
    try:
        first_lost = None
        for _ in range(4):
            await asyncio.wait_for(clock.wait_for_sleepers(), TIMEOUT)
            first_lost = first_lost or health.lost_since
            assert health.lost_since == first_lost  # kept across failed retries
            clock.advance(delays[-1])
        await asyncio.wait_for(clock.wait_for_sleepers(), TIMEOUT)  # parked after the 5th failure
        assert delays == [1, 2, 4, 4, 4]
        assert health.failed_attempts == 5 and not health.connected
        assert health.lost_for() == 1 + 2 + 4 + 4
        async with EmbeddedBroker(port=port):
            clock.advance(delays[-1])
            await asyncio.wait_for(connected.wait(), TIMEOUT)
        assert health.connected and health.lost_since is None and health.failed_attempts == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key (PEM files); the certificate is its own CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mkd-test-broker")])
    now = datetime.now(UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "broker.pem", tmp_path / "broker.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


async def test_tls_round_trip_and_untrusted_broker_refused(tmp_path: Path, topic_root: str) -> None:
    cert, key = self_signed(tmp_path)
    async with EmbeddedBroker(certfile=cert, keyfile=key) as broker:
        assert broker.url.startswith("mqtts://")
        settings = MqttSettings(url=broker.url, tls_ca=cert)
        async with MqttLink(settings, client_id=cid("tls"), persistent=False) as link:
            await link.subscribe(f"{topic_root}/#")
            await link.publish(f"{topic_root}/x", b"secret")
            assert (await next_message(link)).payload == b"secret"
        # the system CAs do not trust a self-signed broker
        with pytest.raises(Transport):
            async with MqttLink(MqttSettings(url=broker.url), client_id=cid("tls"), persistent=False):
                pass


class SilentBroker:
    """Accepts the MQTT CONNECT, then never acknowledges anything: shows that publish waits for PUBACK."""

    def __init__(self) -> None:
        self.writers: list[asyncio.StreamWriter] = []
        self.received = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        await reader.read(1)  # the CONNECT packet's first byte
        writer.write(b"\x20\x02\x00\x00")  # CONNACK, accepted
        while await reader.read(4096):
            self.received.set()

    def cut(self) -> None:
        for w in self.writers:
            w.transport.abort()


async def test_publish_waits_for_the_puback_and_fails_fast_when_the_link_drops() -> None:
    silent = SilentBroker()
    server = await asyncio.start_server(silent.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        settings = MqttSettings(url=f"mqtt://127.0.0.1:{port}", publish_timeout=0.3)
        async with MqttLink(settings, client_id=cid("silent"), persistent=False) as link:
            with pytest.raises(Transport):  # sent, never acknowledged: not reported as published
                await link.publish("a/b", b"unacked")
            assert silent.received.is_set()
        long_wait = MqttSettings(url=f"mqtt://127.0.0.1:{port}", publish_timeout=60)
        async with MqttLink(long_wait, client_id=cid("silent"), persistent=False) as link:
            pending = asyncio.ensure_future(link.publish("a/b", b"never acked"))
            await asyncio.sleep(0)
            silent.cut()
            with pytest.raises(LinkClosed):  # at once, not after the 60 s publish timeout
                await asyncio.wait_for(pending, TIMEOUT)
    finally:
        server.close()
        silent.cut()


async def test_retained_will_marks_presence_offline_for_late_subscribers(broker_url: str, topic_root: str) -> None:
    settings = MqttSettings(url=broker_url)
    topic = f"{topic_root}/c1/presence"
    async with MqttLink(settings, client_id=cid("agent"), will=Will(topic, b"offline"), persistent=False) as agent:
        await agent.publish(topic, b"online", retain=True)
        agent.drop()
    async with MqttLink(settings, client_id=cid("late"), persistent=False) as late:
        await late.subscribe(topic)
        it = late.messages()
        msg = await next_message(late, it)
        while msg.payload == b"online":  # the broker may not have processed the loss yet
            msg = await next_message(late, it)
        await late.publish(topic, b"", retain=True)
    assert msg == Message(topic, b"offline", msg.retain)
