"""Preemption decides as Kueue's classical preemption does, and a preemptor's room is its own.

The set-up is one cohort of three ClusterQueues as users write them: A (4 cpu,
``withinClusterQueue: LowerPriority``, ``reclaimWithinCohort: Any``), B (2 cpu, ``borrowingLimit: 2``,
no preemption), C (2 cpu, ``lendingLimit: 0``); priorities low 10, mid 100, high 1000. Kueue takes
victims from ClusterQueues above their nominal quota first, then the lowest priority, then the most
recently admitted, removes them until the preemptor fits and gives back every one not needed; a
ClusterQueue within its nominal quota is never reclaimed from.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from dispatcher.queueing import api
from dispatcher.queueing.scheduler import Entry, Queues
from tests.queueing.builders import NOW, catalog, cluster, cq, entry, flavor, lq, need, node

LOW, MID, HIGH = 10, 100, 1000


def cohort() -> Queues:
    c = catalog(flavor("default"), lq("default", "qa", "a"), lq("default", "qb", "b"), lq("default", "qc", "c"),
                cq("a", cohort="co", flavors={"default": {"cpu": "4"}},
                   preemption={"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Any"}),
                cq("b", cohort="co", flavors={"default": {"cpu": ("2", "2")}}),
                cq("c", cohort="co", flavors={"default": {"cpu": ("2", None, "0")}}))
    return Queues(c)


def at(seconds: float) -> object:
    return NOW + timedelta(seconds=seconds)


SUBMITTED: dict[str, Entry] = {}


def submit(q: Queues, e: Entry, pin: str | None = None) -> None:
    if pin is not None:
        e.placement = api.Placement(pin=frozenset({pin}))
    SUBMITTED[e.uid] = e
    q.add(replace(e))


def run(q: Queues, clusters: list, t: float) -> tuple[list[str], list[tuple[str, str]]]:
    """One pass at ``t``; an evicted Workload goes back to its queue at its old place, as the engine does."""
    r = q.schedule(clusters, now=at(t), timeout=1e9)  # type: ignore[arg-type]
    for v in r.evicted:
        q.add(replace(SUBMITTED[v.uid]))
    return [a.entry.name for a in r.admitted], [(v.uid.removeprefix("uid-"), v.reason) for v in r.evicted]


def full_cohort(q: Queues, clusters: list, pins: dict[str, str] | None = None) -> None:
    """A: a low 2-cpu job; B: a low 2-cpu job within its nominal quota; C: three jobs, borrowing 2.
    ``pins``: ClusterQueue -> the cluster its jobs run on."""
    pins = pins or {}
    submit(q, entry("a-low", need(cpu=2), queue="qa", priority=LOW, at=0), pins.get("a"))
    submit(q, entry("b-low", need(cpu=2), queue="qb", priority=LOW, at=1), pins.get("b"))
    submit(q, entry("c-1", need(cpu=1), queue="qc", priority=MID, at=2), pins.get("c"))
    submit(q, entry("c-2", need(cpu=1), queue="qc", priority=MID, at=3), pins.get("c"))
    assert sorted(run(q, clusters, 4)[0]) == ["a-low", "b-low", "c-1", "c-2"]
    submit(q, entry("c-big", need(cpu=2), queue="qc", priority=LOW, at=5), pins.get("c"))
    assert run(q, clusters, 6)[0] == ["c-big"]   # C borrows 2 of A's unused quota


def test_reclaims_only_the_borrowed_job_of_the_borrowing_queue() -> None:
    """A's and B's jobs run on w1, C's on w2; the clusters have room for everything. A's own low job
    alone on w1 would also make room, but Kueue's order takes from the ClusterQueue that borrows first,
    and one victim is enough; B (within its nominal quota) is never a victim."""
    w = [cluster("w1", node("n", 64)), cluster("w2", node("n", 64))]
    q = cohort()
    full_cohort(q, w, {"a": "w1", "b": "w1", "c": "w2"})
    submit(q, entry("a-high", need(cpu=2), queue="qa", priority=HIGH, at=7))
    admitted, evicted = run(q, w, 8)
    assert evicted == [("c-big", "InCohortReclamation")]
    assert admitted == []                      # it waits for its victim to leave
    assert run(q, w, 9) == (["a-high"], [])
    for t in range(10, 20):                    # nothing arrives, nothing changes: nothing more is evicted
        assert run(q, w, t) == ([], []), t
    assert q.entries["uid-c-big"].step == "quota"   # C must borrow for it, and A's quota is A's again
    assert {"uid-a-low", "uid-b-low", "uid-c-1", "uid-c-2", "uid-a-high"} == set(q.admitted)


def test_a_lower_priority_job_of_the_preemptors_queue_goes_only_after_the_borrowers() -> None:
    """Kueue takes candidates of other ClusterQueues before those of the preemptor's own: with C
    borrowing 2 cpu in two 1-cpu jobs, both go (the most recently admitted first), not A's low job."""
    w = [cluster("w1", node("n", 64)), cluster("w2", node("n", 64))]
    q = cohort()
    arrivals = [("a-low", "qa", 2, LOW, "w1"), ("c-1", "qc", 1, MID, "w2"), ("c-2", "qc", 1, MID, "w2"),
                ("c-3", "qc", 1, MID, "w2"), ("c-4", "qc", 1, MID, "w2"), ("b-1", "qb", 2, LOW, "w1")]
    for t, (name, queue, cpu, prio, pin) in enumerate(arrivals):   # one a second: admitted one by one
        submit(q, entry(name, need(cpu=cpu), queue=queue, priority=prio, at=t), pin)
        assert run(q, w, t)[0] == [name]
    assert set(q.admitted) == {"uid-a-low", "uid-c-1", "uid-c-2", "uid-c-3", "uid-c-4", "uid-b-1"}
    submit(q, entry("a-high", need(cpu=2), queue="qa", priority=HIGH, at=20))
    evicted = run(q, w, 21)[1]
    assert sorted(evicted) == [("c-3", "InCohortReclamation"), ("c-4", "InCohortReclamation")]


def test_the_evicted_borrower_does_not_take_back_the_reclaimed_room() -> None:
    """C's evicted job must borrow to run again; the preemptor fits without borrowing: it goes first, and
    the victim waits (no eviction livelock)."""
    w = [cluster("w", node("n", 64))]
    q = cohort()
    full_cohort(q, w)
    submit(q, entry("a-high", need(cpu=2), queue="qa", priority=HIGH, at=7))
    assert run(q, w, 8)[1] == [("c-big", "InCohortReclamation")]
    admitted, evicted = run(q, w, 9)
    assert admitted == ["a-high"] and evicted == []
    assert q.entries["uid-c-big"].step == "quota"


def one_queue() -> Queues:
    return Queues(catalog(flavor("default"), lq("default", "q", "a"),
                          cq("a", flavors={"default": {"cpu": "4"}}, preemption={"withinClusterQueue": "LowerPriority"})))


def test_among_equal_candidates_the_victim_is_on_the_cluster_where_the_preemptor_runs() -> None:
    """Two low jobs admitted in one pass (equal in Kueue's order), one per cluster; the preemptor may only
    run on w1. Kueue may take either; mkd takes the one on w1, where the room is of use."""
    q = one_queue()
    w = [cluster("w1", node("n", 2)), cluster("w2", node("n", 2))]
    submit(q, entry("x", need(cpu=2), queue="q", priority=LOW, at=0), "w1")
    submit(q, entry("y", need(cpu=2), queue="q", priority=LOW, at=1), "w2")
    assert sorted(run(q, w, 2)[0]) == ["x", "y"]
    submit(q, entry("high", need(cpu=2), queue="q", priority=HIGH, at=3), "w1")
    full = [cluster("w1", node("n", 0)), cluster("w2", node("n", 0))]
    assert run(q, full, 4)[1] == [("x", "InClusterQueue")]      # y, queued later, would be Kueue's tie order
    assert "their room is freed on cluster w1" in q.entries["uid-high"].reason


def test_the_set_is_never_widened_to_free_one_cluster_and_the_preemptor_says_it_waits() -> None:
    """The preemptor needs both low jobs' quota, on two clusters of 2 cpu: Kueue's set is both, and no set
    of them frees room for it on one cluster. mkd takes exactly Kueue's set and the preemptor waits for
    room where it fits, saying so."""
    q = one_queue()
    w = [cluster("w1", node("n", 2)), cluster("w2", node("n", 2))]
    submit(q, entry("x", need(cpu=2), queue="q", priority=LOW, at=0), "w1")
    assert run(q, w, 1)[0] == ["x"]
    submit(q, entry("y", need(cpu=2), queue="q", priority=LOW, at=2), "w2")
    assert run(q, w, 3)[0] == ["y"]
    submit(q, entry("big", need(cpu=4), queue="q", priority=HIGH, at=4))
    full = [cluster("w1", node("n", 0)), cluster("w2", node("n", 0))]
    assert sorted(run(q, full, 5)[1]) == [("x", "InClusterQueue"), ("y", "InClusterQueue")]
    assert "on no single cluster where it fits: it waits for room to be freed where it fits" in \
        q.entries["uid-big"].reason
    assert run(q, w, 6) == ([], [])          # 2 cpu free on each cluster: still no room for 4 on one
    assert "uid-x" not in q.admitted and "uid-y" not in q.admitted   # nothing took the quota it freed
