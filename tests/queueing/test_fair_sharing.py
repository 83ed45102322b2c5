"""Fair sharing (a setting, off by default): the lower weighted dominant share is admitted first."""

from __future__ import annotations

from dispatcher.queueing.scheduler import Queues
from tests.queueing.builders import NOW, catalog, cluster, cq, entry, flavor, lq, need, node


def admitted_per_queue(fair: bool, weight_b: str | None = None) -> dict[str, int]:
    b_extra = {"fairSharing": {"weight": weight_b}} if weight_b is not None else {}
    c = catalog(flavor("default"), lq("default", "qa", "a"), lq("default", "qb", "b"),
                cq("lender", cohort="c", flavors={"default": {"cpu": "12"}}),
                cq("a", cohort="c", flavors={"default": {"cpu": "0"}}),
                cq("b", cohort="c", flavors={"default": {"cpu": "0"}}, **b_extra))
    q = Queues(c, fair_sharing=fair)
    for i in range(12):
        q.add(entry(f"a{i}", need(cpu=1), queue="qa", at=i))          # a's all queued before b's
    for i in range(12):
        q.add(entry(f"b{i}", need(cpu=1), queue="qb", at=100 + i))
    r = q.schedule([cluster("w", node("n", 100))], now=NOW, timeout=30)
    out = {"a": 0, "b": 0}
    for a in r.admitted:
        out[a.entry.cq or ""] += 1
    return out


def test_off_by_default_the_earlier_queue_takes_the_cohort() -> None:
    assert admitted_per_queue(False) == {"a": 12, "b": 0}


def test_equal_weights_share_equally_and_weights_tilt_it() -> None:
    assert admitted_per_queue(True) == {"a": 6, "b": 6}
    assert admitted_per_queue(True, weight_b="3") == {"a": 3, "b": 9}
    assert admitted_per_queue(True, weight_b="0") == {"a": 12, "b": 0}   # weight 0: only what nobody wants
