"""mkd's scheduler decides as Kueue v0.19.2 did on recorded seeded streams: same admissions, same victims.
``kueue_v0192_streams.json`` holds what Kueue v0.19.2's own scheduler decided (its ``pkg/scheduler`` over
its cache and queue manager, on a fake clock with controller-runtime's fake client, as Kueue's scheduler
tests drive it, with its ``PrioritizePreemptorWorkloads`` feature gate on, which mkd follows; an evicted
Workload's quota released and the Workload requeued at once, as Kueue's controllers do) on the cohort of
``streams.issue_objects``: A (4 cpu, ``withinClusterQueue: LowerPriority``, ``reclaimWithinCohort: Any``),
B (2 cpu, ``borrowingLimit: 2``), C (2 cpu, ``lendingLimit: 0``); classical, with fair sharing (weights 1),
and with A's ``borrowWithinCohort: LowerPriority`` up to priority mid. Each stream is
``streams.random_stream(seed)``: 40 Jobs of 1 or 2 cpu to random queues with priorities low 10, mid 100,
high 1000, 1.2 s apart, then the earliest admitted (then by name) running Job deleted every 6 s; the seed
and the Jobs are in the file. Kueue orders Workloads admitted at the same time by uid; the recording gave
later Jobs smaller uids, the order mkd gives them (the most recently queued first). mkd runs the same
stream through its pure scheduler with one worker cluster that has room for everything, running passes at
each event until they change nothing (as Kueue runs cycles until no head is left). Where mkd must differ
because it places on clusters (among the victim sets Kueue's order allows it prefers one whose room is on
one cluster where the preemptor fits: ``preemption.choose``), one cluster never triggers it;
``test_kueue_order.py::test_among_equal_candidates_the_victim_is_on_the_cluster_where_the_preemptor_runs``
shows the rule.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.queueing.streams import Job, drive, issue_objects, random_stream

RECORDED = json.loads((Path(__file__).parent / "kueue_v0192_streams.json").read_text())
STREAMS = {s["name"]: s for s in RECORDED["streams"]}


def mkd_steps(stream: dict[str, Any]) -> list[list[Any]]:
    jobs = [Job(name, f"q{cq}", cpu, prio, at) for name, cq, cpu, prio, at in stream["jobs"]]
    fair = stream["mode"] == "fair"
    trace = drive(issue_objects(fair=fair, borrow_within_cohort=stream["mode"] == "bwc"), jobs, stream["deletions"],
                  tick=None, fair=fair)
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


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_same_admissions_and_evictions_as_kueue(name: str) -> None:
    stream = STREAMS[name]
    ours, kueue = mkd_steps(stream), stream["kueue"]
    assert by_kind(ours, "evict") == by_kind(kueue, "evict")       # the same victims, for the same preemptors
    assert by_kind(ours, "admit") == by_kind(kueue, "admit")       # admitted at the same events
    assert by_kind(ours, "delete") == by_kind(kueue, "delete")
    evictions = [(s[0], s[2]) for s in ours if s[1] == "evict"]
    assert len(set(evictions)) == len(evictions), "a Job evicted twice at one event (flapping)"


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_the_recorded_jobs_are_the_seeded_stream(name: str) -> None:
    stream = STREAMS[name]
    jobs, deletions = random_stream(stream["seed"])
    assert [[j.name, j.queue[1:], j.cpu, j.priority, j.at] for j in jobs] == stream["jobs"]
    assert deletions == stream["deletions"]
