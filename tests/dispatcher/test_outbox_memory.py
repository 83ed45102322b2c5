"""Committed Commands beyond ``outbox_memory_bytes`` wait in the database, not in memory, and still go out in order."""

from __future__ import annotations

from pathlib import Path

from dispatcher.freshrows import FreshRows
from federation.kube import Kube
from tests.dispatcher.harness import PYTORCHJOBS, FakeAgent, eventually, pytorchjob, running, settings


def test_rows_past_the_byte_budget_are_queued_without_their_bytes() -> None:
    fresh = FreshRows(max_bytes=10)
    fresh.add(1, "t", b"12345", ("u1", 1))
    fresh.add(2, "t", b"123456", ("u2", 1))  # 11 bytes would be over: kept as its id alone
    fresh.add(3, "t", b"12345", None)
    assert [(r[0], r[2]) for r in fresh] == [(1, b"12345"), (2, None), (3, b"12345")]
    assert fresh.held == 10 and fresh.spilled == 1
    fresh.drop(2)
    assert [r[0] for r in fresh] == [3] and fresh.held == 5
    fresh.add(4, "t", b"12345", None)  # room again once the front was taken
    assert fresh.held == 10 and fresh.spilled == 1 and len(fresh) == 2


async def test_places_past_the_memory_budget_are_read_back_and_all_published(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    # no bytes in memory at all, and at most 3 unanswered Places: every Place waits, spilled, then is read back
    s = settings(manager, db_url, mqtt_url, topic_root, outbox_memory_bytes=0, max_unanswered_places=3)
    names = [f"spill-{i}" for i in range(12)]
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s) as d:
        for name in names:
            await kube.create(PYTORCHJOBS, pytorchjob(name), "default")
        await eventually(lambda: len({p.placement.workload_uid for p in agent.places()}) == len(names),
                         what="a Place for every Job", within=30)
        assert d.engine is not None
        assert d.engine.fresh.spilled >= len(names) and d.engine.fresh.held == 0
        placed = [p.manifest["metadata"]["name"] for p in agent.places()]
        assert sorted(set(placed)) == sorted(names)
