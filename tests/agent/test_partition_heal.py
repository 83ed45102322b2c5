"""A silent network partition that heals before either end notices: the agent's Reports flow again.

The agent reaches a real broker through the chaos suite's relay (``bench/chaos/proxy.py``), which
holds every byte while "partitioned" and closes nothing. A publish made during the hold times out
(``publish_timeout``) long before the keepalive can tell the link is dead; once the relay forwards
again the same link carries on. The agent must keep publishing on it: heartbeats (and so its lease)
and Reports. It used to detach its outbox on the timeout and wait for a new link that never came,
so after the heal it sent nothing, fenced every Job and never resumed them .
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

from bench.chaos.proxy import Relay
from federation.kube import Resource
from federation.messages import PlacementKey, Status, decode_reports, encode
from federation.mqtt import MqttLink
from federation.refusals import count
from federation.settings import MqttSettings
from tests.agent.conftest import CLUSTER, AgentHarness, place
from tests.security.attacks import harmless_job
from tests.waiting import eventually
from worker_agent.reports import Outbox

JOBS = Resource("batch", "v1", "jobs", "Job")


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
                        received.extend(r.seq for r in decode_reports(message.payload))  # type: ignore[union-attr]
            finally:
                sender.cancel()
    assert link.state == "closed"
    assert 2 in received  # the Report put after the heal went out on the surviving link
    assert 1 in received  # and the one whose PUBACK timed out was not lost


async def test_a_place_sealed_while_the_link_was_down_applies_on_the_next_link(harness: AgentHarness) -> None:
    """Commands the dispatcher sealed while the agent was cut off wait in the broker for its persistent
    session. The agent's memory of seen Commands spans its links, so on the next link they are new, not
    replays: they apply. They used to be refused as "sealed before this link came up" (a Place left
    unanswered is moved elsewhere, attempt after attempt, until the Job fails).
    A Command this agent already carried out stays refused when it comes again."""
    h = harness
    await h.stop_agent()
    # no clock skew allowed, so that "sealed before the link came up" is decided by the order alone
    await h.start_agent(signing=h.settings.signing.model_copy(update={"clock_skew_seconds": 0}))
    agent, topic = h.agent, f"{h.settings.mqtt.topic_root}/{CLUSTER}/commands"
    assert agent is not None and h.link is not None
    seen = h.signer.seal(topic, encode(place(harmless_job("seen-once"), uid="wl-seen-once")))
    await h.link.publish(topic, seen)
    await h.wait_report(lambda r: r.type == "accepted" and r.placement.workload_uid == "wl-seen-once")

    queued = h.signer.seal(topic, encode(place(harmless_job("sealed-while-cut"), uid="wl-sealed-while-cut")))
    assert agent.link is not None
    agent.link.drop()  # the link dies; the broker keeps the agent's session and queues what comes
    await eventually(lambda: not agent.connected.is_set(), what="the agent to see its link gone")
    replays, expired = count("replay"), count("expired")
    await h.link.publish(topic, queued)
    await h.link.publish(topic, seen)  # a recorded Command played again: still refused
    accepted = await h.wait_report(lambda r: r.type in ("accepted", "rejected")
                                   and r.placement.workload_uid == "wl-sealed-while-cut")
    assert accepted.type == "accepted"
    assert await h.get(JOBS, "sealed-while-cut", "team-a") is not None
    assert agent.inbox is not None
    await agent.inbox.drain()
    assert count("replay") == replays + 1 and count("expired") == expired
