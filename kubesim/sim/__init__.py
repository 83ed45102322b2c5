"""kubesim's simulated cluster components: scheduler, kubelet, Job and TTL-after-finished controllers, KubeRay
(RayCluster, RayJob, RayService), the AppWrapper operator, the LeaderWorkerSet controller (not where
``ClusterSpec.without`` names it), a generic operator for kinds declared in configuration (``generic.py``).

``start(store, spec, loop)`` wires them to one cluster's ``Store`` (call it on the cluster's loop thread);
they react to committed changes through ``Store.subscribe``, never write from inside the callback (work is
scheduled on the loop and coalesced per object) and write back through the Store, so clients see exactly what
a real control plane would show them. The returned ``Simulation`` has ``async stop()``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from kubesim.sim import appwrapper, kuberay, lws, rayservice
from kubesim.sim.appwrapper import AppWrapperOperator
from kubesim.sim.common import StoreLike, log
from kubesim.sim.generic import GenericOperator
from kubesim.sim.jobs import JobController
from kubesim.sim.kubelet import Kubelet
from kubesim.sim.kuberay import KubeRay
from kubesim.sim.lws import LeaderWorkerSetController
from kubesim.sim.rayservice import RayServiceController
from kubesim.sim.scheduler import Scheduler

__all__ = ["Simulation", "start"]

RESOURCES = frozenset({"pods", "nodes", "jobs.batch", *kuberay.RESOURCES, *appwrapper.RESOURCES, *lws.RESOURCES,
                       *rayservice.RESOURCES})
"""What the simulated components react to (``Simulation._dispatch``); other commits are not parsed for them."""


class Simulation:
    """The running simulated components of one cluster."""

    def __init__(self, store: StoreLike, spec: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.store = store
        self.spec = spec
        self.loop = loop
        self.scheduler = Scheduler(store, loop, int(getattr(spec, "seed", 0)))
        self.kubelet = Kubelet(store, loop, self.scheduler, getattr(spec, "kubelet", None))
        self.jobs = JobController(store, loop)
        self.kuberay = KubeRay(store, loop)
        self.rayservices = RayServiceController(store, loop)
        self.appwrappers = AppWrapperOperator(store, loop)
        self.lws = None if "leaderworkerset" in getattr(spec, "without", ()) else LeaderWorkerSetController(store, loop)
        self.generic = GenericOperator(store, loop)
        self._unsubscribe: Callable[[], None] | None = None
        self.stopped = False

    def start(self) -> None:
        # Subscribing and replaying what the store already holds happen in one loop step, so no
        # change falls between them. Nodes first (capacity), then Jobs (owners), then pods.
        self._unsubscribe = self.store.subscribe(self._on_change, RESOURCES)
        for res in ("nodes", "jobs.batch", "pods", *sorted(kuberay.RESOURCES), *sorted(appwrapper.RESOURCES),
                    *sorted(lws.RESOURCES), *sorted(rayservice.RESOURCES)):
            try:
                objects = self.store.list(res)
            except Exception as exc:
                log.debug("replaying %s: %s", res, exc)
                continue
            objects.sort(key=lambda o: (o.get("metadata", {}).get("namespace") or "",
                                        o.get("metadata", {}).get("name") or ""))
            for obj in objects:
                self._on_change("ADDED", res, obj)
        self.generic.start()  # its own subscriptions: the kinds it runs come from a ConfigMap

    def _on_change(self, event: str, res: str, obj: dict[str, Any]) -> None:
        if self.stopped:
            return
        try:
            self._dispatch(event, res, obj)
        except Exception:  # the store swallows subscriber errors; make ours visible
            log.exception("simulation failed on %s %s %s", event, res, obj.get("metadata", {}).get("name"))

    def _dispatch(self, event: str, res: str, obj: dict[str, Any]) -> None:
        if res == "pods":
            self.scheduler.on_pod(event, obj)
            self.kubelet.on_pod(event, obj)
            self.jobs.on_pod(event, obj)
            self.kuberay.on_change(event, res, obj)
            self.appwrappers.on_change(event, res, obj)
            if self.lws is not None:
                self.lws.on_change(event, res, obj)
        elif res == "nodes":
            self.scheduler.on_node(event, obj)
        elif res == "jobs.batch":
            self.jobs.on_job(event, obj)
            self.kuberay.on_change(event, res, obj)
        elif res in kuberay.RESOURCES:
            self.kuberay.on_change(event, res, obj)
            self.rayservices.on_change(event, res, obj)
        elif res in rayservice.RESOURCES:
            self.rayservices.on_change(event, res, obj)
        elif res in appwrapper.RESOURCES:
            self.appwrappers.on_change(event, res, obj)
        elif res in lws.RESOURCES and self.lws is not None:
            self.lws.on_change(event, res, obj)

    async def stop(self) -> None:
        self.stopped = True
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self.scheduler.stop()
        self.kubelet.stop()
        self.jobs.stop()
        self.kuberay.stop()
        self.rayservices.stop()
        self.appwrappers.stop()
        if self.lws is not None:
            self.lws.stop()
        self.generic.stop()


def start(store: StoreLike, spec: Any, loop: asyncio.AbstractEventLoop) -> Simulation:
    """Start the simulated components of one cluster; call on that cluster's loop thread.

    Pod annotations read by the simulated kubelet (on the pod, or on a Job's pod template, whose annotations
    the Job controller copies to its pods); absent ones fall back to the cluster's ``KubeletSpec``:

    - ``kubesim.mkd.dev/start-seconds``: seconds from binding to Running (default ``start_seconds``).
    - ``kubesim.mkd.dev/run-seconds``: seconds each container start runs before it exits (``run_seconds``).
    - ``kubesim.mkd.dev/exit-code``: the exit code of a failing run (``exit_code``).
    - ``kubesim.mkd.dev/fail-attempts``: the first N container starts exit with ``exit-code`` (1 when that is
      0 or unset), later ones with 0 — a pod that fails N times and then succeeds.
    - ``kubesim.mkd.dev/run-forever``: ``"true"``: the containers never exit on their own.
    - ``kubesim.mkd.dev/termination-seconds``: how long a deleted pod stays Terminating (default
      min(terminationGracePeriodSeconds, 0.1)); for tests that need to see terminating pods.

    restartPolicy Never ends the pod Succeeded (exit 0, reason Completed) or Failed (reason Error);
    OnFailure restarts failed containers in place and Always restarts on every exit (restartCount grows,
    lastState.terminated keeps the exit code, a short CrashLoopBackOff wait, phase stays Running).
    Deleted pods are stopped with exit code 143 after min(terminationGracePeriodSeconds, 0.1) seconds
    (pods without finalizers are removed by the API server at once; Job pods carry the tracking finalizer).
    Node capacity is the Node objects' status.allocatable; pods in Succeeded/Failed no longer count.
    """
    sim = Simulation(store, spec, loop)
    sim.start()
    return sim
