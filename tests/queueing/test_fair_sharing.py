"""Fair sharing (a setting, off by default): the lower weighted dominant share is admitted first.

As in Kueue, each round tries one head per ClusterQueue, and several of them may borrow in one round
as long as the cohort has the room; the order only matters when it has room for fewer than all.
"""

from __future__ import annotations

from dispatcher.queueing.scheduler import Queues
from tests.queueing.builders import NOW, catalog, cluster, cq, entry, flavor, lq, need, node

W = [cluster("w", node("n", 100))]


def cohort(fair: bool, lender: str, weight_b: str | None = None) -> Queues:
    b_extra = {"fairSharing": {"weight": weight_b}} if weight_b is not None else {}
    c = catalog(flavor("default"), lq("default", "qa", "a"), lq("default", "qb", "b"),
                cq("lender", cohort="c", flavors={"default": {"cpu": lender}}),
                cq("a", cohort="c", flavors={"default": {"cpu": "0"}}),
                cq("b", cohort="c", flavors={"default": {"cpu": "0"}}, **b_extra))
    return Queues(c, fair_sharing=fair)


def per_queue(q: Queues) -> dict[str, int]:
    out = {"a": 0, "b": 0}
    for a in q.admitted.values():
        out[a.cq] += 1
    return out


def test_heads_of_both_queues_borrow_in_one_pass_while_the_cohort_has_room() -> None:
    for fair in (False, True):
        q = cohort(fair, "12")
        for i in range(12):
            q.add(entry(f"a{i}", need(cpu=1), queue="qa", at=i))          # a's all queued before b's
        for i in range(12):
            q.add(entry(f"b{i}", need(cpu=1), queue="qb", at=100 + i))
        q.schedule(W, now=NOW, timeout=30)
        assert per_queue(q) == {"a": 6, "b": 6}, fair


def contended(fair: bool, weight_b: str | None = None) -> str:
    """a already borrows 3 of the lender's 4 cpu; a's and b's next Workloads want the last one."""
    q = cohort(fair, "4", weight_b)
    for i in range(3):
        q.add(entry(f"a{i}", need(cpu=1), queue="qa", at=i))
    q.schedule(W, now=NOW, timeout=30)
    q.add(entry("a-next", need(cpu=1), queue="qa", at=10))
    q.add(entry("b-next", need(cpu=1), queue="qb", at=11))
    r = q.schedule(W, now=NOW, timeout=30)
    assert len(r.admitted) == 1
    return r.admitted[0].entry.name


def test_off_the_earlier_workload_takes_the_last_room() -> None:
    assert contended(False) == "a-next"


def test_on_the_queue_with_the_lower_share_takes_it_and_weight_zero_only_takes_what_nobody_wants() -> None:
    assert contended(True) == "b-next"
    assert contended(True, weight_b="3") == "b-next"
    assert contended(True, weight_b="0") == "a-next"
