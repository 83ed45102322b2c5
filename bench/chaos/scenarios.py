"""The scenarios: a stream of jobs (PyTorchJobs, RayJobs, AppWrappers, TrainingRuns, pod groups, LeaderWorkerSets,
RayServices) through a World while faults hit processes by PID.

Every scenario submits ``jobs`` jobs, every :data:`RAY_EVERY`-th a RayJob run by the workers' KubeRay (head, one
worker, a submitter whose run is the Ray job's), every fourth from :data:`APPWRAPPER_AT` an AppWrapper run by the
workers' AppWrapper operator (a batch Job of two pods), every fourth from :data:`DECLARED_AT` a TrainingRun, the kind
from configuration of examples/trainingrun (launcher and one worker, run by kubesim's generic operator), every
:data:`POD_GROUP_EVERY`-th from :data:`POD_GROUP_AT` a pod group of two gated Pods (the agents create them), every
:data:`SERVING_EVERY`-th from :data:`LWS_AT` a LeaderWorkerSet (one group of a leader and a worker, run by the
workers' LWS controller) and from :data:`RAYSERVICE_AT` a RayService (head and one worker, served by their KubeRay),
the others PyTorchJobs (1 Master + 1 Worker); 100m CPU per pod, runs of ``run_seconds`` that exit 0; the
LeaderWorkerSets and RayServices serve until the run ends. They go to the manager at ``rate`` per second, runs its fault script while the stream flows, then waits up
to ``deadline`` seconds after the last fault for every job to be Succeeded on the manager, and counts with
:class:`bench.chaos.observe.Observer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.chaos.observe import (
    APPWRAPPERS,
    LEADERWORKERSETS,
    PYTORCHJOBS,
    RAYJOBS,
    RAYSERVICES,
    TRAININGRUNS,
    Figures,
    Observer,
)
from bench.chaos.procs import Service, missing_binaries
from bench.chaos.world import NAMESPACE, WORKERS, World, WorldOptions
from federation.errors import AlreadyExists
from federation.kube import PODS

MULTIKUEUE = "kueue.x-k8s.io/multikueue"
RAY_EVERY = 4
"""Every fourth job of a stream is a RayJob: the agents create, mirror and delete it, KubeRay runs it."""
APPWRAPPER_AT = 1
"""And every fourth, offset by this, an AppWrapper wrapping a batch Job, run by the workers' AppWrapper operator."""
DECLARED_AT = 2
"""And every fourth, offset by this, a TrainingRun (a kind from configuration), run by the workers' own operator."""
POD_GROUP_EVERY = 8
POD_GROUP_AT = 4
"""And every eighth, offset by this (half of the PyTorchJobs' places), a pod group of :data:`POD_GROUP_SIZE` Pods named
``<job>-<i>``."""
POD_GROUP_SIZE = 2
SERVING_EVERY = 32
LWS_AT, RAYSERVICE_AT = 0, 16
"""And every 32nd, offset by these (a quarter of the PyTorchJobs' places), a LeaderWorkerSet or a RayService: they
serve (never finish) and are at their end once the manager shows them serving (``observe.SERVING``)."""


@dataclass
class Size:
    jobs: int = 300
    rate: float = 10.0
    """Jobs created per second on the manager."""
    run_seconds: float = 3.0
    kills: int = 5
    """dispatcher-kill: kill -9s spread over the stream."""
    outage: float = 15.0
    """postgres-outage: seconds the first outage lasts (the second lasts twice as long)."""
    outages: int = 2
    failover_down: float = 15.0
    """failover: seconds each dispatcher stays killed while the other one must carry on."""
    deadline: float = 120.0
    """Seconds after the last fault by which every job must be Succeeded on the manager."""
    small: bool = False
    """Test size: one kubesim process for all clusters, shorter waits."""
    bridge: bool = False
    """The agents on a Mosquitto of their own, bridged to the dispatchers' (``WorldOptions.bridge``)."""


@dataclass
class Run:
    """What a fault script sees: the World, the size, and where to note each fault."""

    world: World
    size: Size
    submitted: list[str]
    faults: list[tuple[str, float, float]] = field(default_factory=list)
    rng: random.Random = field(default_factory=lambda: random.Random(9))
    stream_done: asyncio.Event = field(default_factory=asyncio.Event)

    async def until_submitted(self, fraction: float) -> None:
        while len(self.submitted) < fraction * self.size.jobs and not self.stream_done.is_set():  # noqa: ASYNC110
            await asyncio.sleep(0.1)  # polled: the stream appends without signalling

    def fault(self, what: str, start: float) -> None:
        self.faults.append((what, start, time.monotonic()))


FaultScript = Callable[[Run], Awaitable[None]]


@dataclass
class Scenario:
    """=================== ===========================================================================
    dispatcher-kill     kill -9 the dispatcher a random while after it got to work, restart it (``kills`` times)
    agent-kill          kill -9 one agent after another, restart each after 1-4 s
    broker-restart      restart the private Mosquitto (SIGTERM; the last one kill -9), down 1-3 s
    postgres-outage     the private PostgreSQL shut down immediately (SIGQUIT) for ``outage`` s, twice
    postgres-at-start   kill -9 the dispatcher and shut PostgreSQL down, start the dispatcher into the outage
    postgres-hang       the private PostgreSQL frozen (SIGSTOP, every process) for ``outage`` s
    partition           SIGSTOP one agent past the dispatcher's worker-lost timeout (re-placement), SIGCONT
    partition-net       cut one agent off the broker silently (its relay holds every byte), then heal
    lease-shortened     the dispatcher restarted with a short lease (agents keep the long one), then partition-net
    failover            two dispatchers on one database; kill -9 one and keep it down, then the other
    =================== ===========================================================================
    """
    name: str
    title: str
    script: FaultScript
    postgres: bool = False
    """Needs the PostgreSQL server binaries (no SQLite fallback)."""
    mosquitto: bool = False
    """Needs Mosquitto (no embedded-broker fallback)."""
    dispatchers: int = 1
    dispatcher: dict[str, Any] = field(default_factory=dict)
    """Dispatcher settings this scenario runs with (on top of the World's)."""
    small_dispatcher: dict[str, Any] | None = None
    """The same at the test size (shorter timeouts); None: ``dispatcher``."""
    prepare: FaultScript | None = None
    """Runs before the stream starts (after the World is up with ``dispatcher`` settings)."""
    run_seconds: float | None = None
    """Overrides Size.run_seconds (the partition needs jobs running while the agent is frozen)."""

    def dispatcher_for(self, size: Size) -> dict[str, Any]:
        return dict(self.small_dispatcher if size.small and self.small_dispatcher is not None else self.dispatcher)

    def run_seconds_for(self, size: Size) -> float:
        if self.run_seconds is None:
            return size.run_seconds
        return self.run_seconds / 2.5 if size.small else self.run_seconds

    def skip_reason(self) -> str | None:
        return missing_binaries(postgres=self.postgres, mosquitto=self.mosquitto)


# --- fault scripts ------------------------------------------------------------------------------------


DISPATCHER_WORKING = "watching PyTorchJob"
"""The dispatcher's log line once its intake is watching the jobs: killing it before that would only
test its start-up (which takes seconds on a loaded machine)."""


async def dispatchers_at_work(run: Run, within: float = 30.0) -> None:
    """Until every running dispatcher logged that it watches the jobs (a fault during its start-up is
    another scenario)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and not all(  # noqa: ASYNC110
            DISPATCHER_WORKING in d.log_since_start() for d in run.world.dispatchers if d.alive):
        await asyncio.sleep(0.2)  # polled: the signal is a line in another process's log


async def kill_dispatcher(run: Run) -> None:
    """kill -9 the dispatcher ``kills`` times, each time a random 0.5-``gap`` s after it got to work."""
    kills = max(1, run.size.kills)
    await run.until_submitted(0.05)
    stream_seconds = run.size.jobs / run.size.rate
    gap = max(1.5, stream_seconds * 0.9 / kills)
    d = run.world.dispatchers[0]
    for i in range(kills):
        deadline = time.monotonic() + 30
        while DISPATCHER_WORKING not in d.log_since_start() and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.2)  # polled: the signal is a line in another process's log
        await asyncio.sleep(run.rng.uniform(0.5, gap))
        start = time.monotonic()
        d.kill()
        await asyncio.sleep(run.rng.uniform(0.2, 1.5))
        d.start()
        run.fault(f"kill -9 dispatcher #{i + 1}", start)


async def kill_agents(run: Run) -> None:
    await run.until_submitted(0.1)
    stream_seconds = run.size.jobs / run.size.rate
    rounds = max(3, min(9, int(stream_seconds / 6)))
    for i in range(rounds):
        cluster = WORKERS[i % len(WORKERS)]
        a = run.world.agents[cluster]
        start = time.monotonic()
        a.kill()
        await asyncio.sleep(run.rng.uniform(1.0, 4.0))
        a.start()
        run.fault(f"kill -9 agent {cluster}", start)
        await asyncio.sleep(stream_seconds * 0.8 / rounds)


async def restart_broker(run: Run) -> None:
    await run.until_submitted(0.1)
    stream_seconds = run.size.jobs / run.size.rate
    rounds = 3
    for i in range(rounds):
        kill = i == rounds - 1
        start = time.monotonic()
        await run.world.restart_broker(kill=kill, down_seconds=run.rng.uniform(1.0, 3.0))
        run.fault(f"broker {'kill -9' if kill else 'restart'}", start)
        await asyncio.sleep(stream_seconds * 0.8 / rounds)


async def postgres_outage(run: Run) -> None:
    pg = run.world.postgres
    assert pg is not None, "postgres-outage needs the private PostgreSQL"
    for i in range(run.size.outages):
        await run.until_submitted((i + 1) / (run.size.outages + 1))
        await dispatchers_at_work(run)
        start = time.monotonic()
        await pg.crash()
        await asyncio.sleep(run.size.outage * (1 + i))
        await pg.start()
        run.fault(f"PostgreSQL down {time.monotonic() - start:.0f}s", start)


async def postgres_at_start(run: Run) -> None:
    """The dispatcher restarted while PostgreSQL goes down: it starts (or crash-loops) during the outage."""
    pg = run.world.postgres
    assert pg is not None, "postgres-at-start needs the private PostgreSQL"
    await run.until_submitted(0.3)
    await dispatchers_at_work(run)
    start = time.monotonic()
    for d in run.world.dispatchers:
        d.kill()
    await pg.crash()
    for d in run.world.dispatchers:
        d.start()
    await asyncio.sleep(run.size.outage)
    await pg.start()
    run.fault(f"dispatcher restarted into a PostgreSQL outage of {time.monotonic() - start:.0f}s", start)


async def postgres_hang(run: Run) -> None:
    """PostgreSQL frozen (SIGSTOP to the postmaster and every backend): connections hang instead of failing."""
    pg = run.world.postgres
    assert pg is not None, "postgres-hang needs the private PostgreSQL"
    await run.until_submitted(0.3)
    await dispatchers_at_work(run)
    start = time.monotonic()
    pg.freeze()
    await asyncio.sleep(run.size.outage)
    pg.thaw()
    run.fault(f"PostgreSQL frozen {time.monotonic() - start:.0f}s", start)


def cut_seconds(run: Run) -> float:
    """How long a partition lasts: past the dispatcher's heartbeat + worker-lost timeouts, so jobs move."""
    values = run.world.dispatcher_values(0)
    lost = float(values.get("worker_lost_timeout_seconds") or 10)
    hb = float(values.get("heartbeat_timeout_seconds") or 6)
    # With fencing (reliable's leases) nothing moves before the lease and its margin are over either.
    lease = float(values.get("lease_seconds") or 0) + float(values.get("lease_margin_seconds") or 0)
    return max(hb + lost, lease) + (4 if run.size.small else 8)


async def partition_agent(run: Run) -> None:
    """Freeze the agent of worker-2 past the worker-lost timeout, so its jobs are re-placed, then thaw it."""
    await run.until_submitted(0.3)
    await asyncio.sleep(2)
    cluster = WORKERS[1]
    a = run.world.agents[cluster]
    start = time.monotonic()
    a.freeze()
    await asyncio.sleep(cut_seconds(run))
    a.thaw()
    run.fault(f"SIGSTOP agent {cluster} {time.monotonic() - start:.0f}s", start)


async def partition_network(run: Run) -> None:
    """Cut worker-2's agent off the broker silently (its relay holds every byte), past the worker-lost
    timeout, then heal. The agent keeps running: it can notice and fence its jobs."""
    await run.until_submitted(0.3)
    await asyncio.sleep(2)
    cluster = WORKERS[1]
    relay, _ = run.world.proxies[cluster]
    start = time.monotonic()
    relay.send(signal.SIGUSR1, "partition")
    await asyncio.sleep(cut_seconds(run))
    relay.send(signal.SIGUSR2, "heal")
    run.fault(f"network partition of agent {cluster} {time.monotonic() - start:.0f}s", start)


async def shorten_lease(run: Run) -> None:
    """Before the stream: the dispatcher restarted with a short lease while the agents hold the default
    (long) one they were granted. The partition that follows must still not move anything before the lease
    the agents hold is over."""
    short = PARTITION_SMALL if run.size.small else PARTITION
    run.world.reconfigure_dispatchers(short, fresh_agents=False)
    await run.world.wait_online()


async def failover(run: Run) -> None:
    """kill -9 dispatcher-0 and keep it down while dispatcher-1 carries on alone, then the other way round."""
    await run.until_submitted(0.15)
    for i in range(2):
        d = run.world.dispatchers[i % len(run.world.dispatchers)]
        start = time.monotonic()
        d.kill()
        await asyncio.sleep(run.size.failover_down)
        d.start()
        run.fault(f"kill -9 {d.name}, down {run.size.failover_down:g}s", start)
        await asyncio.sleep(3)


PARTITION: dict[str, Any] = {"worker_lost_timeout_seconds": 8.0, "lease_seconds": 8.0, "lease_margin_seconds": 2.0,
                             "unaccepted_replace_seconds": 8.0}
"""Timeouts short enough that a partition of ~20 s moves jobs (the defaults wait 15 minutes). The lease
settings exist once fencing landed; before that the runner notes they were not set."""
PARTITION_SMALL: dict[str, Any] = {"worker_lost_timeout_seconds": 4.0, "heartbeat_timeout_seconds": 3.0,
                                   "lease_seconds": 5.0, "lease_margin_seconds": 4.0, "unaccepted_replace_seconds": 4.0}
"""The margin covers the agent suspending its Jobs one API call at a time on a loaded machine (1 s was not
enough: 5 of 24 jobs ran on two clusters at once)."""

SCENARIOS: dict[str, Scenario] = {s.name: s for s in [
    Scenario("dispatcher-kill", "kill -9 of the dispatcher during the stream", kill_dispatcher),
    Scenario("agent-kill", "kill -9 of agents during the stream", kill_agents),
    Scenario("broker-restart", "Mosquitto restarted (and once killed) during the stream", restart_broker,
             mosquitto=True),
    Scenario("postgres-outage", "PostgreSQL shut down (immediate) for an outage, twice", postgres_outage,
             postgres=True),
    Scenario("postgres-at-start", "dispatcher killed and restarted into a PostgreSQL outage", postgres_at_start,
             postgres=True),
    Scenario("postgres-hang", "PostgreSQL frozen (SIGSTOP: connections hang) for an outage", postgres_hang,
             postgres=True),
    Scenario("partition", "agent frozen (SIGSTOP) past the worker-lost timeout, re-placement, SIGCONT",
             partition_agent, dispatcher=PARTITION, run_seconds=25.0, small_dispatcher=PARTITION_SMALL),
    Scenario("partition-net", "agent cut off the broker silently past the worker-lost timeout, re-placement, heal",
             partition_network, dispatcher=PARTITION, run_seconds=25.0, small_dispatcher=PARTITION_SMALL),
    Scenario("lease-shortened", "dispatcher restarted with a shorter lease, then partition-net", partition_network,
             run_seconds=25.0, prepare=shorten_lease),
    Scenario("failover", "two dispatchers on one database; each killed and kept down in turn", failover,
             dispatchers=2),
]}


# --- the run --------------------------------------------------------------------------------------------


def manifest(name: str, run_seconds: float) -> dict[str, Any]:
    def replica() -> dict[str, Any]:
        return {"replicas": 1, "restartPolicy": "OnFailure", "template": {
            "metadata": {"annotations": {"kubesim.mkd.dev/run-seconds": f"{run_seconds:g}"}},
            "spec": {"containers": [{"name": "pytorch", "image": "docker.io/kubeflowkatib/pytorch-mnist:v1beta1",
                                     "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}}}

    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"runPolicy": {"managedBy": MULTIKUEUE, "cleanPodPolicy": "None"},
                     "pytorchReplicaSpecs": {"Master": replica(), "Worker": replica()}}}


def ray_pod(container: str) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": container, "image": "docker.io/rayproject/ray:2.46.0",
                                     "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}}


def lws_manifest(name: str) -> dict[str, Any]:
    """A LeaderWorkerSet of one group, a leader and a worker, handed to mkd by its queue label (no managedBy)."""
    pod = {"spec": {"containers": [{"name": "serve", "image": "docker.io/vllm/vllm-openai:v0.9.2",
                                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}}
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"kueue.x-k8s.io/queue-name": "default"}},
            "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": 2, "workerTemplate": pod}}}


def rayservice_manifest(name: str) -> dict[str, Any]:
    """A RayService of a head and one worker serving one application."""
    config = "applications:\n- name: app\n  import_path: app.deployment\n"
    return {"apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"managedBy": MULTIKUEUE, "serveConfigV2": config,
                     "rayClusterConfig": {"headGroupSpec": {"rayStartParams": {}, "template": ray_pod("ray-head")},
                                          "workerGroupSpecs": [{"groupName": "workers", "replicas": 1,
                                                                "template": ray_pod("ray-worker")}]}}}


def ray_manifest(name: str, run_seconds: float) -> dict[str, Any]:
    """A RayJob: head and one worker serve until the submitter's run (``run_seconds``, exit 0) ends the job."""
    def pod(container: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
        return {"metadata": {"annotations": annotations or {}},
                "spec": {"containers": [{"name": container, "image": "docker.io/rayproject/ray:2.46.0",
                                         "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}}

    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"managedBy": MULTIKUEUE, "entrypoint": "python -c 'print(1)'", "shutdownAfterJobFinishes": True,
                     "submitterPodTemplate": {**pod("ray-job-submitter", {
                         "kubesim.mkd.dev/run-seconds": f"{run_seconds:g}"}),
                         "spec": {**pod("ray-job-submitter")["spec"], "restartPolicy": "Never"}},
                     "rayClusterSpec": {"headGroupSpec": {"rayStartParams": {}, "template": pod("ray-head")},
                                        "workerGroupSpecs": [{"groupName": "workers", "replicas": 1,
                                                              "template": pod("ray-worker")}]}}}


def appwrapper_manifest(name: str, run_seconds: float) -> dict[str, Any]:
    """An AppWrapper wrapping a batch Job of two pods (parallelism 2) that run ``run_seconds`` and exit 0."""
    pod = {"metadata": {"annotations": {"kubesim.mkd.dev/run-seconds": f"{run_seconds:g}"}},
           "spec": {"restartPolicy": "Never", "containers": [{
               "name": "main", "image": "docker.io/library/busybox:1.36",
               "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}}
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
           "spec": {"parallelism": 2, "completions": 2, "template": pod}}
    return {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"managedBy": MULTIKUEUE, "components": [{"template": job}]}}


def trainingrun_manifest(name: str, run_seconds: float) -> dict[str, Any]:
    """A TrainingRun (examples/trainingrun): a launcher and one worker that run ``run_seconds`` and exit 0."""
    def template(container: str) -> dict[str, Any]:
        return {"metadata": {"annotations": {"kubesim.mkd.dev/run-seconds": f"{run_seconds:g}"}},
                "spec": {"containers": [{"name": container, "image": "docker.io/library/python:3.11-slim",
                                         "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}}

    return {"apiVersion": "example.com/v1", "kind": "TrainingRun", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"managedBy": MULTIKUEUE, "launcher": {"template": template("launcher")},
                     "workers": {"replicas": 1, "template": template("worker")}}}


def pod_group_manifests(name: str, run_seconds: float) -> list[dict[str, Any]]:
    """A pod group (``kueue.x-k8s.io/pod-group-name: <name>``) of Pods gated by Kueue's admission gate that run
    ``run_seconds`` and exit 0."""
    return [{"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": f"{name}-{i}", "namespace": NAMESPACE,
                          "labels": {"kueue.x-k8s.io/queue-name": "default", "kueue.x-k8s.io/pod-group-name": name},
                          "annotations": {"kueue.x-k8s.io/pod-group-total-count": str(POD_GROUP_SIZE),
                                          "kubesim.mkd.dev/run-seconds": f"{run_seconds:g}"}},
             "spec": {"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}], "restartPolicy": "Never",
                      "containers": [{"name": "main", "image": "docker.io/library/busybox:1.36",
                                      "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}}
            for i in range(POD_GROUP_SIZE)]


async def submit(obs: Observer, run: Run, prefix: str, run_seconds: float) -> None:
    """Create the jobs at the size's rate; a failed create is retried (the manager API is not faulted)."""
    kube = obs.kubes["manager"]
    interval = 1.0 / run.size.rate
    t0 = time.monotonic()
    try:
        for i in range(run.size.jobs):
            name = f"{prefix}-{i:05d}"
            await asyncio.sleep(max(0.0, t0 + i * interval - time.monotonic()))
            for attempt in range(5):
                try:
                    if i % SERVING_EVERY == LWS_AT:
                        await kube.create(LEADERWORKERSETS, lws_manifest(name), NAMESPACE)
                    elif i % SERVING_EVERY == RAYSERVICE_AT:
                        await kube.create(RAYSERVICES, rayservice_manifest(name), NAMESPACE)
                    elif i % RAY_EVERY == RAY_EVERY - 1:
                        await kube.create(RAYJOBS, ray_manifest(name, run_seconds), NAMESPACE)
                    elif i % RAY_EVERY == APPWRAPPER_AT:
                        await kube.create(APPWRAPPERS, appwrapper_manifest(name, run_seconds), NAMESPACE)
                    elif i % RAY_EVERY == DECLARED_AT:
                        await kube.create(TRAININGRUNS, trainingrun_manifest(name, run_seconds), NAMESPACE)
                    elif i % POD_GROUP_EVERY == POD_GROUP_AT:
                        for pod in pod_group_manifests(name, run_seconds):
                            with contextlib.suppress(AlreadyExists):  # a retry after a create that went through
                                await kube.create(PODS, pod, NAMESPACE)
                    else:
                        await kube.create(PYTORCHJOBS, manifest(name, run_seconds), NAMESPACE)
                    break
                except Exception:
                    if attempt == 4:
                        raise
                    await asyncio.sleep(0.5)
            obs.track(name).created = time.monotonic()
            run.submitted.append(name)
    finally:
        run.stream_done.set()


def world_options(scenario: Scenario, size: Size, root: Path) -> WorldOptions:
    return WorldOptions(root=root, dispatchers=scenario.dispatchers, kubesim_per_cluster=not size.small,
                        dispatcher=scenario.dispatcher_for(size), bridge=size.bridge)


async def run_scenario(scenario: Scenario, size: Size, root: Path) -> Figures:
    """Start a World of the scenario's own, run it there, stop it."""
    async with World(world_options(scenario, size, root)) as world, Observer(world) as obs:
        return await run_in(world, obs, scenario, size)


async def run_in(world: World, obs: Observer, scenario: Scenario, size: Size) -> Figures:
    """Stream jobs through a running World, run the fault script, wait for the end, count.

    The World may be shared by several scenarios (the test suite does, to keep start-up cheap): each
    counts only its own jobs, and leaves every service running again.
    """
    size = replace(size, run_seconds=scenario.run_seconds_for(size))
    if world.reconfigure_dispatchers(scenario.dispatcher_for(size)):
        await world.wait_online()
    extra: list[Service] = []
    while len(world.dispatchers) < scenario.dispatchers:
        extra.append(world.add_dispatcher(len(world.dispatchers)))
    run = Run(world, size, [])
    if scenario.prepare is not None:
        await scenario.prepare(run)
    started = time.monotonic()
    stream = asyncio.create_task(submit(obs, run, f"{scenario.name[:12]}-{uuid.uuid4().hex[:4]}", size.run_seconds))
    faults = asyncio.create_task(scenario.script(run))
    try:
        while not (stream.done() and faults.done()):
            await asyncio.wait({stream, faults}, timeout=1.0)
            for s in world.services:
                if s.name.startswith("kubesim"):
                    if why := s.exited():  # the clusters are not under test: fail loudly
                        raise RuntimeError(why)
                else:  # a service that died by itself is a finding: noted, restarted like a pod
                    s.restart_if_crashed()
        stream.result()
        faults.result()
    finally:
        for t in (stream, faults):
            if not t.done():
                t.cancel()
                with contextlib.suppress(BaseException):
                    await t
    for s in world.services:  # every service must be up again once the faults are over
        if s.frozen:
            s.thaw()
        if not s.alive and not s.name.startswith("kubesim"):
            s.held = False
            s.restart_if_crashed()

    def keep_up() -> None:
        for s in world.services:
            if not s.name.startswith("kubesim"):
                s.restart_if_crashed()

    last = max((end for _, _, end in run.faults), default=time.monotonic())
    await obs.wait_done(run.submitted, last + size.deadline, keep_up)
    crashes = [c for s in world.services for c in s.crashes]
    for s in world.services:
        s.crashes.clear()
    notes = [*world.notes, *(f"CRASH (restarted like a pod): {c}" for c in crashes)]
    figures = await obs.tally(scenario.name, run.submitted, run.faults, started, notes, len(crashes))
    for s in extra:
        s.terminate()
        world.dispatchers.remove(s)
    return figures
