"""The dispatcher's HTTP API: reads on a filled database, then actions, metrics and probes on a running
dispatcher (kubesim manager, fake agents over MQTT), and mkctl talking to it with ``--server``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from dispatcher import db
from dispatcher.api import create_app
from dispatcher.api.auth import Authenticator
from dispatcher.api.routes import ApiContext
from federation import messages
from mkctl.main import app as mkctl_app
from tests.dispatcher.harness import (
    PYTORCHJOBS,
    FakeAgent,
    capacity,
    eventually,
    pytorchjob,
    running,
    settings,
)

TOKEN = "s3cret-demo-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def client(admin_db: str) -> AsyncIterator[httpx.AsyncClient]:
    engine = db.make_engine(admin_db)
    ctx = ApiContext(sessions=db.sessionmaker(engine), auth=Authenticator(static_token=TOKEN))
    transport = httpx.ASGITransport(app=create_app(ctx))
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as c:
        yield c
    await engine.dispose()


async def test_every_endpoint_needs_a_token(client: httpx.AsyncClient) -> None:
    for path in ("/api/v1/workloads", "/api/v1/workloads/team-a/zeta", "/api/v1/clusters", "/api/v1/queues",
                 "/api/v1/events"):
        assert (await client.get(path)).status_code == 401
        assert (await client.get(path, headers={"Authorization": "Bearer wrong"})).status_code == 401
    assert (await client.post("/api/v1/clusters/worker-1/cordon")).status_code == 401


async def test_workloads_filters_paging_and_creation_order(client: httpx.AsyncClient) -> None:
    page = (await client.get("/api/v1/workloads", headers=AUTH)).json()
    assert [i["name"] for i in page["items"]] == ["old", "alpha", "zeta", "newest"] and page["total"] == 4
    assert page["total_estimated"] is False  # a small table is counted
    page = (await client.get("/api/v1/workloads", params={"limit": 2, "offset": 1}, headers=AUTH)).json()
    assert [i["name"] for i in page["items"]] == ["alpha", "zeta"] and page["total"] == 4
    for params, expect in (({"state": "Pending"}, ["alpha"]), ({"kind": "jobset"}, ["old"]),
                           ({"queue": "research"}, ["zeta"]), ({"label": "team=nlp"}, ["zeta", "newest"]),
                           ({"cluster": "worker-1", "namespace": "default"}, ["old", "newest"])):
        found = (await client.get("/api/v1/workloads", params=params, headers=AUTH)).json()
        assert [i["name"] for i in found["items"]] == expect, params
    bad = await client.get("/api/v1/workloads", params={"state": "bogus"}, headers=AUTH)
    assert bad.status_code == 400 and "state: 'bogus' is not a Workload state" in bad.json()["detail"]


async def test_one_workload_with_attempts_history_and_why(client: httpx.AsyncClient) -> None:
    zeta = (await client.get("/api/v1/workloads/team-a/zeta", headers=AUTH)).json()
    assert [p["cluster"] for p in zeta["placements"]] == ["worker-2"]
    assert [e["type"] for e in zeta["events"]] == ["claimed", "placed"]
    assert zeta["why"]["answer"].startswith("running on worker-2 (attempt 1)")
    assert zeta["why"]["step"] == "admitted"
    # one serializer for the list and the one Workload: the current placement's times are filled in both
    listed = {i["name"]: i for i in (await client.get("/api/v1/workloads", headers=AUTH)).json()["items"]}
    assert zeta["accepted_at"] is not None and zeta["accepted_at"] == listed["zeta"]["accepted_at"]
    old = (await client.get("/api/v1/workloads/default/old", headers=AUTH)).json()
    assert old["finished_at"] is not None and old["finished_at"] == listed["old"]["finished_at"]
    for key in listed["zeta"]:
        assert zeta[key] == listed["zeta"][key], key
    assert zeta["conditions"] is None  # this server has no manager client: unknown, not "none"
    alpha = (await client.get("/api/v1/workloads/team-a/alpha", headers=AUTH)).json()
    assert alpha["why"]["answer"] == "needs 64 nvidia.com/gpu in one cluster; most free: worker-3 has 8"
    assert alpha["why"]["step"] == "placement"  # the queueing package's answer: held at placement
    missing = await client.get("/api/v1/workloads/default/other-controller", headers=AUTH)
    assert missing.status_code == 404 and "kueue.x-k8s.io/multikueue" in missing.json()["detail"]


async def test_clusters_queues_events_and_openapi(client: httpx.AsyncClient) -> None:
    clusters = {c["name"]: c for c in (await client.get("/api/v1/clusters", headers=AUTH)).json()["items"]}
    assert clusters["worker-2"]["cordoned"] is True and clusters["worker-2"]["running"] == 1
    assert clusters["worker-2"]["used"] == {"cpu": "4", "nvidia.com/gpu": "0"}
    assert clusters["worker-1"]["health"] == "stale" and clusters["worker-3"]["health"] == "offline"
    queues = (await client.get("/api/v1/queues", headers=AUTH)).json()
    assert queues["configured"] is False and queues["source"] == "records"
    by_name = {(q["namespace"], q["name"]): q for q in queues["local_queues"]}
    research = by_name[("team-a", "research")]
    assert research["workloads"] == {"running": 1} and research["requests_admitted"] == {"cpu": "4"}
    # a LocalQueue is namespace/name: default/default and team-a/default are two queues
    assert by_name[("default", "default")]["workloads"] == {"finished": 1, "placed": 1}
    assert by_name[("team-a", "default")]["workloads"] == {"pending": 1}
    events = (await client.get("/api/v1/events", params={"cluster": "worker-3"}, headers=AUTH)).json()["items"]
    assert [e["type"] for e in events] == ["cluster_lost"]
    after = (await client.get("/api/v1/events", params={"after": events[0]["id"] - 1}, headers=AUTH)).json()
    assert [e["type"] for e in after["items"]] == ["cluster_lost"]
    assert (await client.get("/api/v1/events", params={"type": "nope"}, headers=AUTH)).status_code == 400
    spec = (await client.get("/openapi.json")).json()
    for path in ("/api/v1/workloads", "/api/v1/workloads/{namespace}/{name}", "/api/v1/clusters", "/api/v1/queues",
                 "/api/v1/events", "/api/v1/clusters/{name}/cordon", "/api/v1/clusters/{name}/uncordon",
                 "/api/v1/clusters/{name}/drain", "/api/v1/workloads/{namespace}/{name}/requeue",
                 "/api/v1/workloads/{namespace}/{name}/evict", "/api/v1/workloads/{namespace}/{name}/pin",
                 "/api/v1/jobs/{namespace}/{name}/owner"):
        assert path in spec["paths"], path
    assert "WorkloadDetail" in spec["components"]["schemas"]


# --- a running dispatcher -------------------------------------------------------------------------


def mkctl(*args: str) -> Any:
    return CliRunner().invoke(mkctl_app, list(args), env={}, catch_exceptions=False)


async def test_actions_metrics_probes_and_mkctl_server(manager: Path, kube: Any, db_url: str, mqtt_url: str,
                                                       topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root, api_port=0, api_host="127.0.0.1", api_token=TOKEN,
                 placement_retry_seconds=0.5)
    async with FakeAgent("worker-1", mqtt_url, topic_root, cap=capacity(cpu="64")) as w1, \
            FakeAgent("worker-2", mqtt_url, topic_root, cap=capacity(cpu="32")) as w2, running(s) as d:
        await asyncio.wait_for(d.http.started.wait(), 10)
        base = f"http://127.0.0.1:{d.http.port}"
        server = ("--server", base, "--token", TOKEN)
        async with httpx.AsyncClient(base_url=base, headers=AUTH, timeout=30) as api:
            await eventually(lambda: _ok(api, "/readyz"), what="ready")
            assert (await api.get("/healthz")).text == "ok"
            await kube.create(PYTORCHJOBS, pytorchjob("a"), "default")
            await eventually(lambda: w1.places(), what="a placed on the roomiest cluster")

            # cordon worker-1: the next job goes to worker-2 although worker-1 has more room
            out = await asyncio.to_thread(mkctl, "clusters", "cordon", "worker-1", *server)
            assert out.exit_code == 0 and "cordoned" in out.output, out.output
            await kube.create(PYTORCHJOBS, pytorchjob("b"), "default")
            await eventually(lambda: w2.places(), what="b placed on worker-2 (worker-1 cordoned)")
            listed = await asyncio.to_thread(mkctl, "clusters", "list", "-o", "json", *server)
            health = {c["name"]: c["health"] for c in json.loads(listed.output)["items"]}
            assert health["worker-1"] == "online,cordoned"

            # drain worker-1: a gets a Delete there and moves to worker-2; a second drain moves nothing
            out = await asyncio.to_thread(mkctl, "clusters", "drain", "worker-1", *server)
            assert "1 Workload(s)" in out.output, out.output
            await eventually(lambda: w1.deletes(), what="Delete sent to the drained cluster")
            await eventually(lambda: len(w2.places()) == 2, what="a placed again on worker-2")
            again = (await api.post("/api/v1/clusters/worker-1/drain")).json()
            assert "0 Workload(s)" in again["message"]
            assert len(w1.deletes()) == 1

            # uncordon, pin b to worker-1, then requeue it: it moves there
            assert (await api.post("/api/v1/clusters/worker-1/uncordon")).status_code == 200
            out = await asyncio.to_thread(mkctl, "workloads", "pin", "default/b", "worker-1", *server)
            assert "pinned to worker-1" in out.output, out.output
            out = await asyncio.to_thread(mkctl, "workloads", "requeue", "default/b", *server)
            assert out.exit_code == 0, out.output
            await eventually(lambda: len(w1.places()) == 2, what="b requeued onto its pinned cluster")
            # evict b from worker-1: excluded there, pin cleared first so it can go elsewhere
            assert (await api.post("/api/v1/workloads/default/b/pin", json={"cluster": None})).status_code == 200
            out = await asyncio.to_thread(mkctl, "workloads", "evict", "b", *server)
            assert "evicted from worker-1" in out.output, out.output
            await eventually(lambda: len(w2.places()) == 3, what="b evicted to worker-2")
            detail = (await api.get("/api/v1/workloads/default/b")).json()
            assert "worker-1" in detail["excluded"] and detail["cluster"] == "worker-2"
            assert [e["type"] for e in detail["events"] if e["type"] in ("pinned", "requeued", "evicted")] == [
                "pinned", "requeued", "pinned", "evicted"]

            # refusals name the problem
            unknown = await api.post("/api/v1/clusters/nowhere/cordon")
            assert unknown.status_code == 404 and "nowhere" in unknown.json()["detail"]
            pin_unknown = await api.post("/api/v1/workloads/default/a/pin", json={"cluster": "nowhere"})
            assert pin_unknown.status_code == 404

            # mkctl --server reads the same things
            listed = await asyncio.to_thread(mkctl, "workloads", "list", "-o", "json", *server)
            assert [i["name"] for i in json.loads(listed.output)["items"]] == ["a", "b"]
            shown = await asyncio.to_thread(mkctl, "workloads", "show", "default/b", *server)
            assert "Placements:" in shown.output and "evicted" in shown.output
            events = await asyncio.to_thread(mkctl, "events", "--type", "drained", "-o", "json", *server)
            # the moved Workload's own row, then the cluster's, once per drain
            assert [(e["name"], e["cluster"]) for e in json.loads(events.output)["items"]] == [
                ("a", "worker-1"), (None, "worker-1"), (None, "worker-1")]
            bad = await asyncio.to_thread(mkctl, "workloads", "list", "--state", "bogus", *server)
            assert bad.exit_code == 2

            # a Job mkd leaves alone: the API asks the manager cluster who manages it
            await kube.create(PYTORCHJOBS, pytorchjob("foreign", managed_by="kubeflow.org/training-operator"),
                              "default")
            owner = (await api.get("/api/v1/jobs/default/foreign/owner")).json()
            assert "left to kubeflow.org/training-operator" in owner["message"]
            assert (await api.get("/api/v1/jobs/default/nothing/owner")).status_code == 404
            shown = await asyncio.to_thread(mkctl, "workloads", "show", "foreign", *server)
            assert shown.exit_code == 0 and "left to kubeflow.org/training-operator" in shown.output

            # metrics: every family, and figures that follow what happened
            await w1.report(messages.Accepted(cluster="worker-1", placement=w1.places()[0].placement,
                                              spec_version=1, seq=w1.next_seq()))
            text = (await api.get("/metrics")).text
            for family in ("mkd_workloads", "mkd_workload_pending_oldest_age_seconds", "mkd_admission_latency_seconds",
                           "mkd_placement_latency_seconds", "mkd_report_lag_seconds", "mkd_cluster_up",
                           "mkd_cluster_cordoned", "mkd_cluster_heartbeat_age_seconds", "mkd_cluster_allocatable",
                           "mkd_cluster_free", "mkd_cluster_used", "mkd_outbox_unsent_commands",
                           "mkd_places_unanswered", "mkd_report_holes_lost_total", "mkd_report_resyncs_total",
                           "mkd_reports_received_total", "mkd_reports_refused_total", "mkd_mqtt_reconnects_total",
                           "mkd_kube_writes_total", "mkd_reports_stale_dropped_total", "mkd_admin_actions_total",
                           "mkd_messages_refused_total", "process_cpu_seconds_total", "mkd_manager_jobs",
                           "mkd_handover_routed_total", "mkd_handover_policies", "mkd_engine_batches_total"):
                assert f"# TYPE {family.removesuffix('_total')}" in text, family
            assert 'mkd_cluster_allocatable{cluster="worker-1",resource="cpu",unit="core"} 64.0' in text
            assert 'mkd_cluster_allocatable{cluster="worker-2",resource="memory",unit="byte"} 2.74877906944e+11' \
                in text  # 256Gi in bytes
            assert 'mkd_workloads{namespace="default",queue="default",state="running"}' in text
            assert 'mkd_manager_jobs{controller="kueue.x-k8s.io/multikueue",kind="PyTorchJob",namespace="default"}' \
                in text
            assert "mkd_admission_latency_seconds_count 2.0" in text
            batches = float(text.split("\nmkd_engine_batches_total ")[1].split()[0])
            assert batches >= 1  # the claims, the placements and the Accepted above were decided in batches
            assert 'mkd_admin_actions_total{result="ok",verb="drain"} 2.0' in text


async def _ok(api: httpx.AsyncClient, path: str) -> bool:
    return (await api.get(path)).status_code == 200


# --- RBAC decides: TokenReview + SubjectAccessReview against the manager cluster -------------------


@pytest.fixture
async def rbac_client(admin_db: str, tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, str]]]:
    """The API (reads from the filled database, no engine) checking tokens with a kubesim manager where
    alice may get jobs and cordon clusters.mkd.dev, bob may only get jobs in team-a, eve nothing."""
    import kubesim
    from federation.kube import Kube, Resource

    spec = kubesim.ClusterSpec(name="manager", nodes=[kubesim.NodeSpec(name="m1")])
    async with kubesim.serve_async([spec], tmp_path / "sim") as sim:
        reviews = sim.cluster("manager").server.reviews
        tokens = {"alice": "tok-alice", "bob": "tok-bob", "eve": "tok-eve"}
        for user, token in tokens.items():
            reviews.add_token(token, user)
        rbac = "rbac.authorization.k8s.io"
        roles = Resource(rbac, "v1", "clusterroles", "ClusterRole", namespaced=False)
        crbs = Resource(rbac, "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False)
        rbs = Resource(rbac, "v1", "rolebindings", "RoleBinding")
        async with Kube(sim.kubeconfig("manager")) as kube:
            from federation.kube import NAMESPACES

            await kube.create(NAMESPACES, {"metadata": {"name": "team-a"}})
            await kube.create(roles, {"metadata": {"name": "mkd-admin"}, "rules": [
                {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get"]},
                {"apiGroups": ["mkd.dev"], "resources": ["clusters"], "verbs": ["cordon"]}]})
            await kube.create(roles, {"metadata": {"name": "job-reader"}, "rules": [
                {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get"]}]})
            ref = {"apiGroup": rbac, "kind": "ClusterRole"}
            await kube.create(crbs, {"metadata": {"name": "alice"}, "roleRef": {**ref, "name": "mkd-admin"},
                                     "subjects": [{"kind": "User", "name": "alice", "apiGroup": rbac}]})
            await kube.create(rbs, {"metadata": {"name": "bob", "namespace": "team-a"},
                                    "roleRef": {**ref, "name": "job-reader"},
                                    "subjects": [{"kind": "User", "name": "bob", "apiGroup": rbac}]}, "team-a")
            engine = db.make_engine(admin_db)
            ctx = ApiContext(sessions=db.sessionmaker(engine), auth=Authenticator(kube=kube, static_token=TOKEN),
                             kube=kube)
            transport = httpx.ASGITransport(app=create_app(ctx))
            async with httpx.AsyncClient(transport=transport, base_url="http://api") as c:
                yield c, tokens
            await engine.dispose()


async def test_rbac_on_the_manager_decides_who_reads_and_who_acts(
        rbac_client: tuple[httpx.AsyncClient, dict[str, str]]) -> None:
    client, tokens = rbac_client

    def bearer(user: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {tokens[user]}"}

    first = await client.get("/api/v1/workloads", headers=bearer("alice"))
    assert first.status_code == 200, first.text
    assert (await client.get("/api/v1/workloads", params={"namespace": "team-a"}, headers=bearer("bob"))
            ).status_code == 200
    everywhere = await client.get("/api/v1/workloads", headers=bearer("bob"))
    assert everywhere.status_code == 403 and "user 'bob' may not get jobs.batch (all namespaces)" in \
        everywhere.json()["detail"]
    assert (await client.get("/api/v1/workloads/team-a/zeta", headers=bearer("bob"))).status_code == 200
    assert (await client.get("/api/v1/workloads/team-a/zeta", headers=bearer("eve"))).status_code == 403
    # acting: alice may cordon (this read-only server then says it has no engine), bob may not, nobody drains
    assert (await client.post("/api/v1/clusters/worker-1/cordon", headers=bearer("alice"))).status_code == 503
    denied = await client.post("/api/v1/clusters/worker-1/cordon", headers=bearer("bob"))
    assert denied.status_code == 403 and "cordon clusters.mkd.dev/worker-1" in denied.json()["detail"]
    assert (await client.post("/api/v1/clusters/worker-1/drain", headers=bearer("alice"))).status_code == 403
    assert (await client.get("/api/v1/clusters", headers={"Authorization": "Bearer forged"})).status_code == 401
    assert (await client.get("/api/v1/clusters", headers=AUTH)).status_code == 200  # the static token
