"""Reports a broker drops are noticed from the hole in the agent's numbered stream and healed by a Resync."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from federation import labels, messages, topics
from federation.kube import Kube
from tests.dispatcher.harness import PYTORCHJOBS, FakeAgent, eventually, pytorchjob, running, settings
from tests.dispatcher.test_lifecycle import condition


async def numbered(agent: FakeAgent, report: messages.ReportBase, stream: str, n: int) -> None:
    assert agent.link is not None
    topic = topics.reports(agent.name, agent.root)
    await agent.link.publish(topic, agent.signer.seal(topic, messages.encode(messages.numbered(report, stream, n))))


def resyncs(agent: FakeAgent) -> list[messages.Resync]:
    return [c for c in agent.commands if isinstance(c, messages.Resync)]


def resync_logs(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records
            if r.name == "dispatcher.engine" and "sending a resync" in r.getMessage()]


async def test_a_hole_in_the_report_stream_brings_a_resync(manager: Path, kube: Kube, db_url: str,
                                                           mqtt_url: str, topic_root: str,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "dispatcher.engine")
    s = settings(manager, db_url, mqtt_url, topic_root, report_gap_grace_seconds=0.5,
                 placement_retry_seconds=0.25)
    async with FakeAgent("worker-1", mqtt_url, topic_root, auto_accept=False) as agent, running(s):
        await kube.create(PYTORCHJOBS, pytorchjob("gap"), "default")
        (place,) = await eventually(lambda: agent.places(), what="Place")
        await numbered(agent, messages.Accepted(cluster="worker-1", placement=place.placement,
                                                spec_version=place.spec_version, seq=1), "s1", 1)
        await eventually(lambda: condition(kube, "gap", labels.CONDITION_DISPATCHED, "True"))
        assert resyncs(agent) == []  # an unbroken stream needs none

        # report 2 is "dropped by the broker"; 3 arrives and the hole never fills
        await numbered(agent, messages.Status(cluster="worker-1", placement=place.placement, seq=3,
                                              status={"startTime": "2026-11-21T00:00:00Z"}), "s1", 3)
        (resync,) = await eventually(lambda: resyncs(agent), within=10, what="Resync after the loss")
        assert [k.workload_uid for k in resync.expected] == [place.placement.workload_uid]
        assert resync.cluster == "worker-1"
        # a real loss is worth a WARNING
        assert [level for level, _ in resync_logs(caplog)] == [logging.WARNING]


async def test_a_stream_met_part_way_is_resynced_once(manager: Path, kube: Kube, db_url: str, mqtt_url: str,
                                                      topic_root: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "dispatcher.engine")
    s = settings(manager, db_url, mqtt_url, topic_root, report_gap_grace_seconds=0.5,
                 placement_retry_seconds=0.25)
    async with FakeAgent("worker-1", mqtt_url, topic_root, auto_accept=False) as agent, running(s):
        await kube.create(PYTORCHJOBS, pytorchjob("late"), "default")
        (place,) = await eventually(lambda: agent.places(), what="Place")
        # the dispatcher never saw reports 1..41 of this stream (it was away while they were dropped)
        for n in (42, 43, 44):
            await numbered(agent, messages.Accepted(cluster="worker-1", placement=place.placement,
                                                    spec_version=place.spec_version, seq=n), "s9", n)
        await eventually(lambda: resyncs(agent), what="Resync for the unknown start of the stream")
        await eventually(lambda: condition(kube, "late", labels.CONDITION_DISPATCHED, "True"))
        assert len(resyncs(agent)) == 1
        # routine at every start: INFO, not a WARNING that reports were lost
        ((level, text),) = resync_logs(caplog)
        assert level == logging.INFO and "part-way" in text, text


async def test_a_status_reported_again_unchanged_is_not_written_again(manager: Path, kube: Kube, db_url: str,
                                                                      mqtt_url: str, topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s) as d:
        await kube.create(PYTORCHJOBS, pytorchjob("again"), "default")
        (place,) = await eventually(lambda: agent.places(), what="Place")
        status = {"startTime": "2026-11-21T00:00:00Z",
                  "replicaStatuses": {"Master": {"active": 1}, "Worker": {"active": 1}}}
        await agent.status(place, status)

        async def mirrored() -> bool:
            obj = await kube.get(PYTORCHJOBS, "again", "default")
            return (obj.get("status") or {}).get("startTime") == status["startTime"]
        await eventually(mirrored, what="status mirrored")
        assert d.writer is not None
        await eventually(lambda: d.writer is not None and d.writer.backlog == 0, what="writer idle")
        writes = d.writer.writes
        await agent.status(place, status)  # what a Resync makes the agent do: the same status, newer seq
        await eventually(lambda: d.writer is not None and d.writer.unchanged >= 1, what="the repeat seen")
        assert d.writer.writes == writes
