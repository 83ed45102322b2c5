"""mkctl's command line: output formats, one-line errors, flags generated from the settings classes.

The admin commands run against a real SQLite database built by the alembic migrations (``mkctl db
upgrade``) and filled through the dispatcher's table definitions, then read back through the CLI
in each output format.
"""

from __future__ import annotations

import asyncio
import json
import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict
from typer.testing import CliRunner

from federation.errors import Invalid, Transport
from federation.settings import KubeSettings, MqttSettings
from mkctl import flags
from mkctl.errors import EXIT_USAGE, CommandFailed, describe
from mkctl.main import app
from mkctl.output import Column, OutputFormat, render, table
from tests.conftest import postgres_available

runner = CliRunner()


def invoke(*args: str, env: dict[str, str] | None = None) -> Any:
    return runner.invoke(app, list(args), env=env or {}, catch_exceptions=False)


def error_lines(result: Any) -> list[str]:
    text = result.stderr if hasattr(result, "stderr") else result.output
    return [line for line in text.splitlines() if line.strip()]


# --- a database with a little history ------------------------------------------------------------


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    url = f"sqlite+aiosqlite:///{tmp_path / 'mkd.db'}"
    result = invoke("db", "upgrade", "--database-url", url)
    assert result.exit_code == 0, result.output
    asyncio.run(_fill(url))
    return url


async def _fill(url: str) -> None:
    from dispatcher.db import make_engine
    from dispatcher.db.models import clusters, events, placements, workloads

    engine = make_engine(url)
    now = datetime.now(UTC)  # at fill time: the health column compares heartbeats with the clock
    try:
        async with engine.begin() as conn:
            base = {"api_version": "kubeflow.org/v1", "queue": "default", "requests": {}, "podsets": [],
                    "excluded": [], "created_at": now - timedelta(minutes=5), "updated_at": now}
            await conn.execute(workloads.insert(), [
                {**base, "uid": "uid-1", "namespace": "team-a", "name": "bert", "kind": "PyTorchJob",
                 "state": "running", "attempt": 1, "cluster": "worker-2", "reason": ""},
                {**base, "uid": "uid-2", "namespace": "team-a", "name": "huge", "kind": "PyTorchJob",
                 "state": "pending", "attempt": 0, "cluster": None,
                 "reason": "needs 64 nvidia.com/gpu in one cluster; most free: worker-3 has 8"},
            ])
            await conn.execute(placements.insert(), [
                {"workload_uid": "uid-1", "attempt": 1, "cluster": "worker-2", "epoch": 7, "state": "running",
                 "created_at": now - timedelta(minutes=4), "accepted_at": now - timedelta(minutes=4)},
            ])
            await conn.execute(events.insert(), [
                {"workload_uid": "uid-1", "at": now - timedelta(minutes=4), "type": "placed",
                 "cluster": "worker-2", "reason": "Placed", "message": "placed on worker-2"},
            ])
            await conn.execute(clusters.insert(), [
                {"name": "worker-1", "labels": {"zone": "a"}, "capacity": {"free": {"cpu": "8"}}, "kinds": {},
                 "online": True, "interval_seconds": 10.0, "last_heartbeat": now - timedelta(minutes=2),
                 "updated_at": now},
                {"name": "worker-2", "labels": {}, "capacity": {"free": {"cpu": "60", "nvidia.com/gpu": "0"}},
                 "kinds": {}, "online": True, "interval_seconds": 10.0, "last_heartbeat": now, "updated_at": now},
                {"name": "worker-3", "labels": {}, "capacity": {}, "kinds": {}, "online": False,
                 "interval_seconds": 10.0, "last_heartbeat": now - timedelta(hours=1), "updated_at": now},
            ])
    finally:
        await engine.dispose()


# --- admin views -----------------------------------------------------------------------------------


def test_placements_list_table_shows_pending_and_placed_workloads(db_url: str) -> None:
    result = invoke("placements", "list", "--database-url", db_url)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split()[:7] == ["NAMESPACE", "JOB", "KIND", "QUEUE", "CLUSTER", "STATE", "REASON"]
    bert = next(line for line in lines if " bert " in line)
    assert "worker-2" in bert and "running" in bert
    huge = next(line for line in lines if " huge " in line)
    assert "pending" in huge and "needs 64 nvidia.com/gpu" in huge
    assert "UID" not in lines[0]


def test_placements_list_wide_adds_attempt_epoch_and_uid(db_url: str) -> None:
    result = invoke("placements", "list", "-o", "wide", "--database-url", db_url)
    assert result.exit_code == 0, result.output
    assert {"ATTEMPT", "EPOCH", "UID"} <= set(result.output.splitlines()[0].split())
    assert "uid-1" in result.output


def test_placements_list_json_and_yaml_carry_every_field(db_url: str) -> None:
    as_json = json.loads(invoke("placements", "list", "-o", "json", "--database-url", db_url).output)
    assert as_json["kind"] == "PlacementList"
    by_name = {item["name"]: item for item in as_json["items"]}
    assert by_name["bert"]["cluster"] == "worker-2" and by_name["bert"]["epoch"] == 7
    assert by_name["huge"]["state"] == "pending" and by_name["huge"]["cluster"] is None
    assert by_name["bert"]["created_at"].endswith("Z")
    as_yaml = yaml.safe_load(invoke("placements", "list", "-o", "yaml", "--database-url", db_url).output)
    assert as_yaml == as_json


def test_placements_list_filters(db_url: str) -> None:
    result = invoke("placements", "list", "--state", "pending", "-o", "json", "--database-url", db_url)
    assert [i["name"] for i in json.loads(result.output)["items"]] == ["huge"]
    result = invoke("placements", "list", "--cluster", "worker-9", "--database-url", db_url)
    assert result.output.strip() == "No resources found."


def test_placements_show_prints_history(db_url: str) -> None:
    result = invoke("placements", "show", "team-a/bert", "--database-url", db_url)
    assert result.exit_code == 0, result.output
    assert "Placements:" in result.output and "Events:" in result.output
    assert "placed on worker-2" in result.output
    data = json.loads(invoke("placements", "show", "uid-1", "-o", "json", "--database-url", db_url).output)
    assert data["name"] == "bert" and data["placements"][0]["cluster"] == "worker-2"
    assert data["events"][0]["type"] == "placed"


def test_placements_show_unknown_job_is_one_line(db_url: str) -> None:
    result = invoke("placements", "show", "team-a/nope", "--database-url", db_url)
    assert result.exit_code == 1
    lines = error_lines(result)
    assert len(lines) == 1 and lines[0].startswith("error: job: no workload 'team-a/nope'")
    assert "Traceback" not in result.output


def test_clusters_list_health_from_heartbeat_age(db_url: str) -> None:
    result = invoke("clusters", "list", "-o", "json", "--database-url", db_url)
    items = {i["name"]: i for i in json.loads(result.output)["items"]}
    assert items["worker-1"]["health"] == "stale"  # 2 min > 3 x 10 s
    assert items["worker-2"]["health"] == "online" and items["worker-2"]["running"] == 1
    assert items["worker-3"]["health"] == "offline"
    table_out = invoke("clusters", "list", "--database-url", db_url).output
    assert table_out.splitlines()[0].split()[:3] == ["CLUSTER", "HEALTH", "HEARTBEAT"]


def test_database_url_from_environment(db_url: str) -> None:
    result = invoke("clusters", "list", "-o", "json", env={"MKD_DATABASE_URL": db_url})
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.output)["items"]) == 3


# --- errors ----------------------------------------------------------------------------------------


def test_missing_schema_is_one_line_naming_the_fix(tmp_path: Path) -> None:
    result = invoke("placements", "list", "--database-url", f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}")
    assert result.exit_code == 1
    lines = error_lines(result)
    assert len(lines) == 1 and lines[0].startswith("error: database:") and "mkctl db upgrade" in lines[0]


def test_bad_database_url_names_the_flag() -> None:
    result = invoke("placements", "list", "--database-url", "nosuch://x")
    lines = error_lines(result)
    assert result.exit_code == 2 and len(lines) == 1  # a bad flag value is a usage error
    assert lines[0].startswith("error: --database-url:") and "postgresql+asyncpg://" in lines[0]


def test_db_upgrade_waits_for_a_database_that_is_not_up_yet(tmp_path: Path) -> None:
    """``--wait`` (the deployment's init container) rides out a database that is not reachable yet and
    says so when it stays away; a reachable one is upgraded as without it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there: refused, as a database still starting
    result = invoke("db", "upgrade", "--database-url", f"postgresql+asyncpg://mkd@127.0.0.1:{port}/mkd", "--wait", "1")
    errors = [line for line in error_lines(result) if line.startswith("error:")]
    assert result.exit_code == 1 and len(errors) == 1, result.output
    assert "still unreachable after 1s" in errors[0] and "ConnectionRefusedError" in errors[0]
    url = f"sqlite+aiosqlite:///{tmp_path / 'waited.db'}"
    result = invoke("db", "upgrade", "--database-url", url, "--wait", "30")
    assert result.exit_code == 0 and "is at the current schema" in result.output


def test_unknown_output_format_is_a_usage_error(db_url: str) -> None:
    result = invoke("placements", "list", "-o", "xml", "--database-url", db_url)
    assert result.exit_code == 2


def test_debug_lets_the_traceback_through() -> None:
    with pytest.raises(Exception):  # noqa: B017 - any failure; the point is that it is not swallowed
        invoke("--debug", "placements", "list", "--database-url", "nosuch://x")


@pytest.mark.parametrize("where", ["first", "after the command"])
def test_debug_is_taken_anywhere_on_the_line(where: str) -> None:
    """Errors say "rerun with --debug", and the README's ``make demo DEMO_ARGS=--debug`` puts it after
    ``demo``: both places turn debugging on rather than failing with "No such option"."""
    args = ["settings", "no-such-service"]
    args = ["--debug", *args] if where == "first" else [*args, "--debug"]
    result = runner.invoke(app, args, env={})
    assert isinstance(result.exception, CommandFailed), result.output  # raised, not printed as one line
    assert "No such option" not in result.output


def test_demo_accepts_debug_after_the_command() -> None:
    result = runner.invoke(app, ["demo", "--debug", "--help"], env={})
    assert result.exit_code == 0 and "--keep-running" in result.output, result.output


@pytest.mark.skipif(not postgres_available(), reason="needs a PostgreSQL (the shared one, read only)")
def test_a_missing_postgresql_database_says_how_to_create_it() -> None:
    url = "postgresql+asyncpg://postgres@127.0.0.1:5432/mkd_no_such_database"
    for args in (["db", "upgrade"], ["workloads", "list"]):
        result = invoke(*args, "--database-url", url)
        lines = error_lines(result)
        assert result.exit_code == 1 and len(lines) == 1, result.output
        assert 'database "mkd_no_such_database" does not exist' in lines[0]
        assert "createdb" in lines[0] and "mkctl db upgrade" in lines[0], lines[0]


def test_version() -> None:
    result = invoke("--version")
    assert result.exit_code == 0 and result.output.startswith("mkctl ")


def test_describe_maps_the_error_tree() -> None:
    assert describe(Invalid("spec.x", "must be positive", fix="set 1"))[0] == "spec.x: must be positive; set 1"
    assert describe(Invalid("spec.x", "bad"))[1] == EXIT_USAGE
    assert "check the address" in describe(Transport("broker 127.0.0.1:1 refused"))[0]
    assert describe(CommandFailed("x", code=3)) == ("x", 3)
    message, code = describe(RuntimeError("boom\nsecond line"))
    assert message.startswith("RuntimeError: boom") and "--debug" in message and code == 1


# --- flags generated from settings ---------------------------------------------------------------


class ToySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MKD_TOY_", env_nested_delimiter="__", extra="forbid")

    kube: KubeSettings = Field(default_factory=KubeSettings)
    """The cluster."""
    database_url: str = "sqlite+aiosqlite:///toy.db"
    """Where rows go."""
    heartbeat_seconds: float = Field(default=10.0, gt=0)
    """Seconds between heartbeats."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Cluster labels."""
    dry_run: bool = False
    """Change nothing."""
    mqtt: MqttSettings = Field(default_factory=MqttSettings)
    """The broker."""


def _toy_app() -> Any:
    import typer

    seen: list[BaseModel] = []
    toy = typer.Typer()
    toy.command("run")(flags.settings_command(ToySettings, lambda s: seen.append(s), name="run", doc="Toy."))

    @toy.command("noop")
    def noop() -> None:
        """A second command so `run` stays a sub-command."""

    return toy, seen


def test_settings_flags_names_env_and_docs() -> None:
    by_flag = {s.flag: s for s in flags.settings_of(ToySettings)}
    assert {"--kubeconfig", "--context", "--database-url", "--heartbeat-seconds", "--labels", "--dry-run",
            "--mqtt-url", "--mqtt-topic-root"} <= set(by_flag)
    assert by_flag["--mqtt-url"].env == "MKD_TOY_MQTT__URL"
    assert by_flag["--heartbeat-seconds"].doc == "Seconds between heartbeats."
    assert by_flag["--mqtt-url"].default == "mqtt://127.0.0.1:1883"
    assert "| `--database-url` | `MKD_TOY_DATABASE_URL` | `sqlite+aiosqlite:///toy.db` | Where rows go. |" in \
        flags.reference_markdown(ToySettings)


def test_flag_beats_env_beats_default() -> None:
    toy, seen = _toy_app()
    env = {"MKD_TOY_MQTT__URL": "mqtt://env:1883", "MKD_TOY_HEARTBEAT_SECONDS": "3",
           "MKD_TOY_MQTT__TOPIC_ROOT": "from-env/v1"}
    result = runner.invoke(toy, ["run", "--mqtt-url", "mqtt://flag:1883", "--labels", "zone=a,gpu=yes",
                                 "--dry-run", "--kubeconfig", "/tmp/kc"], env=env)
    assert result.exit_code == 0, result.output
    settings = seen[0]
    assert isinstance(settings, ToySettings)
    assert settings.mqtt.url == "mqtt://flag:1883" and settings.mqtt.topic_root == "from-env/v1"
    assert settings.heartbeat_seconds == 3.0 and settings.labels == {"zone": "a", "gpu": "yes"}
    assert settings.dry_run is True and settings.kube.kubeconfig == Path("/tmp/kc")
    assert settings.database_url == "sqlite+aiosqlite:///toy.db"


def test_invalid_setting_names_flag_and_env() -> None:
    toy, _ = _toy_app()
    result = runner.invoke(toy, ["run", "--heartbeat-seconds", "-1"])
    assert isinstance(result.exception, CommandFailed)
    assert result.exception.code == EXIT_USAGE
    assert result.exception.message.startswith("--heartbeat-seconds / MKD_TOY_HEARTBEAT_SECONDS:")
    result = runner.invoke(toy, ["run", "--labels", "novalue"])
    assert isinstance(result.exception, CommandFailed) and "key=value" in result.exception.message


def test_service_commands_take_their_settings_flags() -> None:
    result = invoke("dispatcher", "--help")
    assert result.exit_code == 0
    for flag in ("--database-url", "--mqtt-url", "--kubeconfig", "--heartbeat-timeout-seconds"):
        assert flag in result.output


def test_service_command_bad_setting_is_one_line() -> None:
    result = invoke("dispatcher", "--heartbeat-timeout-seconds", "0")
    assert result.exit_code == EXIT_USAGE
    lines = error_lines(result)
    assert len(lines) == 1
    assert lines[0].startswith("error: --heartbeat-timeout-seconds / MKD_DISPATCHER_HEARTBEAT_TIMEOUT_SECONDS:")


# --- output helpers ----------------------------------------------------------------------------------


def test_table_aligns_and_hides_wide_columns() -> None:
    rows: list[dict[str, Any]] = [{"a": "x", "b": None, "c": "long value"}, {"a": "yyyy", "b": 2, "c": "z"}]
    cols = [Column("a", "a"), Column("bee", "b"), Column("c", "c", wide=True)]
    assert table(rows, cols).splitlines() == ["A      BEE", "x      -", "yyyy   2"]
    assert table(rows, cols, wide=True).splitlines()[0] == "A      BEE   C"
    assert render([], cols, OutputFormat.table) == "No resources found."
    assert json.loads(render(rows, cols, OutputFormat.json))["items"][1]["a"] == "yyyy"


# --- the configuration reference (docs/CONFIGURATION.md) --------------------------------------------


@pytest.mark.parametrize("service", ["dispatcher", "agent", "fencer"])
def test_readme_configuration_reference_lists_every_setting(service: str) -> None:
    """Every setting's flag and env var is in docs/CONFIGURATION.md's table (wording may lag; names may not)."""
    from mkctl.services import (
        agent_settings_class,
        dispatcher_settings_class,
        fencer_settings_class,
        reference_markers,
    )

    cls = {"dispatcher": dispatcher_settings_class, "agent": agent_settings_class,
           "fencer": fencer_settings_class}[service]()
    root = Path(__file__).resolve().parents[1]
    reference = (root / "docs" / "CONFIGURATION.md").read_text(encoding="utf-8")
    begin, end = reference_markers(service)
    current = reference.partition(begin)[2].partition(end)[0]
    missing = [s.flag for s in flags.settings_of(cls) if f"| `{s.flag}` | `{s.env}` |" not in current]
    assert not missing, f"docs/CONFIGURATION.md lacks {missing}: run " \
                        f"`mkctl settings {service} --update docs/CONFIGURATION.md`"


# --- the demo's reading of a manager Job -------------------------------------------------------------


def _sample(**run_policy: Any) -> Any:
    from mkctl.jobs import Sample, expectation

    manifest = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                "metadata": {"name": "j", "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"runPolicy": dict(run_policy), "pytorchReplicaSpecs": {}}}
    return Sample(manifest, Path("j.yaml"), expectation(manifest))


def _with_status(sample: Any, *conditions: dict[str, Any], **status: Any) -> dict[str, Any]:
    return {**sample.manifest, "status": {"conditions": list(conditions), **status}}


def test_demo_expectations_from_managed_by_and_name() -> None:
    from mkctl.jobs import expectation

    assert _sample(managedBy="kueue.x-k8s.io/multikueue").expect == "Succeeded"
    assert _sample(managedBy="kubeflow.org/training-operator").expect == "Untouched"
    assert _sample().expect == "Untouched"
    big = {**_sample(managedBy="kueue.x-k8s.io/multikueue").manifest}
    assert expectation(big, Path("special/too-large.yaml")) == "Pending"


def test_demo_observes_pending_running_finished_and_untouched() -> None:
    from mkctl.jobs import observe, reached

    mine = _sample(managedBy="kueue.x-k8s.io/multikueue")
    pending = _with_status(mine, {"type": "MultiClusterDispatched", "status": "False", "reason": "NoFittingCluster",
                                  "message": "needs 32 nvidia.com/gpu; most free: worker-3 has 8"})
    obs = observe(mine, pending)
    assert (obs.state, obs.cluster) == ("Pending", "") and "worker-3 has 8" in obs.reason
    placed = {"type": "MultiClusterDispatched", "status": "True", "reason": "Placed",
              "message": "placed on cluster worker-2 (attempt 1)"}
    obs = observe(mine, _with_status(mine, placed, {"type": "Created", "status": "True"},
                                     {"type": "Running", "status": "True"}))
    assert (obs.state, obs.cluster) == ("Running", "worker-2") and not reached(mine, obs)
    done = _with_status(mine, placed, {"type": "Succeeded", "status": "True", "reason": "PyTorchJobSucceeded",
                                       "lastTransitionTime": "2026-01-01T00:00:05Z"},
                        completionTime="2026-01-01T00:00:05Z")
    obs = observe(mine, done)
    assert obs.state == "Succeeded" and reached(mine, obs) and obs.elapsed() == 5.0
    other = _sample(managedBy="kubeflow.org/training-operator")
    assert observe(other, other.manifest).state == "Untouched"
    touched = {**other.manifest, "metadata": {**other.manifest["metadata"], "labels": {"mkd.dev/origin": "x"}}}
    assert observe(other, touched).state == "Touched"
    assert observe(mine, None).state == "Missing"


@pytest.mark.parametrize("url,what", [("ftp://127.0.0.1:1883", "scheme"), ("mqtt://127.0.0.1:99999", "port")])
@pytest.mark.parametrize("service", [["dispatcher"], ["agent", "--cluster-name", "w1"]])
def test_a_bad_mqtt_url_stops_a_service_with_one_line_and_a_nonzero_code(
        service: list[str], url: str, what: str, tmp_path: Path) -> None:
    result = runner.invoke(app, [*service, "--mqtt-url", url], env={"MKD_DISPATCHER_DATABASE_URL":
                                                                     f"sqlite+aiosqlite:///{tmp_path}/x.db"})
    assert result.exit_code != 0
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and what in lines[0] and "Traceback" not in result.output, result.output


@pytest.mark.parametrize("service", ["dispatcher", "agent"])
@pytest.mark.parametrize("content", ["garbage: [", "apiVersion: v1\nkind: Config\n"])
def test_an_unusable_kubeconfig_is_a_usage_error_naming_the_flag(tmp_path: Path, service: str, content: str) -> None:
    kubeconfig = tmp_path / "bad.kubeconfig"
    kubeconfig.write_text(content)
    extra = (["--database-url", f"sqlite+aiosqlite:///{tmp_path / 'd.db'}"] if service == "dispatcher"
             else ["--cluster-name", "w1"])
    result = invoke(service, "--kubeconfig", str(kubeconfig), *extra)
    errors = [line for line in error_lines(result) if line.startswith("error:")]
    assert result.exit_code == EXIT_USAGE and len(errors) == 1, result.output
    assert "kubeconfig" in errors[0] and "--kubeconfig" in errors[0], errors[0]
    assert "rerun with --debug" not in errors[0]  # a known mistake, said plainly, not an unexpected failure
