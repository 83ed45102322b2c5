"""JobSet end to end through the real apply loop on kubesim; also the rig the MPIJob / TrainJob loop tests use.

``LoopRig`` wires what the agent wires for these kinds (one cache per resource fed by an informer,
children requeue their controlling job) around the real ``ApplyLoop``. Its ``reconcile`` first calls
a reconciler's optional ``prepare(kube, job)`` hook and hands the result to ``render`` as
``observed.extra``: the TrainJob reconciler reads its runtime that way.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from federation.clock import SystemClock
from federation.errors import NotFound
from federation.kinds.crds import load_crds
from federation.kube import CRDS, JOBS, Kube, Resource
from kubesim import ClusterSpec, KubeletSpec, NodeSpec, serve_async
from tests.waiting import eventually
from worker_agent.apply import ApplyLoop, JobKey
from worker_agent.cache import ObjectCache, key_of
from worker_agent.reconcilers.base import Reconciler
from worker_agent.reconcilers.jobset import JOBSETS, JobSetReconciler

NS = "default"


class PrepareLoop(ApplyLoop):
    """The apply loop plus the ``prepare`` hook (proposed for ``worker_agent.apply``)."""

    async def reconcile(self, key: JobKey) -> float | None:
        observed = self.observe(key)
        if observed is None:
            return None
        reconciler = self.reconcilers[key[0]]
        prepare = getattr(reconciler, "prepare", None)
        if prepare is not None:
            observed.extra = await prepare(self.kube, observed.job)  # type: ignore[attr-defined]
        self.passes += 1
        plan = reconciler.render(observed)
        return await self.carry_out(key, observed.job, plan)


class LoopRig:
    def __init__(self, kube: Kube, kinds: dict[str, tuple[Resource, Reconciler]]) -> None:
        self.kube = kube
        self.kinds = {name: res for name, (res, _) in kinds.items()}
        self.plurals: dict[str, Resource] = {res.plural: res for res in self.kinds.values()}
        for _, rec in kinds.values():
            for res in rec.children:
                self.plurals.setdefault(res.plural, res)
        self.caches = {plural: ObjectCache(plural) for plural in self.plurals}
        self.by_uid: dict[str, JobKey] = {}
        self.loop = PrepareLoop(kube, {n: r for n, (_, r) in kinds.items()}, self.kinds, self.caches, SystemClock(),
                                concurrency=4)

    async def _follow(self, plural: str) -> None:
        cache = self.caches[plural]
        kinds = [n for n, res in self.kinds.items() if res.plural == plural]
        async for event in self.kube.informer(self.plurals[plural]):
            obj = event.object
            if event.type == "DELETED":
                cache.delete_event(obj)
            else:
                cache.upsert(obj)
                for kind in kinds:
                    ns, name = key_of(obj)
                    self.by_uid[str(obj["metadata"].get("uid"))] = (kind, ns, name)
                    self.loop.enqueue((kind, ns, name))
            self.loop.enqueue_owner(obj, self.by_uid)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[LoopRig]:
        tasks = [asyncio.create_task(self._follow(p)) for p in self.plurals]
        tasks.append(asyncio.create_task(self.loop.run()))
        try:
            yield self
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def get(self, res: Resource, name: str) -> dict[str, Any] | None:
        try:
            return await self.kube.get(res, name, NS)
        except NotFound:
            return None

    async def wait(self, res: Resource, name: str, probe: Callable[[dict[str, Any]], bool],
                   within: float = 20.0) -> dict[str, Any]:
        last: dict[str, Any] | None = None

        async def seen() -> dict[str, Any] | None:
            nonlocal last
            last = await self.get(res, name)
            return last if last is not None and probe(last) else None
        try:
            return await eventually(seen, within, what=f"{res.plural}/{name}")  # type: ignore[no-any-return]
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last: {last and last.get('status')}") from None


@contextlib.asynccontextmanager
async def cluster(tmp_path: Path) -> AsyncIterator[Kube]:
    spec = ClusterSpec(name="w", nodes=[NodeSpec(name="n1", cpu="16", memory="64Gi")],
                       kubelet=KubeletSpec(start_seconds=0.05, run_seconds=0.5))
    async with serve_async([spec], tmp_path / "sim") as sim, Kube(sim.kubeconfig("w")) as kube:
        for crd in load_crds():
            await kube.create(CRDS, crd)
        await eventually(lambda: kube.served(JOBSETS), within=15, what="the JobSet CRD to be served")
        yield kube


def conds(obj: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(c["type"], c["status"], c["reason"]) for c in (obj.get("status") or {}).get("conditions") or []]


JOBSET = """
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {name: pair}
spec:
  replicatedJobs:
  - name: leader
    template:
      spec:
        parallelism: 1
        completions: 1
        template:
          spec:
            containers: [{name: main, image: busybox, resources: {requests: {cpu: 100m}}}]
  - name: workers
    replicas: 2
    template:
      spec:
        parallelism: 2
        completions: 2
        template:
          spec:
            containers: [{name: main, image: busybox, resources: {requests: {cpu: 100m}}}]
"""


@pytest.mark.timeout(60)
async def test_jobset_runs_to_completed(tmp_path: Path) -> None:
    async with cluster(tmp_path) as kube:
        rig = LoopRig(kube, {"JobSet": (JOBSETS, JobSetReconciler())})
        async with rig.running():
            await kube.create(JOBSETS, yaml.safe_load(JOBSET), NS)
            done = await rig.wait(JOBSETS, "pair", lambda o: (o.get("status") or {}).get("terminalState") == "Completed")
            assert conds(done) == [("Completed", "True", "AllJobsCompleted")]
            assert done["status"]["replicatedJobsStatus"] == [
                {"name": "leader", "ready": 0, "succeeded": 1, "failed": 0, "active": 0, "suspended": 0},
                {"name": "workers", "ready": 0, "succeeded": 2, "failed": 0, "active": 0, "suspended": 0}]
            job = await rig.get(JOBS, "pair-workers-1")
            assert job is not None
            assert job["metadata"]["labels"]["jobset.sigs.k8s.io/job-global-index"] == "2"
            assert job["metadata"]["ownerReferences"][0]["kind"] == "JobSet"
            svc = await kube.get(Resource("", "v1", "services", "Service"), "pair", NS)
            assert svc["spec"]["clusterIP"] == "None"
            assert svc["spec"]["selector"] == {"jobset.sigs.k8s.io/jobset-name": "pair"}
