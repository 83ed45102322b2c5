"""Restarts, crashes and a second dispatcher: nothing is claimed or placed twice, no Command is lost."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path
from typing import Any

import pytest

from dispatcher.db import models as m
from dispatcher.wire import outbox
from federation import labels, messages
from federation.kube import Kube
from tests.conftest import postgres_available
from tests.dispatcher.harness import PYTORCHJOBS, FakeAgent, eventually, pytorchjob, running, settings
from tests.dispatcher.test_flow import rows


async def accepted(db_url: str, n: int) -> bool:
    return len([p for p in await rows(db_url, m.placements) if p.state == "accepted"]) >= n


def placed_once(places: list[messages.Place], uids: set[str]) -> collections.Counter[str]:
    """Each Workload of ``uids`` reached the agent as one placement, attempt 1: every Place it got carries
    the same (attempt, epoch, spec version). Delivery is at least once (dispatcher/wire/outbox.py): a Place
    whose row is not yet marked sent when its dispatcher stops (the PUBACK or the mark still pending while
    the agent's Accepted is already in) is published again by the next one, the very row with its ids, and
    the agent applies it once. Returns how many times each Workload's Place arrived."""
    ids: dict[str, set[tuple[int, int, int]]] = collections.defaultdict(set)
    for p in places:
        ids[p.placement.workload_uid].add((p.placement.attempt, p.placement.epoch, p.spec_version))
    assert set(ids) == uids
    assert all(len(v) == 1 and next(iter(v))[0] == 1 for v in ids.values()), dict(ids)
    return collections.Counter(p.placement.workload_uid for p in places)


@pytest.mark.parametrize("marks_lost", [False, True], ids=["marked", "marks-lost"])
async def test_restart_neither_claims_nor_places_twice_and_catches_up(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str,
        monkeypatch: pytest.MonkeyPatch, marks_lost: bool) -> None:
    """``marks-lost``: the first dispatcher stops with its Places acknowledged and answered but their rows
    not marked sent (what a stop under load sometimes does by itself); the second publishes them again."""
    s = settings(manager, db_url, mqtt_url, topic_root)
    real_mark = outbox.outbox_q.mark_sent

    async def lost(session: Any, ids: Any, now: Any) -> None:
        return None
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent:
        if marks_lost:
            monkeypatch.setattr(outbox.outbox_q, "mark_sent", lost)
        async with running(s):
            first = await kube.create(PYTORCHJOBS, pytorchjob("first"), "default")
            gone = await kube.create(PYTORCHJOBS, pytorchjob("gone"), "default")
            await eventually(lambda: accepted(db_url, 2), what="both accepted")
        monkeypatch.setattr(outbox.outbox_q, "mark_sent", real_mark)
        # while the dispatcher is away: one Job is created, one deleted
        second = await kube.create(PYTORCHJOBS, pytorchjob("second"), "default")
        await kube.delete(PYTORCHJOBS, "gone", "default")
        async with running(s) as again:
            async def second_running() -> bool:
                return [w.state for w in await rows(db_url, m.workloads, name="second")] == ["running"]
            await eventually(second_running, what="the new Job placed after the restart")
            await eventually(lambda: agent.deletes(), what="Delete for the Job deleted while away")

            async def all_sent() -> bool:
                return all(r.sent_at is not None for r in await rows(db_url, m.outbox))
            await eventually(all_sent, what="every outbox row marked sent, the predecessor's too")
            assert again.engine is not None and again.engine.epoch == 2
    uids = {j["metadata"]["uid"] for j in (first, gone, second)}
    places = placed_once(agent.places(), uids)
    if marks_lost:  # the predecessor's rows went again, with their ids (epoch 1)
        assert places[first["metadata"]["uid"]] >= 2 and places[gone["metadata"]["uid"]] >= 2
    assert [d.placement.workload_uid for d in agent.deletes()] == [gone["metadata"]["uid"]]
    claimed = collections.Counter(e.workload_uid for e in await rows(db_url, m.events) if e.type == "claimed")
    assert set(claimed.values()) == {1} and len(claimed) == 3
    assert sorted((p.workload_uid, p.attempt) for p in await rows(db_url, m.placements)) == sorted(
        (uid, 1) for uid in uids)
    assert {w.name: (w.state, w.attempt) for w in await rows(db_url, m.workloads)} == {
        "first": ("running", 1), "second": ("running", 1), "gone": ("deleted", 1)}


async def test_outbox_survives_a_crash_between_commit_and_publish(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root)
    real_drain = outbox.Publisher.drain_once

    async def dead(self: outbox.Publisher, link: Any) -> int:
        await asyncio.Event().wait()  # the publisher hangs: the process dies before publishing anything
        return 0
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent:
        monkeypatch.setattr(outbox.Publisher, "drain_once", dead)
        async with running(s):
            job = await kube.create(PYTORCHJOBS, pytorchjob("durable"), "default")
            await eventually(lambda: rows(db_url, m.outbox, workload_uid=job["metadata"]["uid"]),
                             what="the Place committed to the outbox")
        (row,) = await rows(db_url, m.outbox, workload_uid=job["metadata"]["uid"])
        assert row.sent_at is None and agent.commands == []
        monkeypatch.setattr(outbox.Publisher, "drain_once", real_drain)
        async with running(s):
            await eventually(lambda: accepted(db_url, 1), what="accepted after the restart")

            async def all_sent() -> bool:
                return all(r.sent_at is not None for r in await rows(db_url, m.outbox))
            await eventually(all_sent, what="the outbox row marked sent")
    uid = job["metadata"]["uid"]
    assert [p.placement.workload_uid for p in agent.places()] == [uid]
    (p,) = await rows(db_url, m.placements)
    assert (p.attempt, p.state) == (1, "accepted")
    assert all(r.sent_at is not None for r in await rows(db_url, m.outbox))


async def test_publish_then_crash_before_marking_sent_repeats_the_send_with_one_effect(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root)
    real_mark = outbox.outbox_q.mark_sent
    calls = {"n": 0}

    async def crash_once(session: Any, ids: Any, now: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("killed after the PUBACK, before the outbox row was marked sent")
        await real_mark(session, ids, now)
    monkeypatch.setattr(outbox.outbox_q, "mark_sent", crash_once)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s) as d:
        job = await kube.create(PYTORCHJOBS, pytorchjob("twice"), "default")
        await eventually(lambda: len(agent.places()) >= 2, what="the Place published a second time")
        await eventually(lambda: accepted(db_url, 1))
        assert d.supervisor is not None and d.supervisor.tasks["outbox"].restarts >= 1
        await asyncio.sleep(0.3)  # let the second Accepted be handled too
    uid = job["metadata"]["uid"]
    places = agent.places()
    assert {(p.placement.workload_uid, p.placement.attempt, p.spec_version) for p in places} == {(uid, 1, 1)}
    assert len(await rows(db_url, m.placements)) == 1
    assert [e.type for e in await rows(db_url, m.events) if e.type == "accepted"] == ["accepted"]


@pytest.mark.skipif(not postgres_available(), reason="two dispatchers on one database need PostgreSQL "
                    "(127.0.0.1:5432 not reachable); SQLite allows one writer process")
async def test_two_dispatchers_on_one_postgres_never_claim_or_place_twice(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    assert db_url.startswith("postgresql")
    a = settings(manager, db_url, mqtt_url, topic_root, batch_size=5)
    b = settings(manager, db_url, mqtt_url, topic_root, batch_size=5)
    n = 30
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(a), running(b):
        await asyncio.gather(*(kube.create(PYTORCHJOBS, pytorchjob(f"pair-{i}"), "default") for i in range(n)))
        await eventually(lambda: accepted(db_url, n), within=30, what=f"{n} accepted")
        await asyncio.sleep(0.3)  # real time: late duplicates, had there been any, land now
    ws = await rows(db_url, m.workloads)
    assert len(ws) == n and {w.attempt for w in ws} == {1}
    assert len(await rows(db_url, m.placements)) == n
    claimed = collections.Counter(e.workload_uid for e in await rows(db_url, m.events) if e.type == "claimed")
    assert len(claimed) == n and set(claimed.values()) == {1}
    # a Command may arrive twice (each publisher also drains rows the other left unsent); the effect is once
    places = {(p.placement.workload_uid, p.placement.attempt, p.spec_version) for p in agent.places()}
    assert len(places) == n and {(a, v) for _, a, v in places} == {(1, 1)}
    epochs = {p.placement.epoch for p in agent.places()}
    assert epochs <= {1, 2}
    assert all(labels.ORIGIN in p.manifest["metadata"]["labels"] for p in agent.places())


async def test_with_namespaces_a_job_deleted_while_away_is_noticed_at_start(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root, namespaces=["default"])
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent:
        async with running(s):
            kept = await kube.create(PYTORCHJOBS, pytorchjob("kept"), "default")
            gone = await kube.create(PYTORCHJOBS, pytorchjob("gone"), "default")
            await eventually(lambda: accepted(db_url, 2), what="both accepted")
        await kube.delete(PYTORCHJOBS, "gone", "default")  # while the dispatcher is away
        async with running(s):
            await eventually(lambda: agent.deletes(), what="Delete for the Job deleted while away")
            await asyncio.sleep(0.3)  # real time: a second Delete, had one been sent, lands now
    assert [d.placement.workload_uid for d in agent.deletes()] == [gone["metadata"]["uid"]]
    assert {w.name: w.state for w in await rows(db_url, m.workloads)} == {"kept": "running", "gone": "deleted"}
    assert kept["metadata"]["uid"] != gone["metadata"]["uid"]
