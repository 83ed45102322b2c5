"""Preemption: the three policies, minimal victim sets, victims on one cluster."""

from __future__ import annotations

from dispatcher.queueing.scheduler import Queues
from tests.queueing.builders import NOW, catalog, cluster, cq, entry, flavor, lq, need, node


def run(q: Queues, clusters: list) -> tuple[list[str], list[tuple[str, str]]]:
    r = q.schedule(clusters, now=NOW, timeout=30)
    return [a.entry.name for a in r.admitted], [(v.uid, v.reason) for v in r.evicted]


W = [cluster("w", node("n", 100))]


def test_within_cluster_queue_lower_priority_evicts_the_most_recent_lower_one_only() -> None:
    c = catalog(flavor("default"), lq("default", "q", "a"),
                cq("a", flavors={"default": {"cpu": "4"}}, preemption={"withinClusterQueue": "LowerPriority"}))
    q = Queues(c)
    q.add(entry("low-old", need(cpu=2), priority=1, at=0))
    q.add(entry("low-new", need(cpu=2), priority=1, at=1))
    assert run(q, W)[0] == ["low-old", "low-new"]
    q.add(entry("high", need(cpu=2), priority=10, at=2))
    q.add(entry("same", need(cpu=2), priority=1, at=3))
    admitted, evicted = run(q, W)
    assert evicted == [("uid-low-new", "InClusterQueue")]   # one is enough; the most recently admitted
    assert admitted == []                                    # the victim's pods still run this pass
    assert run(q, W)[0] == ["high"]
    assert run(q, W) == ([], [])                             # equal priority never preempts under LowerPriority
    assert q.entries["uid-same"].step == "quota"


def test_never_preempts_by_default() -> None:
    c = catalog(flavor("default"), lq("default", "q", "a"), cq("a", flavors={"default": {"cpu": "2"}}))
    q = Queues(c)
    q.add(entry("low", need(cpu=2), priority=1))
    run(q, W)
    q.add(entry("high", need(cpu=2), priority=10, at=1))
    assert run(q, W) == ([], [])


def test_reclaim_within_cohort_takes_back_lent_quota() -> None:
    c = catalog(flavor("default"), lq("default", "qa", "a"), lq("default", "qb", "b"),
                cq("a", cohort="c", flavors={"default": {"cpu": "4"}}, preemption={"reclaimWithinCohort": "Any"}),
                cq("b", cohort="c", flavors={"default": {"cpu": "0"}}))
    q = Queues(c)
    q.add(entry("b1", need(cpu=2), queue="qb", priority=100))
    q.add(entry("b2", need(cpu=2), queue="qb", priority=100, at=1))
    assert run(q, W)[0] == ["b1", "b2"]                      # b borrows all of a's quota
    q.add(entry("a1", need(cpu=3), queue="qa", priority=0, at=2))
    admitted, evicted = run(q, W)
    assert admitted == []
    assert sorted(evicted) == [("uid-b1", "InCohortReclamation"), ("uid-b2", "InCohortReclamation")]
    assert run(q, W)[0] == ["a1"]


def test_victims_on_one_cluster_are_preferred() -> None:
    c = catalog(flavor("default"), lq("default", "q", "a"),
                cq("a", flavors={"default": {"cpu": "4"}}, preemption={"withinClusterQueue": "LowerPriority"}))
    q = Queues(c)
    q.add(entry("w1-small", need(cpu=1), priority=1, at=0))
    q.add(entry("w2-big", need(cpu=2), priority=1, at=1))
    q.add(entry("w1-small-2", need(cpu=1), priority=1, at=2))
    one, two = cluster("w1", node("n", 2)), cluster("w2", node("n", 2))
    r = q.schedule([one, two], now=NOW, timeout=30)
    where = {a.entry.name: a.cluster for a in r.admitted}
    assert where == {"w1-small": "w1", "w2-big": "w2", "w1-small-2": "w1"}
    q.add(entry("high", need(cpu=2), priority=10, at=3))
    r = q.schedule([cluster("w1", node("n", 0)), cluster("w2", node("n", 0))], now=NOW, timeout=30)
    assert [v.uid for v in r.evicted] == ["uid-w2-big"]      # one victim on one cluster, not two on w1
