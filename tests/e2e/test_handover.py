"""The handover guide of the README, played on the demo topology: shadow, 10%, 100%, drain, rollback.

The training-operator's part is played by a trivial in-test controller: it runs every PyTorchJob in
``team-h`` whose managedBy is unset or ``kubeflow.org/training-operator`` (status Running, then
Succeeded) and remembers which Jobs it touched. The dispatcher serves the mutating webhook over HTTPS;
kubesim calls it as a real API server does. At every step: no Job is run by two controllers (the
trivial controller never touches a Job mkd holds; mkd never claims one the trivial controller runs),
and every Job ends Succeeded with its status intact.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from dispatcher.handover.policy import bucket
from dispatcher.handover.queries import counts, report
from federation import labels
from federation.errors import NotFound
from federation.kube import NAMESPACES, Kube, Resource
from kubesim.testing import webhook_pki
from mkctl.topology import Topology, TopologyOptions
from tests.e2e.conftest import NotYet, check_not_forbidden, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.kubesim_only(
    "the dispatcher's webhook listens on this machine's loopback, out of a real API server's reach")]

NS = "team-h"
PYTORCHJOBS = Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
POLICIES = Resource("handover.mkd.dev", "v1alpha1", "handoverpolicies", "HandoverPolicy", namespaced=False)
WEBHOOKS = Resource("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations",
                    "MutatingWebhookConfiguration", namespaced=False)


def job(name: str, *, container: str = "pytorch") -> dict[str, Any]:
    pod = {"metadata": {"annotations": {"kubesim.mkd.dev/run-seconds": "1"}},
           "spec": {"containers": [{"name": container, "image": "example/train:1",
                                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name, "namespace": NS},
            "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "restartPolicy": "OnFailure",
                                                        "template": pod}}}}


def policy(mode: str, percent: int = 100) -> dict[str, Any]:
    return {"apiVersion": "handover.mkd.dev/v1alpha1", "kind": "HandoverPolicy", "metadata": {"name": "team-h"},
            "spec": {"mode": mode, "percent": percent, "kinds": ["PyTorchJob"],
                     "namespaceSelector": {"matchLabels": {"team": "h"}}}}


class TrivialOperator:
    """The other controller: runs the Jobs whose managedBy is unset or its own, and nothing else."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.touched: set[str] = set()

    async def run(self) -> None:
        while True:
            for obj in (await self.kube.list(PYTORCHJOBS, NS)).items:
                managed_by = (obj["spec"].get("runPolicy") or {}).get("managedBy")
                if managed_by not in (None, labels.TRAINING_OPERATOR):
                    continue
                status = obj.get("status") or {}
                now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                if not status.get("startTime"):
                    status = {"startTime": now, "conditions": [self._cond("Running", now)],
                              "replicaStatuses": {"Master": {"active": 1}}}
                elif "Succeeded" not in [c["type"] for c in status.get("conditions", [])]:
                    status = {**status, "completionTime": now, "replicaStatuses": {"Master": {"succeeded": 1}},
                              "conditions": [*status["conditions"], self._cond("Succeeded", now)]}
                else:
                    continue
                self.touched.add(obj["metadata"]["name"])
                with contextlib.suppress(Exception):  # a conflict: the next round writes it
                    await self.kube.replace(PYTORCHJOBS, {**obj, "status": status}, NS, subresource="status")
            await asyncio.sleep(0.2)  # the fake operator's round, as a real one reconciles

    @staticmethod
    def _cond(type_: str, now: str) -> dict[str, str]:
        return {"type": type_, "status": "True", "reason": f"PyTorchJob{type_}", "message": "trivial operator",
                "lastTransitionTime": now, "lastUpdateTime": now}


async def query(url: str, fn: Any) -> Any:
    from sqlalchemy.ext.asyncio import AsyncSession

    from dispatcher.db import make_engine

    engine = make_engine(url)
    try:
        async with AsyncSession(engine) as session:
            return await fn(session)
    finally:
        await engine.dispose()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def handover(tmp_path: Path, mqtt_url: str, database_url: str, topic_root: str
                   ) -> AsyncIterator[tuple[Topology, TrivialOperator, int]]:
    pki = webhook_pki([], ips=("127.0.0.1",))
    (tmp_path / "tls.crt").write_bytes(pki.cert_pem)
    (tmp_path / "tls.key").write_bytes(pki.key_pem)
    port = _free_port()
    options = TopologyOptions(
        state_dir=tmp_path / "state", mqtt_url=mqtt_url, database_url=database_url, topic_root=topic_root,
        heartbeat_seconds=1.0, heartbeat_timeout_seconds=3.0, origin="mkd-handover",
        dispatcher_overrides={"handover": {"webhook_port": port, "webhook_host": "127.0.0.1", "flush_seconds": 0.3,
                                           "webhook_cert_file": tmp_path / "tls.crt",
                                           "webhook_key_file": tmp_path / "tls.key"}})
    async with Topology(options) as top:
        m = top.manager
        await m.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                    "metadata": {"name": NS, "labels": {"team": "h"}}})
        await m.create(WEBHOOKS, {
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "mkd-handover"},
            "webhooks": [{"name": "handover.mkd.dev", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                          "failurePolicy": "Ignore", "timeoutSeconds": 5,
                          "clientConfig": {"url": f"https://127.0.0.1:{port}/mutate", "caBundle": pki.ca_bundle},
                          "namespaceSelector": {"matchLabels": {"team": "h"}},
                          "rules": [{"operations": ["CREATE"], "apiGroups": ["kubeflow.org"], "apiVersions": ["*"],
                                     "resources": ["pytorchjobs"]}]}]})
        operator = TrivialOperator(m)
        task = asyncio.create_task(operator.run())
        try:
            yield top, operator, port
            top.check_running()
            await check_not_forbidden(top)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _set_policy(m: Kube, body: dict[str, Any] | None) -> None:
    if body is None:
        await m.delete(POLICIES, "team-h")
        return
    try:
        old = await m.get(POLICIES, "team-h")
        await m.replace(POLICIES, {**body, "metadata": {**body["metadata"],
                                                         "resourceVersion": old["metadata"]["resourceVersion"]}})
    except NotFound:
        await m.create(POLICIES, body)


async def _submit(top: Topology, names: list[str], **kw: Any) -> dict[str, str | None]:
    """Create Jobs without managedBy; what managedBy each was created with (the webhook's doing)."""
    out = {}
    for name in names:
        created = await top.manager.create(PYTORCHJOBS, job(name, **kw), NS)
        out[name] = (created["spec"].get("runPolicy") or {}).get("managedBy")
    return out


async def _all_succeeded(top: Topology, names: list[str]) -> bool | NotYet:
    waiting = []
    for name in names:
        st = (await top.manager.get(PYTORCHJOBS, name, NS)).get("status") or {}
        if "Succeeded" not in [c["type"] for c in st.get("conditions", []) if c.get("status") == "True"]:
            waiting.append(name)
    return NotYet(", ".join(waiting)) if waiting else True


async def test_the_handover_guide(handover: tuple[Topology, TrivialOperator, int]) -> None:
    top, operator, _ = handover
    m = top.manager
    db = top.database_url
    routed: dict[str, str | None] = {}

    async def online(session: Any) -> list[str]:
        import sqlalchemy as sa

        from dispatcher.db.models import clusters
        result = await session.execute(sa.select(clusters.c.name).where(clusters.c.online))
        return list(result.scalars())

    async def every_cluster_heard() -> bool | NotYet:  # the shadow's "would run on" needs their capacity
        names = await query(db, online)
        return True if len(names) == len(top.worker_names) else NotYet(f"online: {names}")
    await wait_for(every_cluster_heard, "every worker's heartbeat", top=top)

    # 1. Shadow: nothing moves; the report says what mkd would do.
    await _set_policy(m, policy("Shadow"))
    await asyncio.sleep(1.0)  # the dispatcher's informer has the policy
    shadowed = [f"shadow-{i}" for i in range(6)]
    routed |= await _submit(top, shadowed)
    routed |= await _submit(top, ["shadow-bad"], container="trainer")  # mkd's validation would refuse it
    assert not any(routed.values()), routed

    async def shadow_report() -> dict[str, Any] | NotYet:
        rows = await query(db, lambda s: report(s, NS))
        row = next((r for r in rows if r["kind"] == "PyTorchJob"), None)
        return row if row and row["jobs"] == 7 else NotYet(repr(rows))
    row = await wait_for(shadow_report, "the shadow report for team-h", top=top)
    assert row["would_accept"] == 6 and row["would_refuse"] == 1
    assert "container with name pytorch" in row["refusals"][0]["reason"]
    assert "worker-" in row["would_run_on"], row  # a cluster has room for these small Jobs
    await wait_for(lambda: _all_succeeded(top, [*shadowed, "shadow-bad"]), "shadowed Jobs run by their operator",
                   top=top)

    # 2. Route 10%: exactly the Jobs whose stable share is under 10 go to mkd.
    await _set_policy(m, policy("Route", 10))
    await asyncio.sleep(1.0)  # real time: the dispatcher process's informer gets the policy (nothing tells when)
    ten = [f"r10-{i}" for i in range(30)]
    got = await _submit(top, ten)
    assert {n for n, v in got.items() if v == labels.MULTIKUEUE} == {n for n in ten if bucket(NS, n) < 10}
    routed |= got

    # 3. Route 100%: every new Job goes to mkd; the 10% keep theirs.
    await _set_policy(m, policy("Route", 100))
    await asyncio.sleep(1.0)  # real time: the dispatcher process's informer gets the policy (nothing tells when)
    full = [f"r100-{i}" for i in range(5)]
    got = await _submit(top, full)
    assert set(got.values()) == {labels.MULTIKUEUE}
    routed |= got

    # 4. Drain: no new Job goes to mkd; what it holds runs to its end.
    await _set_policy(m, policy("Drain"))
    await asyncio.sleep(1.0)  # real time: the dispatcher process's informer gets the policy (nothing tells when)
    got = await _submit(top, ["drain-0", "drain-1"])
    assert not any(got.values())
    routed |= got

    # 5. Rollback: the policy is gone; nothing is routed, nothing changes hands.
    await _set_policy(m, None)
    await asyncio.sleep(1.0)  # real time: the dispatcher process's informer gets the policy (nothing tells when)
    got = await _submit(top, ["after-0"])
    assert not any(got.values())
    routed |= got

    everything = list(routed)
    await wait_for(lambda: _all_succeeded(top, everything), "every Job Succeeded", top=top, within=120)
    mkd_jobs = {n for n, v in routed.items() if v == labels.MULTIKUEUE}
    assert mkd_jobs and not (mkd_jobs & operator.touched), "a Job routed to mkd was run by the other controller"
    assert operator.touched == set(routed) - mkd_jobs
    for name in everything:  # every status is its controller's: mkd mirrored, or the operator's own
        st = (await m.get(PYTORCHJOBS, name, NS))["status"]
        conds = {c["type"] for c in st["conditions"]}
        if name in mkd_jobs:
            assert labels.CONDITION_DISPATCHED in conds, (name, conds)
        else:
            assert not any(t.startswith("MultiCluster") for t in conds), (name, conds)
            assert st["replicaStatuses"] == {"Master": {"succeeded": 1}}
    for worker in top.worker_names:  # no worker ever got a Job of the other controller
        names = {o["metadata"]["name"] for o in (await top.kubes[worker].list(PYTORCHJOBS, NS)).items}
        assert names <= mkd_jobs, names - mkd_jobs

    async def counted() -> list[dict[str, Any]] | NotYet:
        rows = [r for r in await query(db, lambda s: counts(s, NS)) if r["kind"] == "PyTorchJob"]
        by = {r["controller"]: r["jobs"] for r in rows}
        want = {labels.MULTIKUEUE: len(mkd_jobs), f"{labels.TRAINING_OPERATOR} (default)": len(operator.touched)}
        return rows if by == want else NotYet(f"{by} != {want}")
    await wait_for(counted, "Jobs per controller counted", top=top)
