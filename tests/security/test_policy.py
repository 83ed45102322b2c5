"""The worker policy (worker_agent/policy.py): namespaces, service accounts, Pod Security levels."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from federation.kube import NAMESPACES
from tests.agent.conftest import AgentHarness, place
from tests.federation.test_examples import EXAMPLES
from tests.security.attacks import harmless_job, hostile_job
from worker_agent.policy import Policy, PolicySettings


def fields(manifest: dict[str, Any], ns: str = "team-a", **settings: Any) -> list[str]:
    return [v.field for v in Policy(PolicySettings(**settings)).check(manifest, ns)]


@pytest.mark.parametrize("path", sorted(p.relative_to(EXAMPLES).as_posix() for p in EXAMPLES.rglob("*.yaml")))
def test_every_shipped_example_passes_the_default_policy(path: str) -> None:
    for doc in yaml.safe_load_all((EXAMPLES / path).read_text()):
        if doc and "spec" in doc:
            assert fields(doc) == [], path


def test_baseline_names_every_field_it_refuses_and_privileged_allows_them() -> None:
    job = hostile_job(namespace="team-a")
    pod = job["spec"]["template"]["spec"]
    pod["hostIPC"] = True
    pod["securityContext"] = {"sysctls": [{"name": "kernel.msgmax", "value": "1"}],
                              "seccompProfile": {"type": "Unconfined"}}
    c = pod["containers"][0]
    c["securityContext"].update(capabilities={"add": ["NET_ADMIN", "CHOWN"]}, procMount="Unmasked")
    c["ports"] = [{"containerPort": 80, "hostPort": 80}]
    got = fields(job)
    base = "spec.template.spec"
    for f in (f"{base}.hostPID", f"{base}.hostNetwork", f"{base}.hostIPC", f"{base}.volumes[0].hostPath",
              f"{base}.securityContext.sysctls[0].name", f"{base}.securityContext.seccompProfile.type",
              f"{base}.containers[0].securityContext.privileged",
              f"{base}.containers[0].securityContext.capabilities.add[0]",
              f"{base}.containers[0].securityContext.procMount", f"{base}.containers[0].ports[0].hostPort",
              f"{base}.serviceAccountName"):
        assert f in got, f
    assert f"{base}.containers[0].securityContext.capabilities.add[1]" not in got  # CHOWN is in the default set
    assert fields(job, pod_security="privileged") == [f"{base}.serviceAccountName"]


def test_restricted_wants_non_root_no_escalation_and_dropped_capabilities() -> None:
    job = harmless_job("plain")
    got = fields(job, pod_security="restricted")
    c = "spec.template.spec.containers[0].securityContext"
    assert {f"{c}.allowPrivilegeEscalation", f"{c}.runAsNonRoot", f"{c}.seccompProfile.type",
            f"{c}.capabilities.drop"} <= set(got)
    hardened = copy.deepcopy(job)
    hardened["spec"]["template"]["spec"]["securityContext"] = {"runAsNonRoot": True,
                                                               "seccompProfile": {"type": "RuntimeDefault"}}
    hardened["spec"]["template"]["spec"]["containers"][0]["securityContext"] = {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}
    assert fields(hardened, pod_security="restricted") == []


def test_namespaces_denied_allowed_and_mapped() -> None:
    job = harmless_job("plain")
    assert fields(job, "kube-system") == ["metadata.namespace"]
    assert fields(job, "mkd-system") == ["metadata.namespace"]
    assert fields(job, "ops", agent_namespace="ops") == ["metadata.namespace"]
    assert fields(job, "team-b", allowed_namespaces=["team-a"]) == ["metadata.namespace"]
    assert fields(job, "team-a", service_accounts=["trainer"]) == []
    sa = copy.deepcopy(job)
    sa["spec"]["template"]["spec"]["serviceAccountName"] = "builder"
    assert fields(sa, service_accounts=["trainer"]) == ["spec.template.spec.serviceAccountName"]
    mapped = Policy(PolicySettings(namespace_map={"team-a": "batch", "*": "jobs"}))
    assert [mapped.target_namespace(ns) for ns in ("team-a", "team-b")] == ["batch", "jobs"]


async def test_the_agent_maps_namespaces_and_labels_those_it_creates(harness: AgentHarness) -> None:
    policy = PolicySettings(namespace_map={"research": "research-gpu"})
    await harness.stop_agent()
    await harness.start_agent(policy=policy)
    await harness.send(place(harmless_job("mapped", "research"), uid="wl-mapped", namespace="research"))
    accepted = await harness.wait_report(lambda r: r.type in ("accepted", "rejected")
                                         and getattr(r, "placement", None) is not None
                                         and r.placement.workload_uid == "wl-mapped")
    assert accepted.type == "accepted", accepted
    from tests.security.test_attacks_agent import JOBS
    assert await harness.get(JOBS, "mapped", "research-gpu") is not None
    ns = await harness.kube.get(NAMESPACES, "research-gpu")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"
