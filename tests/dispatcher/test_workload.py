"""Describing a Job: PodSets remembered per spec, validation still per Job; the status merge."""

from __future__ import annotations

from dispatcher import workload as wl
from federation import labels
from federation.kinds.registry import by_name
from tests.dispatcher.harness import pytorchjob

KIND = by_name("PyTorchJob")


def named(name: str, **kw: object) -> dict[str, object]:
    job = pytorchjob(name, **kw)  # type: ignore[arg-type]
    job["metadata"]["uid"] = f"uid-{name}"  # type: ignore[index]
    return job


def test_same_spec_shares_podsets_but_each_job_is_validated_and_named() -> None:
    a = wl.describe(KIND, named("alpha"), None)
    b = wl.describe(KIND, named("beta"), None)
    assert not a.problems and not b.problems
    assert (a.columns["name"], b.columns["name"]) == ("alpha", "beta")
    assert a.columns["podsets"] == b.columns["podsets"] and a.columns["requests"] == {
        "cpu": "2", "memory": "2Gi", "pods": "2"}
    bad = wl.describe(KIND, named("Not_A_Name"), None)  # same spec, invalid name: still refused
    assert bad.problems and bad.need is None
    bigger = wl.describe(KIND, named("gamma", workers=3), None)
    assert bigger.columns["requests"]["pods"] == "4"
    a.columns["podsets"][0]["requests"]["cpu"] = "999"  # a caller's edit must not leak into the cache
    assert wl.describe(KIND, named("delta"), None).columns["podsets"][0]["requests"]["cpu"] == "1"


def test_merge_status_replaces_the_manager_status_and_keeps_the_jobs_latest_condition_last() -> None:
    mkd = {labels.CONDITION_DISPATCHED: {"type": labels.CONDITION_DISPATCHED, "status": "True"}}
    current = {"startTime": "t0", "replicaStatuses": {"Master": {"active": 1}}, "conditions": [
        {"type": "Running", "status": "True"}, {"type": labels.CONDITION_DISPATCHED, "status": "False"}]}
    worker = {"startTime": "t0", "completionTime": "t1", "conditions": [{"type": "Succeeded", "status": "True"}]}
    out = wl.merge_status(worker, mkd, current)
    assert out["completionTime"] == "t1" and "replicaStatuses" not in out
    assert [c["type"] for c in out["conditions"]] == [labels.CONDITION_DISPATCHED, "Succeeded"]
    assert out["conditions"][0]["status"] == "True"
    before_any = wl.merge_status(None, mkd, current)  # no worker status yet: the manager's own is kept
    assert before_any["replicaStatuses"] == {"Master": {"active": 1}}
    assert [c["type"] for c in before_any["conditions"]] == [labels.CONDITION_DISPATCHED, "Running"]


def test_merge_patch_nulls_what_the_target_lacks_at_every_depth() -> None:
    current = {"startTime": "t0", "replicaStatuses": {"Launcher": {"active": 1}, "Worker": {"active": 3}},
               "conditions": [{"type": "Running"}]}
    target = {"startTime": "t0", "replicaStatuses": {"Launcher": {"succeeded": 1}},
              "conditions": [{"type": "Running"}, {"type": "Succeeded"}]}
    patch = wl.merge_patch(current, target)
    assert patch == {"replicaStatuses": {"Launcher": {"active": None, "succeeded": 1}, "Worker": None},
                     "conditions": [{"type": "Running"}, {"type": "Succeeded"}]}
    assert wl.merge_patch(target, target) == {}
    assert wl.merge_patch(None, {"a": {"b": 1}}) == {"a": {"b": 1}}
