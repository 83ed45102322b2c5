"""Placement is pure: roomiest fitting cluster, gang and per-node fit, stale heartbeats, and the reasons."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from dispatcher.placement import CapacityBook, ClusterView, Need, choose
from federation import messages

NOW = datetime(2026, 1, 1, tzinfo=UTC)
D = Decimal


def view(name: str, *, cpu: int = 64, free_cpu: int | None = None, gpu: int = 0, free_gpu: int | None = None,
         node_cpu: int | None = None, node_gpu: int | None = None, age: float = 1.0, online: bool = True,
         kinds: frozenset[str] | None = None) -> ClusterView:
    alloc = {"cpu": D(cpu), "memory": D(2**40)}
    free = {"cpu": D(cpu if free_cpu is None else free_cpu), "memory": D(2**40)}
    if gpu:
        alloc["nvidia.com/gpu"] = D(gpu)
        free["nvidia.com/gpu"] = D(gpu if free_gpu is None else free_gpu)
    largest = dict(free)
    if node_cpu is not None:
        largest["cpu"] = D(node_cpu)
    if node_gpu is not None:
        largest["nvidia.com/gpu"] = D(node_gpu)
    return ClusterView(name, online, NOW - timedelta(seconds=age), alloc, free, largest, kinds)


def need(per_pod: dict[str, int], count: int = 2, kind: str = "PyTorchJob") -> Need:
    pod = {k: D(v) for k, v in per_pod.items()} | {"pods": D(1)}
    return Need(kind, {k: v * count for k, v in pod.items()}, (("worker", pod),))


def test_roomiest_cluster_after_placement_wins() -> None:
    clusters = [view("worker-1", free_cpu=10), view("worker-2", free_cpu=40), view("worker-3", free_cpu=30)]
    assert choose(need({"cpu": 4}), clusters, now=NOW, timeout=30).cluster == "worker-2"


def test_the_scarce_resource_decides() -> None:
    # worker-1 has more cpu left, worker-2 more of the GPUs the job asks for
    clusters = [view("worker-1", free_cpu=60, gpu=8, free_gpu=2), view("worker-2", free_cpu=20, gpu=8)]
    assert choose(need({"cpu": 1, "nvidia.com/gpu": 1}), clusters, now=NOW, timeout=30).cluster == "worker-2"


def test_gang_needs_everything_in_one_cluster() -> None:
    clusters = [view("worker-1", gpu=4), view("worker-2", gpu=4)]
    d = choose(need({"cpu": 1, "nvidia.com/gpu": 4}, count=2), clusters, now=NOW, timeout=30)
    assert d.cluster is None
    assert d.reason == "needs 8 nvidia.com/gpu in one cluster; most free: worker-2 has 4"


def test_a_pod_must_fit_one_node() -> None:
    clusters = [view("worker-1", cpu=64, node_cpu=8), view("worker-2", cpu=64, node_cpu=12)]
    d = choose(need({"cpu": 16}, count=2), clusters, now=NOW, timeout=30)
    assert d.cluster is None
    assert d.reason == "a worker pod needs 16 cpu on one node; largest free node: worker-2 has 12"


def test_stale_offline_excluded_and_wrong_kind_are_skipped() -> None:
    n = need({"cpu": 1})
    assert choose(n, [view("w1", age=31)], now=NOW, timeout=30).cluster is None
    assert "no worker cluster is online" in choose(n, [view("w1", age=31)], now=NOW, timeout=30).reason
    assert choose(n, [view("w1", online=False), view("w2", free_cpu=2)], now=NOW, timeout=30).cluster == "w2"
    d = choose(n, [view("w1")], now=NOW, timeout=30, exclude=["w1"])
    assert d.cluster is None and "rejected it before: w1" in d.reason
    d = choose(n, [view("w1", kinds=frozenset({"MPIJob"}))], now=NOW, timeout=30)
    assert d.cluster is None and "runs PyTorchJob" in d.reason
    assert choose(n, [], now=NOW, timeout=30).reason.startswith("no worker cluster is known")


def test_no_cluster_has_all_of_it_at_once() -> None:
    clusters = [view("a", cpu=64, free_cpu=2, gpu=8), view("b", cpu=64, gpu=8, free_gpu=1)]
    d = choose(need({"cpu": 2, "nvidia.com/gpu": 2}), clusters, now=NOW, timeout=30)
    assert d.cluster is None
    assert d.reason == "no cluster has room for all of it at once: a lacks 2 cpu; b lacks 3 nvidia.com/gpu"


def test_capacity_book_subtracts_recent_placements_until_a_later_heartbeat() -> None:
    cap = messages.Capacity(allocatable={"cpu": "10"}, free={"cpu": "10"}, largest_node_free={"cpu": "10"})
    book = CapacityBook(settle_seconds=5)
    book.heartbeat(messages.Heartbeat(cluster="w1", capacity=cap, sent_at=NOW), NOW)
    book.reserve("u1", "w1", {"cpu": D(6)})
    assert book.views()[0].free["cpu"] == 4
    n = need({"cpu": 3})  # 6 in total
    assert choose(n, book.views(), now=NOW, timeout=30).cluster is None
    book.accepted("u1", NOW)
    book.heartbeat(messages.Heartbeat(cluster="w1", capacity=cap, sent_at=NOW + timedelta(seconds=2)), NOW)
    assert book.views()[0].free["cpu"] == 4  # too early: the pods may not show yet
    used = messages.Capacity(allocatable={"cpu": "10"}, free={"cpu": "4"}, largest_node_free={"cpu": "4"})
    book.heartbeat(messages.Heartbeat(cluster="w1", capacity=used, sent_at=NOW + timedelta(seconds=6)), NOW)
    assert book.views()[0].free["cpu"] == 4 and not book.reservations



def test_a_settled_heartbeat_drops_only_its_own_clusters_settled_reservations() -> None:
    cap = messages.Capacity(allocatable={"cpu": "100"}, free={"cpu": "100"}, largest_node_free={"cpu": "100"})
    book = CapacityBook(settle_seconds=5)
    for c in ("w1", "w2"):
        book.heartbeat(messages.Heartbeat(cluster=c, capacity=cap, sent_at=NOW), NOW)
    book.reserve("early", "w1", {"cpu": D(1)})
    book.accepted("early", NOW)
    book.reserve("late", "w1", {"cpu": D(2)})
    book.accepted("late", NOW + timedelta(seconds=3))
    book.reserve("other", "w2", {"cpu": D(4)})
    book.accepted("other", NOW)
    book.reserve("again", "w1", {"cpu": D(8)})
    book.accepted("again", NOW)
    book.reserve("again", "w1", {"cpu": D(8)})  # placed anew (not accepted yet): its old acceptance is void
    book.reserve("gone", "w1", {"cpu": D(16)})
    book.accepted("gone", NOW)
    book.release("gone")
    def free() -> dict[str, D]:
        return {v.name: v.free["cpu"] for v in book.views()}
    assert free() == {"w1": 100 - 1 - 2 - 8, "w2": 100 - 4}  # "again" counted once, "gone" not at all
    book.heartbeat(messages.Heartbeat(cluster="w1", capacity=cap, sent_at=NOW + timedelta(seconds=5)), NOW)
    assert set(book.reservations) == {"late", "other", "again"}
    assert free() == {"w1": 100 - 2 - 8, "w2": 100 - 4}
    book.heartbeat(messages.Heartbeat(cluster="w1", capacity=cap, sent_at=NOW + timedelta(seconds=8)), NOW)
    assert set(book.reservations) == {"other", "again"}
    book.heartbeat(messages.Heartbeat(cluster="w2", capacity=cap, sent_at=NOW + timedelta(seconds=4)), NOW)
    assert set(book.reservations) == {"other", "again"}
    book.heartbeat(messages.Heartbeat(cluster="w2", capacity=cap, sent_at=NOW + timedelta(seconds=5)), NOW)
    assert set(book.reservations) == {"again"}
    assert free() == {"w1": 100 - 8, "w2": 100}
    book.release("again")
    book.reserve("new", "w2", {"cpu": D(3)})
    assert free() == {"w1": 100, "w2": 100 - 3}

def test_a_pending_reason_whose_figures_alone_changed_is_not_rewritten_within_a_minute() -> None:
    from dispatcher.engine.loop import Engine

    old = "needs 8 nvidia.com/gpu in one cluster; most free: worker-1 has 4"
    assert Engine._same_story("needs 8 nvidia.com/gpu in one cluster; most free: worker-1 has 6", old,
                              NOW, NOW + timedelta(seconds=30))
    assert not Engine._same_story("needs 8 nvidia.com/gpu in one cluster; most free: worker-1 has 6", old,
                                  NOW, NOW + timedelta(seconds=61))
    assert not Engine._same_story("needs 8 nvidia.com/gpu in one cluster; most free: worker-2 has 4", old,
                                  NOW, NOW + timedelta(seconds=1))


def test_a_placement_says_why_its_cluster_won() -> None:
    clusters = [view("worker-1", free_cpu=10), view("worker-2", free_cpu=40), view("worker-3", free_cpu=30),
                view("worker-4", free_cpu=2), view("worker-5", age=300)]
    d = choose(need({"cpu": 4}), clusters, now=NOW, timeout=30)
    assert d.cluster == "worker-2"
    # worker-2 keeps (40 - 8) / 64 = 50% of its cpu free; worker-5's heartbeat is stale
    assert d.reason == ("roomiest fit: worker-2 keeps 50% of its scarcest requested resource free; "
                        "also fit: worker-1, worker-3; no room: worker-4 (lacks 6 cpu)")


def test_a_placement_reason_names_a_few_clusters_however_many_there_are() -> None:
    """The reason is kept in the Placement row and an Event: with 1,000 clusters it listed every other one
    that fit (about 7 KB per Workload, written and held for each); it names the first few and counts the rest."""
    clusters = [view(f"c{i:04d}", free_cpu=20 + i % 7) for i in range(1000)]
    clusters += [view(f"full{i:03d}", free_cpu=1) for i in range(50)]
    d = choose(need({"cpu": 4}), clusters, now=NOW, timeout=30)
    assert d.cluster is not None and len(d.reason) < 600, len(d.reason)
    assert "also fit: c0000, c0001, c0002, c0003, c0004 and 994 more" in d.reason
    assert "no room: full000 (lacks 7 cpu), full001 (lacks 7 cpu)" in d.reason and "and 45 more" in d.reason


def test_a_pod_no_node_could_ever_hold_is_told_before_the_clusters_totals() -> None:
    """2 pods x 16 GPUs on clusters of 4-GPU nodes: the first answer said "needs 32 nvidia.com/gpu in one
    cluster; most free: ..." (waiting), where no node could ever hold one pod (never)."""
    from dispatcher.placement import NodeView, PodSetDemand

    def gpu_cluster(name: str, nodes: int, free: int) -> ClusterView:
        c = view(name, gpu=4 * nodes, free_gpu=free, node_gpu=min(4, free))
        c.nodes = [NodeView(f"{name}-n{i}", {}, (), {"cpu": D(32), "nvidia.com/gpu": D(min(4, free))},
                            {"cpu": D(32), "nvidia.com/gpu": D(4)}) for i in range(nodes)]
        return c

    pod = {"cpu": D(1), "nvidia.com/gpu": D(16)}
    huge = Need("PyTorchJob", {"cpu": D(2), "nvidia.com/gpu": D(32)}, (("master", pod),),
                (PodSetDemand("master", 2, pod),))
    d = choose(huge, [gpu_cluster("worker-3", 2, 6), gpu_cluster("worker-4", 1, 4)], now=NOW, timeout=30)
    assert d.cluster is None
    assert d.reason == ("can never run here: a master pod needs 16 nvidia.com/gpu on one node; no node has that "
                        "much (largest: worker-4's, 4)")
    # nodes that could hold a pod once free: waiting, per pod on the nodes, still before the totals
    small = Need("PyTorchJob", {"cpu": D(2), "nvidia.com/gpu": D(8)}, (("master", {"cpu": D(1),
                 "nvidia.com/gpu": D(4)}),), (PodSetDemand("master", 2, {"cpu": D(1), "nvidia.com/gpu": D(4)}),))
    d = choose(small, [gpu_cluster("worker-3", 2, 3)], now=NOW, timeout=30)
    assert d.cluster is None and not d.reason.startswith("can never"), d.reason


def test_heartbeat_quantities_are_parsed_once_per_text_in_a_bounded_memo() -> None:
    from dispatcher import placement

    placement._quantities.clear()
    assert placement._parse({"cpu": "64", "memory": "256Gi", "bad": "lots"}, "free") == \
        {"cpu": D(64), "memory": D(256 * 2**30)}
    assert set(placement._quantities) == {"64", "256Gi"}  # a bad figure is skipped, never remembered
    for i in range(placement.QUANTITY_MEMO_SIZE + 10):
        assert placement._parse({"cpu": f"{i}m"}, "free") == {"cpu": D(i) / 1000}
    assert len(placement._quantities) <= placement.QUANTITY_MEMO_SIZE
