"""Pure parts of kubesim.sim: quantities, a pod's effective requests, completedIndexes, filter messages."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kubesim.sim.jobpods import format_indexes, parse_indexes, success_policy
from kubesim.sim.kubelet import Outcome, outcome_of
from kubesim.sim.resources import parse_quantity, pod_requests
from kubesim.sim.scheduler import Scheduler
from kubesim.spec import KubeletSpec

pytestmark = pytest.mark.kubesim_only("unit tests of kubesim's internals; no cluster involved")


@pytest.mark.parametrize(("text", "resource", "amount"), [
    ("500m", "cpu", 500), ("2", "cpu", 2000), ("1.5", "cpu", 1500), ("0.1", "cpu", 100),
    ("2Gi", "memory", 2 * 2**30), ("1e3", "memory", 1000), ("1k", "memory", 1000), ("3", "nvidia.com/gpu", 3),
    ("100M", "memory", 100_000_000), ("1.5Ki", "memory", 1536),
])
def test_quantities(text: str, resource: str, amount: int) -> None:
    assert parse_quantity(text, resource) == amount


@pytest.mark.parametrize("bad", ["", "abc", "-1", "1Qi"])
def test_bad_quantities(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_quantity(bad, "cpu")


def container(name: str, cpu: str, restart: str | None = None, limits: dict[str, str] | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "x", "resources": {"requests": {"cpu": cpu}}}
    if limits:
        c["resources"]["limits"] = limits
    if restart:
        c["restartPolicy"] = restart
    return c


def test_pod_requests_follow_the_scheduler_rule() -> None:
    spec = {
        "containers": [container("a", "1"), container("b", "500m", limits={"nvidia.com/gpu": "2"})],
        # A sidecar (restartPolicy Always) runs next to the app; a plain init container runs alone after it.
        "initContainers": [container("side", "250m", restart="Always"), container("big-init", "3")],
        "overhead": {"cpu": "100m"},
    }
    need = pod_requests(spec)
    # max(1 + 0.5 + 0.25 sidecar, 0.25 sidecar + 3 init) + 0.1 overhead
    assert need["cpu"] == 3350
    assert need["nvidia.com/gpu"] == 2  # limits stand in for a missing extended-resource request
    assert need["pods"] == 1


def test_completed_indexes_round_trip() -> None:
    assert format_indexes([0, 1, 2, 4, 6, 7]) == "0-2,4,6-7"
    assert format_indexes([]) == ""
    assert parse_indexes("0-2,4,6-7") == {0, 1, 2, 4, 6, 7}
    assert parse_indexes(None) == set()


def test_outcome_from_annotations_and_defaults() -> None:
    pod = {"metadata": {"annotations": {"kubesim.mkd.dev/fail-attempts": "2"}}}
    out = outcome_of(pod, KubeletSpec(start_seconds=0.1, run_seconds=2, exit_code=0))
    assert (out.start_seconds, out.run_seconds) == (0.1, 2.0)
    assert [out.code_for(n) for n in (1, 2, 3)] == [1, 1, 0]  # fail twice with a failing code, then succeed
    plain = Outcome(start_seconds=0, run_seconds=0, exit_code=5, fail_attempts=None, forever=False)
    assert plain.code_for(9) == 5


def test_unschedulable_message_counts_reasons_per_node() -> None:
    loop = asyncio.new_event_loop()
    try:
        sched = Scheduler(store=None, loop=loop, seed=0)  # type: ignore[arg-type]
        for name, alloc in (("a", {"cpu": "2", "pods": "10"}), ("b", {"cpu": "2", "pods": "10"}),
                            ("c", {"cpu": "1", "pods": "10", "nvidia.com/gpu": "1"})):
            sched.on_node("ADDED", {"metadata": {"name": name}, "status": {"allocatable": alloc}})
        sched.on_pod("ADDED", {"metadata": {"name": "p", "namespace": "ns", "uid": "u"},
                               "spec": {"containers": [container("m", "1500m", limits={"nvidia.com/gpu": "1"})]}})
        node, message = sched._place(sched.pending[("ns", "p")])
    finally:
        loop.close()
    assert node is None
    assert message == ("0/3 nodes are available: 1 Insufficient cpu, 2 Insufficient nvidia.com/gpu. preemption: "
                       "0/3 nodes are available: 3 No preemption victims found for incoming pod.")


def test_success_policy_rules() -> None:
    rules = {"rules": [{"succeededIndexes": "0-1", "succeededCount": 1}, {"succeededCount": 3}]}
    assert success_policy(rules, {2}) is None
    assert success_policy(rules, {1}) == "Matched rules at index 0"
    assert success_policy({"rules": [{"succeededCount": 3}]}, {2, 5, 7}) == "Matched rules at index 0"
    assert success_policy({"rules": [{"succeededIndexes": "0,2"}]}, {0}) is None
    assert success_policy(None, {0, 1}) is None


def test_the_simulation_is_told_of_commits_outside_the_request() -> None:
    """Subscribers (the simulated control plane) run without the request scope of the write that woke them,
    so what they schedule then is not taken for a client's request (fieldValidation, warnings)."""
    from kubesim import schema
    from kubesim.spec import ClusterSpec, NodeSpec
    from kubesim.store import Store

    store = Store(ClusterSpec("units", [NodeSpec("n1")]))
    seen: list[Any] = []
    store.subscribe(lambda _etype, _res, _obj: seen.append(schema.current_scope()), {"configmaps"})
    with schema.request_scope("Strict", "POST") as scope:
        store.create_rec("configmaps", {"metadata": {"name": "c", "namespace": "default"}})
        assert schema.current_scope() is scope
    assert seen == [None]


def test_a_terminating_namespace_is_swept_once_not_again_for_every_object_that_goes() -> None:
    """Every object removed from a terminating namespace (each pod as its kubelet confirmed, one by one) queued a
    new sweep of the namespace controller, which listed and sorted the whole namespace: deleting a namespace of
    27,000 objects (the e2e benchmark's floor on one worker) kept kubesim busy for over ten minutes, answering
    nothing else. The namespace is swept once; a removal only checks whether it is empty now."""
    from kubesim.spec import ClusterSpec, NodeSpec
    from kubesim.store import Store

    store = Store(ClusterSpec("units", [NodeSpec("n1")]))
    queued: list[Any] = []
    store.defer = queued.append
    store.create_rec("namespaces", {"metadata": {"name": "big"}})
    for i in range(300):  # bound pods: deleted gracefully, removed when their kubelet confirms
        store.create_rec("pods", {"metadata": {"name": f"p{i}", "namespace": "big"},
                                  "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]}})
    store.create_rec("configmaps", {"metadata": {"name": "c", "namespace": "big"}})
    listed = 0
    objects_in = store.objects_in

    def counting(namespace: str) -> Any:
        nonlocal listed
        listed += 1
        return objects_in(namespace)

    def drain() -> None:
        while queued:
            queued.pop(0)()

    store.objects_in = counting  # type: ignore[method-assign]
    store.delete_rec("namespaces", None, "big")
    drain()
    assert len(objects_in("big")) == 300  # the ConfigMap went, the pods wait for their kubelet
    for i in range(300):  # each kubelet confirms on its own
        store.delete_rec("pods", "big", f"p{i}", grace_period=0)
        drain()
        assert (store.get_rec("namespaces", None, "big") is None) == (i == 299)
    assert not objects_in("big")
    assert listed <= 10, f"the namespace was listed {listed} times for 300 pods"
