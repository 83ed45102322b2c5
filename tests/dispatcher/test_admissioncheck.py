"""Kueue mode's reading of Kueue's objects and its two writes, held to a recording of Kueue v0.19.2.

``tests/fixtures/kueue_v0192_admission_check.json`` holds a Workload as Kueue v0.19.2 running left it after
each step of an admission-check life (created; quota reserved; mkd's check Pending, Ready; admitted; Retry
and the eviction it causes; the quota released and requeued; reserved and admitted again; finished; and a
second Workload Rejected and deactivated; see tests/fixtures/README.md). mkd must read each as Kueue means
it (is the Workload released to mkd, which flavors, which check state), and its check write must be what
Kueue's ``SetAdmissionCheckState`` makes of it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dispatcher.admissioncheck import kueueview as kv
from dispatcher.admissioncheck.controller import KueueChecks, _generation

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "kueue_v0192_admission_check.json"
STEPS = {s["step"]: s["workload"] for s in json.loads(FIXTURE.read_text())["steps"]}
MINE = ["mkd"]


def test_the_recording_holds_every_step() -> None:
    assert list(STEPS) == ["created", "quota_reserved", "check_pending_message", "admitted", "evicted_by_retry",
                           "requeued", "quota_reserved_again", "admitted_again", "finished",
                           "second_quota_reserved", "rejected_deactivated"]


@pytest.mark.parametrize(("step", "released"), [
    ("created", False), ("quota_reserved", True), ("check_pending_message", True), ("admitted", True),
    ("evicted_by_retry", False), ("requeued", False), ("quota_reserved_again", True), ("admitted_again", True),
    ("finished", False), ("second_quota_reserved", True), ("rejected_deactivated", False)])
def test_released_reads_each_recorded_step_as_kueue_means_it(step: str, released: bool) -> None:
    view = kv.parse_workload(STEPS[step])
    owner = STEPS[step]["metadata"]["ownerReferences"][0]
    assert (view.job_uid, view.job_kind, view.job_name) == (owner["uid"], "Job", owner["name"])
    assert kv.released(view, MINE) is released


def test_kueue_adds_the_check_pending_and_admits_only_once_it_is_ready() -> None:
    created = kv.parse_workload(STEPS["created"])
    assert created.checks["mkd"].state == "Pending" and not created.quota_reserved
    # until mkd marks its AdmissionCheck Active, Kueue holds the ClusterQueue inactive
    assert created.reserved_since is not None
    qr = next(c for c in STEPS["created"]["status"]["conditions"] if c["type"] == "QuotaReserved")
    assert (qr["reason"], qr["message"]) == ("Inadmissible", "ClusterQueue cq-mkd is inactive")
    reserved = kv.parse_workload(STEPS["quota_reserved"])
    assert reserved.quota_reserved and not reserved.admitted and reserved.cluster_queue == "cq-mkd"
    assert reserved.flavors == {"main": {"cpu": "default", "memory": "default"}}
    assert kv.parse_workload(STEPS["admitted"]).admitted


def test_retry_evicts_and_kueue_resets_the_check_to_pending() -> None:
    evicted = kv.parse_workload(STEPS["evicted_by_retry"])
    assert evicted.evicted and evicted.quota_reserved  # the quota goes once the Job is stopped (next step)
    assert evicted.checks["mkd"].state == "Pending"
    assert evicted.checks["mkd"].message == "Reset to Pending after eviction. Previously: Retry"
    requeued = kv.parse_workload(STEPS["requeued"])
    assert not requeued.quota_reserved and requeued.cluster_queue is None


def test_rejected_deactivates() -> None:
    view = kv.parse_workload(STEPS["rejected_deactivated"])
    assert not view.active


def test_the_generation_grows_with_each_reservation_and_release() -> None:
    gens = []
    for step in ("created", "quota_reserved", "evicted_by_retry", "requeued", "quota_reserved_again"):
        view = kv.parse_workload(STEPS[step])
        gens.append(_generation(view, kv.released(view, MINE)))
    assert gens[0] < gens[1] < gens[2] and gens[3] > gens[1] and gens[4] > gens[3]
    assert gens[1] % 2 == 1 and gens[3] % 2 == 0 and gens[4] % 2 == 1


def _kueue_set(obj: dict[str, Any], state: str, message: str, at: str) -> list[dict[str, Any]]:
    """What the recording shows Kueue's SetAdmissionCheckState made of mkd's writes (the next step's entry)."""
    return [dict(c, state=state, message=message, lastTransitionTime=at) if c["name"] == "mkd" else c
            for c in obj["status"]["admissionChecks"]]


def test_mkds_check_write_is_kept_as_written_while_kueue_admits() -> None:
    before, after = STEPS["check_pending_message"], STEPS["admitted"]
    want = next(c for c in after["status"]["admissionChecks"] if c["name"] == "mkd")
    at = kv.parse_time(want["lastTransitionTime"])
    assert at is not None
    got = kv.with_check_state(before, "mkd", "Ready", want["message"], at)
    assert got is not None
    assert got == _kueue_set(before, "Ready", want["message"], want["lastTransitionTime"])
    # the same state again with a new message: the transition time stays (SetAdmissionCheckState)
    again = kv.with_check_state(after, "mkd", "Ready", "another message", at + timedelta(seconds=9))
    assert again is not None and again[0]["lastTransitionTime"] == want["lastTransitionTime"]
    assert kv.with_check_state(after, "mkd", "Ready", want["message"], at) is None  # nothing to change
    assert kv.with_check_state(after, "other", "Ready", "", at) is None  # a check the Workload lacks: Kueue's


CONTROLLERS = {"mkd": kv.CONTROLLER, "mk": kv.MULTIKUEUE, "prov": "kueue.x-k8s.io/provisioning-request"}


@pytest.mark.parametrize(("spec", "who"), [
    ({"admissionChecks": ["mkd"]}, "mkd"), ({"admissionChecks": ["mk", "prov"]}, "multikueue"),
    ({"admissionChecks": ["mkd", "mk"]}, "both"), ({"admissionChecks": ["prov"]}, "none"), ({}, "none"),
    ({"admissionChecksStrategy": {"admissionChecks": [{"name": "mkd", "onFlavors": ["gpu"]}]}}, "mkd")])
def test_who_serves_a_cluster_queue(spec: dict[str, Any], who: str) -> None:
    assert kv.serving({"spec": spec}, CONTROLLERS) == who


def test_the_active_condition_as_multikueue_writes_its_own() -> None:
    now = datetime(2026, 12, 5, tzinfo=UTC)
    ac = {"metadata": {"name": "mkd", "generation": 2}, "spec": {"controllerName": kv.CONTROLLER}}
    conds = kv.active_conditions(ac, now)
    assert conds == [{"type": "Active", "status": "True", "reason": "Active",
                      "message": "The admission check is active", "observedGeneration": 2,
                      "lastTransitionTime": "2026-12-05T00:00:00Z"}]
    assert kv.active_conditions({**ac, "status": {"conditions": conds}}, now) is None


def test_assigned_flavors_become_node_selectors_and_tolerations() -> None:
    view = kv.parse_workload(STEPS["quota_reserved"])
    flavors = {"default": {"spec": {"nodeLabels": {"pool": "a"},
                                    "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]}}}
    got = kv.pod_scheduling(view, flavors)
    assert got["main"].node_selector == {"pool": "a"}
    assert got["main"].tolerations == [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]


def _checks(no_fit: float = 60.0) -> KueueChecks:
    engine = SimpleNamespace(known={}, queueing=SimpleNamespace(assigned={}))
    return KueueChecks(None, engine, None, None, kinds={}, sync_seconds=1.0,  # type: ignore[arg-type]
                       no_fit_retry_seconds=no_fit)


@pytest.mark.parametrize(("state", "cluster", "reason", "check", "waited", "want"), [
    ("running", "worker-1", "", "Pending", 0, ("Ready", 'placed on worker cluster "worker-1" by mkd (attempt 1)')),
    ("placed", "worker-1", "", "Pending", 0, ("Pending", 'sent to worker cluster "worker-1"; waiting for its '
                                                          "agent to accept it")),
    ("pending", None, "needs 8 cpu", "Pending", 10, ("Pending", "needs 8 cpu")),
    ("pending", None, "needs 8 cpu", "Pending", 61, ("Retry", "no worker cluster fits after 61s: needs 8 cpu")),
    ("pending", None, "cluster worker-1 lost", "Ready", 0, ("Retry", "cluster worker-1 lost")),
    ("rejected", None, "spec.x: bad", "Pending", 0, ("Rejected", "spec.x: bad")),
    ("failed", None, "gave up after 5 placement attempts", "Ready", 0,
     ("Rejected", "gave up after 5 placement attempts")),
    ("finished", None, "Succeeded", "Ready", 0, None),
])
def test_the_check_state_follows_the_workload_row(state: str, cluster: str | None, reason: str, check: str,
                                                  waited: int, want: tuple[str, str] | None) -> None:
    view = kv.parse_workload(STEPS["quota_reserved"])
    since = view.reserved_since
    assert since is not None
    row = SimpleNamespace(state=state, cluster=cluster, reason=reason, attempt=1)
    got = _checks().desired(row, kv.Check("mkd", check, "", since), view, since + timedelta(seconds=waited))
    assert got == want
