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
    role = next(d for d in docs("worker/agent.yaml") if d["kind"] == "ClusterRole")
    for kind in KINDS:
        for verb in ("create", "delete", "watch"):
            assert granted(role, kind.group, kind.plural, verb), (kind.name, verb)
        assert granted(role, kind.group, f"{kind.plural}/status", "update"), kind.name
    for resource in ("pods", "services", "configmaps", "secrets"):
        assert granted(role, "", resource, "create"), resource


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
        for doc in docs(relative):
            if doc["kind"] in ("ConfigMap", "Secret"):
                values = doc.get("data") or doc.get("stringData") or {}
                unknown = set(values) - known
                assert not unknown, f"{relative}: {unknown} are not settings of {cls.__name__}"
