"""A silent network partition that heals before either end notices: the agent's Reports flow again.

The agent reaches a real broker through the chaos suite's relay (``bench/chaos/proxy.py``), which
holds every byte while "partitioned" and closes nothing. A publish made during the hold times out
(``publish_timeout``) long before the keepalive can tell the link is dead; once the relay forwards
again the same link carries on. The agent must keep publishing on it: heartbeats (and so its lease)
and Reports. It used to detach its outbox on the timeout and wait for a new link that never came,
so after the heal it sent nothing, fenced every Job and never resumed them (issue 9, partition-net).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

from bench.chaos.proxy import Relay
from federation.messages import PlacementKey, Status, decode_report
from federation.mqtt import MqttLink
from federation.settings import MqttSettings
from worker_agent.reports import Outbox


def status(i: int) -> Status:
    return Status(cluster="w1", placement=PlacementKey(workload_uid=f"u{i}", attempt=1, epoch=1), seq=i, status={})


@asynccontextmanager
async def relay_to(broker_url: str) -> AsyncIterator[tuple[Relay, str]]:
    """A relay in this process in front of the broker; yields it and the URL to reach the broker through it."""
    upstream = urlsplit(broker_url)
    relay = Relay(upstream.port or 1883)
    server = await asyncio.start_server(relay.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield relay, f"mqtt://127.0.0.1:{port}"
    finally:
        relay.open.set()
        server.close()


async def test_reports_flow_again_on_a_link_that_survived_a_silent_partition(mqtt_url: str, topic_root: str) -> None:
    topic = f"{topic_root}/w1/reports"
    received: list[int] = []
    async with relay_to(mqtt_url) as (relay, via_relay), \
            MqttLink(MqttSettings(url=mqtt_url), client_id=f"listener-{uuid.uuid4().hex[:8]}",
                     persistent=False) as listener:
        await listener.subscribe(topic)
        # keepalive 30: the link cannot be noticed dead within the test; the PUBACK wait is short
        agent_settings = MqttSettings(url=via_relay, keepalive=30, publish_timeout=0.3)
        outbox = Outbox()
        async with MqttLink(agent_settings, client_id=f"agent-{uuid.uuid4().hex[:8]}", persistent=False) as link:
            outbox.attach(link)
            sender = asyncio.create_task(outbox.run_sender())
            try:
                relay.open.clear()  # the partition: bytes held both ways, nothing closed
                outbox.put(topic, status(1))
                await asyncio.sleep(0.8)  # past publish_timeout: the PUBACK is held, the publish fails
                assert outbox.sent == 0
                relay.open.set()  # healed: the same TCP connection carries on
                outbox.put(topic, status(2))
                it = listener.messages()
                async with asyncio.timeout(8):
                    while 2 not in received:
                        message = await anext(it)
                        received.append(decode_report(message.payload).seq)
            finally:
                sender.cancel()
    assert link.state == "closed"
    assert 2 in received  # the Report put after the heal went out on the surviving link
    assert 1 in received  # and the one whose PUBACK timed out was not lost
