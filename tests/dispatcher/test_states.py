"""Workload and Placement states: one table of legal transitions, and states that tell the truth.

A suspended Job reads ``suspended`` in the database and does not count as running in
``mkctl clusters list``; a Job whose managedBy changed stops showing the worker's ``Running=True``.
"""

from __future__ import annotations

import ast
import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dispatcher.db import models as m
from dispatcher.states import IllegalTransition, PlacementState, WorkloadState, initial, parse, transition
from federation import labels
from federation.kube import Kube
from mkctl.main import app
from tests.dispatcher.harness import PYTORCHJOBS, FakeAgent, eventually, pytorchjob, running, settings
from tests.dispatcher.test_flow import rows


def test_the_table_allows_the_lifecycle_and_refuses_the_rest() -> None:
    W, P = WorkloadState, PlacementState
    for old, new in ((W.PENDING, W.PLACED), (W.PLACED, W.RUNNING), (W.RUNNING, W.SUSPENDED),
                     (W.SUSPENDED, W.RUNNING), (W.RUNNING, W.FINISHED), (W.FINISHED, W.DELETED),
                     (W.RUNNING, W.RUNNING)):
        assert transition(old, new) is new
    assert transition("accepted", P.SUSPENDED) is P.SUSPENDED  # the database's strings are accepted
    for old, new in ((W.DELETED, W.PENDING), (W.FINISHED, W.RUNNING), (W.PENDING, W.RUNNING)):
        with pytest.raises(IllegalTransition, match=f"from {old} to {new}"):
            transition(old, new)
    for p_old, p_new in ((P.LOST, P.RUNNING), (P.FINISHED, P.RUNNING), (P.REJECTED, P.ACCEPTED)):
        with pytest.raises(IllegalTransition):
            transition(p_old, p_new)
    with pytest.raises(IllegalTransition, match="not a WorkloadState"):
        transition("sleeping", W.PENDING)
    assert parse(WorkloadState, " Suspended") is W.SUSPENDED
    with pytest.raises(ValueError, match="use one of: pending, placed, running, suspended"):
        parse(WorkloadState, "runing")


def test_a_new_row_starts_only_where_the_table_lets_it() -> None:
    """Inserts pass the table too: a Workload is claimed pending, suspended or rejected; a Placement starts sent."""
    W, P = WorkloadState, PlacementState
    for first in (W.PENDING, W.SUSPENDED, W.REJECTED, P.SENT):
        assert initial(first) is first
    for never in (W.PLACED, W.RUNNING, W.DELETED, P.ACCEPTED, P.LOST):
        with pytest.raises(IllegalTransition, match=f"cannot start as {never}"):
            initial(never)


ENGINE = Path(__file__).resolve().parents[2] / "dispatcher"


def test_the_engine_writes_and_compares_states_as_enum_members() -> None:
    """No state string literal in the engine: a ``state=`` write, a ``"state":`` key or a comparison with a
    row's state names a member of WorkloadState or PlacementState, so mypy sees a typo."""
    found = []
    for path in [*sorted((ENGINE / "engine").glob("*.py")), ENGINE / "clusters" / "health.py"]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            values: list[ast.expr] = []
            if isinstance(node, ast.keyword) and node.arg == "state":
                values = [node.value]
            elif isinstance(node, ast.Dict):
                values = [v for k, v in zip(node.keys, node.values, strict=True)
                          if isinstance(k, ast.Constant) and k.value == "state"]
            elif isinstance(node, ast.Compare) and any(
                    (isinstance(x, ast.Subscript) and isinstance(x.slice, ast.Constant) and x.slice.value == "state")
                    or (isinstance(x, ast.Attribute) and x.attr in ("state", "p_state")) for x in (node.left, *node.comparators)):
                values = [node.left, *node.comparators]
            for v in values:
                keys = {id(x.slice) for x in ast.walk(v) if isinstance(x, ast.Subscript)}  # row["state"] is no state
                for leaf in ast.walk(v):
                    if isinstance(leaf, ast.Constant) and isinstance(leaf.value, str) and id(leaf) not in keys:
                        found.append(f"{path.name}:{leaf.lineno} {leaf.value!r}")
    assert found == []


async def running_on(db_url: str, cluster: str) -> int:
    """The RUNNING column of ``mkctl clusters list`` (run in a thread: mkctl runs its own event loop)."""
    return await asyncio.to_thread(_running_on, db_url, cluster)


def _running_on(db_url: str, cluster: str) -> int:
    result = CliRunner().invoke(app, ["clusters", "list", "-o", "json", "--database-url", db_url],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    items = json.loads(result.output)
    items = items["items"] if isinstance(items, dict) else items
    (row,) = [c for c in items if c["name"] == cluster]
    return int(row["running"])


async def test_a_suspended_job_reads_suspended_and_does_not_count_as_running(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s):
        await kube.create(PYTORCHJOBS, pytorchjob("nap"), "default")
        (place,) = await eventually(lambda: agent.places(), what="Place")
        await agent.status(place, {"startTime": "2026-01-01T00:00:00Z", "conditions": []})

        async def states() -> tuple[str, str]:
            (w,) = await rows(db_url, m.workloads)
            (p,) = await rows(db_url, m.placements)
            return w.state, p.state

        async def reads(expected: tuple[str, str]) -> bool:
            return await states() == expected
        await eventually(lambda: reads(("running", "running")), what="running")
        assert await running_on(db_url, "worker-1") == 1

        await kube.patch(PYTORCHJOBS, "nap", {"spec": {"runPolicy": {"suspend": True}}}, "default")
        await eventually(lambda: len(agent.places()) >= 2, what="Place with the suspended spec")
        await eventually(lambda: reads(("suspended", "suspended")), what="suspended in the database")
        assert await running_on(db_url, "worker-1") == 0

        await kube.patch(PYTORCHJOBS, "nap", {"spec": {"runPolicy": {"suspend": False}}}, "default")
        await eventually(lambda: len(agent.places()) >= 3, what="Place with the resumed spec")
        await eventually(lambda: reads(("running", "accepted")), what="resumed in the database")
        assert await running_on(db_url, "worker-1") == 1


async def test_created_suspended_reads_suspended_until_resumed(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s):
        await kube.create(PYTORCHJOBS, pytorchjob("asleep", suspend=True), "default")
        await eventually(lambda: rows(db_url, m.workloads), what="claim")
        assert [w.state for w in await rows(db_url, m.workloads)] == ["suspended"]
        await kube.patch(PYTORCHJOBS, "asleep", {"spec": {"runPolicy": {"suspend": False}}}, "default")
        await eventually(lambda: agent.places(), what="Place after resume")

        async def running_now() -> bool:
            return [w.state for w in await rows(db_url, m.workloads)] == ["running"]
        await eventually(running_now, what="running once accepted")


async def test_a_job_whose_managed_by_changed_loses_the_stale_running_condition(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s):
        await kube.create(PYTORCHJOBS, pytorchjob("moved"), "default")
        (place,) = await eventually(lambda: agent.places(), what="Place")
        await agent.status(place, {"startTime": "2026-01-01T00:00:00Z", "conditions": [
            {"type": "Running", "status": "True", "reason": "PyTorchJobRunning", "message": "",
             "lastTransitionTime": "2026-01-01T00:00:00Z"}]})

        async def shows_running() -> Any:
            st = (await kube.get(PYTORCHJOBS, "moved", "default")).get("status") or {}
            return any(c["type"] == "Running" for c in st.get("conditions") or [])
        await eventually(shows_running, what="Running mirrored")

        await kube.patch(PYTORCHJOBS, "moved", {"spec": {"runPolicy": {"managedBy": labels.TRAINING_OPERATOR}}},
                         "default")
        await eventually(lambda: agent.deletes(), what="Delete of the worker copy")

        async def cleared() -> Any:
            st = (await kube.get(PYTORCHJOBS, "moved", "default")).get("status") or {}
            types = [c["type"] for c in st.get("conditions") or []]
            return st if labels.CONDITION_REJECTED in types and "Running" not in types else None
        st = await eventually(cleared, what="the worker's Running=True gone from the manager Job")
        assert "startTime" not in st
        # a late Status from the deleted copy does not bring it back
        await agent.status(place, {"startTime": "2026-01-01T00:00:00Z", "conditions": [
            {"type": "Running", "status": "True", "reason": "PyTorchJobRunning", "message": "",
             "lastTransitionTime": "2026-01-01T00:00:01Z"}]})
        (w,) = await rows(db_url, m.workloads)
        assert w.state == "rejected"
        await eventually(lambda: rows(db_url, m.events, type="rejected"), what="history")
        st = (await kube.get(PYTORCHJOBS, "moved", "default")).get("status") or {}
        assert "Running" not in [c["type"] for c in st.get("conditions") or []]


async def test_a_copy_refused_for_two_controllers_is_placed_elsewhere(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    """The agent found an upstream operator also running its copy, deleted the copy and said so
    (``TwoControllers``, after it had accepted): the Workload goes elsewhere, never back there."""
    from federation import messages
    s = settings(manager, db_url, mqtt_url, topic_root, placement_retry_seconds=0.25)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as w1, running(s):
        await kube.create(PYTORCHJOBS, pytorchjob("twice"), "default")
        (place,) = await eventually(lambda: w1.places(), what="Place on worker-1")

        async def accepted() -> bool:
            return [p.state for p in await rows(db_url, m.placements)] == ["accepted"]
        await eventually(accepted, what="accepted")
        async with FakeAgent("worker-2", mqtt_url, topic_root) as w2:
            await w1.report(messages.Rejected(cluster="worker-1", placement=place.placement, spec_version=1,
                                              seq=w1.next_seq(), reason=messages.REJECTED_TWO_CONTROLLERS,
                                              message="another controller reconciles PyTorchJob", permanent=True))
            await w1.status(place, {}, gone=True)  # the agent deleted its copy
            await eventually(lambda: w2.places(), what="placed on worker-2")
            (w,) = await rows(db_url, m.workloads)
            assert w.excluded == ["worker-1"] and w.cluster == "worker-2"
            first = [p for p in await rows(db_url, m.placements) if p.attempt == 1]
            assert first[0].state == "rejected" and "TwoControllers" in first[0].reason
        assert len(w1.places()) == 1
