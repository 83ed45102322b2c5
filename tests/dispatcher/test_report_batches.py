"""Several Reports per MQTT message: the agent's outbox sends what waits as one sealed batch;
the dispatcher's subscriber opens it once and hands every Report on, in order, as if each came alone.
A replayed batch, a batch whose Reports do not belong to its seal, or one on the presence topic is
refused whole; a single Report (an agent of an earlier version) is still taken."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from dispatcher.clusters.identity import Identity
from dispatcher.engine.batch import ReportIn
from dispatcher.settings import DispatcherSettings
from dispatcher.wire.reports import ReportSubscriber
from dispatcher.wire.streams import StreamBook
from federation import messages, signing, topics
from federation.clock import SystemClock
from federation.settings import SigningSettings
from tests import keys
from worker_agent.reports import Outbox

ROOT = "mkd/v1"
CLUSTER = "worker-1"
REPORTS = topics.reports(CLUSTER, ROOT)


def subscriber() -> ReportSubscriber:
    s = DispatcherSettings(signing=SigningSettings(private_key=keys.private(keys.DISPATCHER)),
                           cluster_public_keys=keys.cluster_keys())
    engine: Any = SimpleNamespace(identity=Identity(s), streams=StreamBook(), inbox=asyncio.Queue())
    return ReportSubscriber(s, engine, SystemClock(), client_id="batches")


def status(i: int) -> messages.Status:
    key = messages.PlacementKey(workload_uid=f"u{i}", attempt=1, epoch=1)
    return messages.Status(cluster=CLUSTER, placement=key, seq=i, status={"active": i})


def inbox(sub: ReportSubscriber) -> list[Any]:
    """The Reports handed to the engine (a stream met part-way also brings a ResyncDue: not a Report)."""
    out = []
    while not sub.engine.inbox.empty():
        item = sub.engine.inbox.get_nowait()
        if isinstance(item, ReportIn):
            out.append(item.report)
    return out


class Link:
    alive = True

    def __init__(self) -> None:
        self.messages: list[tuple[str, bytes]] = []
        self.published = asyncio.Event()

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        self.messages.append((topic, payload))
        self.published.set()


async def agent_messages(reports: list[messages.ReportBase]) -> list[tuple[str, bytes]]:
    """What the agent's outbox publishes for ``reports`` queued together, sealed with worker-1's key."""
    sealer = signing.Sealer(signing.parse_private_key(keys.private(CLUSTER)))
    outbox, link = Outbox(seal=lambda t, b, s, n: sealer.seal(t, b, stream=s, n=n)), Link()
    outbox.attach(link)  # type: ignore[arg-type]
    for report in reports:
        outbox.put(REPORTS, report)
    sender = asyncio.create_task(outbox.run_sender())
    async with asyncio.timeout(5):
        await link.published.wait()  # everything was queued before the sender started: one message
    sender.cancel()
    return link.messages


async def test_a_batch_is_opened_once_and_every_report_handed_on_in_order() -> None:
    sub = subscriber()
    accepted = messages.Accepted(cluster=CLUSTER, placement=status(9).placement, spec_version=1, seq=10)
    wire = await agent_messages([status(1), status(2), accepted, status(3)])
    assert len(wire) == 1
    sub.accept(*wire[0])
    got = inbox(sub)
    assert [(r.type, r.n) for r in got] == [("status", 1), ("status", 2), ("accepted", 3), ("status", 4)]
    assert [r.seq for r in got] == [1, 2, 10, 3] and sub.received == 4
    sub.accept(*wire[0])  # the same message again (a replay, or a QoS 1 duplicate): refused whole
    assert inbox(sub) == [] and sub.refused == 1


async def test_a_single_report_of_an_earlier_agent_is_still_taken() -> None:
    sub = subscriber()
    signer = keys.Signer(CLUSTER)
    sub.accept(REPORTS, signer.seal(REPORTS, messages.encode(messages.numbered(status(1), signer.stream, 1))))
    assert [r.seq for r in inbox(sub)] == [1]


async def test_a_batch_whose_reports_do_not_belong_to_its_seal_or_on_presence_is_refused_whole() -> None:
    sub = subscriber()
    signer = keys.Signer(CLUSTER, stream="s1")
    other = messages.encode_reports([messages.encode_numbered(status(1), "s1", 1),
                                     messages.encode_numbered(status(2), "another", 2)])
    sub.accept(REPORTS, signer.seal(REPORTS, other))
    unnumbered = messages.encode_reports([messages.encode_numbered(status(1), "s1", 0)])
    sub.accept(REPORTS, signer.seal(REPORTS, unnumbered))
    presence = topics.presence(CLUSTER, ROOT)
    fine = messages.encode_reports([messages.encode_numbered(status(3), "s1", 7)])
    sub.accept(presence, signer.seal(presence, fine))
    assert inbox(sub) == [] and sub.refused == 3
    sub.accept(REPORTS, signer.seal(REPORTS, fine))
    assert [r.seq for r in inbox(sub)] == [3]


async def test_a_batch_from_another_cluster_or_with_a_foreign_report_is_refused() -> None:
    sub = subscriber()
    signer = keys.Signer(CLUSTER, stream="s1")
    foreign = status(1).model_copy(update={"cluster": "worker-2"})
    mixed = messages.encode_reports([messages.encode_numbered(status(2), "s1", 1),
                                     messages.encode_numbered(foreign, "s1", 2)])
    sub.accept(REPORTS, signer.seal(REPORTS, mixed))
    assert [r.seq for r in inbox(sub)] == [2]  # the foreign Report is dropped, as alone: its neighbour is not
    assert sub.refused == 1
