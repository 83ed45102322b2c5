"""The what-if run: a trace replayed through the dispatcher's own scheduler on a virtual clock, pure.

:func:`simulate` feeds the Jobs of a trace to :class:`dispatcher.queueing.scheduler.Queues` (admission,
flavors, borrowing, preemption, fair sharing, starvation holds) over :class:`~dispatcher.placement.ClusterView`
s built from the configuration's nodes (gang placement by :func:`dispatcher.placement.choose`), as the
dispatcher's placement round does: a Job arrives and queues with its arrival as queue time, a pass runs
whenever something changed, an admitted Job holds its quota and its pods' room on the nodes until its run
time has passed, a preempted one goes back to its queue at its old place (its room free for the next pass,
one ``pass_seconds`` later) and later runs its whole run time again, and a cordoned cluster takes nothing
new. No database, broker or cluster; the clock moves from event to event.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from dispatcher.placement import NodeView, subtract_from_nodes
from dispatcher.queueing import api
from dispatcher.queueing.scheduler import OPEN, Admission, Entry, Queues
from dispatcher.whatif.config import Config
from dispatcher.whatif.trace import TraceJob

ZERO = Decimal(0)
ARRIVE, FINISH, CORDON, WAKE = 0, 1, 2, 3
"""Event kinds, in the order events at one instant are applied (finishes before the pass that follows)."""
SAMPLES = 400
"""About how many points the series over time hold (queue depth, borrowing, shares, utilisation)."""


@dataclass
class JobResult:
    """What happened to one Job of the trace."""

    job: TraceJob
    cluster_queue: str | None = None
    priority: int = 0
    first_start: float | None = None
    end: float | None = None
    clusters: list[str] = field(default_factory=list)   # one per admission, in order
    evictions: int = 0
    pending_seconds: float = 0.0
    reason: str = ""   # why it never ran (the scheduler's reason when the run ended)
    step: str = ""


@dataclass
class Preemption:
    at: float
    preemptor: str
    preemptor_cq: str | None
    victim: str
    victim_cq: str | None
    reason: str
    message: str


@dataclass
class Run:
    """The outcome of :func:`simulate`; times are seconds from the first arrival (``start`` is its POSIX time)."""

    start: float
    end: float
    jobs: dict[str, JobResult]
    admissions: list[tuple[float, str, str]]          # (time, namespace/name, cluster), in the order admitted
    preemptions: list[Preemption]
    sample_times: list[float]
    depth: dict[str, list[int]]                       # LocalQueue namespace/name -> pending Workloads
    borrowed: dict[str, list[dict[str, Decimal]]]     # ClusterQueue -> resource -> quota used above nominal
    shares: dict[str, list[float]]                    # ClusterQueue -> weighted dominant share
    used: dict[str, list[dict[str, Decimal]]]         # cluster -> resource -> requests placed
    allocatable: dict[str, dict[str, Decimal]]
    busy: dict[str, dict[str, Decimal]]               # cluster -> resource -> integral of use over time
    cq_of_lq: dict[str, str | None]
    passes: int = 0
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Running:
    uid: str
    cluster: str
    token: int
    deltas: list[tuple[int, dict[str, Decimal]]]
    total: dict[str, Decimal]


Progress = Callable[[int, int, float], None]
"""(Jobs finished or never to run, Jobs in the trace, virtual seconds so far)."""


def _entry(job: TraceJob, uid: str, seq: int, priority: int) -> Entry:
    placement = api.placement_of(job.annotations)   # checked when the trace was read
    if job.cluster:
        placement = api.Placement(frozenset({job.cluster}), placement.exclude, placement.selector)
    return Entry(uid=uid, namespace=job.namespace, name=job.name, queue=job.queue, priority=priority,
                 queued_at=job.arrival, seq=seq, need=job.need, placement=placement, pinned=job.cluster)


def simulate(jobs: list[TraceJob], config: Config, *, progress: Progress | None = None,
             progress_every: int = 5000) -> Run:
    """Replay ``jobs`` against ``config``; see the module docstring."""
    s = config.settings
    catalog = config.catalog({j.namespace for j in jobs})
    queues = Queues(catalog, starvation_seconds=s.starvation_seconds, max_attempts_per_pass=s.max_admissions_per_pass,
                    fair_sharing=s.fair_sharing, preemption_strategies=s.preemption_strategies,
                    hold_seconds=s.starvation_hold_seconds, prioritize_preemptors=s.prioritize_preemptors)
    ordered = sorted(range(len(jobs)), key=lambda i: (jobs[i].arrival, i))
    start = jobs[ordered[0]].arrival if jobs else 0.0
    views = {name: c.view() for name, c in sorted(config.clusters.items())}
    allocatable = {name: dict(v.allocatable) for name, v in views.items()}
    uids = {jobs[i].key: jobs[i] for i in ordered}
    results = {k: JobResult(j) for k, j in uids.items()}
    seqs = {jobs[i].key: n for n, i in enumerate(ordered)}
    prio: dict[str, int] = {}
    for key, job in uids.items():
        if job.priority is not None:
            prio[key] = job.priority
        else:
            labels = {api.PRIORITY_CLASS_LABEL: job.priority_class} if job.priority_class else {}
            prio[key] = catalog.priority(labels, job.pod_priority_classes())[0]
        results[key].priority = prio[key]

    events: list[tuple[float, int, int, str]] = []
    for n, i in enumerate(ordered):
        events.append((jobs[i].arrival - start, ARRIVE, n, jobs[i].key))
    for c in config.clusters.values():
        for since, until in c.cordons:
            events.append((since, CORDON, 0, c.name))
            if until is not None:
                events.append((until, CORDON, 0, c.name))
    heapq.heapify(events)
    running: dict[str, _Running] = {}
    tokens: dict[str, int] = {}
    pending_since: dict[str, float] = {}
    depth_now: dict[str, int] = {}
    lq_of = {k: f"{j.namespace}/{j.queue}" for k, j in uids.items()}
    used_now = {name: {k: ZERO for k in a} for name, a in allocatable.items()}
    busy = {name: {k: ZERO for k in a} for name, a in allocatable.items()}
    horizon = max((j.arrival - start + j.run_seconds for j in jobs), default=0.0)
    step = max(horizon / SAMPLES, 1.0)
    run = Run(start=start, end=0.0, jobs=results, admissions=[], preemptions=[], sample_times=[], depth={},
              borrowed={}, shares={}, used={n: [] for n in views}, allocatable=allocatable, busy=busy, cq_of_lq={},
              settings=s.as_dict())
    cq_names = sorted(catalog.cluster_queues)
    for name in cq_names:
        run.borrowed[name], run.shares[name] = [], []
    lqs = sorted(set(lq_of.values()))
    for lq in lqs:
        run.depth[lq] = []
        depth_now[lq] = 0
        ns, _, qname = lq.partition("/")
        resolved = catalog.resolve(ns, qname)
        run.cq_of_lq[lq] = (OPEN if catalog.open else
                            resolved.cluster_queue.name if resolved.cluster_queue is not None and not resolved.problem
                            else None)
    finished = 0
    last_t = 0.0
    next_sample = 0.0
    wake_at: float | None = None
    last_progress_t = 0.0
    reported = 0

    def integrate(t: float) -> None:
        nonlocal last_t
        dt = Decimal(str(t - last_t)) if t > last_t else ZERO
        if dt:
            for name, used in used_now.items():
                acc = busy[name]
                for k, v in used.items():
                    if v:
                        acc[k] += v * dt
        last_t = max(last_t, t)

    def sample(t: float) -> None:
        run.sample_times.append(t)
        for lq in lqs:
            run.depth[lq].append(depth_now[lq])
        for name in cq_names:
            node = queues.tree.queues.get(name)
            borrowed: dict[str, Decimal] = {}
            if node is not None:
                for (_, res), v in node.usage.items():
                    over = v - node.nominal.get((_, res), ZERO)
                    if over > 0:
                        borrowed[res] = borrowed.get(res, ZERO) + over
            run.borrowed[name].append(borrowed)
            run.shares[name].append(float(queues.share(name)))
        for name in views:
            run.used[name].append(dict(used_now[name]))

    def queue_job(key: str, t: float) -> None:
        job = uids[key]
        queues.add(_entry(job, key, seqs[key], prio[key]))
        pending_since[key] = t
        depth_now[lq_of[key]] += 1

    def free(r: _Running) -> None:
        view = views[r.cluster]
        nodes = list(view.nodes)
        for i, delta in r.deltas:
            n = nodes[i]
            nodes[i] = NodeView(n.name, n.labels, n.taints, {k: v + delta.get(k, ZERO) for k, v in n.free.items()},
                                n.allocatable)
        view.nodes = nodes
        view.free = {k: view.free.get(k, ZERO) + r.total.get(k, ZERO) for k in {*view.free, *r.total}}
        used = used_now[r.cluster]
        for k, v in r.total.items():
            if k in used:
                used[k] -= v

    def cordoned(t: float) -> frozenset[str]:
        return frozenset(n for n, c in config.clusters.items() if c.cordoned_at(t))

    cordon_set = cordoned(0.0)
    while events or wake_at is not None:
        t = events[0][0] if events else float("inf")
        if wake_at is not None and wake_at < t:
            t = wake_at
        integrate(t)
        wake_at = None
        changed_capacity = False
        while events and events[0][0] <= t:
            _, kind, token, key = heapq.heappop(events)
            if kind == ARRIVE:
                queue_job(key, t)
            elif kind == FINISH:
                r = running.get(key)
                if r is None or r.token != token:
                    continue   # preempted since: this end belongs to an earlier run
                del running[key]
                free(r)
                queues.release(key)
                changed_capacity = True
                results[key].end = t
                finished += 1
            elif kind == CORDON:
                now_cordoned = cordoned(t)
                if now_cordoned != cordon_set:
                    cordon_set = now_cordoned
                    changed_capacity = True
        if changed_capacity:
            queues.capacity_changed()
        when = datetime.fromtimestamp(start + t, UTC)
        usable = []
        for name, view in views.items():
            if name not in cordon_set:
                view.last_heartbeat = when
                usable.append(view)
        before = {view.name: view.nodes for view in usable}
        result = queues.schedule(usable, now=when, timeout=3600.0)
        run.passes += 1
        by_cluster: dict[str, list[Admission]] = {}
        for adm in result.admitted:
            by_cluster.setdefault(adm.cluster, []).append(adm)
        for name, admissions in by_cluster.items():
            nodes = before[name]
            for a in admissions:
                new = subtract_from_nodes(nodes, a.need.total, a.need) if nodes else nodes
                deltas = [(i, {k: v - new[i].free.get(k, ZERO) for k, v in nodes[i].free.items()})
                          for i in range(len(nodes)) if new[i] is not nodes[i]]
                nodes = new
                key = a.entry.uid
                tokens[key] = tokens.get(key, 0) + 1
                running[key] = _Running(key, name, tokens[key], deltas, dict(a.need.total))
                used = used_now[name]
                for k, v in a.need.total.items():
                    if k in used:
                        used[k] += v
                res = results[key]
                res.cluster_queue = a.entry.cq or None
                if res.first_start is None:
                    res.first_start = t
                res.clusters.append(name)
                res.pending_seconds += t - pending_since.pop(key, t)
                depth_now[lq_of[key]] -= 1
                run.admissions.append((t, key, name))
                heapq.heappush(events, (t + uids[key].run_seconds, FINISH, tokens[key], key))
            views[name].nodes = nodes
        for ev in result.evicted:
            r = running.pop(ev.uid, None)
            if r is not None:
                free(r)
            results[ev.uid].evictions += 1
            run.preemptions.append(Preemption(t, ev.preemptor.uid, ev.preemptor.cq or None, ev.uid,
                                              results[ev.uid].cluster_queue, ev.reason, ev.message))
            queue_job(ev.uid, t)
        if result.evicted:
            queues.capacity_changed()
            wake_at = t + s.pass_seconds
        if result.admitted or result.evicted:
            last_progress_t = t
        if wake_at is None and queues.entries:
            wake_at = _timer(queues, t, start, s.retry_seconds, s.starvation_seconds)
            if wake_at is not None and not running and not events and \
                    t - last_progress_t > s.starvation_seconds + 2 * s.starvation_hold_seconds + s.retry_seconds:
                wake_at = None   # nothing runs, nothing arrives, timers brought nothing: the rest never runs
        if t >= next_sample or (not events and wake_at is None):
            sample(t)
            next_sample = t + step
        if progress is not None and (finished - reported >= progress_every or (not events and wake_at is None)):
            reported = finished
            progress(finished, len(jobs), t)
    run.end = last_t
    for key, e in queues.entries.items():
        res = results[key]
        res.reason, res.step = e.reason or "waiting for its turn", e.step
        res.cluster_queue = res.cluster_queue or e.cq or None
        res.pending_seconds += last_t - pending_since.get(key, last_t)
    return run


def _timer(queues: Queues, t: float, start: float, retry: float, starvation: float) -> float | None:
    """When the next pass is due without any event: a hold or a preemptor's room is watched every ``retry``
    seconds, as the dispatcher's retry pass does; a Workload set aside for capacity starts starving at
    ``set_aside_since + starvation``."""
    if queues.held.by_uid:
        return t + retry
    soonest: float | None = None
    for aside in queues.aside.values():
        for e in aside.values():
            if e.preempting_since is not None:
                return t + retry
            if e.set_aside == "capacity" and e.set_aside_since is not None:
                due = e.set_aside_since - start + starvation   # set_aside_since is POSIX time
                if due <= t:
                    return t + retry
                soonest = due if soonest is None or due < soonest else soonest
    return soonest
