"""The fencer: a process of its own that stops the Jobs of a hung (frozen, absent) agent once the lease the
agent recorded in its worker cluster runs out; the agent resumes them only after a renewal and a Resync.

The agent is stopped here (an absent agent: nothing of it runs, as with SIGSTOP); the chaos suite's
``partition`` scenario freezes a real agent process (bench/chaos).
"""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime, timedelta
from typing import Any

from federation import labels
from federation.clock import FakeClock
from federation.kube import JOBS, LEASES, PODS, Kube, Resource
from federation.messages import Lease, Resync
from tests.agent.conftest import CLUSTER, PYTORCHJOBS, AgentHarness, place
from tests.agent.test_agent_inbox import forever
from tests.agent.test_agent_kinds import load
from tests.waiting import eventually
from worker_agent import leaserecord
from worker_agent.fencer import Fencer

JOBSETS = Resource("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet")
FOREVER = "kubesim.mkd.dev/run-forever"


def running_forever(doc: dict[str, Any], templates: list[dict[str, Any]]) -> dict[str, Any]:
    for t in templates:
        meta = t.setdefault("metadata", {})
        meta["annotations"] = {k: v for k, v in (meta.get("annotations") or {}).items() if "run-seconds" not in k}
        meta["annotations"][FOREVER] = "true"
    return doc


def batch_job() -> dict[str, Any]:
    doc = load("batch/job.yaml")
    return running_forever(doc, [doc["spec"]["template"]])


def jobset() -> dict[str, Any]:
    doc = load("jobset/jobset.yaml")
    return running_forever(doc, [r["template"]["spec"]["template"] for r in doc["spec"]["replicatedJobs"]])


def suspended_at(job: dict[str, Any] | None, *path: str) -> bool:
    node: Any = job or {}
    for key in path:
        node = (node or {}).get(key) if isinstance(node, dict) else None
    return node is True


async def live_pods(kube: Kube, ns: str = "team-a") -> list[str]:
    pods = (await kube.list(PODS, ns)).items
    return sorted(p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")
                  and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"))


async def until(probe: Any, what: str, within: float = 30.0) -> None:
    await eventually(probe, within, what=what)


async def grant(harness: AgentHarness, seconds: float) -> None:
    hb = harness.heartbeats()[-1]
    await harness.send(Lease(cluster=CLUSTER, epoch=1, heartbeat_sent_at=hb.sent_at, seconds=seconds))


async def recorded(harness: AgentHarness) -> leaserecord.Held | None:
    return await leaserecord.fetch(harness.kube, harness.settings.namespace, CLUSTER)


async def test_each_renewal_is_recorded_in_the_worker_cluster_as_a_lease(harness: AgentHarness) -> None:
    await grant(harness, 60)

    async def written() -> bool:
        return await recorded(harness) is not None
    await until(written, "the agent's Lease record")
    lease = await harness.kube.get(LEASES, f"mkd-agent-{CLUSTER}", harness.settings.namespace)
    assert lease["spec"]["holderIdentity"] == f"mkd-agent/{CLUSTER}"
    assert lease["metadata"]["labels"][labels.ORIGIN] == harness.settings.origin
    # the dispatcher's 60 s less half the quarter the agent keeps to stop its Jobs (7.5 s), rounded down:
    # a live agent stops them itself first, the fencer only if it did not
    assert 48 <= lease["spec"]["leaseDurationSeconds"] <= 52
    held = await recorded(harness)
    assert held is not None and held.ends > held.renewed


async def test_the_fencer_stops_an_absent_agents_jobs_when_its_record_runs_out_and_only_a_renewal_resumes_them(
        harness: AgentHarness) -> None:
    pytorch, batch, js = place(forever(), uid="wl-pt"), place(batch_job(), uid="wl-batch"), place(jobset(), uid="wl-js")
    for cmd in (pytorch, batch, js):
        await harness.send(cmd)
        await harness.wait_report(lambda r: r.type == "accepted" and r.placement == cmd.placement)  # noqa: B023
    await until(all_running_of(harness, 2 + 2 + 5), "every pod of the three Jobs")  # 2 + 2 batch + 1 + 2 * 2
    # a short lease (8 s: the agent keeps 2 s to stop, the record says 6-7), then the agent is gone:
    # nothing of it stops anything now
    await grant(harness, 8)
    await until(lambda: recorded(harness), "the agent's Lease record")
    held = await recorded(harness)
    assert held is not None and 5 <= held.seconds <= 7
    await harness.stop_agent()

    async with Kube(harness.settings.kubeconfig, user_agent="mkd-fencer") as kube:
        clock = FakeClock(start=held.ends - timedelta(seconds=3))
        fencer = Fencer(kube, cluster=CLUSTER, namespace=harness.settings.namespace,
                        origin=harness.settings.origin, clock=clock)
        # inside the recorded lease: the fencer waits (at most until the record's end), and touches nothing
        assert 0 < await fencer.check() <= fencer.poll_seconds and fencer.sweeps == 0
        pt = await harness.get(PYTORCHJOBS, "pytorch-simple", "team-a")
        assert not suspended_at(pt, "spec", "runPolicy", "suspend")
        # it runs out for real: the agent started again below reads its record on the system clock
        await asyncio.sleep(max(0.0, (held.ends - datetime.now(UTC)).total_seconds()))
        clock.advance(3.0)
        await fencer.check()
        assert fencer.sweeps == 1

    pt = await harness.get(PYTORCHJOBS, "pytorch-simple", "team-a")
    bj = await harness.get(JOBS, "batch-pi", "team-a")
    jset = await harness.get(JOBSETS, "driver-workers", "team-a")
    assert suspended_at(pt, "spec", "runPolicy", "suspend") and suspended_at(bj, "spec", "suspend")
    assert suspended_at(jset, "spec", "suspend")
    for job in (pt, bj, jset):
        assert job is not None and job["metadata"]["annotations"][labels.FENCED_ANNOTATION] == "true"
    # the JobSet's own Jobs (its controller is the agent) are suspended too, so their pods go
    children = [j for j in (await harness.kube.list(JOBS, "team-a")).items if j["metadata"]["name"] != "batch-pi"]
    assert len(children) == 3 and all(suspended_at(j, "spec", "suspend") for j in children)

    async def no_pods() -> bool:
        return not await live_pods(harness.kube)
    await until(no_pods, "every pod gone (deleted by the fencer, or by the Job controller)")

    # the agent comes back: it holds no renewal yet (only its start-up grace), so nothing runs again, not
    # even for a Resync listing the Job: the fencer would stop it at once, its record being out of date
    await harness.start_agent()
    await harness.send(Resync(cluster=CLUSTER, epoch=1, expected=[pytorch.placement, batch.placement]))
    await asyncio.sleep(1.5)  # real time: a window in which the agent (system clock) must resume nothing
    again = await harness.get(PYTORCHJOBS, "pytorch-simple", "team-a")
    assert suspended_at(again, "spec", "runPolicy", "suspend") and not await live_pods(harness.kube)
    # a renewal: the record had run out, so the agent asks for a Resync before resuming anything
    n = len(harness.reports)
    await grant(harness, 600)
    await harness.wait_report(lambda r: r.type == "inventory", after=n)
    # the Resync lists the PyTorchJob and the batch Job only: those resume, the JobSet (moved away) goes
    await harness.send(Resync(cluster=CLUSTER, epoch=1, expected=[pytorch.placement, batch.placement]))

    async def resumed() -> bool:
        pt = await harness.get(PYTORCHJOBS, "pytorch-simple", "team-a")
        bj = await harness.get(JOBS, "batch-pi", "team-a")
        return not suspended_at(pt, "spec", "runPolicy", "suspend") and not suspended_at(bj, "spec", "suspend")
    await until(resumed, "the PyTorchJob and the batch Job resumed")

    async def jobset_gone() -> bool:
        return await harness.get(JOBSETS, "driver-workers", "team-a") is None
    await until(jobset_gone, "the JobSet the Resync no longer lists deleted")
    await until(all_running_of(harness, 4), "the resumed Jobs' pods running again")


def all_running_of(harness: AgentHarness, n: int) -> Any:
    async def probe() -> bool:
        return len(await live_pods(harness.kube)) >= n
    return probe


async def test_a_fencer_with_no_record_to_read_touches_nothing(harness: AgentHarness) -> None:
    await harness.send(place(forever(), uid="wl-alone"))
    await harness.wait_report(lambda r: r.type == "accepted")
    async with Kube(harness.settings.kubeconfig, user_agent="mkd-fencer") as kube:
        fencer = Fencer(kube, cluster="another-cluster", namespace=harness.settings.namespace,
                        origin=harness.settings.origin, clock=FakeClock())
        assert await fencer.check() == fencer.poll_seconds and fencer.sweeps == 0
    job = await harness.get(PYTORCHJOBS, "pytorch-simple", "team-a")
    assert not suspended_at(copy.deepcopy(job), "spec", "runPolicy", "suspend")


async def test_the_fencer_stops_what_runs_under_an_mpijob_and_a_trainjob(harness: AgentHarness) -> None:
    """The agent is the controller of both: the fencer deletes the MPIJob's worker pods and suspends its
    launcher Job, and suspends the TrainJob's JobSet and that JobSet's Jobs (the Job controller then
    removes their pods)."""
    from tests.agent.test_agent_kinds import RUNTIMES

    runtime = load("trainjob/torch-distributed-runtime.yaml")
    running_forever(runtime, [r["template"]["spec"]["template"] for r in runtime["spec"]["template"]["spec"]["replicatedJobs"]])
    await harness.kube.create(RUNTIMES, runtime)
    mpi = load("mpi/pi.yaml")
    running_forever(mpi, [r["template"] for r in mpi["spec"]["mpiReplicaSpecs"].values()])
    for cmd in (place(mpi, uid="wl-mpi"), place(load("trainjob/multi-node.yaml"), uid="wl-train")):
        await harness.send(cmd)
        accepted = await harness.wait_report(lambda r: r.type in ("accepted", "rejected")
                                             and r.placement == cmd.placement)  # noqa: B023
        assert accepted.type == "accepted", getattr(accepted, "message", "")

    async def children_running() -> bool:  # the MPI launcher Job and the TrainJob's JobSet with its Job
        jobs = (await harness.kube.list(JOBS, "team-a")).items
        return len(jobs) >= 2 and len(await live_pods(harness.kube)) >= 3
    await until(children_running, "the MPIJob's and the TrainJob's children running")
    await harness.stop_agent()
    async with Kube(harness.settings.kubeconfig, user_agent="mkd-fencer") as kube:
        await leaserecord.write(kube, harness.settings.namespace, CLUSTER, origin=harness.settings.origin,
                                renewed=datetime.now(UTC) - timedelta(seconds=30), seconds=5)
        fencer = Fencer(kube, cluster=CLUSTER, namespace=harness.settings.namespace, origin=harness.settings.origin)
        await fencer.check()
        assert fencer.sweeps == 1
    mpijob = await harness.get(Resource("kubeflow.org", "v2beta1", "mpijobs", "MPIJob"), "pi", "team-a")
    trainjob = await harness.get(Resource("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob"),
                                 "multi-node-example", "team-a")
    assert suspended_at(mpijob, "spec", "runPolicy", "suspend") and suspended_at(trainjob, "spec", "suspend")
    jobsets = (await harness.kube.list(JOBSETS, "team-a")).items
    assert len(jobsets) == 1 and suspended_at(jobsets[0], "spec", "suspend")
    jobs = (await harness.kube.list(JOBS, "team-a")).items
    assert jobs and all(suspended_at(j, "spec", "suspend") for j in jobs), [j["metadata"]["name"] for j in jobs]

    async def no_pods() -> bool:
        return not await live_pods(harness.kube)
    await until(no_pods, "every pod gone (the MPI workers deleted, the Jobs' pods removed by the Job controller)")


async def test_the_fencers_port_serves_probes_and_counts_what_it_stopped(harness: AgentHarness) -> None:
    """``mkctl fencer``'s run with ``metrics_port``: /healthz, /readyz once it read the record and listed the
    kinds it fences, and /metrics counting the sweep that stopped an absent agent's Job (deploy/worker)."""
    import socket

    import httpx

    from tests.admin.test_agent_metrics import _value
    from worker_agent import fencer as fencer_mod
    from worker_agent.fencermetrics import FencerServer
    from worker_agent.settings import FencerSettings

    # before its first read the fencer is not ready, and says why
    async with Kube(harness.settings.kubeconfig, user_agent="mkd-fencer") as kube:
        unread = FencerServer(Fencer(kube, cluster=CLUSTER, namespace=harness.settings.namespace,
                                     origin=harness.settings.origin), "127.0.0.1", 0)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=unread.app), base_url="http://f") as client:
            ready = await client.get("/readyz")
            assert ready.status_code == 503 and "lease record not read yet" in ready.text
            page = (await client.get("/metrics")).text.splitlines()
            assert not [line for line in page if line.startswith("mkd_fencer_record_seconds_left ")]

    await harness.send(place(forever(), uid="wl-probed"))
    await harness.wait_report(lambda r: r.type == "accepted")
    await until(all_running_of(harness, 2), "the PyTorchJob's pods running")
    await harness.stop_agent()
    await leaserecord.write(harness.kube, harness.settings.namespace, CLUSTER, origin=harness.settings.origin,
                            renewed=datetime.now(UTC) - timedelta(seconds=30), seconds=5)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    settings = FencerSettings(cluster_name=CLUSTER, kubeconfig=harness.settings.kubeconfig,
                              namespace=harness.settings.namespace, origin=harness.settings.origin,
                              metrics_port=port, metrics_host="127.0.0.1", poll_seconds=0.2)
    stop = asyncio.Event()
    task = asyncio.create_task(fencer_mod.run(settings, stop=stop))
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
            async def swept() -> bool:
                try:
                    text = (await client.get("/metrics")).text
                except httpx.TransportError:
                    return False  # not bound yet
                return "mkd_fencer_sweeps_total 1.0" in text and "mkd_fencer_pods_deleted_total 0.0" not in text
            await until(swept, "a sweep counted on the fencer's metrics page")
            assert (await client.get("/healthz")).text == "ok"
            ready = await client.get("/readyz")
            assert ready.status_code == 200, ready.text
            text = (await client.get("/metrics")).text
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
    assert _value(text, "mkd_fencer_jobs_suspended_total") == 1
    assert _value(text, "mkd_fencer_pods_deleted_total") >= 1
    assert _value(text, 'mkd_fencer_failures_total{reason="suspend"}') == 0
    assert -40 < _value(text, "mkd_fencer_record_seconds_left") < -20
    assert _value(text, 'mkd_fencer_api_calls_total{code="200",verb="PATCH"}') >= 1
    assert "process_cpu_seconds_total" in text
    pt = await harness.get(PYTORCHJOBS, "pytorch-simple", "team-a")
    assert suspended_at(pt, "spec", "runPolicy", "suspend")
