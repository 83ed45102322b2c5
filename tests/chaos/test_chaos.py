"""The chaos scenarios of ``bench/chaos`` at a small size: separate processes, faults by PID.

One federation (kubesim, a private Mosquitto or the embedded broker in a process, a private PostgreSQL or
SQLite, a dispatcher, three agents) is shared by the module to keep start-up cheap; each scenario streams its
own jobs through it, hurts it, waits for the end and counts from the clusters and the database (see
``bench/chaos/observe.py``). Each asserts 0 lost, 0 run twice at once, 0 stuck, and no service exiting by
itself; scenarios with a reported cause (``KNOWN_TWICE``, ``KNOWN_STUCK``, ``KNOWN_CRASH``) mark themselves
xfail for that one figure only, after asserting the others. The first two tests prove the counting itself can
fail: a job live on two workers is seen as run twice, a job nobody claims is counted lost.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
import pytest_asyncio

from bench.chaos.__main__ import figure_lines
from bench.chaos.observe import (
    APPWRAPPERS,
    LEADERWORKERSETS,
    PYTORCHJOBS,
    RAYJOBS,
    RAYSERVICES,
    TRAININGRUNS,
    Observer,
)
from bench.chaos.procs import missing_binaries
from bench.chaos.scenarios import (
    SCENARIOS,
    Size,
    appwrapper_manifest,
    lws_manifest,
    manifest,
    pod_group_manifests,
    ray_manifest,
    rayservice_manifest,
    run_in,
    trainingrun_manifest,
)
from bench.chaos.world import MANAGER, NAMESPACE, World, WorldOptions
from federation.kube import PODS

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

# The deadline only costs time when a job does not make it: generous, so a loaded machine is not a failure.
SMALL = Size(jobs=24, rate=10.0, run_seconds=2.0, kills=2, outage=6.0, outages=1, failover_down=6.0, deadline=60.0,
             small=True)

KNOWN_TWICE: dict[str, str] = {
    # Reported limits: the test still fails on anything else (lost, stuck, crashes), and marks itself
    # xfail only for this one figure, so it keeps failing for any other reason. (``partition``, a frozen
    # agent, left here once the fencer stopped its Jobs: bench/chaos/README.md.)
}
KNOWN_STUCK: dict[str, str] = {
    # (``partition-net`` left here once its causes were fixed: a publish timed out during the partition
    # muted the agent's outbox on a link that survived it, tests/agent/test_partition_heal.py; Commands
    # queued during the cut were refused as replays; fenced Jobs were resumed from a stale cache.)
}
KNOWN_CRASH: dict[str, str] = {
    # none known: postgres-outage (the 'starting up' exit) and postgres-at-start (the exit at start-up)
    # ran 0 crashes in tests/chaos and at 300 jobs (bench/RESULTS.md, dispatcher robustness)
}


class Shared:
    def __init__(self, world: World, obs: Observer) -> None:
        self.world = world
        self.obs = obs


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Shared]:
    """Scenarios needing a backend that is not installed skip and say which; the others fall back
    (embedded broker, SQLite). ``bench/chaos/README.md`` has the full-size runs and their figures.
    """
    root: Path = tmp_path_factory.mktemp("chaos")
    async with World(WorldOptions(root=root, kubesim_per_cluster=False)) as world, Observer(world) as obs:
        yield Shared(world, obs)


async def eventually(probe: object, what: str, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if probe():  # type: ignore[operator]
            return
        await asyncio.sleep(0.2)
    pytest.fail(f"not within {within:.0f}s: {what}")


@pytest.mark.parametrize("kind", ["PyTorchJob", "RayJob", "AppWrapper", "TrainingRun", "PodGroup", "LeaderWorkerSet",
                                  "RayService"])
async def test_a_job_live_on_two_workers_counts_as_run_twice(shared: Shared, kind: str) -> None:
    """The counter of the main guarantee can fail: copies made by hand on two workers are caught, for every
    kind of the mix."""
    name = f"selfcheck-twice-{kind.lower()}"
    if kind == "PodGroup":  # gated Pods: no worker's scheduler runs them, they are live copies all the same
        group = pod_group_manifests(name, 60)
        for w in ("worker-1", "worker-2"):
            for pod in group:
                await shared.obs.kubes[w].create(PODS, pod, NAMESPACE)
        try:
            await eventually(lambda: shared.obs.jobs.get(name) is not None and shared.obs.jobs[name].twice,
                             "the observer to confirm the pod group live on worker-1 and worker-2")
            assert "worker-1, worker-2" in shared.obs.jobs[name].twice
        finally:
            for w in ("worker-1", "worker-2"):
                for pod in group:
                    await shared.obs.kubes[w].delete(PODS, pod["metadata"]["name"], NAMESPACE)
        return
    res = {"PyTorchJob": PYTORCHJOBS, "RayJob": RAYJOBS, "AppWrapper": APPWRAPPERS, "TrainingRun": TRAININGRUNS,
           "LeaderWorkerSet": LEADERWORKERSETS, "RayService": RAYSERVICES}[kind]
    # managedBy multikueue: no controller in a worker cluster touches them (an LWS has none: the workers' LWS
    # controllers run both copies, which is the point)
    copy = {"PyTorchJob": manifest(name, 60), "RayJob": ray_manifest(name, 60), "AppWrapper": appwrapper_manifest(name, 60),
            "TrainingRun": trainingrun_manifest(name, 60), "LeaderWorkerSet": lws_manifest(name),
            "RayService": rayservice_manifest(name)}[kind]
    for w in ("worker-1", "worker-2"):
        await shared.obs.kubes[w].create(res, copy, NAMESPACE)
    try:
        await eventually(lambda: shared.obs.jobs.get(name) is not None and shared.obs.jobs[name].twice,
                         "the observer to confirm the job live on worker-1 and worker-2")
        assert "worker-1, worker-2" in shared.obs.jobs[name].twice
    finally:
        for w in ("worker-1", "worker-2"):
            await shared.obs.kubes[w].delete(res, name, NAMESPACE)


async def test_a_job_nobody_claims_counts_as_lost(shared: Shared) -> None:
    """With the dispatcher stopped, a submitted job is counted lost ("not claimed") and stuck."""
    d = shared.world.dispatchers[0]
    d.terminate()
    try:
        name = "selfcheck-unclaimed"
        await shared.obs.kubes[MANAGER].create(PYTORCHJOBS, manifest(name, 1), NAMESPACE)
        started = time.monotonic()
        figures = await shared.obs.tally("selfcheck", [name], [], started, [])
        assert (figures.lost, figures.stuck, figures.categories) == (1, 1, {"not claimed": 1}), figures
    finally:
        d.start()
        await shared.world.wait_online()


# Ordered so that a scenario that leaves the federation broken (a defect) hurts as few others as possible.
ORDER = ["dispatcher-kill", "agent-kill", "broker-restart", "failover", "partition", "partition-net",
         "postgres-outage", "postgres-at-start"]
"""Every scenario of bench/chaos but two, to keep the suite short: postgres-hang (it passes) and
lease-shortened (at this size its jobs end before the window it probes; its figures are in
bench/RESULTS.md)."""


@pytest.mark.parametrize("name", ORDER)
async def test_scenario(shared: Shared, name: str) -> None:
    scenario = SCENARIOS[name]
    if (why := scenario.skip_reason()) is not None:
        pytest.skip(f"{name}: {why}")
    if scenario.postgres and shared.world.postgres is None:
        pytest.skip(f"{name}: the shared federation runs on SQLite ({missing_binaries(postgres=True)})")
    figures = await run_in(shared.world, shared.obs, scenario, SMALL)
    report = "\n".join(figure_lines(figures, replace(SMALL, run_seconds=scenario.run_seconds_for(SMALL))))
    print(report)
    assert figures.submitted == SMALL.jobs, report
    assert figures.lost == 0, report
    if figures.stuck and name in KNOWN_STUCK and not figures.crashes and not figures.twice:
        pytest.xfail(f"{KNOWN_STUCK[name]}: {figures.stuck} jobs")
    assert figures.stuck == 0, report
    if figures.twice and name in KNOWN_TWICE and not figures.crashes:
        pytest.xfail(f"{KNOWN_TWICE[name]}: {figures.twice} jobs")
    assert figures.twice == 0, report
    # The runner restarts a service that exits by itself at once; Kubernetes would back off for minutes.
    if figures.crashes and name in KNOWN_CRASH:
        pytest.xfail(f"{KNOWN_CRASH[name]}: {figures.crashes} exits")
    assert figures.crashes == 0, report
