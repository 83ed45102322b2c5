"""The demo's queue set (``demo/queues``, installed by ``make demo`` with ``examples/``) and its panel.

The set loads and resolves: every job ``make demo`` submits names a LocalQueue whose ClusterQueue
admits its namespace and covers what it asks for. The scenario is pure-scheduled as the dispatcher
would run it: the borrower borrows, ``high`` preempts a low job. The live view shows both: a line per
ClusterQueue with what it borrowed, and the preemption and the borrow as events.
"""

from __future__ import annotations

import io
from decimal import Decimal
from pathlib import Path

from rich.console import Console

from dispatcher.placement import ClusterView, Need, NodeView
from dispatcher.queueing.catalog import Catalog
from dispatcher.queueing.flavors import assign
from dispatcher.queueing.scheduler import Entry, Queues
from dispatcher.workload import describe
from federation.kinds.registry import by_api
from mkctl import demo
from mkctl.demoqueues import BORROWS, PREEMPTED, QueuePanel, queue_line
from mkctl.jobs import Examples, load_examples, queues_dir
from tests.queueing.builders import NOW, cluster

DEMO = Path(__file__).resolve().parents[2] / "demo" / "queues"


def demo_set() -> Examples:
    found = load_examples()
    found.add(load_examples(queues_dir()))
    return found


def need(found: Examples, manifest: dict[str, object]) -> Need:
    """The Workload's demand as the dispatcher computes it (a TrainJob with its runtime)."""
    kind = by_api(str(manifest["apiVersion"]), str(manifest["kind"]))
    assert kind is not None
    ref = ((manifest.get("spec") or {}).get("runtimeRef") or {}).get("name")  # type: ignore[union-attr]
    runtime = next((r for r in found.runtimes if r["metadata"]["name"] == ref), None)
    described = describe(kind, {**manifest, "metadata": {**manifest["metadata"], "uid": "u"}},  # type: ignore[dict-item]
                         runtime)
    assert described.need is not None, described.problems
    return described.need


def catalog_of(found: Examples) -> Catalog:
    catalog = Catalog()
    for obj in found.queue_objects:
        catalog.apply(obj["kind"], obj)
    for ns in found.namespaces:
        catalog.apply("Namespace", {"metadata": {"name": ns}})
    return catalog


def test_demo_queues_set_parses_and_resolves() -> None:
    assert queues_dir() == DEMO
    found = load_examples(DEMO)
    assert sorted(s.key for s in found.samples) == ["team-a/high", "team-a/low-1", "team-a/low-2", "team-b/borrower"]
    assert {s.expect for s in found.samples} == {"Succeeded"}
    assert {"team-a", "team-b"} <= found.namespaces
    catalog = catalog_of(found)
    assert not catalog.problems
    assert catalog.cohort_chain(catalog.cluster_queues["team-b"]) == ["org"]
    assert catalog.cohort_chain(catalog.cluster_queues["team-a"]) == ["org"]
    for sample in found.samples:
        kind = by_api(sample.manifest["apiVersion"], sample.kind)
        assert kind is not None and kind.validate(sample.manifest) == []
        queue = sample.manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
        assert catalog.resolve(sample.namespace, queue).problem == ""
        assert catalog.priority(sample.manifest["metadata"]["labels"], [])[0] in (10, 1000)


def test_every_job_make_demo_submits_has_a_queue_that_admits_it() -> None:
    """``make demo`` = examples/ + demo/queues: no job may wait for a missing LocalQueue or quota it can never get."""
    found = demo_set()
    catalog = catalog_of(found)
    assert not catalog.problems
    for sample in found.samples:
        if sample.expect == "Untouched":
            continue
        queue = (sample.manifest["metadata"].get("labels") or {}).get("kueue.x-k8s.io/queue-name", "default")
        resolved = catalog.resolve(sample.namespace, queue)
        assert resolved.problem == "", f"{sample.key}: {resolved.problem}"
        assert resolved.cluster_queue is not None
        got = assign(resolved.cluster_queue, need(found, sample.manifest), Queues(catalog).tree, catalog)
        assert not isinstance(got, str), f"{sample.key}: {got}"


def _cluster(name: str, cpu: int) -> ClusterView:
    room = NodeView(f"{name}-n0", {}, (), {"cpu": Decimal(cpu), "memory": Decimal(64 * 2**30), "pods": Decimal(110)})
    return cluster(name, room)


def test_the_scenario_borrows_then_preempts_as_the_demo_says() -> None:
    found = load_examples(DEMO)
    catalog = catalog_of(found)
    q = Queues(catalog)
    samples = {s.name: s for s in found.samples}

    def entry(name: str, at: float, seq: int) -> Entry:
        s = samples[name]
        labels = s.manifest["metadata"]["labels"]
        return Entry(uid=name, namespace=s.namespace, name=name, queue=labels["kueue.x-k8s.io/queue-name"],
                     priority=catalog.priority(labels, [])[0], queued_at=at, seq=seq, need=need(found, s.manifest))

    for i, name in enumerate(("borrower", "low-1", "low-2")):
        q.add(entry(name, NOW.timestamp(), i))
    first = q.schedule([_cluster("w", 16)], now=NOW, timeout=60)
    assert {a.entry.name for a in first.admitted} == {"borrower", "low-1", "low-2"}
    assert [a.borrows for a in first.admitted if a.entry.name == "borrower"] == [True]
    q.add(entry("high", NOW.timestamp() + 5, 4))
    second = q.schedule([_cluster("w", 16)], now=NOW, timeout=60)
    assert [v.uid for v in second.evicted] in (["low-1"], ["low-2"]) and second.evicted[0].reason == "InClusterQueue"
    third = q.schedule([_cluster("w", 16)], now=NOW, timeout=60)
    assert [a.entry.name for a in third.admitted] == ["high"]


def _cq_object(name: str, cohort: str | None, cpu_nominal: str, used: str, borrowed: str) -> dict[str, object]:
    spec: dict[str, object] = {"resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
        {"name": "default", "resources": [{"name": "cpu", "nominalQuota": cpu_nominal}]}]}]}
    if cohort:
        spec["cohortName"] = cohort
    return {"metadata": {"name": name}, "spec": spec, "status": {
        "pendingWorkloads": 0, "admittedWorkloads": 1,
        "flavorsUsage": [{"name": "default", "resources": [{"name": "cpu", "total": used, "borrowed": borrowed}]}]}}


def test_the_live_view_shows_the_borrow_and_the_preemption() -> None:
    borrower = {"status": {"conditions": [
        {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved",
         "message": "Quota reserved in ClusterQueue team-b (master: cpu=default), borrowing from its cohort"}]}}
    victim = {"status": {"conditions": [
        {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "Preempted to accommodate ..."},
        {"type": "Preempted", "status": "True", "reason": "InClusterQueue",
         "message": "Preempted to accommodate a workload (team-a/high, UID: u) due to prioritization in the ClusterQueue"}]}}
    panel = QueuePanel()
    cqs = [_cq_object("team-a", "org", "4", "2", "0"), _cq_object("team-b", "org", "1", "3", "2")]
    panel.update(cqs, {"team-b/borrower": borrower, "team-a/low-2": victim, "team-a/high": None}, 3.0)
    assert panel.shown(BORROWS) and panel.shown(PREEMPTED)
    assert queue_line(cqs[1]).borrowed == "cpu 2" and queue_line(cqs[0]).borrowed == ""

    # the live (terminal) view: the jobs, a line per ClusterQueue, the events
    progress = demo.Progress([], {}, 0.0, queues=panel)
    out = io.StringIO()
    Console(file=out, width=250, force_terminal=False).print(demo.render(progress))
    text = out.getvalue()
    team_b = next(line for line in text.splitlines() if "team-b " in line and "org" in line)
    assert "cpu 3 of 1" in team_b and "cpu 2" in team_b
    assert "preempted" in text and "team-a/low-2" in text and "team-a/high" in text
    assert "borrows" in text and "team-b/borrower" in text

    # the plain (CI) view: one line per change, each event once
    out = io.StringIO()
    view = demo.View(Console(file=out, width=250, force_terminal=False))
    view.show(progress)
    view.show(progress)  # nothing changed: nothing printed twice
    lines = out.getvalue().splitlines()
    assert sum("PREEMPTED team-a/low-2" in line for line in lines) == 1
    assert sum("BORROWED cpu 2" in line for line in lines) == 1
    assert sum("BORROWS team-b/borrower" in line for line in lines) == 1

    # a borrow or a preemption the run never showed is a problem the demo reports
    assert demo.queue_problems(load_examples(DEMO), panel) == []
    assert demo.queue_problems(load_examples(DEMO), QueuePanel()) == [
        "the queueing demo never showed a Job that borrows", "the queueing demo never showed a Job that preempted another"]


def test_the_demo_table_shows_no_cluster_for_a_job_that_waits_again() -> None:
    """A preempted Job waits again; its latest placement row still names the cluster it left (the demo
    showed ``cluster=worker-2  Pending``)."""
    from mkctl.demo import merge
    from mkctl.jobs import Observation
    row = {"cluster": "worker-2", "queue": "team-a", "reason": "Preempted to accommodate a workload"}
    assert merge(Observation("team-a/low-1", "PyTorchJob", "team-a", "Pending", "Preempted"), row).cluster == ""
    assert merge(Observation("team-a/low-1", "PyTorchJob", "team-a", "Running"), row).cluster == "worker-2"
