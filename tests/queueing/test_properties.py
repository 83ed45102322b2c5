"""Property tests over random queues, cohorts and job streams (hypothesis).

- quota and borrowing limits are never exceeded, at every ClusterQueue and cohort;
- in a StrictFIFO queue no Workload is admitted while a higher-priority one of that queue waits;
- every admissible Workload is eventually admitted once running ones finish.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatcher.queueing.quota import ZERO
from dispatcher.queueing.scheduler import Queues
from tests.queueing.builders import NOW, catalog, cluster, cq, entry, flavor, lq, need, node

CPU = ("default", "cpu")


@st.composite
def setups(draw: st.DrawFn) -> tuple[list[dict], list[tuple[str, int, int, int]]]:
    n_cq = draw(st.integers(1, 4))
    objs: list[dict] = [flavor("default")]
    for i in range(n_cq):
        nominal = draw(st.integers(0, 8))
        borrow = draw(st.one_of(st.none(), st.integers(0, 6)))
        lend = draw(st.one_of(st.none(), st.integers(0, nominal)))
        cohort = draw(st.sampled_from(["c1", "c2", None]))
        strategy = draw(st.sampled_from(["StrictFIFO", "BestEffortFIFO"]))
        objs.append(cq(f"q{i}", cohort=cohort, strategy=strategy,
                       flavors={"default": {"cpu": (str(nominal), str(borrow) if cohort and borrow is not None
                                                    else None, str(lend) if cohort and lend is not None else None)}}))
        objs.append(lq("default", f"lq{i}", f"q{i}"))
    jobs = draw(st.lists(st.tuples(st.integers(0, n_cq - 1), st.integers(1, 4), st.integers(0, 2), st.integers(1, 2)),
                         min_size=1, max_size=25))
    return objs, jobs  # (queue, cpu per pod, priority, pods)


def _check_limits(q: Queues) -> None:
    tree = q.tree
    for name, qn in tree.queues.items():
        used = qn.usage.get(CPU, ZERO)
        nominal = qn.nominal.get(CPU, ZERO)
        limit = qn.borrowing_limit.get(CPU)
        assert used >= ZERO, name
        if qn.parent is None:
            assert used <= nominal, name            # no cohort: never above its own quota
        elif limit is not None:
            assert used <= nominal + limit, name    # never above nominal + borrowingLimit
    for name, cn in tree.cohorts.items():
        if cn.parent is None:                        # a cohort never lends more than its members lend
            assert cn.usage.get(CPU, ZERO) <= cn.subtree.get(CPU, ZERO), name


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setups())
def test_limits_hold_strict_order_holds_and_everything_admissible_runs(setup: tuple[list[dict], list]) -> None:
    objs, jobs = setup
    c = catalog(*objs)
    q = Queues(c)
    entries = []
    for n, (qi, cpu, prio, pods) in enumerate(jobs):
        e = entry(f"j{n}", need(cpu=cpu, count=pods), queue=f"lq{qi}", priority=prio, at=n)
        entries.append(e)
        q.add(e)
    w = [cluster("w", *[node(f"n{i}", 8) for i in range(20)])]
    admitted: list[str] = []
    idle = 0
    while q.entries and idle < 2:  # stop when a pass after everything finished admits nothing
        result = q.schedule(w, now=NOW, timeout=30)
        idle = 0 if result.admitted else idle + 1
        _check_limits(q)
        for a in result.admitted:
            spec = c.cluster_queues[a.entry.cq or ""]
            if spec.strategy == "StrictFIFO":
                waiting = [e for e in q.entries.values() if e.cq == a.entry.cq]
                assert all(e.priority <= a.entry.priority for e in waiting), "lower priority admitted first"
        admitted += [a.entry.uid for a in result.admitted]
        if not result.admitted:
            # everything running finishes: quota and room come back
            for uid in list(q.admitted):
                q.release(uid)
            w = [cluster("w", *[node(f"n{i}", 8) for i in range(20)])]
            q.capacity_changed()
    # admissible: fits its ClusterQueue's quota (with what the cohort could lend) when alone, and in a
    # StrictFIFO queue so does every Workload ahead of it (a head that never fits blocks, as in Kueue)
    def fits_alone(e: object) -> bool:
        alone = Queues(catalog(*objs))
        alone.add(entry("alone", e.need, queue=e.queue, priority=e.priority))  # type: ignore[attr-defined]
        return bool(alone.schedule([cluster("w", *[node(f"n{i}", 8) for i in range(20)])], now=NOW,
                                   timeout=30).admitted)
    for e in entries:
        spec = c.cluster_queues[e.cq or ""] if e.cq else None
        if spec is None or not fits_alone(e):
            continue
        if spec.strategy == "StrictFIFO" and not all(fits_alone(o) for o in entries
                                                     if o.cq == e.cq and o.key() < e.key()):
            continue
        assert e.uid in admitted, f"{e.name} was admissible and never admitted"
    assert len(set(admitted)) == len(admitted)


# --- fair sharing's preemption (fair_sharing on) ---------------------------------------------------------


@st.composite
def fair_setups(draw: st.DrawFn) -> tuple[list[dict], list[tuple[str, int, int]], tuple[str, ...]]:
    from dispatcher.queueing.fairshare import ALLOWED

    n_cq = draw(st.integers(2, 4))
    objs: list[dict] = [flavor("default"), cq("lender", cohort="c", flavors={"default": {"cpu": str(draw(
        st.integers(4, 12)))}})]
    for i in range(n_cq):
        nominal = draw(st.integers(0, 4))
        weight = draw(st.sampled_from(["1", "1", "2", "0"]))
        pre = {"reclaimWithinCohort": draw(st.sampled_from(["Any", "LowerPriority", "Never"])),
               "withinClusterQueue": draw(st.sampled_from(["Never", "LowerPriority"]))}
        objs.append(cq(f"q{i}", cohort="c", flavors={"default": {"cpu": str(nominal)}}, preemption=pre,
                       fairSharing={"weight": weight}))
        objs.append(lq("default", f"lq{i}", f"q{i}"))
    jobs = draw(st.lists(st.tuples(st.integers(0, n_cq - 1), st.integers(1, 4), st.integers(0, 2)),
                         min_size=1, max_size=30))
    return objs, jobs, draw(st.sampled_from(ALLOWED))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fair_setups())
def test_fair_preemption_keeps_limits_and_comes_to_rest(setup: tuple[list[dict], list, tuple[str, ...]]) -> None:
    """Jobs arrive in two waves and nothing finishes: every pass keeps quota limits, and the passes come
    to rest (no pair of ClusterQueues preempts each other back and forth); every eviction for fair
    sharing took quota from a ClusterQueue above its nominal quota at some point of the pass, and
    never a Workload admitted in the same pass."""
    objs, jobs, strategies = setup
    c = catalog(*objs)
    q = Queues(c, fair_sharing=True, preemption_strategies=strategies)
    w = [cluster("w", *[node(f"n{i}", 8) for i in range(20)])]
    half = len(jobs) // 2
    for wi, wave in enumerate((jobs[:half], jobs[half:])):
        for n, (qi, cpu, prio) in enumerate(wave):
            q.add(entry(f"w{wi}-{n}", need(cpu=cpu), queue=f"lq{qi}", priority=prio, at=wi * 100 + n))
        for _ in range(200):
            before = {name: (node.usage.get(CPU, ZERO), node.nominal.get(CPU, ZERO))
                      for name, node in q.tree.queues.items()}
            holder = {uid: a.cq for uid, a in q.admitted.items()}
            result = q.schedule(w, now=NOW, timeout=30)
            _check_limits(q)
            gained: dict[str, object] = {}
            for a in result.admitted:
                gained[a.entry.cq or ""] = gained.get(a.entry.cq or "", ZERO) + a.usage.get(CPU, ZERO)  # type: ignore
            for v in result.evicted:
                assert v.uid in holder, f"{v.uid} admitted and evicted in one pass"
                if v.reason == "InCohortFairSharing":
                    used, nominal = before[holder[v.uid]]
                    most = used + gained.get(holder[v.uid], ZERO)  # type: ignore[operator]
                    assert most > nominal, f"{v.uid} taken from {holder[v.uid]}, which was not borrowing"
            if not result.admitted and not result.evicted:
                break
        else:
            raise AssertionError("fair-sharing preemptions never came to rest")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(2, 4), st.integers(4, 16), st.sampled_from([("LessThanOrEqualToFinalShare",),
                                                               ("LessThanOrEqualToFinalShare", "LessThanInitialShare")]),
       st.lists(st.integers(0, 3), min_size=1, max_size=4))
def test_fair_preemption_evens_out_equal_weights(n_cq: int, lendable: int, strategies: tuple[str, ...],
                                                 first: list[int]) -> None:
    """Queues with no quota of their own, equal weights, unit jobs and more demand than the cohort
    holds: whoever came first, at rest no queue holds two more than another."""
    objs: list[dict] = [flavor("default"), cq("lender", cohort="c", flavors={"default": {"cpu": str(lendable)}})]
    for i in range(n_cq):
        objs += [cq(f"q{i}", cohort="c", flavors={"default": {"cpu": "0"}}, preemption={"reclaimWithinCohort": "Any"}),
                 lq("default", f"lq{i}", f"q{i}")]
    q = Queues(catalog(*objs), fair_sharing=True, preemption_strategies=strategies)
    w = [cluster("w", *[node(f"n{i}", 8) for i in range(20)])]
    order = [i % n_cq for i in first] + list(range(n_cq))   # some queues get there first
    for n, qi in enumerate(order):
        for k in range(lendable):
            q.add(entry(f"q{qi}-{n}-{k}", need(cpu=1), queue=f"lq{qi}", at=n * 100 + k))
        for _ in range(200):
            r = q.schedule(w, now=NOW, timeout=30)
            if not r.admitted and not r.evicted:
                break
        else:
            raise AssertionError("never came to rest")
    held = [sum(1 for a in q.admitted.values() if a.cq == f"q{i}") for i in range(n_cq)]
    assert sum(held) == lendable and max(held) - min(held) <= 1, held
