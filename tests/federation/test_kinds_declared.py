"""Kinds from configuration: the example declaration's PodSets, validation, suspend and finished; every invalid
declaration refused naming its field and the fix; the registry's scope of declared kinds; the settings check."""

from __future__ import annotations

import copy
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from federation import labels
from federation.errors import Invalid
from federation.kinds import registry
from federation.kinds.base import Finished
from federation.kinds.declared import DeclarationsInvalid, DeclaredKind, guess_plural, load, parse
from federation.kinds.registry import KINDS

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trainingrun"
D = Decimal
Obj = dict[str, Any]


def declaration() -> Obj:
    doc = yaml.safe_load((EXAMPLE / "kinds.yaml").read_text())
    assert isinstance(doc, dict)
    return doc


def trainingrun() -> DeclaredKind:
    [kind] = load(EXAMPLE / "kinds.yaml", KINDS)
    return kind


def job() -> Obj:
    doc = yaml.safe_load((EXAMPLE / "trainingrun.yaml").read_text())
    assert isinstance(doc, dict)
    return doc


def test_the_example_declares_trainingrun() -> None:
    kind = trainingrun()
    assert (kind.name, kind.api_version, kind.plural, kind.run_by) == ("TrainingRun", "example.com/v1",
                                                                     "trainingruns", "operator")
    assert kind.managed_by_path == ("spec", "managedBy") and kind.suspend_path == ("spec", "suspend")


def test_podsets_come_from_the_declared_paths() -> None:
    kind, run = trainingrun(), job()
    assert kind.validate(run) == []
    launcher, workers = kind.podsets(run)
    assert (launcher.name, launcher.count, workers.name, workers.count) == ("launcher", 1, "workers", 2)
    assert workers.requests == {"cpu": D("0.25"), "memory": D(256 * 2**20), "pods": D(1)}
    del run["spec"]["workers"]["replicas"]  # the declared defaultCount
    assert [p.count for p in kind.podsets(run)] == [1, 1]
    run["spec"]["workers"]["replicas"] = 0  # a PodSet of no pods is left out (and needs no template)
    del run["spec"]["workers"]["template"]
    assert [p.name for p in kind.podsets(run)] == ["launcher"]


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda j: j["spec"]["workers"].update(replicas="two"), "spec.workers.replicas"),
    (lambda j: j["spec"]["workers"].update(replicas=-1), "spec.workers.replicas"),
    (lambda j: j["spec"]["launcher"].pop("template"), "spec.launcher.template"),
    (lambda j: j["spec"]["workers"]["template"]["spec"]["containers"][0].pop("image"),
     "spec.workers.template.spec.containers[0].image"),
    (lambda j: j["spec"].update(suspend="yes"), "spec.suspend"),
    (lambda j: j["spec"].update(managedBy="example.com/other"), "spec.managedBy"),
], ids=["count-not-int", "count-negative", "no-template", "no-image", "suspend-not-bool", "managedby"])
def test_a_job_of_a_declared_kind_is_refused_naming_the_field(mutate: Callable[[Obj], None], field: str) -> None:
    run = job()
    mutate(run)
    errors = trainingrun().validate(run)
    assert field in [e.field for e in errors], errors
    with pytest.raises(Invalid):
        trainingrun().podsets(run)


def test_suspend_managedby_and_the_worker_copy() -> None:
    kind, run = trainingrun(), job()
    assert kind.managed_by(run) == labels.MULTIKUEUE
    assert kind.with_suspended(run, True)["spec"]["suspend"] is True and not kind.is_suspended(run)
    run["status"] = {"conditions": [{"type": "Succeeded", "status": "True"}]}
    copy_ = kind.prepare_for_worker(run, stamp={labels.ORIGIN: "mkd"}, managed_by=None)
    assert "managedBy" not in copy_["spec"] and "status" not in copy_  # as Kueue's generic adapter creates it
    assert copy_["metadata"]["labels"][labels.ORIGIN] == "mkd"


def test_finished_by_conditions_the_newest_wins() -> None:
    kind, run = trainingrun(), job()
    assert kind.finished(run) is None
    run["status"] = {"conditions": [{"type": "Running", "status": "True"}]}
    assert kind.finished(run) is None
    run["status"]["conditions"].append({"type": "Failed", "status": "True", "reason": "PodFailed", "message": "m"})
    assert kind.finished(run) == Finished("Failed", "PodFailed", "m")
    run["status"]["conditions"].append({"type": "Succeeded", "status": "True"})
    assert kind.finished(run) == Finished("Succeeded", "Succeeded", "")


def test_finished_by_a_status_field() -> None:
    doc = declaration()
    doc["externalFrameworks"][0]["success"] = {"field": "status.phase", "values": ["Completed", "Done"]}
    doc["externalFrameworks"][0]["failure"] = {"field": "status.phase", "values": ["Failed"]}
    [kind] = parse(doc, "kinds.yaml", KINDS)
    run = job()
    run["status"] = {"phase": "Running"}
    assert kind.finished(run) is None
    run["status"]["phase"] = "Done"
    assert kind.finished(run) == Finished("Succeeded", "Done", "")
    run["status"]["phase"] = "Failed"
    assert kind.finished(run) == Finished("Failed", "Failed", "")


def test_plural_is_guessed_as_kubernetes_does() -> None:
    assert [guess_plural(k) for k in ("TrainingRun", "Policy", "Class")] == ["trainingruns", "policies", "classes"]
    doc = declaration()
    del doc["externalFrameworks"][0]["plural"]
    assert parse(doc, "kinds.yaml", KINDS)[0].plural == "trainingruns"


def _at(path: list[Any], value: Any) -> Callable[[Obj], None]:
    def mutate(doc: Obj) -> None:
        node: Any = doc["externalFrameworks"][0]
        for step in path[:-1]:
            node = node[step]
        if value is _DELETE:
            del node[path[-1]]
        else:
            node[path[-1]] = value
    return mutate


_DELETE = object()
BROKEN: list[tuple[str, Callable[[Obj], None], str, str]] = [
    ("no name", _at(["name"], _DELETE), "externalFrameworks[0].name", "TrainingRun.v1.example.com"),
    ("name not GVK", _at(["name"], "TrainingRun"), "externalFrameworks[0].name", "e.g. TrainingRun.v1.example.com"),
    ("core group", _at(["name"], "TrainingRun.v1.core"), "externalFrameworks[0].name", "e.g. TrainingRun.v1.example.com"),
    ("bad version", _at(["name"], "TrainingRun.1.example.com"), "externalFrameworks[0].name", "e.g. TrainingRun.v1.example.com"),
    ("bad plural", _at(["plural"], "Training_Runs"), "externalFrameworks[0].plural", "spec.names.plural"),
    ("typo", _at(["podsets"], []), "externalFrameworks[0].podsets", "podSets"),
    ("managedBy path with index", _at(["managedByPath"], "spec.a[0]"), "externalFrameworks[0].managedByPath",
     "path of field names"),
    ("managedBy path empty step", _at(["managedByPath"], "spec..managedBy"), "externalFrameworks[0].managedByPath",
     "path of field names"),
    ("suspend is managedBy", _at(["suspendPath"], "spec.managedBy"), "externalFrameworks[0].suspendPath",
     "spec.suspend"),
    ("controller multikueue", _at(["controller"], labels.MULTIKUEUE), "externalFrameworks[0].controller",
     "own operator"),
    ("no podSets", _at(["podSets"], _DELETE), "externalFrameworks[0].podSets", "podSets: [{name: workers"),
    ("too many podSets", _at(["podSets"], [{"name": f"p{i}", "template": f"spec.p{i}"} for i in range(9)]),
     "externalFrameworks[0].podSets", "fewer"),
    ("podSet name", _at(["podSets", 0, "name"], "Launcher"), "externalFrameworks[0].podSets[0].name",
     "lower-case"),
    ("podSet twice", _at(["podSets", 1, "name"], "launcher"), "externalFrameworks[0].podSets[1].name",
     "its own name"),
    ("no template", _at(["podSets", 0, "template"], _DELETE), "externalFrameworks[0].podSets[0].template",
     "dotted path"),
    ("bad count path", _at(["podSets", 1, "count"], 3), "externalFrameworks[0].podSets[1].count", "dotted path"),
    ("bad defaultCount", _at(["podSets", 1, "defaultCount"], -1), "externalFrameworks[0].podSets[1].defaultCount",
     "e.g. 1"),
    ("podSet typo", _at(["podSets", 1, "replicas"], "spec.workers.replicas"),
     "externalFrameworks[0].podSets[1].replicas", "count"),
    ("no success", _at(["success"], _DELETE), "externalFrameworks[0].success", "conditionTypes"),
    ("both rules", _at(["failure"], {"conditionTypes": ["Failed"], "field": "status.phase", "values": ["F"]}),
     "externalFrameworks[0].failure", "conditionTypes"),
    ("neither rule", _at(["failure"], {}), "externalFrameworks[0].failure", "conditionTypes"),
    ("field without values", _at(["success"], {"field": "status.phase"}), "externalFrameworks[0].success.values",
     "Succeeded"),
    ("empty conditions", _at(["success"], {"conditionTypes": []}), "externalFrameworks[0].success.conditionTypes",
     "Succeeded"),
    ("values with conditions", _at(["success"], {"conditionTypes": ["Succeeded"], "values": ["x"]}),
     "externalFrameworks[0].success.values", "remove values"),
    ("a built-in kind", _at(["name"], "Job.v1.batch.x-k8s.io"), "externalFrameworks[0].name", "mkctl kinds"),
]


@pytest.mark.parametrize(("what", "mutate", "field", "fix"), BROKEN, ids=[b[0] for b in BROKEN])
def test_an_invalid_declaration_is_refused_naming_the_field_and_the_fix(
        what: str, mutate: Callable[[Obj], None], field: str, fix: str) -> None:
    doc = declaration()
    mutate(doc)
    with pytest.raises(DeclarationsInvalid) as caught:
        parse(doc, "kinds.yaml", KINDS)
    found = {e.field: e for e in caught.value.errors}
    assert field in found, (what, [str(e) for e in caught.value.errors])
    assert fix in found[field].fix, (what, found[field].fix)
    assert str(caught.value).startswith("kinds.yaml: ")


def test_a_kind_declared_twice_and_a_file_that_is_no_declaration() -> None:
    doc = declaration()
    doc["externalFrameworks"].append(copy.deepcopy(doc["externalFrameworks"][0]))
    with pytest.raises(DeclarationsInvalid) as caught:
        parse(doc, "kinds.yaml", KINDS)
    assert [e.field for e in caught.value.errors] == ["externalFrameworks[1].name"]
    for bad, field in (([1], "externalFrameworks"), ({"frameworks": []}, "frameworks"),
                       ({"externalFrameworks": {"a": 1}}, "externalFrameworks"),
                       ({"externalFrameworks": ["x"]}, "externalFrameworks[0]")):
        with pytest.raises(DeclarationsInvalid) as caught:
            parse(bad, "kinds.yaml", KINDS)
        assert caught.value.errors[0].field == field, bad
    assert parse(None, "kinds.yaml", KINDS) == () == parse({"externalFrameworks": []}, "kinds.yaml", KINDS)


def test_an_unreadable_or_broken_file(tmp_path: Path) -> None:
    with pytest.raises(DeclarationsInvalid, match="cannot be read"):
        load(tmp_path / "missing.yaml", KINDS)
    broken = tmp_path / "kinds.yaml"
    broken.write_text("externalFrameworks: [\n")
    with pytest.raises(DeclarationsInvalid, match="not valid YAML at line"):
        load(broken, KINDS)


def test_the_registry_knows_declared_kinds_while_declared() -> None:
    kind = trainingrun()
    assert registry.by_api("example.com/v1", "TrainingRun") is None
    with registry.declared([kind]):
        with registry.declared([kind]):  # a second service of the process, the same declarations
            assert registry.by_name("TrainingRun") is kind
        assert registry.by_api("example.com/v1", "TrainingRun") is kind  # still held by the first
        assert kind in registry.kinds()
        other = parse({"externalFrameworks": [{**declaration()["externalFrameworks"][0], "plural": "runs"}]},
                      "other.yaml", KINDS)
        with pytest.raises(Invalid, match="declared differently"), registry.declared(other):
            pass
    with pytest.raises(Invalid, match="declare it"):
        registry.by_name("TrainingRun")
    assert kind not in registry.kinds()


def test_a_service_with_an_invalid_kinds_file_refuses_to_start(tmp_path: Path) -> None:
    from dispatcher.settings import DispatcherSettings
    from worker_agent.settings import AgentSettings, FencerSettings

    doc = declaration()
    del doc["externalFrameworks"][0]["podSets"][0]["template"]
    bad = tmp_path / "kinds.yaml"
    bad.write_text(yaml.safe_dump(doc))
    for make in (lambda: DispatcherSettings(kinds_file=bad), lambda: AgentSettings(cluster_name="w", kinds_file=bad),
                 lambda: FencerSettings(cluster_name="w", kinds_file=bad)):
        with pytest.raises(ValidationError, match=r"externalFrameworks\[0\]\.podSets\[0\]\.template: is required"):
            make()
    good = DispatcherSettings(kinds_file=EXAMPLE / "kinds.yaml")
    assert [k.name for k in good.declared_kinds()] == ["TrainingRun"]


def test_mkctl_kinds_lists_checks_and_writes_the_manifests_of_declared_kinds(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from mkctl.main import app

    runner = CliRunner()
    listed = runner.invoke(app, ["kinds", "--kinds-file", str(EXAMPLE / "kinds.yaml")])
    assert listed.exit_code == 0, listed.output
    row = next(line.split() for line in listed.output.splitlines() if line.startswith("TrainingRun "))
    assert row == ["TrainingRun", "example.com/v1", "trainingruns", "spec.managedBy", "spec.suspend", "operator",
                   "(declared)"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("externalFrameworks: [{name: TrainingRun}]\n")
    refused = runner.invoke(app, ["kinds", "--kinds-file", str(bad)])
    assert refused.exit_code == 2
    assert "externalFrameworks[0].name: 'TrainingRun' is not Kind.version.group" in refused.output
    out = tmp_path / "manifests"
    wrote = runner.invoke(app, ["kinds", "--kinds-file", str(EXAMPLE / "kinds.yaml"), "--manifests", str(out),
                                "--namespace", "team-a", "--namespace", "team-b"])
    assert wrote.exit_code == 0, wrote.output
    docs = {name: list(yaml.safe_load_all((out / f"{name}.yaml").read_text()))
            for name in ("manager", "worker", "admission")}
    roles = {d["metadata"]["name"]: d for ds in docs.values() for d in ds if d["kind"] == "ClusterRole"}
    assert {"apiGroups": ["example.com"], "resources": ["trainingruns/status"], "verbs": ["patch"]} in \
        roles["mkd-dispatcher-declared-kinds"]["rules"]
    assert {"apiGroups": ["example.com"], "resources": ["trainingruns"],
            "verbs": ["create", "update", "patch", "delete"]} in roles["mkd-agent-declared-kinds-workloads"]["rules"]
    assert {"apiGroups": ["example.com"], "resources": ["trainingruns"], "verbs": ["patch"]} in \
        roles["mkd-fencer-declared-kinds"]["rules"]
    bound = sorted((d["metadata"].get("namespace"), d["subjects"][0]["name"]) for d in docs["worker"]
                   if d["kind"] == "RoleBinding")
    assert bound == [("team-a", "mkd-agent"), ("team-b", "mkd-agent")]
    policies = [d for d in docs["admission"] if d["kind"].startswith("ValidatingAdmissionPolicy")]
    assert {d["metadata"]["name"] for d in policies} == {"mkd-managedby-immutable-declared-spec"}
    assert [d["spec"]["policyName"] for d in policies if d["kind"].endswith("Binding")] == \
        ["mkd-managedby-immutable-declared-spec"]
    shipped = (Path(__file__).resolve().parents[2] / "deploy" / "admission" / "managedby-immutable.yaml").read_text()
    assert "mkd-managedby-immutable-declared" not in shipped  # beside deploy/'s policies, never over them


async def test_a_dispatcher_knows_its_declared_kinds_only_while_it_runs(tmp_path: Path) -> None:
    from dispatcher.app import Dispatcher
    from dispatcher.settings import DispatcherSettings

    broken = DispatcherSettings(kinds_file=EXAMPLE / "kinds.yaml", database_url="postgresql+nope://x/y",
                                kube={"kubeconfig": tmp_path / "missing.kubeconfig"})
    dispatcher = Dispatcher(broken)
    assert [k.name for k in dispatcher.kinds if k.name == "TrainingRun"] == ["TrainingRun"]
    with pytest.raises(Exception):  # noqa: B017 - whatever stops it starting, the scope is left
        await dispatcher.__aenter__()
    assert registry.by_api("example.com/v1", "TrainingRun") is None


def test_the_admin_commands_filter_by_a_declared_kind_with_the_dispatchers_kinds_file(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from mkctl.admin import workload_filter

    with pytest.raises(Invalid, match="MKD_DISPATCHER_KINDS_FILE names it"):
        workload_filter(kind="trainingrun")
    monkeypatch.setenv("MKD_DISPATCHER_KINDS_FILE", str(EXAMPLE / "kinds.yaml"))
    assert workload_filter(kind="trainingrun").kind == "TrainingRun"
    assert registry.by_api("example.com/v1", "TrainingRun") is None  # known for the parse only
