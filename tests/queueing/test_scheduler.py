"""The scheduling pass: order, quota, strategies, flavors, node fit, starvation, no pending cap."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from dispatcher.placement import choose
from dispatcher.queueing.scheduler import Queues
from tests.queueing.builders import NOW, catalog, cluster, cq, entry, flavor, lq, need, node


def admitted_names(q: Queues, clusters: list, *, at: float = 0.0) -> list[str]:
    result = q.schedule(clusters, now=NOW + timedelta(seconds=at), timeout=10**6)
    return [a.entry.name for a in result.admitted]


def test_same_second_claims_keep_arrival_order_not_uid_order() -> None:
    q = Queues(catalog())  # open mode: no ClusterQueue
    names = [f"job-{i}" for i in range(9, 30)]
    for name in names:
        e = entry(name)
        e.uid = f"{99 - int(name[4:]):02d}-uid"   # uids sort in the opposite order
        q.add(e)
    got = admitted_names(q, [cluster("w", node("n1", 5))])
    assert got == names[:5]


def test_priority_first_then_queue_time() -> None:
    q = Queues(catalog())
    q.add(entry("old-low", at=0))
    q.add(entry("new-high", at=10, priority=100))
    q.add(entry("mid-low", at=5))
    assert admitted_names(q, [cluster("w", node("n1", 10))]) == ["new-high", "old-low", "mid-low"]


def test_no_pending_cap() -> None:
    q = Queues(catalog(), max_attempts_per_pass=100_000)
    for i in range(3000):
        q.add(entry(f"j{i}", need(cpu="100m")))
    got = admitted_names(q, [cluster("w", *[node(f"n{i}", 100) for i in range(4)])])
    assert len(got) == 3000


def test_quota_limits_a_team_and_borrowing_follows_the_cohort() -> None:
    c = catalog(flavor("default"), cq("a", cohort="c", flavors={"default": {"cpu": ("4", "2")}}),
                cq("b", cohort="c", flavors={"default": {"cpu": "4"}}), lq("default", "qa", "a"),
                lq("default", "qb", "b"))
    q = Queues(c)
    for i in range(5):
        q.add(entry(f"a{i}", need(cpu=2), queue="qa"))
    got = admitted_names(q, [cluster("w", node("n1", 100))])
    assert got == ["a0", "a1", "a2"]   # 4 own + 2 borrowed from b
    waiting = q.entries["uid-a3"]
    assert waiting.step == "quota"
    assert waiting.reason == ("couldn't assign flavors to pod set worker: insufficient unused quota for cpu "
                              "in flavor default, 2 more needed")
    # b takes its own quota back as it is released by a (quota frees -> set-aside Workloads return)
    q.add(entry("b0", need(cpu=2), queue="qb"))
    assert admitted_names(q, [cluster("w", node("n1", 100))]) == ["b0"]
    q.release("uid-a0")
    assert admitted_names(q, [cluster("w", node("n1", 100))]) == ["a3"]


def test_strict_fifo_head_blocks_best_effort_skips() -> None:
    for strategy, expected in (("StrictFIFO", []), ("BestEffortFIFO", ["small"])):
        c = catalog(flavor("default"), cq("a", flavors={"default": {"cpu": "4"}}, strategy=strategy),
                    lq("default", "q", "a"))
        q = Queues(c)
        q.add(entry("big", need(cpu=8)))
        q.add(entry("small", need(cpu=1), at=1))
        assert admitted_names(q, [cluster("w", node("n1", 100))]) == expected, strategy


def test_strict_fifo_never_admits_lower_priority_ahead() -> None:
    c = catalog(flavor("default"), cq("a", flavors={"default": {"cpu": "100"}}, strategy="StrictFIFO"),
                lq("default", "q", "a"))
    q = Queues(c)
    q.add(entry("low", need(cpu=1), priority=1))
    q.add(entry("high-big", need(cpu=50), priority=10, at=5))
    assert admitted_names(q, [cluster("w", node("n1", 20))]) == []   # the head fits no cluster: blocks
    assert q.entries["uid-high-big"].step == "placement"


def test_namespace_selector_and_stop_policy_hold_with_reasons() -> None:
    c = catalog(flavor("default"), cq("a", selector={"matchLabels": {"team": "a"}}), lq("x", "q", "a"),
                cq("stopped", stopPolicy="Hold"), lq("default", "q", "stopped"),
                namespaces={"x": {"team": "b"}, "default": {}})
    q = Queues(c)
    q.add(entry("in-x", namespace="x"))
    q.add(entry("in-default"))
    q.add(entry("no-queue", queue="missing"))
    assert admitted_names(q, [cluster("w", node("n1", 10))]) == []
    assert q.entries["uid-in-x"].reason.startswith("ClusterQueue a does not admit namespace x")
    assert q.entries["uid-in-default"].reason == "ClusterQueue stopped is stopped (stopPolicy Hold)"
    assert q.entries["uid-no-queue"].reason == "LocalQueue default/missing does not exist"
    c.apply("ClusterQueue", cq("stopped"))   # stopPolicy None again: the catalog change re-routes
    assert admitted_names(q, [cluster("w", node("n1", 10))]) == ["in-default"]


def test_flavor_order_fungibility_and_node_labels() -> None:
    objs = [flavor("spot", labels={"pool": "spot"}), flavor("on-demand", labels={"pool": "od"}),
            lq("default", "q", "a")]
    w = cluster("w", node("spot-1", 4, {"pool": "spot"}), node("od-1", 16, {"pool": "od"}))
    for policy, expected in (("MayStopSearch", "spot"), ("TryNextFlavor", "on-demand")):
        c = catalog(*objs, cq("a", cohort="c", flavors={"spot": {"cpu": "2"}, "on-demand": {"cpu": "8"}},
                              flavorFungibility={"whenCanBorrow": policy}),
                    cq("lender", cohort="c", flavors={"spot": {"cpu": "8"}, "on-demand": {"cpu": "0"}}))
        q = Queues(c)
        q.add(entry("j", need(cpu=4)))
        result = q.schedule([w], now=NOW, timeout=30)
        assert [a.flavors["worker"]["cpu"] for a in result.admitted] == [expected], policy
        assert result.admitted[0].borrows == (expected == "spot")
        chosen_need = result.admitted[0].need
        assert dict(chosen_need.podsets[0].node_selector) == {"pool": "spot" if expected == "spot" else "od"}


def test_flavor_taints_need_tolerations() -> None:
    c = catalog(flavor("gpu", taints=[{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]),
                flavor("cpu"), cq("a", flavors={"gpu": {"cpu": "8"}, "cpu": {"cpu": "8"}}), lq("default", "q", "a"))
    q = Queues(c)
    q.add(entry("plain", need(cpu=1)))
    q.add(entry("tolerant", need(cpu=1, tolerations=(("gpu", "Equal", "yes", "NoSchedule"),))))
    result = q.schedule([cluster("w", node("n", 10))], now=NOW, timeout=30)
    assert {a.entry.name: a.flavors["worker"]["cpu"] for a in result.admitted} == {"plain": "cpu", "tolerant": "gpu"}


def test_gang_fits_pod_by_pod_not_by_totals() -> None:
    """Two nodes with 12 CPU free each: 24 free in total and 12 on the largest node, yet three 8-CPU pods
    do not fit (one per node). The per-resource check said they did and left a pod Pending."""
    w = cluster("w", node("n1", 12), node("n2", 12))
    decision = choose(need(cpu=8, count=3), [w], now=NOW, timeout=30)
    assert decision.cluster is None
    assert "worker pod 3 of 3 fits on no node" in decision.reason
    assert choose(need(cpu=6, count=4), [w], now=NOW, timeout=30).cluster == "w"


def test_pods_node_selector_is_honoured_on_nodes() -> None:
    w = cluster("w", node("a", 8, {"zone": "a"}), node("b", 8, {"zone": "b"}))
    assert choose(need(cpu=6, count=2, selector={"zone": "a"}), [w], now=NOW, timeout=30).cluster is None
    assert choose(need(cpu=6, count=1, selector={"zone": "b"}), [w], now=NOW, timeout=30).cluster == "w"


def test_pin_and_exclude_per_cluster_queue_and_job() -> None:
    base = [flavor("default"), lq("default", "q", "a")]
    c = catalog(*base, {**cq("a"), "metadata": {"name": "a", "annotations": {"mkd.dev/clusters": "w2,w3"}}})
    q = Queues(c)
    e = entry("j")
    q.add(e)
    clusters = [cluster(n, node("n", 10)) for n in ("w1", "w2", "w3")]
    result = q.schedule(clusters, now=NOW, timeout=30)
    assert [a.cluster for a in result.admitted] == ["w2"]
    c2 = catalog(*base, cq("a"))
    q2 = Queues(c2)
    from dispatcher.queueing.api import placement_of
    e2 = entry("j2")
    e2.placement = placement_of({"mkd.dev/exclude-clusters": "w1,w2"})
    q2.add(e2)
    result = q2.schedule(clusters, now=NOW, timeout=30)
    assert [a.cluster for a in result.admitted] == ["w3"]


def test_small_jobs_do_not_starve_a_large_gang() -> None:
    """A 4 x 15-CPU gang waits on a busy cluster while a stream of 1-CPU jobs keeps arriving after it.
    Without the starvation rule each freed CPU goes to a small job and the gang never fits."""
    q = Queues(catalog(), starvation_seconds=60)
    gang = entry("gang", need(cpu=15, count=4), at=0)
    q.add(gang)
    free = 10                                   # a 64-CPU single-node cluster with 54 busy
    admitted: list[str] = []
    for t in range(0, 600, 10):
        for i in range(4):
            q.add(entry(f"small-{t}-{i}", need(cpu=1), at=t + 1))
        got = admitted_names(q, [cluster("w", node("n", free), allocatable={"cpu": Decimal(64)})], at=t)
        admitted += got
        free -= sum(1 for name in got if name.startswith("small"))
        if "gang" in got:
            assert got[0] == "gang"            # first in its pass: nothing took its room before it
            break
        free += 4                              # running jobs finish: 4 CPU free every 10 s
        q.capacity_changed()
    assert "gang" in admitted
    assert t <= 60 + 140   # starving after 60 s, then the held cluster gathers 4 CPU per 10 s up to 60


def test_without_the_rule_the_gang_starves() -> None:
    q = Queues(catalog(), starvation_seconds=10**9)
    q.add(entry("gang", need(cpu=15, count=4), at=0))
    free = 10
    admitted: list[str] = []
    for t in range(0, 600, 10):
        for i in range(4):
            q.add(entry(f"small-{t}-{i}", need(cpu=1), at=t + 1))
        got = admitted_names(q, [cluster("w", node("n", free), allocatable={"cpu": Decimal(64)})], at=t)
        admitted += got
        free = free - len(got) + 4
        q.capacity_changed()
    assert "gang" not in admitted   # the behaviour the rule exists to prevent


def test_a_resource_no_cluster_offers_is_named() -> None:
    gpu = need(cpu=1, extra={"nvidia.com/gpu": "2"})
    decision = choose(gpu, [cluster("w1", node("n", 8)), cluster("w2", node("n", 8))], now=NOW, timeout=30)
    assert decision.reason == "no cluster offers nvidia.com/gpu at all (checked w1, w2); it needs 2 nvidia.com/gpu"


def _gang_and_smalls(q: Queues, clusters: object, until: int, *, start: int = 0) -> dict[int, list[str]]:
    """Passes every 10 s up to ``until``; a 1-CPU job arrives at each and finishes at once."""
    got: dict[int, list[str]] = {}
    for t in range(start, until, 10):
        q.add(entry(f"small-{t}", need(cpu=1), at=t + 1))
        got[t] = admitted_names(q, clusters() if callable(clusters) else clusters, at=t)  # type: ignore[arg-type]
        q.capacity_changed()
    return got


def test_a_starving_head_that_never_fits_lets_go_of_the_held_cluster() -> None:
    """A 4 x 15-CPU gang on a cluster of eight 8-CPU nodes: 64 CPU in all, never room for one pod. It
    holds the cluster once starving; with no more room after hold_seconds it lets go, says so, and the
    small jobs run there again (before, the cluster stayed held forever)."""
    q = Queues(catalog(), starvation_seconds=60, hold_seconds=60)
    q.add(entry("gang", need(cpu=15, count=4), at=0))

    def w() -> list:
        return [cluster("w", *[node(f"n{i}", 8) for i in range(8)])]
    got = _gang_and_smalls(q, w, 60)
    assert all(got[t] == [f"small-{t}"] for t in range(0, 60, 10))       # not starving yet: they run
    got = _gang_and_smalls(q, w, 120, start=60)
    assert q.holds == {"w": "uid-gang"}                                  # starving at 60: w held
    assert all(got[t] == [] for t in range(60, 120, 10))
    gang = q.entries["uid-gang"]
    assert "holding w for it" in gang.reason
    got = _gang_and_smalls(q, w, 130, start=120)
    assert q.holds == {}
    assert "let go of cluster w, held for it 60s: no more room for it there in 60s" in gang.reason
    assert gang.step == "placement"
    assert got[120] == [f"small-{t}" for t in range(60, 130, 10)]       # the waiting ones run at once
    got = _gang_and_smalls(q, w, 180, start=130)
    assert all(got[t] == [f"small-{t}"] for t in range(130, 180, 10))   # its clock starts over
    assert "let go of cluster w" in gang.reason                          # still saying why it waits
    _gang_and_smalls(q, w, 190, start=180)
    assert q.holds == {"w": "uid-gang"}                                  # and it may hold again


def test_a_hold_is_kept_while_its_room_grows() -> None:
    """Room that keeps growing on the held cluster keeps the hold past hold_seconds (the gang of the
    starvation test needs 125 s of draining; a plain timer would hand its room back to the stream)."""
    q = Queues(catalog(), starvation_seconds=60, hold_seconds=30)
    q.add(entry("gang", need(cpu=15, count=4), at=0))
    free = 10
    for t in range(0, 600, 10):
        q.add(entry(f"small-{t}", need(cpu=1), at=t + 1))
        got = admitted_names(q, [cluster("w", node("n", free), allocatable={"cpu": Decimal(64)})], at=t)
        free -= sum(1 for name in got if name.startswith("small"))
        if "gang" in got:
            break
        free += 4
        q.capacity_changed()
    assert "gang" in got and t <= 60 + 140
    assert "let go" not in q.entries.get("uid-gang", entry("x")).reason


def test_a_head_that_can_never_have_its_quota_does_not_block_its_queue() -> None:
    """8 CPU asked of a ClusterQueue of 4 with no cohort: it can never be admitted; starving, it
    blocked its BestEffortFIFO queue for good before."""
    c = catalog(flavor("default"), lq("default", "q", "a"), cq("a", flavors={"default": {"cpu": "4"}}))
    q = Queues(c, starvation_seconds=60, hold_seconds=60)
    q.add(entry("huge", need(cpu=8), queue="q", at=0))
    for t in range(0, 200, 10):
        q.add(entry(f"small-{t}", need(cpu=1), queue="q", at=t + 1))
        got = admitted_names(q, [cluster("w", node("n", 100))], at=t)
        assert got == [f"small-{t}"], (t, got)
        q.release(f"uid-small-{t}")           # finished: the quota comes back and "huge" is tried again
    assert "insufficient unused quota for cpu in flavor default" in q.entries["uid-huge"].reason


def test_a_head_short_of_quota_lets_go_of_its_queue_when_no_quota_frees() -> None:
    """Two long runners hold 2 of 4 CPU for good; a 3-CPU head starves. It blocks its queue while
    quota frees for it, and lets go once none has freed for hold_seconds."""
    c = catalog(flavor("default"), lq("default", "q", "a"), cq("a", flavors={"default": {"cpu": "4"}}))
    q = Queues(c, starvation_seconds=60, hold_seconds=40)
    w = [cluster("w", node("n", 100))]
    q.add(entry("long-1", need(cpu=1), queue="q", at=-20))
    q.add(entry("long-2", need(cpu=1), queue="q", at=-19))
    assert admitted_names(q, w, at=-10) == ["long-1", "long-2"]
    q.add(entry("mid", need(cpu=3), queue="q", at=0))
    seen: dict[int, list[str]] = {}
    for t in range(0, 200, 10):
        q.add(entry(f"small-{t}", need(cpu=1), queue="q", at=t + 1))
        seen[t] = admitted_names(q, w, at=t)
        for name in seen[t]:
            q.release(f"uid-{name}")
    assert seen[0] == ["small-0"]
    blocked = [t for t, names in seen.items() if not names]
    # starving at 60: its queue turns strict; no quota freed for it for 40 s: let go at 100; its clock
    # starts over, so it blocks again from 160 for at most as long (mid never fits while long-* run)
    assert blocked == [60, 70, 80, 90, 160, 170, 180, 190], blocked
    assert seen[100] == ["small-60", "small-70"]            # the two CPU the long runners leave
    assert "let go of the quota of ClusterQueue a, held for it 40s" in q.entries["uid-mid"].reason
