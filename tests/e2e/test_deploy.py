"""The production manifests in deploy/: they parse, and they cover every JobKind mkd supports.

A kind added to the registry without RBAC for the dispatcher and the agent, or without the managedBy
immutability policy, would fail in a real cluster only; these checks fail here instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from federation.kinds.registry import KINDS

pytestmark = pytest.mark.realcluster  # reads the manifests only: the same with real clusters configured

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def docs(relative: str) -> list[dict[str, Any]]:
    with (DEPLOY / relative).open() as fh:
        return [d for d in yaml.safe_load_all(fh) if d]


def granted(role: dict[str, Any], group: str, resource: str, verb: str) -> bool:
    return any(group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]
               for rule in role["rules"])


def test_dispatcher_may_watch_every_kind_and_write_its_status() -> None:
    role = next(d for d in docs("manager/dispatcher.yaml") if d["kind"] == "ClusterRole")
    for kind in KINDS:
        assert granted(role, kind.group, kind.plural, "watch"), kind.name
        assert granted(role, kind.group, f"{kind.plural}/status", "patch"), kind.name
        assert not granted(role, kind.group, kind.plural, "delete"), f"the dispatcher never deletes {kind.name}"


def test_agent_may_run_every_kind() -> None:
    roles = [d for d in docs("worker/agent.yaml") if d["kind"] == "ClusterRole"]
    role = {"rules": [rule for r in roles for rule in r["rules"]]}
    for kind in KINDS:
        for verb in ("create", "delete", "watch"):
            assert granted(role, kind.group, kind.plural, verb), (kind.name, verb)
        assert granted(role, kind.group, f"{kind.plural}/status", "update"), kind.name
    for resource in ("pods", "services", "configmaps", "secrets"):
        assert granted(role, "", resource, "create"), resource


def test_agent_writes_only_where_placed_jobs_may_land() -> None:
    """The agent's cluster-wide role reads; its write role is bound per allowed namespace only."""
    agent = docs("worker/agent.yaml")
    read = next(d for d in agent if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "mkd-agent")
    for rule in read["rules"]:  # creating a namespace (create_namespaces) is the one cluster-wide write
        writes = set(rule["verbs"]) & {"create", "update", "patch", "delete"}
        assert not writes or (rule["resources"] == ["namespaces"] and writes == {"create"}), rule
    cluster_bindings = [d["roleRef"]["name"] for d in agent if d["kind"] == "ClusterRoleBinding"]
    assert cluster_bindings == ["mkd-agent"]
    bound = [d for d in agent if d["kind"] == "RoleBinding" and d["roleRef"]["name"] == "mkd-agent-workloads"]
    policy = next(d for d in agent if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "mkd-agent-policy")
    allowed = yaml.safe_load(policy["data"]["MKD_AGENT_POLICY__ALLOWED_NAMESPACES"])
    assert sorted(d["metadata"]["namespace"] for d in bound) == sorted(allowed)
    own = [d for d in agent if d["kind"] == "Role"]
    assert [(d["metadata"]["namespace"], r["resources"]) for d in own for r in d["rules"]] == \
        [("mkd-system", ["configmaps"]), ("mkd-system", ["leases"])], \
        "in its own namespace the agent only keeps its epoch ConfigMap and the Lease its fencer reads"
    # nothing secret is read cluster-wide: Secrets and ConfigMaps only where its write role is bound
    assert not [r for r in read["rules"] if {"secrets", "configmaps"} & set(r["resources"])], read["rules"]
    workloads = next(d for d in agent if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "mkd-agent-workloads")
    assert any({"secrets", "configmaps"} <= set(r["resources"]) and {"get", "list", "watch"} <= set(r["verbs"])
               for r in workloads["rules"])
    assert not [r for d in own for r in d["rules"] if "secrets" in r["resources"]], "its own Secrets are mounted"
    assert not {"kube-system", "mkd-system"} & set(allowed)
    namespaces = {d["metadata"]["name"]: d for d in agent if d["kind"] == "Namespace"}
    for ns in allowed:
        assert namespaces[ns]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"


def test_managedby_immutable_on_every_kind() -> None:
    policies = [d for d in docs("admission/managedby-immutable.yaml") if d["kind"] == "ValidatingAdmissionPolicy"]
    bindings = {d["spec"]["policyName"] for d in docs("admission/managedby-immutable.yaml")
                if d["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert {p["metadata"]["name"] for p in policies} == bindings
    for kind in KINDS:
        path = ".".join(kind.managed_by_path)
        covering = [p for p in policies
                    if any(kind.group in r["apiGroups"] and kind.plural in r["resources"]
                           and r["operations"] == ["UPDATE"] for r in p["spec"]["matchConstraints"]["resourceRules"])]
        if not kind.managed_by_path:
            # handed over by its queue label (LeaderWorkerSet, Pods): no managedBy field to keep immutable
            assert covering == [], kind.name
            continue
        assert len(covering) == 1, kind.name
        assert all(path.removeprefix("spec.") in v["expression"] for v in covering[0]["spec"]["variables"]), \
            (kind.name, path)


def test_settings_in_manifests_are_real_settings() -> None:
    """Every MKD_* variable the manifests set is one the service's settings class reads."""
    from mkctl.flags import settings_of
    from mkctl.services import agent_settings_class, dispatcher_settings_class

    for relative, cls in (("manager/dispatcher.yaml", dispatcher_settings_class()),
                          ("worker/agent.yaml", agent_settings_class())):
        known = {s.env for s in settings_of(cls)}
        files = docs(relative)
        env_from = {ref["name"] for d in files if d["kind"] == "Deployment"
                    for c in d["spec"]["template"]["spec"]["containers"] for e in c.get("envFrom", [])
                    for ref in (e.get("configMapRef"), e.get("secretRef")) if ref}
        for doc in files:
            if doc["kind"] in ("ConfigMap", "Secret") and doc["metadata"]["name"] in env_from:
                values = doc.get("data") or doc.get("stringData") or {}
                unknown = set(values) - known
                assert not unknown, f"{relative}: {unknown} are not settings of {cls.__name__}"
