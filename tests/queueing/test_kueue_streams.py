"""mkd's scheduler decides as Kueue v0.19.2 did on recorded streams, its ``PrioritizePreemptorWorkloads`` gate on
and off. ``kueue_v0192_streams.json`` (the gate on, mkd's default) and ``kueue_v0192_streams_gate_off.json`` (the
gate off, Kueue's default; mkd's setting ``preemption.prioritize_preemptors`` false) hold what Kueue v0.19.2's own
scheduler decided (its ``pkg/scheduler`` over its cache and queue manager, on a fake clock with controller-runtime's fake
client, as Kueue's scheduler tests drive it; an evicted Workload's quota released and the Workload requeued at
once, as Kueue's controllers do) on the cohort of ``streams.issue_objects``: A (4 cpu, ``withinClusterQueue:
LowerPriority``, ``reclaimWithinCohort: Any``), B (2 cpu, ``borrowingLimit: 2``), C (2 cpu, ``lendingLimit: 0``);
classical, with fair sharing (weights 1), and with A's ``borrowWithinCohort: LowerPriority`` up to priority mid.
A seeded stream is ``streams.random_stream(seed)``: 40 Jobs of 1 or 2 cpu to random queues with priorities low 10,
mid 100, high 1000, 1.2 s apart, then the earliest admitted (then by name) running Job deleted every 6 s; the
others (no seed) are streams the property test found, no two events at one time. Kueue orders Workloads
admitted at the same time by uid; the recording gave later Jobs smaller uids, the order mkd gives them (the most
recently queued first). mkd runs each stream through its pure scheduler with one worker cluster that has room
for everything, running passes at each event until they change nothing (as Kueue runs cycles until no head is
left). With the gate off Kueue loops on the streams the property test found: at one event it evicts the same
Workload for the same preemptor again and again (a Workload within its nominal quota reclaims the room the
preemptor freed, and is preempted in turn) until its harness stops after 400 cycles; such a recording ends with
that event, and mkd must loop there too, through the same evictions and admissions. Where mkd must differ because
it places on clusters (among the victim sets Kueue's order allows it prefers one whose room is on one cluster
where the preemptor fits: ``preemption.choose``), one cluster never triggers it;
``test_kueue_order.py::test_among_equal_candidates_the_victim_is_on_the_cluster_where_the_preemptor_runs``
shows the rule.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.queueing.streams import Job, drive, issue_objects, random_stream

HERE = Path(__file__).parent
RECORDED = {gate: json.loads((HERE / name).read_text()) for gate, name in
            (("on", "kueue_v0192_streams.json"), ("off", "kueue_v0192_streams_gate_off.json"))}
CASES = [(gate, s) for gate, doc in RECORDED.items() for s in doc["streams"]]
LOOP = 3
"""A Workload evicted this often for the same preemptor at one event: a loop."""


def mkd_steps(stream: dict[str, Any], *, gate: bool) -> list[list[Any]]:
    jobs = [Job(name, f"q{cq}", cpu, prio, at) for name, cq, cpu, prio, at in stream["jobs"]]
    fair = stream["mode"] == "fair"
    trace = drive(issue_objects(fair=fair, borrow_within_cohort=stream["mode"] == "bwc"), jobs, stream["deletions"],
                  tick=None, fair=fair, prioritize_preemptors=gate)
    out: list[list[Any]] = []
    for s in trace.steps:
        row: list[Any] = [s.at, s.what, s.job]
        if s.what == "admit":
            row.append(s.cq)
        if s.what == "evict":
            row += [s.cq, s.reason, s.preemptor]
        out.append(row)
    return out


def by_kind(steps: list[list[Any]], what: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(s) for s in steps if s[1] == what)


def first_loop(steps: list[list[Any]]) -> float | None:
    """The first event at which a Workload was evicted ``LOOP`` times or more for the same preemptor."""
    counts = Counter((s[0], s[2], s[5]) for s in steps if s[1] == "evict")
    return min((at for (at, _, _), n in counts.items() if n >= LOOP), default=None)


def test_the_gate_is_recorded_as_named() -> None:
    assert RECORDED["on"]["prioritize_preemptor_workloads"] is True
    assert RECORDED["off"]["prioritize_preemptor_workloads"] is False


@pytest.mark.parametrize(("gate", "stream"), CASES, ids=[f"gate-{g}-{s['name']}" for g, s in CASES])
def test_same_admissions_and_evictions_as_kueue(gate: str, stream: dict[str, Any]) -> None:
    ours, kueue = mkd_steps(stream, gate=gate == "on"), stream["kueue"]
    loop = first_loop(kueue)
    assert first_loop(ours) == loop                                 # mkd loops where Kueue loops, and only there
    if loop is not None:
        before = [s for s in ours if s[0] < loop]
        at_loop = {tuple(s) for s in ours if s[0] == loop}
        assert at_loop == {tuple(s) for s in kueue if s[0] == loop}  # the same evictions and admissions, round and round
        ours, kueue = before, [s for s in kueue if s[0] < loop]
    else:
        evictions = [(s[0], s[2]) for s in ours if s[1] == "evict"]
        assert len(set(evictions)) == len(evictions), "a Job evicted twice at one event (flapping)"
    assert by_kind(ours, "evict") == by_kind(kueue, "evict")       # the same victims, for the same preemptors
    assert by_kind(ours, "admit") == by_kind(kueue, "admit")       # admitted at the same events
    assert by_kind(ours, "delete") == by_kind(kueue, "delete")


def test_kueue_loops_with_the_gate_off_only() -> None:
    """The streams on which Kueue's default order loops: with the gate on, Kueue (and mkd) do not."""
    off = {s["name"]: s for s in RECORDED["off"]["streams"]}
    on = {s["name"]: s for s in RECORDED["on"]["streams"]}
    looping = sorted(name for name, s in off.items() if first_loop(s["kueue"]) is not None)
    assert looping and all(off[name]["seed"] is None for name in looping)
    assert set(looping) <= set(on)
    assert all(first_loop(on[name]["kueue"]) is None for name in looping)


@pytest.mark.parametrize(("gate", "stream"), [c for c in CASES if c[1]["seed"] is not None],
                         ids=[f"gate-{g}-{s['name']}" for g, s in CASES if s["seed"] is not None])
def test_the_recorded_jobs_are_the_seeded_stream(gate: str, stream: dict[str, Any]) -> None:
    jobs, deletions = random_stream(stream["seed"])
    assert [[j.name, j.queue[1:], j.cpu, j.priority, j.at] for j in jobs] == stream["jobs"]
    assert deletions == stream["deletions"]
