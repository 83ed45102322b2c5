"""Kueue mode on the demo topology: mkd as the AdmissionCheck controller ``mkd.dev/dispatcher`` beside Kueue.

One manager runs a stand-in for Kueue (tests/e2e/kueuestandin.py: Workloads, quota reservation, admission,
eviction and requeue as the recording of Kueue v0.19.2 shows them) and a stand-in for MultiKueue's check
controller. ClusterQueue ``cq-mkd`` lists mkd's check, ``cq-mk`` MultiKueue's. The dispatcher runs in Kueue
mode under deploy/'s RBAC. The guide of docs/KUEUE.md is then played: shadow, the move of ``cq-mk`` to mkd's
check (held until MultiKueue's running Jobs end), and the rollback. At every step nothing runs twice: no Job
is dispatched by both controllers, none is admitted twice without an eviction between, and mkd's Jobs run on
mkd's workers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from dispatcher.db.models import placements, workloads
from dispatcher.handover.queries import counts, report
from federation import labels
from federation.kube import NAMESPACES, Kube, Resource
from mkctl.topology import Topology, TopologyOptions
from tests.e2e.conftest import NotYet, check_not_forbidden, wait_for
from tests.e2e.kueuestandin import (
    ADMISSION_CHECKS,
    CLUSTER_QUEUES,
    JOBS,
    LOCAL_QUEUES,
    WORKLOADS,
    KueueStandIn,
    MultiKueueStandIn,
)
from tests.e2e.test_deploy_manifests import KUBECTL, check_role, record_calls, render, role_of

pytestmark = [pytest.mark.slow, pytest.mark.kubesim_only("Kueue and MultiKueue are played by in-test stand-ins")]

NS = "team-k"
FLAVORS = Resource("kueue.x-k8s.io", "v1beta2", "resourceflavors", "ResourceFlavor", namespaced=False)


def job(name: str, queue: str, *, seconds: str = "1") -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": NS, "labels": {"kueue.x-k8s.io/queue-name": queue}},
            "spec": {"managedBy": labels.MULTIKUEUE, "suspend": True, "parallelism": 1, "completions": 1,
                     "template": {"metadata": {"annotations": {"kubesim.mkd.dev/run-seconds": seconds}},
                                  "spec": {"restartPolicy": "Never", "containers": [{
                                      "name": "main", "image": "example/train:1",
                                      "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}}}}


def cluster_queue(name: str, checks: list[str]) -> dict[str, Any]:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": name},
            "spec": {"namespaceSelector": {}, "admissionChecksStrategy": strategy(checks),
                     "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [
                         {"name": "default", "resources": [{"name": "cpu", "nominalQuota": "100"},
                                                           {"name": "memory", "nominalQuota": "100Gi"}]}]}]}}


def strategy(checks: list[str]) -> dict[str, Any]:
    """A v1beta2 ClusterQueue lists its checks under admissionChecksStrategy (v1beta1's admissionChecks is gone)."""
    return {"admissionChecks": [{"name": c} for c in checks]}


async def query(url: str, fn: Any) -> Any:
    from sqlalchemy.ext.asyncio import AsyncSession

    from dispatcher.db import make_engine

    engine = make_engine(url)
    try:
        async with AsyncSession(engine) as session:
            return await fn(session)
    finally:
        await engine.dispose()


@pytest.fixture
async def kueue(tmp_path: Path, mqtt_url: str, database_url: str, topic_root: str
                ) -> AsyncIterator[tuple[Topology, KueueStandIn, MultiKueueStandIn]]:
    options = TopologyOptions(
        state_dir=tmp_path / "state", mqtt_url=mqtt_url, database_url=database_url, topic_root=topic_root,
        heartbeat_seconds=1.0, heartbeat_timeout_seconds=3.0, origin="mkd-kueue",
        dispatcher_overrides={"admission_check": {"enabled": True, "sync_seconds": 0.2},
                              "handover": {"flush_seconds": 0.3}})
    async with Topology(options) as top:
        m = top.manager
        await m.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        await m.create(FLAVORS, {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                                 "metadata": {"name": "default"}, "spec": {}})
        for name, controller in (("mkd", "mkd.dev/dispatcher"), ("multikueue", labels.MULTIKUEUE)):
            await m.create(ADMISSION_CHECKS, {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "AdmissionCheck",
                                              "metadata": {"name": name}, "spec": {"controllerName": controller}})
        await m.create(CLUSTER_QUEUES, cluster_queue("cq-mkd", ["mkd"]))
        await m.create(CLUSTER_QUEUES, cluster_queue("cq-mk", ["multikueue"]))
        for lq, cq in (("lq-mkd", "cq-mkd"), ("lq-mk", "cq-mk")):
            await m.create(LOCAL_QUEUES, {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                                          "metadata": {"name": lq, "namespace": NS}, "spec": {"clusterQueue": cq}})
        kueue, mk = KueueStandIn(m, NS), MultiKueueStandIn(m, NS)
        tasks = [asyncio.create_task(kueue.run()), asyncio.create_task(mk.run())]
        try:
            yield top, kueue, mk
            top.check_running()
            await check_not_forbidden(top)
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t


async def _claimed(top: Topology) -> dict[str, str]:
    """Job name → mkd's Workload state."""
    async def q(s: Any) -> dict[str, str]:
        rows = await s.execute(sa.select(workloads.c.name, workloads.c.state).where(workloads.c.namespace == NS))
        return {r.name: r.state for r in rows}
    return dict(await query(top.database_url, q))


async def _placed_on(top: Topology) -> dict[str, set[str]]:
    async def q(s: Any) -> dict[str, set[str]]:
        rows = await s.execute(sa.select(workloads.c.name, placements.c.cluster).join(
            placements, placements.c.workload_uid == workloads.c.uid).where(workloads.c.namespace == NS))
        out: dict[str, set[str]] = {}
        for r in rows:
            out.setdefault(r.name, set()).add(r.cluster)
        return out
    return dict(await query(top.database_url, q))


async def _complete(m: Kube, names: list[str]) -> bool | NotYet:
    waiting = []
    for name in names:
        st = (await m.get(JOBS, name, NS)).get("status") or {}
        if "Complete" not in {c["type"] for c in st.get("conditions") or [] if c["status"] == "True"}:
            waiting.append(name)
            continue
        # ended as Kueue sees it: its Workload Finished (what the guide waits for before a queue's checks change)
        wl = (await _workload(m, name)).get("status") or {}
        if not any(c["type"] == "Finished" and c["status"] == "True" for c in wl.get("conditions") or []):
            waiting.append(f"{name}'s Workload")
    return NotYet(", ".join(waiting)) if waiting else True


async def _workload(m: Kube, job_name: str) -> dict[str, Any]:
    return next(w for w in (await m.list(WORKLOADS, NS)).items
                if w["metadata"]["ownerReferences"][0]["name"] == job_name)


def _check(wl: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((c for c in (wl.get("status") or {}).get("admissionChecks") or [] if c["name"] == name), None)


async def _set_queue(m: Kube, name: str, checks: list[str] | None = None, **spec: Any) -> None:
    if checks is not None:
        spec["admissionChecksStrategy"] = strategy(checks)
    await m.patch(CLUSTER_QUEUES, name, {"spec": spec})


def _nothing_ran_twice(top: Topology, kueue: KueueStandIn, mk: MultiKueueStandIn, placed: dict[str, set[str]]
                       ) -> None:
    both = sorted(set(mk.ran) & set(placed))
    assert not both, f"dispatched by MultiKueue and by mkd: {both}"
    assert all(n == 1 for n in mk.ran.values()), f"MultiKueue dispatched a Job twice: {mk.ran}"
    assert all(n == 1 for n in kueue.admitted.values()), f"admitted twice: {kueue.admitted}"
    assert all(len(c) == 1 for c in placed.values()), f"placed on two clusters: {placed}"
    assert all(c <= set(top.worker_names) for c in placed.values()), placed


@pytest.mark.skipif(KUBECTL is None, reason="kubectl (with its built-in kustomize) renders deploy/ for the RBAC check")
async def test_kueue_mode_and_the_handover_guide(kueue: tuple[Topology, KueueStandIn, MultiKueueStandIn]) -> None:
    top, standin, mk = kueue
    m = top.manager
    used, stop = record_calls()
    try:
        # mkd marks its AdmissionCheck Active, as Kueue's check controllers do; MultiKueue's is not its to write.
        async def active() -> bool | NotYet:
            ac = await m.get(ADMISSION_CHECKS, "mkd")
            conds = {c["type"]: c for c in (ac.get("status") or {}).get("conditions") or []}
            return True if conds.get("Active", {}).get("status") == "True" else NotYet(str(conds))
        await wait_for(active, "mkd's AdmissionCheck Active", top=top)
        assert not ((await m.get(ADMISSION_CHECKS, "multikueue")).get("status") or {}).get("conditions")

        # 1. One queue each: cq-mkd's Jobs run on mkd's workers, cq-mk's are left to MultiKueue.
        mine, theirs = ["a-1", "a-2", "a-3"], ["b-1", "b-2"]
        for name in mine:
            await m.create(JOBS, job(name, "lq-mkd"), NS)
        for name in theirs:
            await m.create(JOBS, job(name, "lq-mk"), NS)
        await wait_for(lambda: _complete(m, mine + theirs), "every Job complete", top=top)
        claimed = await _claimed(top)
        assert set(claimed) == set(mine), f"mkd claimed {claimed}"
        placed = await _placed_on(top)
        assert set(placed) == set(mine)
        assert set(mk.ran) == set(theirs)
        for name in mine:
            check = _check(await _workload(m, name), "mkd")
            assert check is not None and check["state"] == "Ready", check
            assert check["message"].startswith('placed on worker cluster "worker-'), check
        _nothing_ran_twice(top, standin, mk, placed)

        async def copies_gone() -> bool | NotYet:  # a finished Job's worker copy is deleted, as MultiKueue's are
            left = [(w, j["metadata"]["name"]) for w in top.worker_names
                    for j in (await top.kubes[w].list(JOBS, NS, label_selector=labels.ORIGIN)).items]
            return NotYet(str(left)) if left else True
        await wait_for(copies_gone, "the finished Jobs' worker copies deleted", top=top)

        # 2. Shadow: what mkd would do with the Jobs of cq-mk, and the counts per controller.
        mk.finish = False  # MultiKueue's next Jobs keep running until the guide lets them end
        await m.create(JOBS, job("b-3", "lq-mk"), NS)

        async def shadowed() -> bool | NotYet:
            rows = await query(top.database_url, lambda s: report(s, NS))
            row = next((r for r in rows if "ClusterQueue/cq-mk" in r["policies"]), None)
            return True if row is not None and row["would_accept"] >= 3 else NotYet(str(rows))
        await wait_for(shadowed, "the shadow report on cq-mk", top=top)

        async def counted() -> bool | NotYet:
            got = {r["controller"]: r["jobs"] for r in await query(top.database_url, lambda s: counts(s, NS))}
            want = {"mkd.dev/dispatcher": 3, labels.MULTIKUEUE: 3}
            return True if got == want else NotYet(str(got))
        await wait_for(counted, "handover status: Jobs per controller", top=top)
        await wait_for(lambda: _running(mk, ["b-3"]), "b-3 running with MultiKueue", top=top)

        # 3. Move cq-mk to mkd's check as the guide says: hold it, wait for MultiKueue's running Jobs, switch.
        await _set_queue(m, "cq-mk", stopPolicy="Hold")
        await m.create(JOBS, job("c-1", "lq-mk"), NS)  # waits: the queue admits nothing while held
        mk.finish = True
        await wait_for(lambda: _complete(m, ["b-3"]), "MultiKueue's running Job ends", top=top)
        await _set_queue(m, "cq-mk", checks=["mkd"], stopPolicy="None")
        await m.create(JOBS, job("c-2", "lq-mk"), NS)
        await wait_for(lambda: _complete(m, ["c-1", "c-2"]), "cq-mk's new Jobs complete on mkd", top=top)
        placed = await _placed_on(top)
        assert {"c-1", "c-2"} <= set(placed) and "b-3" not in placed, placed
        assert set(mk.ran) == {"b-1", "b-2", "b-3"}
        _nothing_ran_twice(top, standin, mk, placed)

        # 4. A queue listing both checks is refused: neither dispatches, and the Job says why.
        await _set_queue(m, "cq-mk", checks=["mkd", "multikueue"])
        await m.create(JOBS, job("d-1", "lq-mk"), NS)

        async def refused() -> bool | NotYet:
            events = (await m.list(Resource("", "v1", "events", "Event"), NS)).items
            said = [e for e in events if e["involvedObject"]["name"] == "d-1"
                    and e["reason"] == "ConflictingAdmissionChecks"]
            return True if said and labels.MULTIKUEUE in said[0]["message"] else NotYet("no Event on d-1")
        await wait_for(refused, "the Event naming the other controller", top=top)
        await asyncio.sleep(1.0)
        assert "d-1" not in await _claimed(top) and "d-1" not in mk.ran
        await m.delete(JOBS, "d-1", NS)

        # 5. Rollback: hold, let mkd's running Jobs end, give the queue back to MultiKueue.
        await _set_queue(m, "cq-mk", checks=["mkd"])
        await m.create(JOBS, job("e-1", "lq-mk", seconds="3"), NS)
        await wait_for(lambda: _running_on_mkd(top, ["e-1"]), "e-1 running on mkd", top=top)
        await _set_queue(m, "cq-mk", stopPolicy="Hold")
        await wait_for(lambda: _complete(m, ["e-1"]), "mkd's running Job ends", top=top)
        await _set_queue(m, "cq-mk", checks=["multikueue"], stopPolicy="None")
        await m.create(JOBS, job("f-1", "lq-mk"), NS)
        await wait_for(lambda: _complete(m, ["f-1"]), "f-1 complete with MultiKueue", top=top)
        placed = await _placed_on(top)
        assert "f-1" in mk.ran and "f-1" not in placed and "e-1" not in mk.ran
        _nothing_ran_twice(top, standin, mk, placed)
    finally:
        stop()
    calls = {(c.verb, c.group, c.resource) for c in used["mkd-dispatcher"]}
    for call in (("patch", "kueue.x-k8s.io", "workloads/status"), ("patch", "kueue.x-k8s.io", "admissionchecks/status"),
                 ("watch", "kueue.x-k8s.io", "workloads"), ("watch", "kueue.x-k8s.io", "admissionchecks")):
        assert call in calls, call
    check_role("dispatcher", role_of(render("production-manager"), "mkd-dispatcher"), calls, ignore_unused=True)


async def _running(mk: MultiKueueStandIn, names: list[str]) -> bool | NotYet:
    missing = [n for n in names if n not in mk.ran]
    return NotYet(", ".join(missing)) if missing else True


async def _running_on_mkd(top: Topology, names: list[str]) -> bool | NotYet:
    claimed = await _claimed(top)
    waiting = [n for n in names if claimed.get(n) != "running"]
    return NotYet(str(claimed)) if waiting else True
