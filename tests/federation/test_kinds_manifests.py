"""What deploy/ and the HandoverPolicy CRD list of the job kinds is generated from the registry: a stale file
fails here with the command that regenerates it, and a kind added to the registry reaches every list."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import yaml

from federation.kinds import manifests
from federation.kinds.batchjob import BATCH_JOB
from federation.kinds.registry import KINDS

ROOT = Path(__file__).resolve().parents[2]


def test_generated_blocks_are_current() -> None:
    assert manifests.stale(ROOT, KINDS) == [], "run `mkctl kinds --update` and commit the result"


def test_every_generated_file_is_valid_yaml() -> None:
    for path, text in manifests.render(ROOT, KINDS).items():
        assert list(yaml.safe_load_all(text)), path


def test_a_new_kind_reaches_rbac_webhook_policies_and_enum(tmp_path: Path) -> None:
    for block in manifests.BLOCKS:
        (tmp_path / block.path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / block.path, tmp_path / block.path)
    extra = dataclasses.replace(BATCH_JOB, name="Widget", group="widgets.example.com", version="v1",
                                plural="widgets", managed_by_path=("spec", "owner", "managedBy"))
    assert manifests.update(tmp_path, (*KINDS, extra))
    dispatcher = list(yaml.safe_load_all((tmp_path / "deploy/manager/dispatcher.yaml").read_text()))
    rules = next(d for d in dispatcher if d and d["kind"] == "ClusterRole")["rules"]
    assert {"apiGroups": ["widgets.example.com"], "resources": ["widgets"], "verbs": ["get", "list", "watch"]} in rules
    assert {"apiGroups": ["widgets.example.com"], "resources": ["widgets/status"], "verbs": ["patch"]} in rules
    agent = list(yaml.safe_load_all((tmp_path / "deploy/worker/agent.yaml").read_text()))
    writes = next(d for d in agent if d and d["metadata"]["name"] == "mkd-agent-workloads" and d["kind"] == "ClusterRole")
    assert {"apiGroups": ["widgets.example.com"], "resources": ["widgets"],
            "verbs": ["create", "update", "patch", "delete"]} in writes["rules"]
    hook = yaml.safe_load_all((tmp_path / "deploy/components/handover-webhook/webhook.yaml").read_text())
    config = next(d for d in hook if d["kind"] == "MutatingWebhookConfiguration")
    assert {"operations": ["CREATE"], "apiGroups": ["widgets.example.com"], "apiVersions": ["*"],
            "resources": ["widgets"]} in config["webhooks"][0]["rules"]
    policies = {d["metadata"]["name"]: d for d in
                yaml.safe_load_all((tmp_path / "deploy/admission/managedby-immutable.yaml").read_text())
                if d["kind"] == "ValidatingAdmissionPolicy"}
    owner = policies["mkd-managedby-immutable-owner"]
    assert owner["spec"]["variables"][0]["expression"] == (
        'has(oldObject.spec.owner) && has(oldObject.spec.owner.managedBy) ? oldObject.spec.owner.managedBy : ""')
    assert "mkd-managedby-immutable-runpolicy" in policies and "mkd-managedby-immutable-spec" in policies
    crd = yaml.safe_load((tmp_path / "dispatcher/handover/crds/handoverpolicies.handover.mkd.dev.yaml").read_text())
    kinds = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["kinds"]
    assert kinds["items"]["enum"] == [*(k.name for k in KINDS if k.managed_by_path), "Widget"]
    assert manifests.stale(tmp_path, (*KINDS, extra)) == []


def test_pods_have_rbac_but_no_handover_or_managedby_policy() -> None:
    """A Pod has no managedBy (its queue label and Kueue's admission gate opt it in): the dispatcher reads Pods and
    writes their status, but no HandoverPolicy routes them and no managedBy-immutable policy matches them."""
    rendered = manifests.render(ROOT, KINDS)
    rules = next(d for d in yaml.safe_load_all(rendered["deploy/manager/dispatcher.yaml"])
                 if d and d["kind"] == "ClusterRole")["rules"]
    assert {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]} in rules
    hook = next(d for d in yaml.safe_load_all(rendered["deploy/components/handover-webhook/webhook.yaml"])
                if d["kind"] == "MutatingWebhookConfiguration")
    assert all("pods" not in r["resources"] for r in hook["webhooks"][0]["rules"])
    policies = [d for d in yaml.safe_load_all(rendered["deploy/admission/managedby-immutable.yaml"])
                if d["kind"] == "ValidatingAdmissionPolicy"]
    assert all("pods" not in r["resources"] for p in policies for r in p["spec"]["matchConstraints"]["resourceRules"])
    crd = yaml.safe_load(rendered["dispatcher/handover/crds/handoverpolicies.handover.mkd.dev.yaml"])
    enum = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["kinds"]
    assert "Pod" not in enum["items"]["enum"]


def test_mkctl_kinds_lists_every_kind_and_who_runs_it() -> None:
    from typer.testing import CliRunner

    from mkctl.main import app

    result = CliRunner().invoke(app, ["kinds"])
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line.split() for line in result.output.splitlines()[1:]}
    assert set(rows) == {k.name for k in KINDS}
    for kind in KINDS:
        assert rows[kind.name][1] == kind.api_version and rows[kind.name][-1] == kind.run_by
    assert rows["RayJob"][-1] == "operator" and rows["PyTorchJob"][-1] == "agent"
