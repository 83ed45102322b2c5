"""Fair sharing's preemption strategies (``LessThanOrEqualToFinalShare``, ``LessThanInitialShare``).

With ``fair_sharing`` on, a ClusterQueue below its fair share takes back borrowed quota from the one
above it, until the shares are even (weights tilt them); a rule that would make the preemptor the
more unfair one refuses, so two queues never preempt each other back and forth. Off, the classic
policies apply: a queue with no nominal quota never preempts to borrow.
"""

from __future__ import annotations

import pytest

from dispatcher.queueing import fairshare
from dispatcher.queueing.quota import QuotaTree
from dispatcher.queueing.scheduler import Queues
from tests.queueing.builders import NOW, catalog, cluster, cq, entry, flavor, lq, need, node

W = [cluster("w", node("n", 1000))]
RECLAIM = {"reclaimWithinCohort": "Any"}


def cohort(weight_b: str | None = None, lender: str = "12") -> list[dict]:
    b_extra = {"fairSharing": {"weight": weight_b}} if weight_b is not None else {}
    return [flavor("default"), lq("default", "qa", "a"), lq("default", "qb", "b"),
            cq("lender", cohort="c", flavors={"default": {"cpu": lender}}),
            cq("a", cohort="c", flavors={"default": {"cpu": "0"}}, preemption=RECLAIM),
            cq("b", cohort="c", flavors={"default": {"cpu": "0"}}, preemption=RECLAIM, **b_extra)]


def settle(q: Queues, passes: int = 60) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Passes until one admits and evicts nothing; every Workload keeps running (nothing finishes)."""
    evicted: list[tuple[str, str]] = []
    for _ in range(passes):
        r = q.schedule(W, now=NOW, timeout=30)
        evicted += [(v.uid, v.reason) for v in r.evicted]
        if not r.admitted and not r.evicted:
            break
    else:
        pytest.fail("preemptions never stopped")
    held = {"a": 0, "b": 0}
    for a in q.admitted.values():
        held[a.cq] = held.get(a.cq, 0) + 1
    return held, evicted


def fill_a_then_b(q: Queues, n: int = 12, cpu: int = 1) -> None:
    for i in range(n):
        q.add(entry(f"a{i}", need(cpu=cpu), queue="qa", at=i))
    q.schedule(W, now=NOW, timeout=30)
    for i in range(n):
        q.add(entry(f"b{i}", need(cpu=cpu), queue="qb", at=100 + i))


def test_off_the_queue_that_came_first_keeps_the_cohort() -> None:
    q = Queues(catalog(*cohort()), fair_sharing=False)
    fill_a_then_b(q)
    held, evicted = settle(q)
    assert held == {"a": 12, "b": 0} and evicted == []


def test_on_the_late_queue_preempts_until_the_shares_are_even() -> None:
    q = Queues(catalog(*cohort()), fair_sharing=True)
    fill_a_then_b(q)
    held, evicted = settle(q)
    assert held == {"a": 6, "b": 6}
    assert len(evicted) == 6 and {reason for _, reason in evicted} == {"InCohortFairSharing"}
    assert {uid for uid, _ in evicted} == {f"uid-a{i}" for i in range(6, 12)}  # the most recently admitted


def test_the_message_names_the_preemptor_and_fair_sharing() -> None:
    q = Queues(catalog(*cohort()), fair_sharing=True)
    fill_a_then_b(q, n=2, cpu=6)
    r = q.schedule(W, now=NOW, timeout=30)
    assert [v.reason for v in r.evicted] == ["InCohortFairSharing"]
    assert r.evicted[0].message.startswith("Preempted to accommodate a workload (default/b0, UID: uid-b0)")
    assert r.evicted[0].message.endswith("due to Fair Sharing within the cohort")


def test_weights_tilt_the_even_point() -> None:
    q = Queues(catalog(*cohort(weight_b="2")), fair_sharing=True)
    fill_a_then_b(q)
    assert settle(q)[0] == {"a": 4, "b": 8}


def test_weight_zero_never_preempts_to_borrow() -> None:
    q = Queues(catalog(*cohort(weight_b="0")), fair_sharing=True)
    fill_a_then_b(q)
    assert settle(q)[0] == {"a": 12, "b": 0}


@pytest.mark.parametrize("strategies,preempts", [
    (("LessThanOrEqualToFinalShare",), False),           # b at 4/12 is above a's 0/12 once a's 10 go
    (("LessThanInitialShare",), True),                   # b at 4/12 is below a's 10/12 now
    (("LessThanOrEqualToFinalShare", "LessThanInitialShare"), True),  # the second rule after the first
])
def test_a_big_workload_is_preempted_only_by_less_than_initial_share(strategies: tuple[str, ...],
                                                                     preempts: bool) -> None:
    q = Queues(catalog(*cohort()), fair_sharing=True, preemption_strategies=strategies)
    q.add(entry("a-big", need(cpu=10), queue="qa"))
    assert [a.entry.name for a in q.schedule(W, now=NOW, timeout=30).admitted] == ["a-big"]
    q.add(entry("b-small", need(cpu=4), queue="qb", at=1))
    r = q.schedule(W, now=NOW, timeout=30)
    assert [(v.uid, v.reason) for v in r.evicted] == ([("uid-a-big", "InCohortFairSharing")] if preempts else [])
    if preempts:
        assert [a.entry.name for a in q.schedule(W, now=NOW, timeout=30).admitted] == ["b-small"]
        # and a-big, back in a's queue, does not preempt b-small back: a's share would be 10/12 > 0
        held, evicted = settle(q)
        assert evicted == [] and held == {"a": 0, "b": 1}


def test_a_queue_within_its_nominal_quota_reclaims_with_fair_sharing_too() -> None:
    objs = [flavor("default"), lq("default", "qa", "a"), lq("default", "qb", "b"),
            cq("a", cohort="c", flavors={"default": {"cpu": "6"}}, preemption=RECLAIM),
            cq("b", cohort="c", flavors={"default": {"cpu": "6"}}, preemption=RECLAIM)]
    q = Queues(catalog(*objs), fair_sharing=True)
    fill_a_then_b(q)   # a borrows all of b's 6
    held, evicted = settle(q)
    assert held == {"a": 6, "b": 6} and len(evicted) == 6


def test_within_cluster_queue_priority_still_applies() -> None:
    objs = [flavor("default"), lq("default", "q", "a"),
            cq("a", cohort="c", flavors={"default": {"cpu": "4"}}, preemption={"withinClusterQueue": "LowerPriority"})]
    q = Queues(catalog(*objs), fair_sharing=True)
    q.add(entry("low", need(cpu=4), queue="q", priority=1))
    q.schedule(W, now=NOW, timeout=30)
    q.add(entry("high", need(cpu=4), queue="q", priority=10, at=1))
    r = q.schedule(W, now=NOW, timeout=30)
    assert [(v.uid, v.reason) for v in r.evicted] == [("uid-low", "InClusterQueue")]


def test_nested_cohorts_compare_the_subtrees_under_the_common_ancestor() -> None:
    """a1, a2 under cohort A, b under cohort B, A and B under root (which has the quota): B's queue
    compares cohort A (not a1) with itself, so it takes from the more unfair subtree."""
    objs = [flavor("default"), lq("default", "qa1", "a1"), lq("default", "qa2", "a2"), lq("default", "qb", "b"),
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Cohort", "metadata": {"name": "root"},
             "spec": {"resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
                 {"name": "default", "resources": [{"name": "cpu", "nominalQuota": "12"}]}]}]}},
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Cohort", "metadata": {"name": "A"},
             "spec": {"parentName": "root"}},
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Cohort", "metadata": {"name": "B"},
             "spec": {"parentName": "root"}},
            cq("a1", cohort="A", flavors={"default": {"cpu": "0"}}, preemption=RECLAIM),
            cq("a2", cohort="A", flavors={"default": {"cpu": "0"}}, preemption=RECLAIM),
            cq("b", cohort="B", flavors={"default": {"cpu": "0"}}, preemption=RECLAIM)]
    q = Queues(catalog(*objs), fair_sharing=True)
    for i in range(6):
        q.add(entry(f"x{i}", need(cpu=1), queue="qa1", at=i))
        q.add(entry(f"y{i}", need(cpu=1), queue="qa2", at=i))
    q.schedule(W, now=NOW, timeout=30)
    for i in range(12):
        q.add(entry(f"b{i}", need(cpu=1), queue="qb", at=100 + i))
    settle(q)
    per_cq = {"a1": 0, "a2": 0, "b": 0}
    for a in q.admitted.values():
        per_cq[a.cq] += 1
    assert per_cq["b"] == 6 and per_cq["a1"] + per_cq["a2"] == 6   # the two subtrees even
    assert abs(per_cq["a1"] - per_cq["a2"]) <= 1                  # taken from the higher one each time


def test_shares_and_almost_lcas() -> None:
    c = catalog(*cohort())
    tree = QuotaTree(c)
    shares = fairshare.Shares(tree, c)
    tree.add("a", {("default", "cpu"): __import__("decimal").Decimal(3)})
    assert shares.of(tree.queues["a"]) == __import__("decimal").Decimal(3) / 12
    assert shares.of(tree.queues["lender"]) == 0
    x, y = fairshare.almost_lcas(tree.queues["a"], tree.queues["b"])
    assert (x.name, y.name) == ("a", "b")


def test_only_the_lists_kueue_accepts() -> None:
    with pytest.raises(ValueError, match="preemption strategies"):
        Queues(catalog(*cohort()), preemption_strategies=("LessThanInitialShare", "LessThanOrEqualToFinalShare"))


def test_the_setting_refuses_an_order_kueue_refuses_naming_the_field() -> None:
    from pydantic import ValidationError

    from dispatcher.settings import DispatcherSettings

    ok = DispatcherSettings(database_url="sqlite+aiosqlite://", fair_sharing={"enable": True})  # type: ignore[arg-type]
    assert ok.fair_sharing.preemption_strategies == ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]
    with pytest.raises(ValidationError, match=r"fair_sharing\.preemption_strategies"):
        DispatcherSettings(database_url="sqlite+aiosqlite://",  # type: ignore[arg-type]
                           fair_sharing={"preemption_strategies": ["LessThanInitialShare", "LessThanOrEqualToFinalShare"]})
