"""Seeded streams of Jobs driven through the pure scheduler on a virtual clock, as the engine drives it.

A stream is Jobs submitted at given times to LocalQueues of a set of Kueue objects, and deletions of
running Jobs (the earliest admitted first) at given times. :func:`drive` runs a pass at every event and
every ``tick`` seconds between them (or, ``tick`` None, passes at each event until they change nothing); an
evicted Workload goes back to its queue at its old place, as the engine requeues it. The trace lists each admission and eviction in order.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from dispatcher.queueing.scheduler import Entry, Queues
from tests.queueing.builders import NOW, catalog, cluster, cq, entry, flavor, lq, need, node

PRIORITIES = {"low": 10, "mid": 100, "high": 1000}


@dataclass(frozen=True)
class Job:
    name: str
    queue: str      # LocalQueue (in namespace default)
    cpu: int
    priority: str   # a key of PRIORITIES
    at: float       # seconds after the stream starts


@dataclass
class Step:
    at: float
    what: str       # admit, evict, delete
    job: str
    cq: str = ""
    reason: str = ""
    preemptor: str = ""


@dataclass
class Trace:
    steps: list[Step] = field(default_factory=list)

    def evictions(self) -> list[Step]:
        return [s for s in self.steps if s.what == "evict"]

    def admitted_by(self, t: float) -> set[str]:
        """Jobs holding quota at ``t`` (admitted and neither evicted nor deleted since)."""
        held: set[str] = set()
        for s in self.steps:
            if s.at > t:
                break
            if s.what == "admit":
                held.add(s.job)
            else:
                held.discard(s.job)
        return held

    def flaps(self) -> dict[str, int]:
        """Per Job, how often it was evicted after an admission (a restart for nothing when > 1)."""
        out: dict[str, int] = {}
        for s in self.evictions():
            out[s.job] = out.get(s.job, 0) + 1
        return out


def issue_objects(*, fair: bool = False, borrow_within_cohort: bool = False) -> list[dict[str, Any]]:
    """One cohort of three ClusterQueues: A (4 cpu, preempts lower priority within, reclaims any), B (2 cpu,
    borrowingLimit 2), C (2 cpu, lendingLimit 0). ``borrow_within_cohort``: A also preempts lower
    priority Workloads while it borrows (up to priority mid). ``fair``: each ClusterQueue has a weight."""
    pre: dict[str, Any] = {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Any"}
    if borrow_within_cohort:
        pre["borrowWithinCohort"] = {"policy": "LowerPriority", "maxPriorityThreshold": PRIORITIES["mid"]}
    weight: dict[str, Any] = {"fairSharing": {"weight": "1"}} if fair else {}
    return [flavor("default"), lq("default", "qa", "a"), lq("default", "qb", "b"), lq("default", "qc", "c"),
            cq("a", cohort="co", flavors={"default": {"cpu": "4"}}, preemption=pre, **weight),
            cq("b", cohort="co", flavors={"default": {"cpu": ("2", "2")}}, **weight),
            cq("c", cohort="co", flavors={"default": {"cpu": ("2", None, "0")}}, **weight)]


def random_stream(seed: int, n: int = 40, every: float = 1.2, delete_every: float = 6.0
                  ) -> tuple[list[Job], list[float]]:
    """``n`` Jobs of 1 or 2 cpu to random queues with random priorities, ``every`` seconds apart; then a
    deletion of the earliest admitted running Job every ``delete_every`` seconds, ``n`` times."""
    rnd = random.Random(seed)
    jobs = [Job(f"j{i:02d}", rnd.choice(["qa", "qb", "qc"]), rnd.choice([1, 2]), rnd.choice(list(PRIORITIES)),
                round(i * every, 3)) for i in range(n)]
    start = n * every
    return jobs, [round(start + (k + 1) * delete_every, 3) for k in range(n)]


def drive(objs: list[dict[str, Any]], jobs: list[Job], deletions: list[float], *, tick: float | None = 0.5,
          fair: bool = False, cpu: int = 64, prioritize_preemptors: bool = True) -> Trace:
    """Run the stream; ``cpu``: the one worker cluster's free room at every pass (quota is the limit).
    ``tick`` None: no passes between events; at each event, passes at that instant until one admits and
    evicts nothing (as Kueue runs cycles until its queues have no head to try)."""
    q = Queues(catalog(*objs), fair_sharing=fair, prioritize_preemptors=prioritize_preemptors)
    trace = Trace()
    submitted: dict[str, Entry] = {}
    order: list[str] = []   # admission order of what holds quota
    cq_of: dict[str, str] = {}
    admitted_at: dict[str, float] = {}
    events = sorted({j.at for j in jobs} | set(deletions))
    end = (max(events) if events else 0.0) + 30.0
    times = sorted(set(events) | ({round(k * tick, 3) for k in range(int(end / tick) + 1)} if tick else set()))
    pending_jobs = sorted(jobs, key=lambda j: j.at)
    for t in times:
        while pending_jobs and pending_jobs[0].at <= t:
            j = pending_jobs.pop(0)
            e = entry(j.name, need(cpu=j.cpu), queue=j.queue, priority=PRIORITIES[j.priority], at=j.at)
            e.uid = j.name
            submitted[j.name] = e
            q.add(replace(e))
        if t in deletions and order:   # the earliest admitted (then by name) of what runs
            gone = min(order, key=lambda uid: (admitted_at[uid], uid))
            order.remove(gone)
            q.release(gone)
            trace.steps.append(Step(t, "delete", gone))
        for _ in range(1 if tick else 50):
            if not _pass(q, [cluster("w", node("n", cpu))], t, trace, submitted, order, cq_of):
                break
        held = set(order)
        for uid in [u for u in admitted_at if u not in held]:   # evicted or deleted: admitted anew later
            del admitted_at[uid]
        for uid in order:
            admitted_at.setdefault(uid, t)
    return trace


def _pass(q: Queues, w: list[Any], t: float, trace: Trace, submitted: dict[str, Entry], order: list[str],
          cq_of: dict[str, str]) -> bool:
    r = q.schedule(w, now=NOW + timedelta(seconds=t), timeout=1e9)
    for v in r.evicted:
        order.remove(v.uid)
        trace.steps.append(Step(t, "evict", v.uid, cq_of.get(v.uid, ""), v.reason, v.preemptor.uid))
        q.add(replace(submitted[v.uid]))   # its queue time stays its creationTimestamp, as in Kueue
    for a in r.admitted:
        order.append(a.entry.uid)
        held = q.admitted.get(a.entry.uid)
        cq_of[a.entry.uid] = held.cq if held else ""
        trace.steps.append(Step(t, "admit", a.entry.uid, cq_of[a.entry.uid]))
    return bool(r.admitted or r.evicted)
