"""Places left unanswered are sent again, paced (a restarted dispatcher re-sent every
unanswered Place at once, a burst to every agent, most of them answered already while it was away).

Read from the database's outbox: each tick's re-sends are the Place rows committed together (one
``created_at``), at most ``place_resend_batch`` per cluster, oldest placement first, none skipped,
and none for a Place whose answer was waiting for the restarted dispatcher in the broker."""

from __future__ import annotations

import collections
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from dispatcher.db import models as m
from federation import messages
from federation.kube import Kube
from tests.dispatcher.harness import (
    PYTORCHJOBS,
    FakeAgent,
    eventually,
    is_place,
    pytorchjob,
    running,
    settings,
)
from tests.dispatcher.test_flow import rows

JOBS = 12
ANSWERED_WHILE_AWAY = 4
BATCH = 3


async def test_a_restarted_dispatcher_resends_paced_oldest_first_and_not_what_was_answered(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    first = settings(manager, db_url, mqtt_url, topic_root, place_resend_seconds=600.0, placement_retry_seconds=0.3)
    async with FakeAgent("worker-1", mqtt_url, topic_root, auto_accept=False, beat_every=0.5) as agent:
        async with running(first):
            for i in range(JOBS):
                await kube.create(PYTORCHJOBS, pytorchjob(f"job-{i:02d}"), "default")
            await eventually(lambda: len(agent.places()) == JOBS, within=30, what="every Job placed, unanswered")
        sent_before = len(agent.places())
        # the agent answers some while no dispatcher runs: the Accepted wait in the broker for its session
        for place in agent.places()[:ANSWERED_WHILE_AWAY]:
            await agent.report(messages.Accepted(cluster="worker-1", placement=place.placement,
                                                 spec_version=place.spec_version, seq=agent.next_seq()))
        answered = {p.placement.workload_uid for p in agent.places()[:ANSWERED_WHILE_AWAY]}
        second = first.model_copy(update={"place_resend_seconds": 2.0, "place_resend_batch": BATCH})
        async with running(second) as d:
            engine = d.engine
            assert engine is not None
            epoch = await eventually(lambda: engine.epoch, what="the restarted dispatcher's epoch")

            async def resent_uids() -> set[str]:
                return {r.workload_uid for r in await rows(db_url, m.outbox)
                        if r.id >> 32 == epoch and is_place(r.payload)}
            unanswered = {p.placement.workload_uid for p in agent.places()} - answered
            await eventually(lambda: _covers(resent_uids(), unanswered), within=60,
                             what="every unanswered Place sent again")
            await eventually(lambda: unanswered <= {p.placement.workload_uid for p in agent.places()[sent_before:]},
                             what="and received by the agent")
    placements = {p.workload_uid: p.created_at for p in await rows(db_url, m.placements)}
    resent = [r for r in await rows(db_url, m.outbox) if r.id >> 32 == epoch and is_place(r.payload)]
    rounds: dict[object, list[str]] = collections.defaultdict(list)
    for r in sorted(resent, key=lambda r: r.id):
        rounds[r.created_at].append(r.workload_uid)
    order = [uid for _, uids in sorted(rounds.items()) for uid in uids]
    assert not answered & set(order), "a Place answered while the dispatcher was away was sent again"
    assert max(len(uids) for uids in rounds.values()) <= BATCH, {str(k): len(v) for k, v in rounds.items()}
    firsts = list(dict.fromkeys(order))  # each Place's first re-send, in the order they went
    assert set(firsts) == unanswered
    assert [placements[u] for u in firsts] == sorted(placements[u] for u in firsts), "not oldest first"


async def _covers(found: Awaitable[set[str]], want: set[str]) -> bool:
    return want <= await found


async def test_a_place_still_waiting_in_the_outbox_is_not_sent_again(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    """A Place is sent again when its agent has not answered it ``place_resend_seconds`` after it was sent, not
    after it was created: Places held back by the unanswered-Place budget (a 10,000-Job burst: up to 50 s in the
    outbox) were queued a second time before their first copy was published, and a third after that."""
    config = settings(manager, db_url, mqtt_url, topic_root, place_resend_seconds=1.0, placement_retry_seconds=0.2,
                      max_unanswered_places=2)
    async with FakeAgent("worker-1", mqtt_url, topic_root, auto_accept=False, beat_every=0.5) as agent:
        async with running(config):
            for i in range(8):
                await kube.create(PYTORCHJOBS, pytorchjob(f"held-{i}"), "default")
            await eventually(lambda: len({p.placement.workload_uid for p in agent.places()}) == 8, within=60,
                             what="every Place published at last, two at a time")
    by_uid: dict[str, list[Any]] = collections.defaultdict(list)
    for r in sorted(await rows(db_url, m.outbox), key=lambda r: r.id):
        if is_place(r.payload):
            by_uid[r.workload_uid].append(r)
    early = {uid: len(rs) for uid, rs in by_uid.items()
             if any(r.created_at < (rs[0].sent_at or r.created_at) or rs[0].sent_at is None for r in rs[1:])}
    assert not early, f"Places queued again before their first copy was sent: {early}"
