"""Side work degrades, never kills: a dispatcher whose ClusterRole lacks ``patch`` on ``clusterqueues/status``
and ``localqueues/status`` keeps placing Jobs, and says why the queues' status is stale (the log once, a
counter, ``/readyz`` with the missing rule).

The manager is a kubesim cluster that authorizes every request; the dispatcher runs with a token of its
ServiceAccount bound to the ClusterRole of ``deploy/manager/dispatcher.yaml`` minus the two status rules,
as on a real cluster whose role was installed from an older manifest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import kubesim
from dispatcher.db import models as m
from federation import labels
from federation.kube import Kube
from mkctl import deployrbac
from tests.dispatcher.harness import (
    PYTORCHJOBS,
    FakeAgent,
    eventually,
    install_crd,
    pytorchjob,
    running,
    settings,
)
from tests.dispatcher.test_flow import rows
from tests.dispatcher.test_queueing import CQS, FLAVORS, KUEUE, LQS, _cq, install_kueue, labelled

STATUS_RULES = {"clusterqueues/status", "localqueues/status"}


def without_rules(docs: list[dict[str, Any]], resources: set[str]) -> list[dict[str, Any]]:
    """deploy/'s documents with ``resources`` taken out of every ClusterRole rule."""
    for doc in docs:
        if doc["kind"] == "ClusterRole":
            doc["rules"] = [{**rule, "resources": kept} for rule in doc["rules"]
                            if (kept := [r for r in rule.get("resources", []) if r not in resources])]
    return docs


@contextlib.asynccontextmanager
async def manager_without(tmp_path: Path, resources: set[str], *, kueue: bool = True) -> AsyncIterator[tuple[Kube, Path]]:
    """An authorizing kubesim manager with mkd's CRDs (and Kueue's), the dispatcher's deploy/ roles minus
    ``resources``: (an admin client, a kubeconfig with the dispatcher's ServiceAccount token)."""
    spec = kubesim.ClusterSpec("manager", nodes=[kubesim.NodeSpec("m1")], authorize=True)
    async with kubesim.serve_async([spec], tmp_path / "sim") as sim:
        admin = Path(sim.kubeconfig("manager"))
        await install_crd(admin)
        async with Kube(admin) as kube:
            if kueue:
                await install_kueue(kube)
            await deployrbac.apply(kube, without_rules(deployrbac.documents("dispatcher"), resources))
            yield kube, await deployrbac.service_kubeconfig(kube, admin, "dispatcher", tmp_path / "d.kubeconfig")


async def placed(url: str) -> set[str]:
    return {r.name for r in await rows(url, m.workloads) if r.state in ("placed", "running")}


async def test_a_dispatcher_without_the_queue_status_rule_keeps_placing_and_says_why(
        tmp_path: Path, db_url: str, mqtt_url: str, topic_root: str, caplog: pytest.LogCaptureFixture) -> None:
    async with manager_without(tmp_path, STATUS_RULES) as (kube, token_config):
        await kube.create(FLAVORS, {"apiVersion": f"{KUEUE}/v1beta2", "kind": "ResourceFlavor",
                                    "metadata": {"name": "default"}})
        await kube.create(CQS, _cq("team-a", "2"))
        await kube.create(LQS, {"apiVersion": f"{KUEUE}/v1beta2", "kind": "LocalQueue",
                                "metadata": {"name": "team-a", "namespace": "default"},
                                "spec": {"clusterQueue": "team-a"}}, "default")
        s = settings(token_config, db_url, mqtt_url, topic_root, api_port=0, api_host="127.0.0.1")
        caplog.set_level(logging.ERROR, logger="federation.tasks")
        async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s) as d:
            for i in range(3):
                await kube.create(PYTORCHJOBS, labelled(pytorchjob(f"a{i}", workers=0),
                                                        **{labels.QUEUE_NAME: "team-a"}), "default")
            await eventually(lambda: _count(db_url, 2), what="two placed within the quota", within=30)

            def degraded() -> Any:
                if d.supervisor is not None and d.supervisor.failed:
                    return "stopped"
                side = getattr(d, "side", None)
                return side is not None and len(side.of("queues/status")) == 2 and side.of("queues/status")
            faults = await eventually(degraded, what="queue status degraded", within=30)
            assert faults != "stopped", f"the dispatcher stopped on a side-work failure: {d.supervisor._errors}"
            assert sorted(f.cause for f in faults) == [
                "forbidden: patch clusterqueues/status in API group kueue.x-k8s.io",
                "forbidden: patch localqueues/status in API group kueue.x-k8s.io"]
            fault = next(f for f in faults if "clusterqueues" in f.cause)
            assert ('clusterqueues.kueue.x-k8s.io "team-a" is forbidden: User '
                    '"system:serviceaccount:mkd-system:mkd-dispatcher" cannot patch resource '
                    '"clusterqueues/status" in API group "kueue.x-k8s.io" at the cluster scope') in fault.message
            rule = '{apiGroups: ["kueue.x-k8s.io"], resources: ["clusterqueues/status"], verbs: ["patch"]}'
            assert rule in fault.fix

            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{d.http.port}") as client:
                ready = await client.get("/readyz")
                metrics = (await client.get("/metrics")).text
            assert ready.status_code == 200, ready.text
            assert ready.text.startswith("ok\ndegraded: queues/status: ") and rule in ready.text
            assert ('mkd_side_work_failures_total{cause="forbidden: patch clusterqueues/status in API group '
                    'kueue.x-k8s.io",work="queues/status"}') in metrics
            assert 'mkd_side_work_degraded{cause="forbidden: patch clusterqueues/status' in metrics

            # said once per cause, however often it was tried
            said = [r for r in caplog.records if "queues/status is degraded" in r.getMessage()]
            assert len(said) == 2, [r.getMessage() for r in said]
            assert sum(d.side.failures[("queues/status", f.cause)] for f in faults) >= 2

            # and the dispatcher goes on: a finished Job frees quota for the third
            place = next(p for p in agent.places() if p.job.name == "a0")
            await agent.status(place, {"conditions": [{"type": "Succeeded", "status": "True"}]},
                               finished="Succeeded")
            await eventually(lambda: _has(db_url, "a2"), what="a2 placed once a0 finished", within=30)
            assert not d.supervisor.failed  # type: ignore[union-attr]
            cq = await kube.get(CQS, "team-a")
            assert "admittedWorkloads" not in (cq.get("status") or {})  # stale, and /readyz says why


async def _count(url: str, n: int) -> bool:
    return len(await placed(url)) >= n


async def _has(url: str, name: str) -> bool:
    return name in await placed(url)


async def test_a_status_write_the_role_refuses_is_kept_retried_and_said_until_the_role_is_fixed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A 403 on a manager Job's status write (the ClusterRole lacks ``pytorchjobs/status``) is not dropped: the
    write waits and is tried again with backoff, the refusal is degraded side work (``/readyz`` and the metrics
    read it: the missing rule), logged once; once the role has the rule the write goes and the fault is over."""
    from dispatcher.intake.jobcache import JobCache
    from dispatcher.mirror.kubewriter import WORK, JobKey, KubeWriter
    from dispatcher.workload import condition
    from federation.clock import FakeClock
    from federation.tasks import SideWork

    async with manager_without(tmp_path, {"pytorchjobs/status"}, kueue=False) as (kube, token_config):
        job = await kube.create(PYTORCHJOBS, pytorchjob("refused"), "default")
        key = JobKey(job["metadata"]["uid"], "PyTorchJob", "default", "refused")
        cache = JobCache()
        cache[key.uid] = job
        clock = FakeClock()
        side = SideWork(clock)
        async with Kube(token_config) as limited:
            writer = KubeWriter(limited, cache, clock, side=side)
            task = asyncio.create_task(writer.run())
            try:
                writer.condition(key, condition(labels.CONDITION_DISPATCHED, True, "Placed", "on worker-1",
                                                clock.now()))
                clock.advance(1)  # the condition's short wait to share a write
                for tries in (1, 2, 3):
                    await eventually(lambda n=tries: writer.failures == n, what=f"refusal {tries}")
                    [fault] = side.of(WORK)
                    assert fault.failures == tries
                    clock.advance(2 ** (tries - 1))  # the backoff: 1, 2, 4 s
                assert fault.cause == "forbidden: patch pytorchjobs/status in API group kubeflow.org"
                assert 'resources: ["pytorchjobs/status"], verbs: ["patch"]' in fault.fix
                await eventually(lambda: writer.failures == 4, what="refusal 4")
                await deployrbac.apply(kube, deployrbac.documents("dispatcher"))  # the role fixed
                clock.advance(8)
                await eventually(lambda: writer.writes == 1, what="the write once the role allows it",
                                 within=15)
                assert side.of(WORK) == []
            finally:
                task.cancel()
        got = await kube.get(PYTORCHJOBS, "refused", "default")
        assert [c["type"] for c in got["status"]["conditions"]] == [labels.CONDITION_DISPATCHED]
    said = [r for r in caplog.records if f"{WORK} is degraded" in r.getMessage()]
    assert len(said) == 1


async def test_a_refused_queue_list_says_why_nothing_is_admitted_and_is_tried_again(
        tmp_path: Path, db_url: str, mqtt_url: str, topic_root: str) -> None:
    """A ClusterRole without ``list`` on ``clusterqueues``: the queueing catalog cannot be listed, so the scheduler
    admits nothing; ``/readyz`` says so (503, the kind and the missing rule) instead of a bare "ok", and once the
    role has the rule the list is tried again, the catalog is ready and the Job is placed."""
    async with manager_without(tmp_path, {"clusterqueues"}) as (kube, token_config):
        s = settings(token_config, db_url, mqtt_url, topic_root, api_port=0, api_host="127.0.0.1")
        async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s) as d:
            await asyncio.wait_for(d.http.started.wait(), 10)
            await kube.create(PYTORCHJOBS, pytorchjob("waits", workers=0), "default")
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{d.http.port}") as client:
                async def refused() -> httpx.Response | None:
                    ready = await client.get("/readyz")
                    return ready if "forbidden" in ready.text else None
                ready = await eventually(refused, what="/readyz saying why", within=30)
                assert ready.status_code == 503
                assert "queues: queueing objects not listed yet, no Workload is admitted" in ready.text
                assert ('ClusterQueue (list clusterqueues in all namespaces: clusterqueues.kueue.x-k8s.io is forbidden'
                        in ready.text
                        and 'resources: ["clusterqueues"], verbs: ["list"]' in ready.text), ready.text
                assert agent.places() == []
                await deployrbac.apply(kube, deployrbac.documents("dispatcher"))
                await eventually(lambda: len(agent.places()) == 1, what="placed once the list is allowed",
                                 within=60)
                assert (await client.get("/readyz")).status_code == 200
