"""``mkctl whatif`` replays a trace file or the dispatcher's history; ``mkctl whatif export`` writes the trace."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import yaml
from typer.testing import CliRunner

from dispatcher import db
from dispatcher.db import models as m
from federation.kube import Kube
from mkctl.main import app
from tests.whatif.builders import CPU_QUEUES, cluster, install_queues, job

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _files(tmp_path: Path) -> tuple[Path, Path]:
    lines = [job("borrower", "team-b", 0, 20, ("master", 1, "1"), ("worker", 2, "1"), priority_class="low"),
             job("low-1", "team-a", 0, 20, ("master", 1, "1"), priority_class="low"),
             job("low-2", "team-a", 0, 20, ("master", 1, "1"), priority_class="low"),
             job("high", "team-a", 5, 20, ("master", 1, "1"), priority_class="high")]
    t = tmp_path / "trace.jsonl"
    t.write_text("\n".join(lines) + "\n")
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "queues.yaml").write_text(Path(CPU_QUEUES).read_text())
    (conf / "clusters.yaml").write_text(yaml.safe_dump(cluster("w1", 2, "4")))
    return t, conf


def test_whatif_reports_a_trace_against_a_configuration_and_compares(tmp_path: Path) -> None:
    t, conf = _files(tmp_path)
    runner = CliRunner()
    out = runner.invoke(app, ["whatif", "--trace", str(t), "--config", str(conf)])
    assert out.exit_code == 0, out.output
    assert "4 Jobs, 4 admitted, 4 finished" in out.output
    assert "team-a        team-a     InClusterQueue  1" in out.output
    out = runner.invoke(app, ["whatif", "--trace", str(t), "--config", str(conf), "-o", "json"])
    assert out.exit_code == 0, out.output
    rep = json.loads(out.output)
    assert rep["clusterQueues"]["team-b"]["borrowed"]["cpu"]["peak"] == "2"
    # team-a gets 2 more CPU: high no longer preempts anybody, nobody waits
    more = tmp_path / "more.yaml"
    cq = next(d for d in yaml.safe_load_all(Path(CPU_QUEUES).read_text())
              if d["kind"] == "ClusterQueue" and d["metadata"]["name"] == "team-a")
    cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = "6"
    more.write_text(yaml.safe_dump(cq))
    out = runner.invoke(app, ["whatif", "--trace", str(t), "--config", str(conf), "--compare", str(more), "-o", "json"])
    assert out.exit_code == 0, out.output
    both = json.loads(out.output)
    assert both["a"]["preemptions"]["total"] == 1 and both["b"]["preemptions"]["total"] == 0
    out = runner.invoke(app, ["whatif", "--trace", str(t), "--config", str(conf), "--compare", str(more)])
    assert out.exit_code == 0, out.output
    assert "preempted 1 → 0" in out.output


def test_whatif_names_the_line_and_field_of_a_bad_trace(tmp_path: Path) -> None:
    t, conf = _files(tmp_path)
    t.write_text(t.read_text() + '{"name": "x", "namespace": "team-a", "arrival": 0, "runSeconds": -1, '
                                 '"podSets": [{"name": "w", "requests": {"cpu": "1"}}]}\n')
    out = CliRunner().invoke(app, ["whatif", "--trace", str(t), "--config", str(conf)])
    assert out.exit_code != 0
    assert f"{t} line 5: runSeconds: -1 is not a number of seconds >= 0" in out.output


def test_whatif_names_the_object_and_field_of_a_bad_configuration(tmp_path: Path) -> None:
    t, conf = _files(tmp_path)
    (conf / "clusters.yaml").write_text(yaml.safe_dump(cluster("w1", 2, "4", cordons=[{"until": 5}])))
    out = CliRunner().invoke(app, ["whatif", "--trace", str(t), "--config", str(conf)])
    assert out.exit_code != 0
    assert "clusters.yaml: WorkerCluster w1: spec.cordons[0].from: is missing" in out.output


def _workload(name: str, ns: str, at: int, cpu: str, state: str, **extra: Any) -> dict[str, Any]:
    podsets = [{"name": "worker", "count": 1, "requests": {"cpu": cpu}}]
    return {"uid": f"uid-{name}", "namespace": ns, "name": name, "kind": "PyTorchJob",
            "api_version": "kubeflow.org/v1", "queue": ns, "priority": 10, "state": state, "requests": {"cpu": cpu},
            "podsets": podsets, "excluded": [], "created_at": T0 + timedelta(seconds=at), "updated_at": T0,
            "queued_at": T0 + timedelta(seconds=at), "queue_seq": at, "labels": {"kueue.x-k8s.io/priority-class": "low"},
            **extra}


async def _fill(url: str) -> None:
    await db.upgrade_async(url)
    engine = db.make_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.execute(sa.insert(m.workloads), [
                _workload("a", "team-a", 0, "2", "finished", cluster="w1"),
                _workload("b", "team-b", 1, "1", "finished", cluster="w1"),
                _workload("c", "team-a", 2, "1", "pending", cluster=None)])
            await conn.execute(sa.insert(m.placements), [
                {"workload_uid": "uid-a", "attempt": 1, "cluster": "w1", "epoch": 1, "state": "finished",
                 "created_at": T0, "accepted_at": T0 + timedelta(seconds=1), "finished_at": T0 + timedelta(seconds=30)},
                {"workload_uid": "uid-b", "attempt": 1, "cluster": "w1", "epoch": 1, "state": "finished",
                 "created_at": T0, "accepted_at": T0 + timedelta(seconds=1), "finished_at": T0 + timedelta(seconds=10)}])
            await conn.execute(sa.insert(m.clusters), [{
                "name": "w1", "labels": {"zone": "a"}, "kinds": ["PyTorchJob"], "online": True, "updated_at": T0,
                "capacity": {"allocatable": {"cpu": "4"}, "free": {"cpu": "4"}, "largest_node_free": {"cpu": "2"},
                             "nodes": [{"name": "n1", "free": {"cpu": "2"}, "allocatable": {"cpu": "2"}},
                                       {"name": "n2", "free": {"cpu": "2"}, "allocatable": {"cpu": "2"}}]}}])
    finally:
        await engine.dispose()


def test_export_and_replay_the_history_with_the_live_clusters(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'mkd.db'}"
    asyncio.run(_fill(url))
    runner = CliRunner()
    out = runner.invoke(app, ["whatif", "export", "--database-url", url, "--since", "all", "-f",
                               str(tmp_path / "t.jsonl")])
    assert out.exit_code == 0, out.output
    assert "wrote 3 Jobs" in out.output and "1 with an estimated run time" in out.output
    lines = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [(x["name"], x["runSeconds"], x.get("runEstimated", False)) for x in lines] == [
        ("a", 30.0, False), ("b", 10.0, False), ("c", 20.0, True)]   # c never ran: the median of the others
    assert lines[0]["priorityClass"] == "low" and lines[0]["arrival"] == "2026-01-01T00:00:00Z"
    # the queue objects from files, the clusters from the database (its nodes: a 2-CPU pod per node at most)
    out = runner.invoke(app, ["whatif", "--from-history", "--since", "2025-12-31T00:00:00Z", "--database-url", url,
                               "--config", CPU_QUEUES, "-o", "json"])
    assert out.exit_code == 0, out.output
    rep = json.loads(out.output)
    assert rep["admitted"] == 3 and rep["clusters"]["w1"]["admissions"] == 3
    assert "the clusters in the database" in rep["sources"]["configuration"]
    # without a manager nor queue objects, it says what to give
    out = runner.invoke(app, ["whatif", "--database-url", url, "--since", "all"])
    assert out.exit_code != 0 and "pass --kubeconfig" in out.output
    # by default the last week: this history is older
    out = runner.invoke(app, ["whatif", "--database-url", url, "--config", CPU_QUEUES])
    assert out.exit_code != 0 and "the trace (the dispatcher's history of the last 7d) holds no Job" in out.output


def test_plot_draws_both_configurations_into_one_png(tmp_path: Path) -> None:
    t, conf = _files(tmp_path)
    more = tmp_path / "fair.yaml"
    more.write_text(yaml.safe_dump({"apiVersion": "whatif.mkd.dev/v1", "kind": "WhatIfSettings",
                                    "metadata": {"name": "fair"}, "spec": {"fairSharing": {"enable": True}}}))
    png = tmp_path / "out.png"
    out = CliRunner().invoke(app, ["whatif", "--trace", str(t), "--config", str(conf), "--compare", str(more),
                                   "--plot", str(png)])
    assert out.exit_code == 0, out.output
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width = int.from_bytes(data[16:20], "big")
    assert width == 1400   # two columns of 7 inches at 100 dpi


def test_the_readme_example_prints_what_the_readme_shows(tmp_path: Path) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme[readme.index("    $ mkctl whatif"):]
    block = block[:block.index("\n\n")]
    command, _, shown = block.partition("\n        ")
    args = (command.removeprefix("    $ mkctl ").rstrip("\\").split()
            + shown.split("\n", 1)[0].split())
    args[args.index("--plot") + 1] = str(tmp_path / "w.png")
    out = CliRunner().invoke(app, args, catch_exceptions=False)
    assert out.exit_code == 0, out.output
    lines = shown.split("\n")[1:]
    assert len(lines) >= 4
    for line in lines:
        assert line.strip() in out.output, line


async def test_the_first_run_needs_no_files(tmp_path: Path, manager: Path, kube: Kube) -> None:
    """The queue objects from the manager cluster (kubesim with Kueue's CRDs), the history and clusters from the
    database, the settings from the environment: ``mkctl whatif`` alone."""
    await install_queues(kube)
    url = f"sqlite+aiosqlite:///{tmp_path / 'mkd.db'}"
    await _fill(url)
    out = await asyncio.to_thread(CliRunner().invoke, app, ["whatif", "--database-url", url, "--kubeconfig",
                                                            str(manager), "--since", "all"])
    assert out.exit_code == 0, out.output
    assert "3 Jobs, 3 admitted, 3 finished" in out.output
    assert "the queue objects of the manager cluster" in out.output and "the clusters in the database" in out.output
