"""Several Commands per MQTT message to one agent: rows for one cluster are signed together as
they are published, in order; a Resync, a row an earlier version signed, and everything to an agent that
has not shown it opens batches (a Reports batch on its live stream) go alone, as before."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from dispatcher.clusters.identity import Identity
from dispatcher.settings import DispatcherSettings
from dispatcher.wire.outbox import Publisher
from federation import messages, signing, topics
from federation.clock import SystemClock
from federation.kube import Kube
from federation.settings import SigningSettings
from tests import keys
from tests.dispatcher.harness import PYTORCHJOBS, FakeAgent, eventually, pytorchjob, running, settings
from worker_agent.identity import AgentIdentity
from worker_agent.settings import AgentSettings

ROOT = "mkd/v1"
W1, W2 = topics.commands("worker-1", ROOT), topics.commands("worker-2", ROOT)


def delete(uid: str) -> bytes:
    return messages.encode(messages.Delete(
        placement=messages.PlacementKey(workload_uid=uid, attempt=1, epoch=1),
        job=messages.JobRef(kind="Job", api_version="batch/v1", namespace="n", name=uid)))


def resync() -> bytes:
    return messages.encode(messages.Resync(cluster="worker-1", epoch=1, expected=[]))


class Recording:
    """Stands in for ``OutboxSealing``: records what it was asked to sign; worker-1 takes batches."""

    def __init__(self) -> None:
        self.signed: list[tuple[str, list[int]]] = []

    def rows(self, topic: str, rows: list[tuple[int, bytes]]) -> bytes:
        self.signed.append((topic, [row_id for row_id, _ in rows]))
        return b"signed"

    def batches(self, topic: str) -> bool:
        return topic == W1


def publisher(seal: Any) -> Publisher:
    s = DispatcherSettings(signing=SigningSettings(private_key=keys.private(keys.DISPATCHER)))
    return Publisher(s, None, SystemClock(), asyncio.Event(), client_id="t", seal=seal)  # type: ignore[arg-type]


def test_rows_for_an_agent_that_takes_batches_go_together_in_order_and_a_resync_alone() -> None:
    seal = Recording()
    old = keys.Signer(keys.DISPATCHER, stream="e1").seal(W1, delete("old"))  # signed by an earlier version
    rows = [(1, W1, delete("a")), (2, W2, delete("b")), (3, W1, delete("c")), (4, W2, delete("d")),
            (5, W1, resync()), (6, W1, delete("e")), (7, W1, old), (8, W1, delete("f")), (9, W1, delete("g"))]
    out = publisher(seal)._messages(rows)
    assert [(topic, ids) for topic, ids, _ in out if topic == W1] == [(W1, [1, 3]), (W1, [5]), (W1, [6]), (W1, [7]),
                                                                     (W1, [8, 9])]
    assert [(topic, ids) for topic, ids, _ in out if topic == W2] == [(W2, [2]), (W2, [4])]  # no batches there
    assert dict((ids[0], payload) for _, ids, payload in out)[7] == old  # sent as it was signed
    assert (W1, [7]) not in seal.signed


def test_a_batch_is_bounded_in_count_and_in_bytes() -> None:
    seal = Recording()
    many = messages.MAX_COMMANDS_PER_MESSAGE + 3
    out = publisher(seal)._messages([(i, W1, delete(f"u{i}")) for i in range(1, many + 1)])
    assert [len(ids) for _, ids, _ in out] == [messages.MAX_COMMANDS_PER_MESSAGE, 3]
    big = b'{"v":1,"type":"delete","pad":"' + b"x" * (messages.MAX_BATCH_BYTES // 2) + b'"}'
    out = publisher(seal)._messages([(i, W1, big) for i in range(1, 6)])
    assert [len(ids) for _, ids, _ in out] == [1, 1, 1, 1, 1]


def test_one_row_is_numbered_by_its_id_and_a_batch_by_a_fresh_id_and_the_agent_opens_both() -> None:
    s = DispatcherSettings(signing=SigningSettings(private_key=keys.private(keys.DISPATCHER)),
                           cluster_public_keys=keys.cluster_keys())
    identity = Identity(s)
    fresh = iter(range(1000, 2000))
    a = delete("a")
    single = identity.seal_rows(W1, [(7, a)], epoch=1, fresh=lambda: next(fresh))
    batch = identity.seal_rows(W1, [(8, delete("b")), (9, delete("c"))], epoch=1, fresh=lambda: next(fresh))
    assert signing.peek(single) == ("e1", 7) and signing.peek(batch) == ("e1", 1000)
    agent = AgentIdentity(AgentSettings(cluster_name="worker-1",
                                        signing=SigningSettings(private_key=keys.private("worker-1")),
                                        dispatcher_public_keys=[keys.public(keys.DISPATCHER)]))
    assert agent.open_commands(W1, single, 0) == [a]
    assert [messages.decode_command(b).placement.workload_uid for b in agent.open_commands(W1, batch, 0)] == [  # type: ignore[union-attr]
        "b", "c"]
    assert agent.open_commands(W1, batch, 0) == []  # the same message again: a replay
    again = identity.seal_rows(W1, [(7, a)], epoch=1, fresh=lambda: next(fresh))
    assert agent.open_commands(W1, again, 0) == []  # a row published again alone is the same message


def test_only_an_agent_whose_live_stream_sent_a_batch_of_reports_takes_batches() -> None:
    s = DispatcherSettings(signing=SigningSettings(private_key=keys.private(keys.DISPATCHER)),
                           cluster_public_keys=keys.cluster_keys())
    identity = Identity(s)
    assert not identity.takes_batches("worker-1")
    identity.streams["worker-1"] = "s1"
    identity.batches("worker-1", "s1")
    assert identity.takes_batches("worker-1")
    identity.streams["worker-1"] = "s2"  # reconnected (maybe an earlier version): singles until it shows again
    assert not identity.takes_batches("worker-1")


async def test_places_to_an_agent_that_sends_batches_go_several_per_message_each_once(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root, batch_linger_seconds=0.5)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s) as d:
        assert d.engine is not None and d.reports is not None
        await eventually(d.reports.subscribed.is_set, what="the dispatcher listening")
        await agent.report_batch([messages.Inventory(cluster="worker-1", items=[])])
        await eventually(lambda: d.engine.identity.takes_batches("worker-1"), what="the batch of Reports heard")
        await asyncio.gather(*(kube.create(PYTORCHJOBS, pytorchjob(f"b{i}"), "default") for i in range(20)))
        await eventually(lambda: len(agent.places()) >= 20, what="20 Places")
        await eventually(lambda: d.publisher is not None and d.publisher.sent >= 20, what="the rows marked sent")
    uids = [p.placement.workload_uid for p in agent.places()]
    assert len(set(uids)) == 20
    assert max(agent.messages) > 1  # Places taken together went together


def test_an_agent_opens_a_batch_item_by_item_a_place_sealed_to_it_and_a_stale_batch_only_for_its_deletes() -> None:
    from federation.sealing import PlaceSealer, recipients
    s = DispatcherSettings(signing=SigningSettings(private_key=keys.private(keys.DISPATCHER)),
                           cluster_public_keys=keys.cluster_keys())
    identity = Identity(s)
    place = messages.Place(placement=messages.PlacementKey(workload_uid="p", attempt=1, epoch=1), spec_version=1,
                           job=messages.JobRef(kind="Job", api_version="batch/v1", namespace="n", name="p"),
                           manifest={"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "p"}})
    body = messages.encode(place)
    mine = PlaceSealer().seal(W1, body, recipients([signing.parse_public_key(keys.public("worker-1"))]))
    theirs = PlaceSealer().seal(W1, body, recipients([signing.parse_public_key(keys.public("worker-2"))]))
    fresh = iter(range(1000, 2000))
    rows = [(1, mine), (2, theirs), (3, delete("d"))]
    batch = identity.seal_rows(W1, rows, epoch=1, fresh=lambda: next(fresh))

    def agent() -> AgentIdentity:
        return AgentIdentity(AgentSettings(cluster_name="worker-1",
                                           signing=SigningSettings(private_key=keys.private("worker-1")),
                                           dispatcher_public_keys=[keys.public(keys.DISPATCHER)]))
    one = agent()
    opened = one.open_commands(W1, batch, 0)
    assert [messages.decode_command(b).type for b in opened] == ["place", "delete"] and opened[0] == body
    assert one.refused == 1  # the Place sealed to another key: refused alone, its neighbours kept
    late = agent()  # a process that first connected after the batch was signed: only the Delete applies
    opened = late.open_commands(W1, batch, 2**62)
    assert [messages.decode_command(b).type for b in opened] == ["delete"] and late.refused == 2
