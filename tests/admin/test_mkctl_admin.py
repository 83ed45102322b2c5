"""mkctl's admin verbs against a real migrated database: the state filter, the order, the outputs, then the verbs.

The first tests hold: ``--state`` takes any case and refuses an unknown state with the list; lists come in
creation order; ``show`` of a Job mkd never claimed names who manages it; the demo prints mkctl as it can be
typed after ``make demo``; ``--kind``, ``--queue``, ``--label``, ``-w`` and ``events`` work.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from mkctl.main import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


def invoke(*args: str) -> Any:
    return runner.invoke(app, list(args), env={}, catch_exceptions=False)


def names(result: Any) -> list[str]:
    assert result.exit_code == 0, result.output
    return [i["name"] for i in json.loads(result.output)["items"]]


# --- the named defects ----------------------------------------------------------------------------


def test_state_filter_takes_the_demos_spelling(admin_db: str) -> None:
    for spelling in ("Pending", "pending", "PENDING"):
        assert names(invoke("workloads", "list", "--state", spelling, "-o", "json", "--database-url", admin_db)) \
            == ["alpha"]
    assert names(invoke("placements", "list", "--state", "Running", "-o", "json", "--database-url", admin_db)) \
        == ["zeta"]


def test_unknown_state_is_refused_naming_the_flag_and_the_states(admin_db: str) -> None:
    result = invoke("workloads", "list", "--state", "bogus", "--database-url", admin_db)
    assert result.exit_code == 2
    assert "No resources found" not in result.output
    line = result.output.strip()
    assert line.startswith("error: --state: 'bogus' is not a Workload state")
    from dispatcher.states import WorkloadState

    for state in WorkloadState:
        assert state.value in line


def test_lists_are_in_creation_order_not_uid_order(admin_db: str) -> None:
    # old (1 h ago), then zeta and alpha (same batch: by name), then newest; uids sort the other way
    order = names(invoke("workloads", "list", "-o", "json", "--database-url", admin_db))
    assert order == ["old", "alpha", "zeta", "newest"]
    table = invoke("workloads", "list", "--database-url", admin_db).output.splitlines()[1:]
    assert [line.split()[1] for line in table] == order


async def _manager_with_foreign_job(tmp: Path) -> Any:
    import kubesim
    from federation.kinds.registry import by_name
    from federation.kube import Kube, resource_for
    from tests.dispatcher.harness import install_crd

    spec = kubesim.ClusterSpec(name="manager", nodes=[kubesim.NodeSpec(name="m1")])
    cm = kubesim.serve_async([spec], tmp / "sim")
    sim = await cm.__aenter__()
    path = sim.kubeconfig("manager")
    await install_crd(path)
    import yaml

    job = yaml.safe_load((ROOT / "examples" / "special" / "other-controller.yaml").read_text())
    async with Kube(path) as kube:
        await kube.create(resource_for(by_name("PyTorchJob")), job, "default")  # type: ignore[arg-type]
    return cm, path


def test_show_of_a_job_left_to_another_controller_says_so(admin_db: str, tmp_path: Path) -> None:
    import asyncio

    async def scenario() -> Any:
        cm, path = await _manager_with_foreign_job(tmp_path)
        try:
            return await asyncio.to_thread(invoke, "workloads", "show", "other-controller", "--database-url",
                                           admin_db, "--kubeconfig", str(path))
        finally:
            await cm.__aexit__(None, None, None)

    result = asyncio.run(scenario())
    assert result.exit_code == 0  # the Job exists and another controller runs it: an answer, not an error
    assert "left to kubeflow.org/training-operator" in result.output and "error" not in result.output
    assert "spec.runPolicy.managedBy" in result.output
    # without a way to the manager cluster, the message says what mkd claims and how to learn more
    result = invoke("placements", "show", "other-controller", "--database-url", admin_db)
    assert result.exit_code == 1 and "--kubeconfig" in result.output and "kueue.x-k8s.io/multikueue" in result.output


def test_demo_hints_run_as_printed(admin_db: str) -> None:
    from mkctl.demo import inspect_hints

    hints = inspect_hints(admin_db, "team-a/zeta")
    assert {h.split()[1] for h in hints} >= {"workloads", "clusters", "events"}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = shlex.split(hints[0])  # the executable as printed, run for real once
    assert Path(argv[0]).exists() or argv[0] == "mkctl" or argv[0] == sys.executable, argv[0]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=Path.cwd(), timeout=60)
    assert done.returncode == 0, (hints[0], done.stderr)
    assert "zeta" in done.stdout
    for hint in hints:  # every printed command line is accepted as printed
        result = invoke(*[a for a in shlex.split(hint)[1:] if a != "-m" and a != "mkctl.main"])
        assert result.exit_code == 0, (hint, result.output)


def test_mkctl_command_is_runnable_where_mkctl_is_not_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from mkctl.admin import mkctl_command

    monkeypatch.setenv("PATH", "/nonexistent")
    command = mkctl_command()
    assert command != "mkctl"
    assert Path(shlex.split(command)[0]).exists()


# --- filters --------------------------------------------------------------------------------------


def test_kind_queue_and_label_filters(admin_db: str) -> None:
    url = ("--database-url", admin_db, "-o", "json")
    assert names(invoke("workloads", "list", "--kind", "jobset", *url)) == ["old"]
    assert names(invoke("workloads", "list", "--queue", "research", *url)) == ["zeta"]
    assert names(invoke("workloads", "list", "--label", "team=nlp", *url)) == ["zeta", "newest"]
    assert names(invoke("workloads", "list", "-l", "team=nlp,kueue.x-k8s.io/queue-name=research", *url)) == ["zeta"]
    assert names(invoke("workloads", "list", "-n", "default", "--cluster", "worker-1", *url)) == ["old", "newest"]


def test_bad_kind_and_label_are_usage_errors(admin_db: str) -> None:
    result = invoke("workloads", "list", "--kind", "Deployment", "--database-url", admin_db)
    assert result.exit_code == 2 and "--kind: 'Deployment' is not a job kind" in result.output and "PyTorchJob" in result.output
    result = invoke("workloads", "list", "--label", "team", "--database-url", admin_db)
    assert result.exit_code == 2 and "--label: 'team' is not a key=value selector" in result.output


def _later(delay: float, fn: Any) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        fn()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _set_state(url: str, uid: str, state: str) -> None:
    import asyncio

    import sqlalchemy as sa

    from dispatcher import db
    from dispatcher.db.models import workloads

    async def run() -> None:
        engine = db.make_engine(url)
        async with engine.begin() as conn:
            await conn.execute(sa.update(workloads).where(workloads.c.uid == uid).values(state=state))
        await engine.dispose()

    asyncio.run(run())


def test_watch_prints_a_line_per_change(admin_db: str) -> None:
    thread = _later(1.2, lambda: _set_state(admin_db, "0-uid", "running"))
    result = invoke("workloads", "list", "-w", "--watch-for", "2.5", "--database-url", admin_db)
    thread.join()
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("NAMESPACE") and len(lines) == 1 + 4 + 1, lines
    assert "newest" in lines[-1] and "running" in lines[-1]


# --- events ---------------------------------------------------------------------------------------


def test_events_across_all_workloads(admin_db: str) -> None:
    result = invoke("events", "--database-url", admin_db)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split()[:4] == ["AT", "NAMESPACE", "JOB", "TYPE"]
    assert [line.split()[3] if "cluster_lost" not in line else "cluster_lost" for line in lines[1:]] == [
        "claimed", "placed", "pending", "cluster_lost"]
    items = json.loads(invoke("events", "--for", "team-a/alpha", "-o", "json", "--database-url", admin_db).output)
    assert [(i["name"], i["type"]) for i in items["items"]] == [("alpha", "pending")]
    items = json.loads(invoke("events", "--cluster", "worker-3", "-o", "json", "--database-url", admin_db).output)
    assert [i["type"] for i in items["items"]] == ["cluster_lost"]
    result = invoke("events", "--type", "nonsense", "--database-url", admin_db)
    assert result.exit_code == 2 and "--type" in result.output


def test_events_watch_prints_new_rows(admin_db: str) -> None:
    import asyncio
    from datetime import UTC, datetime

    from dispatcher import db
    from dispatcher.db.models import events

    async def add() -> None:
        engine = db.make_engine(admin_db)
        async with engine.begin() as conn:
            await conn.execute(events.insert().values(workload_uid="b-uid", at=datetime.now(UTC), type="requeued",
                                                      message="requeued by admin"))
        await engine.dispose()

    thread = _later(1.2, lambda: asyncio.run(add()))
    result = invoke("events", "-w", "--watch-for", "2.5", "--database-url", admin_db)
    thread.join()
    assert result.output.splitlines()[-1].split()[1:4] == ["team-a", "alpha", "requeued"]


def test_clusters_list_shows_cordon(admin_db: str) -> None:
    items = {i["name"]: i for i in json.loads(invoke("clusters", "list", "-o", "json", "--database-url",
                                                     admin_db).output)["items"]}
    assert items["worker-2"]["health"] == "online,cordoned" and items["worker-2"]["running"] == 1
    assert items["worker-1"]["health"] == "stale"


def test_actions_without_server_name_the_flag(admin_db: str) -> None:
    result = invoke("clusters", "cordon", "worker-1")
    assert result.exit_code == 2 and "--server" in result.output
