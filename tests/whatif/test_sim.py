"""The what-if simulator replays a trace through the dispatcher's scheduler and placement on a virtual clock."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from dispatcher.queueing.scheduler import Queues
from dispatcher.whatif import config, report, sim, trace
from tests.whatif.builders import cluster, demo_config, job, jobs


def demo_trace() -> list[trace.TraceJob]:
    """The demo's four Jobs: team-b borrows 2 CPU, then team-a's high needs a CPU its low Jobs hold."""
    return jobs(job("borrower", "team-b", 0, 20, ("master", 1, "1"), ("worker", 2, "1"), priority_class="low"),
                job("low-1", "team-a", 0, 20, ("master", 1, "1"), priority_class="low"),
                job("low-2", "team-a", 0, 20, ("master", 1, "1"), priority_class="low"),
                job("high", "team-a", 5, 20, ("master", 1, "1"), priority_class="high"))


def test_demo_borrows_preempts_and_requeues_the_victim_at_its_old_place() -> None:
    run = sim.simulate(demo_trace(), demo_config(cluster("w1", 2, "4")))
    first = [k for t, k, _ in run.admissions if t == 0]
    assert sorted(first) == ["team-a/low-1", "team-a/low-2", "team-b/borrower"]
    # team-a: 4 CPU nominal, 2 used, 2 lent to team-b; high needs 1 more and takes it from one of its own
    # lower-priority Jobs (withinClusterQueue LowerPriority)
    assert [(p.preemptor, p.reason) for p in run.preemptions] == [("team-a/high", "InClusterQueue")]
    victim = run.preemptions[0].victim
    assert victim in ("team-a/low-1", "team-a/low-2")
    assert run.preemptions[0].at == 5
    high = run.jobs["team-a/high"]
    assert high.first_start == 6   # the pass after the eviction (pass_seconds)
    v = run.jobs[victim]
    assert v.evictions == 1 and len(v.clusters) == 2
    # it ran 5 s, was evicted, and runs its whole 20 s again once quota frees (the borrower ends at 20)
    assert v.end is not None and v.end >= 20 + 20
    assert all(j.end is not None for j in run.jobs.values())
    rep = report.summarize(run)
    assert rep["clusterQueues"]["team-b"]["borrowed"]["cpu"]["peak"] == "2"
    assert rep["preemptions"]["byPair"] == [{"preemptorClusterQueue": "team-a", "victimClusterQueue": "team-a",
                                             "reason": "InClusterQueue", "count": 1}]
    assert rep["neverRan"] == []
    over = rep["overTime"]
    assert len(over["seconds"]) == len(over["pendingByLocalQueue"]["team-a/team-a"]) >= 3
    assert max(p.get("cpu", "0") for p in over["borrowedByClusterQueue"]["team-b"]) == "2"
    assert max(over["fairShareByClusterQueue"]["team-b"]) > 0


def test_gang_needs_every_pod_on_the_nodes_at_once() -> None:
    """Two pods of 3 CPU do not fit two 4-CPU nodes that already run a 2-CPU pod each, though 4 CPU are free."""
    cfg = demo_config(cluster("small", 2, "4"), cluster("big", 1, "8"))
    run = sim.simulate(jobs(job("a", "default", 0, 100, ("w", 1, "2"), queue="default", cluster="small"),
                            job("b", "default", 0, 100, ("w", 1, "2"), queue="default", cluster="small"),
                            job("gang", "default", 1, 10, ("w", 2, "3"), queue="default")), cfg)
    assert run.jobs["default/gang"].clusters == ["big"]


def test_a_cordoned_cluster_takes_nothing_new_while_cordoned() -> None:
    cfg = demo_config(cluster("w1", 1, "4", cordons=[{"from": 10, "until": 50}]), cluster("w2", 1, "2"))
    run = sim.simulate(jobs(job("j1", "default", 0, 5, ("w", 1, "1"), queue="default"),
                            job("j2", "default", 20, 5, ("w", 1, "1"), queue="default"),
                            job("j3", "default", 60, 5, ("w", 1, "1"), queue="default")), cfg)
    assert [run.jobs[f"default/{n}"].clusters for n in ("j1", "j2", "j3")] == [["w1"], ["w2"], ["w1"]]


def test_a_job_no_node_can_hold_never_runs_and_says_why() -> None:
    cfg = demo_config(cluster("w1", 4, "2"))
    run = sim.simulate(jobs(job("huge", "default", 0, 10, ("w", 1, "3"), queue="default"),
                            job("ok", "default", 0, 10, ("w", 1, "1"), queue="default")), cfg)
    rep = report.summarize(run)
    assert [n["job"] for n in rep["neverRan"]] == ["default/huge"]
    assert "can never run here" in rep["neverRan"][0]["reason"]
    assert run.jobs["default/ok"].end == 10
    assert "1 Jobs never ran" in report.text(rep)


def test_more_quota_for_team_b_lowers_its_wait() -> None:
    lines = [job(f"b{i}", "team-b", i, 30, ("w", 1, "1"), priority_class="low") for i in range(6)]
    cfg = demo_config(cluster("w1", 4, "8"))
    more = copy.deepcopy(cfg)
    for o in more.objects:
        if o["kind"] == "ClusterQueue" and o["metadata"]["name"] == "team-b":
            o["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = "6"
    a = report.summarize(sim.simulate(jobs(*lines), cfg))
    b = report.summarize(sim.simulate(jobs(*lines), more))
    c = report.compare(a, b)
    assert c["clusterQueues"]["team-b"]["change"]["waitMAX"] < 0
    assert "▼" in report.compare_text(c)


def test_fair_sharing_and_starvation_settings_reach_the_scheduler() -> None:
    settings = {"apiVersion": "whatif.mkd.dev/v1", "kind": "WhatIfSettings", "metadata": {"name": "s"},
                "spec": {"fairSharing": {"enable": True}, "starvationSeconds": 30}}
    cfg = demo_config(cluster("w1", 1, "8"), extra=[settings])
    assert cfg.settings.fair_sharing and cfg.settings.starvation_seconds == 30
    # a big gang behind a stream of small Jobs starts once it starves and holds the cluster
    lines = [job("gang", "default", 1, 10, ("w", 1, "8"), queue="default")]
    lines += [job(f"s{i}", "default", i * 5, 20, ("w", 1, "2"), queue="default") for i in range(60)]
    run = sim.simulate(jobs(*lines), cfg)
    gang = run.jobs["default/gang"]
    assert gang.first_start is not None and gang.first_start < 5 * 60
    no_hold = copy.deepcopy(cfg)
    no_hold.settings.starvation_seconds = 10_000
    late = sim.simulate(jobs(*lines), no_hold).jobs["default/gang"]
    assert late.first_start is None or late.first_start > gang.first_start


def test_the_trace_refuses_a_bad_line_naming_line_and_field() -> None:
    good = job("a", "default", 0, 1, ("w", 1, "1"))
    with pytest.raises(trace.TraceError, match=r"line 2: podSets\[0\].requests.cpu"):
        trace.parse([good, job("b", "default", 0, 1, ("w", 1, "lots"))])
    with pytest.raises(trace.TraceError, match="line 1: runSeconds"):
        trace.parse(['{"name":"a","namespace":"d","arrival":0,"podSets":[]}'])
    with pytest.raises(trace.TraceError, match="line 3: arrival"):
        trace.parse([good, "", job("c", "default", "yesterday", 1, ("w", 1, "1"))])  # type: ignore[arg-type]
    with pytest.raises(trace.TraceError, match="line 2: name: default/a is already on line 1"):
        trace.parse([good, good])
    with pytest.raises(trace.TraceError, match="line 1: colour: is not a trace field"):
        trace.parse([job("a", "default", 0, 1, ("w", 1, "1"), colour="red")])


def test_the_configuration_refuses_a_bad_object_naming_it_and_the_field() -> None:
    bad_cq = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": "q"},
              "spec": {"queueingStrategy": "Fastest"}}
    with pytest.raises(config.ConfigError, match=r"f.yaml document 2: ClusterQueue q: spec.queueingStrategy"):
        config.load_documents([("f.yaml", 1, cluster("w", 1, "1")), ("f.yaml", 2, bad_cq)])
    with pytest.raises(config.ConfigError, match=r"WorkerCluster w: spec.nodes\[0\].allocatable.cpu"):
        config.load_documents([("f.yaml", 0, cluster("w", 1, "many"))])
    lq = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "l", "namespace": "n"},
          "spec": {"clusterQueue": "nope"}}
    cq = {**bad_cq, "spec": {}}
    with pytest.raises(config.ConfigError, match=r"LocalQueue n/l: spec.clusterQueue: ClusterQueue 'nope'"):
        config.load_documents([("f.yaml", 1, cq), ("f.yaml", 2, lq)])
    settings = {"apiVersion": "whatif.mkd.dev/v1", "kind": "WhatIfSettings", "metadata": {"name": "s"},
                "spec": {"fairSharing": {"preemptionStrategies": ["Random"]}}}
    with pytest.raises(config.ConfigError, match=r"WhatIfSettings s: spec.fairSharing.preemptionStrategies"):
        config.load_documents([("f.yaml", 0, settings)])


def test_the_preemptor_order_setting_reaches_the_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    """``prioritizePreemptors`` (the dispatcher's ``preemption.prioritize_preemptors``) orders the replay's passes."""
    settings = {"apiVersion": "whatif.mkd.dev/v1", "kind": "WhatIfSettings", "metadata": {"name": "s"},
                "spec": {"prioritizePreemptors": False}}
    cfg = demo_config(cluster("w1", 1, "8"), extra=[settings])
    assert cfg.settings.prioritize_preemptors is False
    assert cfg.settings.as_dict()["prioritizePreemptors"] is False
    seen: list[bool] = []
    real = Queues

    def spy(*args: Any, **kwargs: Any) -> Queues:
        q = real(*args, **kwargs)
        seen.append(q.prioritize_preemptors)
        return q
    monkeypatch.setattr(sim, "Queues", spy)
    sim.simulate(jobs(job("one", "default", 0, 10, ("w", 1, "1"), queue="default")), cfg)
    assert seen == [False]
    bad = {**settings, "spec": {"prioritizePreemptors": "no"}}
    with pytest.raises(config.ConfigError, match=r"WhatIfSettings s: spec.prioritizePreemptors: 'no' is not true"):
        config.load_documents([("f.yaml", 0, bad)])


def test_the_benchmark_trace_replays_at_a_small_scale(capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import whatif_bench

    monkeypatch.setattr("sys.argv", ["whatif_bench", "--jobs", "300", "--clusters", "3", "--nodes", "4"])
    whatif_bench.main()
    line = capsys.readouterr().out
    assert line.startswith("300 Jobs, 3 clusters x 4 nodes")
    admitted = int(re.search(r"([\d,]+) admitted", line).group(1))  # type: ignore[union-attr]
    never = int(re.search(r"([\d,]+) never ran", line).group(1))  # type: ignore[union-attr]
    # 4 pods of 8 GPUs ask for more than a team's quota and what it may borrow here: those never run
    assert admitted + never == 300 and 0 < never < 100
