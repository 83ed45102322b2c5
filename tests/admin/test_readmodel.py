"""The admin surfaces tell the truth: conditions are the manager Job's own, every ClusterQueue is listed,
``why`` tells "never" from "wait" with per-node figures, a Job mkd does not manage is explained (not an
error), help and behaviour agree, and the dashboard's small defects are gone.

Each test failed on the code before: conditions were read from the engine's job cache (always empty
through the API), ``queues list`` read only the database, ``why`` compared cluster totals first and
printed ``admitted: admitted:``, ``show other-controller`` exited 1 with ``error:``.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from dispatcher import db
from dispatcher.api import create_app
from dispatcher.api.auth import Authenticator
from dispatcher.api.routes import ApiContext
from federation.kube import CRDS, Kube
from mkctl.main import app as mkctl_app

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def mkctl(*args: str) -> Any:
    return CliRunner().invoke(mkctl_app, list(args), env={}, catch_exceptions=False)


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[tuple[Path, Kube]]:
    """A kubesim manager with the PyTorchJob and Kueue CRDs and demo/queues' ClusterQueues and LocalQueues."""
    import kubesim
    from federation.kinds.crds import load_crds
    from federation.kube import NAMESPACES, Resource
    from tests.dispatcher.harness import install_crd

    spec = kubesim.ClusterSpec(name="manager", nodes=[kubesim.NodeSpec(name="m1")])
    async with kubesim.serve_async([spec], tmp_path / "sim") as s:
        path = s.kubeconfig("manager")
        await install_crd(path)
        async with Kube(path) as kube:
            for crd in load_crds():
                if crd["spec"]["group"] == "kueue.x-k8s.io":
                    await kube.create(CRDS, copy.deepcopy(crd))
            lqs = Resource("kueue.x-k8s.io", "v1beta2", "localqueues", "LocalQueue")
            for _ in range(200):
                if await kube.served(lqs):
                    break
                await asyncio.sleep(0.05)
            for ns in ("team-a", "team-b"):
                await kube.create(NAMESPACES, {"metadata": {"name": ns}})
            for obj in yaml.safe_load_all((ROOT / "demo" / "queues" / "queues.yaml").read_text()):
                if obj and obj["kind"] in ("ClusterQueue", "LocalQueue", "ResourceFlavor"):
                    plural = obj["kind"].lower() + "s"
                    res = Resource("kueue.x-k8s.io", "v1beta2", plural, obj["kind"], obj["kind"] == "LocalQueue")
                    await kube.create(res, obj, obj["metadata"].get("namespace"))
            yield path, kube


async def _job_with_conditions(kube: Kube) -> dict[str, Any]:
    from federation.kinds.registry import by_name
    from federation.kube import resource_for
    from tests.dispatcher.harness import pytorchjob

    res = resource_for(by_name("PyTorchJob"))  # type: ignore[arg-type]
    job = await kube.create(res, pytorchjob("conditioned", namespace="team-a"), "team-a")
    conditions = [
        {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": "quota in team-a",
         "lastTransitionTime": "2026-01-01T00:00:00Z"},
        {"type": "MultiClusterDispatched", "status": "True", "reason": "Placed", "message": "on worker-2",
         "lastTransitionTime": "2026-01-01T00:00:01Z"},
        {"type": "Running", "status": "True", "reason": "JobRunning", "message": "running",
         "lastTransitionTime": "2026-01-01T00:00:02Z"}]
    await kube.patch(res, "conditioned", {"status": {"conditions": conditions}}, "team-a", subresource="status")
    return job


async def _add_workload(url: str, uid: str, namespace: str, name: str, **extra: Any) -> None:
    from dispatcher.db.models import workloads

    engine = db.make_engine(url)
    now = datetime.now(UTC)
    try:
        async with engine.begin() as conn:
            await conn.execute(workloads.insert(), [{
                "uid": uid, "namespace": namespace, "name": name, "api_version": "kubeflow.org/v1",
                "kind": "PyTorchJob", "queue": "team-a", "requests": {"cpu": "2"}, "podsets": [], "excluded": [],
                "updated_at": now, "labels": {}, "reason": "", "state": "running", "attempt": 0, "cluster": "worker-2",
                "created_at": now, "cluster_queue": "team-a", **extra}])
    finally:
        await engine.dispose()


async def test_conditions_are_the_manager_jobs_own(admin_db: str, sim: tuple[Path, Kube]) -> None:
    path, kube = sim
    job = await _job_with_conditions(kube)
    await _add_workload(admin_db, job["metadata"]["uid"], "team-a", "conditioned")
    engine = db.make_engine(admin_db)
    ctx = ApiContext(sessions=db.sessionmaker(engine), auth=Authenticator(static_token=TOKEN), kube=kube)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(ctx)), base_url="http://api") as c:
        detail = (await c.get("/api/v1/workloads/team-a/conditioned", headers=AUTH)).json()
        page = (await c.get("/ui/workloads/team-a/conditioned", headers=AUTH)).text
    await engine.dispose()
    assert [c["type"] for c in detail["conditions"]] == ["QuotaReserved", "MultiClusterDispatched", "Running"]
    assert "MultiClusterDispatched" in page and "on worker-2" in page and "condition-rows" in page
    shown = await asyncio.to_thread(mkctl, "workloads", "show", "team-a/conditioned", "--database-url", admin_db,
                                    "--kubeconfig", str(path))
    assert shown.exit_code == 0, shown.output
    assert "Conditions:" in shown.output and "MultiClusterDispatched" in shown.output
    # without the manager the CLI says it cannot know, instead of showing none
    bare = await asyncio.to_thread(mkctl, "workloads", "show", "team-a/conditioned", "--database-url", admin_db)
    assert "conditions:" in bare.output and "--kubeconfig" in bare.output


async def test_queues_list_every_cluster_queue_of_the_manager(admin_db: str, sim: tuple[Path, Kube]) -> None:
    path, _ = sim
    await _add_workload(admin_db, "q-1", "team-a", "low-1", usage={"default/cpu": "2"})
    await _add_workload(admin_db, "q-2", "team-a", "low-2", state="pending", cluster=None)
    listed = await asyncio.to_thread(mkctl, "queues", "list", "-o", "json", "--database-url", admin_db,
                                     "--kubeconfig", str(path))
    assert listed.exit_code == 0, listed.output
    items = {q["name"]: q for q in json.loads(listed.output)["items"]}
    assert set(items) == {"team-a", "team-b", "shared"}  # team-b and shared never held a Workload
    assert items["team-a"]["cohort"] == "org" and items["team-a"]["quota"]["default/cpu"] == "4"
    assert (items["team-a"]["pending"], items["team-a"]["admitted"]) == (1, 1)
    assert items["team-a"]["usage"] == {"default/cpu": "2"}
    shown = await asyncio.to_thread(mkctl, "queues", "show", "team-b", "--database-url", admin_db,
                                    "--kubeconfig", str(path))
    assert shown.exit_code == 0, shown.output
    assert "LocalQueues:" in shown.output and "team-b" in shown.output
    shown = await asyncio.to_thread(mkctl, "queues", "show", "team-a", "--database-url", admin_db,
                                    "--kubeconfig", str(path))
    assert shown.exit_code == 0 and "low-2" in shown.output, shown.output
    # the API and the dashboard read the same: the manager's ClusterQueues, quota against what is held
    engine = db.make_engine(admin_db)
    ctx = ApiContext(sessions=db.sessionmaker(engine), auth=Authenticator(static_token=TOKEN), kube=sim[1])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(ctx)), base_url="http://api") as c:
        page = (await c.get("/api/v1/queues", headers=AUTH)).json()
        html = (await c.get("/ui/queues", headers=AUTH)).text
    await engine.dispose()
    assert page["configured"] is True and page["source"] == "manager"
    via_api = {q["name"]: q for q in page["cluster_queues"]}["team-a"]
    assert via_api == {k: v for k, v in items["team-a"].items() if k not in ("usage_text", "quota_text")}
    assert "Queues not configured" not in html and "default/cpu: 2 of 4" in html and "team-b" in html
    # without the manager, the list says it holds only the queues Workloads were recorded in
    bare = await asyncio.to_thread(mkctl, "queues", "list", "--database-url", admin_db)
    assert "--kubeconfig" in bare.output and "team-a" in bare.output


async def test_a_job_left_to_another_controller_is_an_answer_not_an_error(admin_db: str,
                                                                          sim: tuple[Path, Kube]) -> None:
    path, kube = sim
    from federation.kinds.registry import by_name
    from federation.kube import resource_for

    job = yaml.safe_load((ROOT / "examples" / "special" / "other-controller.yaml").read_text())
    await kube.create(resource_for(by_name("PyTorchJob")), job, "default")  # type: ignore[arg-type]
    for verb in (("workloads", "show"), ("why",)):
        out = await asyncio.to_thread(mkctl, *verb, "default/other-controller", "--database-url", admin_db,
                                      "--kubeconfig", str(path))
        assert out.exit_code == 0, out.output
        assert "error" not in out.output and "left to kubeflow.org/training-operator" in out.output


def _cluster_row(name: str, nodes: list[tuple[str, str, str]], age: float) -> dict[str, Any]:
    """A clusters row whose heartbeat (``age`` seconds old) lists nodes as (name, allocatable gpu, free gpu)."""
    now = datetime.now(UTC)
    total = sum(int(a) for _, a, _ in nodes)
    free = sum(int(f) for _, _, f in nodes)
    return {"name": name, "labels": {}, "online": True, "interval_seconds": 10.0, "cordoned": False, "kinds": {},
            "capacity": {"allocatable": {"cpu": "64", "nvidia.com/gpu": str(total)},
                         "free": {"cpu": "64", "nvidia.com/gpu": str(free)},
                         "largest_node_free": {"cpu": "32", "nvidia.com/gpu": max(f for _, _, f in nodes)},
                         "nodes": [{"name": n, "labels": {}, "taints": [], "free": {"cpu": "32", "nvidia.com/gpu": f},
                                    "allocatable": {"cpu": "32", "nvidia.com/gpu": a}} for n, a, f in nodes]},
            "last_heartbeat": now - timedelta(seconds=age), "updated_at": now}


def _podsets(per_pod_gpu: int, count: int) -> list[dict[str, Any]]:
    return [{"name": "worker", "count": count, "requests": {"cpu": "1", "nvidia.com/gpu": str(per_pod_gpu)}}]


async def _why_db(tmp_path: Path) -> str:
    from dispatcher.db.models import clusters, events, workloads

    url = f"sqlite+aiosqlite:///{tmp_path / 'why.db'}"
    await db.upgrade_async(url)
    engine = db.make_engine(url)
    now = datetime.now(UTC)
    base = {"api_version": "kubeflow.org/v1", "kind": "PyTorchJob", "excluded": [], "updated_at": now, "labels": {},
            "attempt": 0, "cluster": None, "created_at": now, "namespace": "default", "queue": "default",
            "reason": ""}
    try:
        async with engine.begin() as conn:
            await conn.execute(clusters.insert(), [
                _cluster_row("worker-3", [("gpu-1", "4", "4"), ("gpu-2", "4", "1")], 4.0),
                _cluster_row("worker-4", [("big-1", "8", "2")], 7.0)])
            stale = "needs 32 nvidia.com/gpu in one cluster; most free: worker-3 has 6"
            await conn.execute(workloads.insert(), [
                {**base, "uid": "too-large", "name": "too-large", "state": "pending", "reason": stale,
                 "requests": {"nvidia.com/gpu": "32"}, "podsets": _podsets(16, 2), "cluster_queue": "shared"},
                {**base, "uid": "waits", "name": "waits", "state": "pending", "reason": "old words",
                 "requests": {"nvidia.com/gpu": "6"}, "podsets": _podsets(6, 1), "cluster_queue": "shared"},
                {**base, "uid": "lost", "name": "lost", "state": "pending", "queue": "nowhere",
                 "reason": "LocalQueue default/nowhere does not exist", "requests": {"cpu": "1"},
                 "podsets": _podsets(0, 1), "cluster_queue": None},
                {**base, "uid": "runs", "name": "runs", "state": "running", "cluster": "worker-4", "attempt": 1,
                 "requests": {"cpu": "1"}, "podsets": _podsets(0, 1), "cluster_queue": "shared"}])
            await conn.execute(events.insert(), [
                {"workload_uid": "too-large", "at": now, "type": "pending", "reason": "NoFittingCluster",
                 "message": stale, "cluster": None},
                {"workload_uid": "waits", "at": now, "type": "pending", "reason": "NoFittingCluster",
                 "message": "old words", "cluster": None},
                {"workload_uid": "lost", "at": now, "type": "pending", "reason": "LocalQueueDoesNotExist",
                 "message": "LocalQueue default/nowhere does not exist", "cluster": None}])
    finally:
        await engine.dispose()
    return url


async def test_why_tells_never_from_waiting_with_per_node_figures_and_their_age(tmp_path: Path) -> None:
    url = await _why_db(tmp_path)
    never = await asyncio.to_thread(mkctl, "why", "default/too-large", "--database-url", url)
    assert never.exit_code == 0, never.output
    first = never.output.splitlines()[0]
    assert "can never run here" in first and "16 nvidia.com/gpu" in first and "no node has" in first, first
    assert "most free" not in never.output  # the stale cluster-total sentence is not repeated
    assert "worker-3 (heartbeat 4s ago)" in never.output and "worker-4 (heartbeat 7s ago)" in never.output
    wait = await asyncio.to_thread(mkctl, "why", "default/waits", "--database-url", url)
    first = wait.output.splitlines()[0]
    assert "waiting for room" in first and "can never" not in first, wait.output
    assert "on worker-4" in first and "lacks 4 nvidia.com/gpu" in first  # its only node: 2 free of 8
    lost = await asyncio.to_thread(mkctl, "why", "default/lost", "--database-url", url)
    assert "queue: LocalQueue default/nowhere does not exist" in lost.output
    assert "position" not in lost.output and "open mode" not in lost.output, lost.output
    runs = await asyncio.to_thread(mkctl, "why", "default/runs", "--database-url", url)
    assert runs.output.startswith("default/runs: admitted: running on worker-4"), runs.output
    assert "admitted: admitted" not in runs.output


def test_help_says_what_the_verbs_do() -> None:
    evict = mkctl("workloads", "evict", "--help").output
    assert "another cluster" in evict and "until it is requeued" not in evict
    pending = mkctl("workloads", "pending", "--help").output
    assert "--cluster-queue" in pending and "LocalQueue" in pending
    listed = mkctl("workloads", "list", "--help").output
    assert "--queue" in listed and "LocalQueue" in listed


def test_help_boxes_wrap_values_instead_of_cutting_them() -> None:
    import typer.main

    def walk(command: Any, path: list[str]) -> list[list[str]]:
        subs = getattr(command, "commands", None)
        if not subs:
            return [path]
        return [p for name, sub in subs.items() if not sub.hidden for p in walk(sub, [*path, name])]

    for path in walk(typer.main.get_command(mkctl_app), []):
        out = mkctl(*path, "--help").output
        assert "…" not in out, (path, out)
    fencer = mkctl("fencer", "--help").output
    assert "--kubeconfig" in fencer and "--kube-kubeconfig" not in fencer
    refused = mkctl("fencer", "--kube-kubeconfig", "x")
    assert refused.exit_code == 2 and "--kubeconfig" in refused.output


async def test_dashboard_deep_links_icon_and_namespaced_queues(admin_db: str) -> None:
    engine = db.make_engine(admin_db)
    ctx = ApiContext(sessions=db.sessionmaker(engine), auth=Authenticator(static_token=TOKEN))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(ctx)), base_url="http://api") as c:
        deep = await c.get("/ui/clusters", params={"token": TOKEN})
        assert deep.status_code == 303 and deep.headers["location"] == "/ui/clusters"
        assert "mkd_token" in deep.headers["set-cookie"]
        c.cookies.set("mkd_token", TOKEN)
        page = await c.get("/ui/clusters")
        assert page.status_code == 200 and "Sign in" not in page.text and "white-space:nowrap" in page.text
        icon = await c.get("/favicon.ico")
        assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/")
        queues = (await c.get("/ui/queues", headers=AUTH)).text
    await engine.dispose()
    assert "default/default" in queues and "team-a/default" in queues


async def test_metrics_queue_label_is_namespace_and_name(admin_db: str) -> None:
    from dispatcher.api.metrics import DispatcherMetrics

    metrics = DispatcherMetrics()
    engine = db.make_engine(admin_db)
    async with db.sessionmaker(engine)() as s:
        await metrics.refresh(s)
    await engine.dispose()
    text = metrics.exposition().decode()
    assert 'mkd_workloads{namespace="team-a",queue="default",state="pending"} 1.0' in text
    assert 'mkd_workloads{namespace="default",queue="default",state="placed"} 1.0' in text


async def test_an_unfiltered_total_above_the_threshold_is_postgresqls_estimate_and_says_so(
        database_url: str, sqlite_url: str) -> None:
    """Counting a million Workloads costs more than the page: above ``estimate_above`` an unfiltered list's
    total is the table's row estimate, marked as one; a filtered total, and SQLite's, are always counted."""
    import sqlalchemy as sa
    from sqlalchemy.ext.asyncio import async_sessionmaker

    from dispatcher import readmodel
    from dispatcher.db import admin as dbadmin
    from dispatcher.db import models as m

    now = datetime.now(UTC)
    for url in (database_url, sqlite_url):
        await db.upgrade_async(url)
        engine = db.make_engine(url)
        try:
            async with engine.begin() as conn:
                await conn.execute(sa.insert(m.workloads), [
                    {"uid": f"u{i}", "namespace": "team" if i < 3 else "other", "name": f"j{i}", "kind": "Job",
                     "api_version": "batch/v1", "queue": "q", "state": "finished", "requests": {}, "podsets": [],
                     "excluded": [], "created_at": now, "updated_at": now} for i in range(5)])
            if url.startswith("postgresql"):
                async with engine.connect() as conn:
                    await (await conn.execution_options(isolation_level="AUTOCOMMIT")).execute(sa.text("ANALYZE workloads"))
            async with async_sessionmaker(engine)() as s:
                everything = await readmodel.workload_total(s, estimate_above=2)
                team = await readmodel.workload_total(s, dbadmin.WorkloadFilter(namespace="team"), estimate_above=2)
                counted = await readmodel.workload_total(s)
        finally:
            await engine.dispose()
        pg = url.startswith("postgresql")
        assert everything == {"total": 5, "total_estimated": pg}, url
        assert team == {"total": 3, "total_estimated": False}
        assert counted == {"total": 5, "total_estimated": False}
