"""End to end, through the manager cluster's API only: the sample jobs, a lost agent, and ``mkctl demo``.

The federation is the demo's (``mkctl.topology``); jobs are the ``examples/`` manifests. Every
assertion reads the manager cluster (the user's view) or the dispatcher's database through
``mkctl`` (the admin's view); worker clusters are only read to know *when* to bring an agent back.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from federation import labels
from federation.errors import Invalid, Permanent
from federation.kinds.registry import by_api
from federation.kube import PODS, resource_for
from mkctl import jobs
from mkctl.demo import observe_all, read_job, submit
from mkctl.main import app
from mkctl.topology import Topology
from tests.e2e.conftest import REAL, NotYet, adapt_to_capacity, check_not_forbidden, wait_for
from tests.realcluster import parse_kubeconfigs

pytestmark = pytest.mark.slow


def kind_of(job: dict[str, Any]) -> Any:
    kind = by_api(job["apiVersion"], job["kind"])
    assert kind is not None
    return kind


def assert_mirrored(job: dict[str, Any]) -> None:
    """The manager Job carries the worker's final status the way MultiKueue mirrors it."""
    status = job.get("status") or {}
    name = f"{job['kind']} {job['metadata']['namespace']}/{job['metadata']['name']}"
    done = kind_of(job).finished(job)
    assert done is not None and done.outcome == "Succeeded", f"{name}: not succeeded: {status}"
    types = [c["type"] for c in status.get("conditions", []) if c.get("status") == "True"]
    dispatched = jobs.condition(job, labels.CONDITION_DISPATCHED)
    assert dispatched is not None and dispatched["status"] == "True", f"{name}: {status.get('conditions')}"
    if job["kind"] in ("PyTorchJob", "MPIJob"):
        assert "Created" in types and "Succeeded" in types, f"{name}: conditions {types}"
        assert status.get("startTime") and status.get("completionTime"), f"{name}: times missing: {status}"
        replicas = status.get("replicaStatuses") or {}
        assert replicas, f"{name}: no replicaStatuses"
        if job["kind"] == "MPIJob":
            assert replicas.get("Launcher", {}).get("succeeded") == 1, f"{name}: {replicas}"
        else:
            succeeded = sum(int(r.get("succeeded", 0)) for r in replicas.values())
            assert succeeded >= 1, f"{name}: {replicas}"
    elif job["kind"] == "Job":
        assert status.get("succeeded") == job["spec"].get("completions", 1), f"{name}: {status}"
        assert status.get("startTime") and status.get("completionTime"), f"{name}: {status}"
    elif job["kind"] == "JobSet":
        assert "Completed" in types, f"{name}: {types}"
        assert status.get("replicatedJobsStatus"), f"{name}: {status}"
    elif job["kind"] == "TrainJob":
        assert "Complete" in types, f"{name}: {types}"


@pytest.mark.needs_running_pods("every sample must run to its end: the pods of PyTorchJobs, MPIJobs and TrainJobs "
                                "must complete, which kwok-style nodes do only for batch Job pods "
                                "(test_batch_samples_run_to_their_end covers those)")
async def test_every_sample_job_reaches_its_end(federation: Topology) -> None:
    examples = jobs.load_examples()
    kinds = {s.kind for s in examples.samples}
    assert {"PyTorchJob", "MPIJob", "TrainJob", "Job", "JobSet"} <= kinds
    await submit(federation, examples)

    async def all_reached() -> dict[str, jobs.Observation] | NotYet:
        seen = await observe_all(federation.manager, examples.samples)
        missing = [f"{s.key} expected {s.expect}, is {seen[s.key].state} {seen[s.key].reason}".strip()
                   for s in examples.samples if not jobs.reached(s, seen[s.key])]
        return NotYet("; ".join(missing)) if missing else seen

    await wait_for(all_reached, "every sample job at its expected end", within=90, top=federation)

    for sample in examples.samples:
        job = await read_job(federation.manager, sample)
        assert job is not None
        if sample.expect == "Succeeded":
            assert_mirrored(job)
        elif sample.expect == "Untouched":
            assert not job.get("status"), f"{sample.key} got a status: {job.get('status')}"
            meta = job["metadata"]
            assert not any(k.startswith(labels.PREFIX) for k in {**meta.get("labels", {}),
                                                               **meta.get("annotations", {})})
            assert kind_of(job).managed_by(job) == kind_of(sample.manifest).managed_by(sample.manifest)
        elif sample.expect == "Pending":
            cond = jobs.condition(job, labels.CONDITION_DISPATCHED)
            assert cond is not None and cond["status"] == "False", job.get("status")
            assert "nvidia.com/gpu" in cond.get("message", ""), cond
            assert kind_of(job).finished(job) is None


@pytest.mark.realcluster
async def test_sample_jobs_are_claimed_and_copied_to_a_worker(federation: Topology) -> None:
    """What holds whether or not pods ever run: each job that fits is dispatched to a worker, which then
    holds its copy; the job that fits nowhere says why; the job of another controller is left alone."""
    examples = jobs.load_examples()
    examples.samples = await adapt_to_capacity(federation, examples.samples, examples.runtimes)
    await submit(federation, examples)

    async def placed() -> dict[str, str] | NotYet:
        where: dict[str, str] = {}
        missing = []
        for sample in examples.samples:
            job = await read_job(federation.manager, sample)
            cond = jobs.condition(job, labels.CONDITION_DISPATCHED) if job else None
            if sample.expect == "Untouched":
                continue
            if sample.expect == "Pending":
                if not (cond and cond.get("status") == "False" and cond.get("message")):
                    missing.append(f"{sample.key}: no pending reason yet")
                continue
            cluster = jobs.cluster_from(cond) if cond and cond.get("status") == "True" else ""
            if not cluster:
                missing.append(f"{sample.key}: not dispatched ({cond})")
                continue
            copies = await federation.kubes[cluster].list(resource_for(kind_of(sample.manifest)), sample.namespace)
            if sample.name not in [c["metadata"]["name"] for c in copies.items]:
                missing.append(f"{sample.key}: no copy on {cluster} yet")
            where[sample.key] = cluster
        return NotYet("; ".join(missing)) if missing else where

    where = await wait_for(placed, "every fitting sample dispatched with its copy on the named worker",
                           within=90, top=federation)
    assert set(where.values()) <= set(federation.worker_names), where
    for sample in examples.samples:
        if sample.expect == "Untouched":
            job = await read_job(federation.manager, sample)
            assert job is not None and not job.get("status"), f"{sample.key} got a status"


@pytest.mark.realcluster
async def test_batch_samples_run_to_their_end_and_are_mirrored(federation: Topology) -> None:
    """The batch Jobs of examples/ (their pods complete on kwok-style nodes too) run on a worker and the
    manager Job carries the worker's final status; one that fits no worker waits, saying why."""
    examples = jobs.load_examples()
    samples = [s for s in examples.samples if s.kind == "Job"]
    assert samples
    huge = copy.deepcopy(samples[0].manifest)  # more CPU than any test cluster has: waits, saying why
    huge["metadata"]["name"] = "batch-too-large"
    for container in huge["spec"]["template"]["spec"]["containers"]:
        container.setdefault("resources", {}).setdefault("requests", {})["cpu"] = "100000"
    samples.append(jobs.Sample(huge, samples[0].source, "Succeeded"))  # adapt_to_capacity knows better
    examples = jobs.Examples(samples=await adapt_to_capacity(federation, samples),
                             namespaces={s.namespace for s in samples})
    await submit(federation, examples)

    async def all_reached() -> bool | NotYet:
        seen = await observe_all(federation.manager, examples.samples)
        missing = [f"{s.key} expected {s.expect}, is {seen[s.key].state} {seen[s.key].reason}".strip()
                   for s in examples.samples if not jobs.reached(s, seen[s.key])]
        return NotYet("; ".join(missing)) if missing else True

    await wait_for(all_reached, "every batch sample at its expected end", within=90, top=federation)
    for sample in examples.samples:
        job = await read_job(federation.manager, sample)
        assert job is not None
        if sample.expect == "Succeeded":
            assert_mirrored(job)
    assert next(s for s in examples.samples if s.name == "batch-too-large").expect == "Pending"


@pytest.mark.realcluster
async def test_a_stopped_agent_is_shown_stale_then_online_again(federation: Topology) -> None:
    """Cluster health as the admin reads it (``mkctl clusters list``): an agent that stops heartbeating is
    noticed, and is online again once it is back; no pod needs to run for this."""
    worker = federation.worker_names[-1]

    async def health(want: tuple[str, ...]) -> str | None:
        state = (await asyncio.to_thread(clusters_json, federation.database_url)).get(worker, {}).get("health")
        return str(state) if state in want else None

    await wait_for(lambda: health(("online",)), f"{worker} online", top=federation)
    await federation.stop_agent(worker)
    await wait_for(lambda: health(("stale", "offline")), f"{worker} shown stale or offline", top=federation)
    federation.start_agent(worker)
    await wait_for(lambda: health(("online",)), f"{worker} online again", top=federation)


def _gpu_job(run_seconds: int) -> jobs.Sample:
    """The GPU example (fits worker-3 only), running long enough to lose its agent in the middle."""
    examples = jobs.load_examples()
    sample = next(s for s in examples.samples if s.name == "pytorch-dist-mnist-gloo")
    manifest = copy.deepcopy(sample.manifest)
    manifest["metadata"]["name"] = "agent-outage"
    for spec in manifest["spec"]["pytorchReplicaSpecs"].values():
        annotations = spec["template"].setdefault("metadata", {}).setdefault("annotations", {})
        annotations["kubesim.mkd.dev/run-seconds"] = str(run_seconds)
    return jobs.Sample(manifest, sample.source, "Succeeded")


def clusters_json(database_url: str) -> dict[str, dict[str, Any]]:
    """``mkctl clusters list -o json``, run as the admin would (in a thread: it has its own event loop)."""
    result = CliRunner().invoke(app, ["clusters", "list", "-o", "json", "--database-url", database_url])
    assert result.exit_code == 0, result.output
    return {item["name"]: item for item in json.loads(result.output)["items"]}


@pytest.mark.needs_running_pods("the job's pods must finish while its agent is away, timed by kubesim's run-seconds "
                                "(a stopped agent alone: test_a_stopped_agent_is_shown_stale_then_online_again)")
async def test_lost_agent_is_noticed_and_nothing_is_lost(federation: Topology) -> None:
    sample = _gpu_job(run_seconds=6)
    examples = jobs.Examples(samples=[sample], namespaces={sample.namespace})
    await submit(federation, examples)

    async def running() -> dict[str, Any] | None:
        job = await read_job(federation.manager, sample)
        return job if job and jobs.condition(job, "Running") else None

    await wait_for(running, "the GPU job Running on the manager (mirrored from worker-3)", top=federation)
    health = await asyncio.to_thread(clusters_json, federation.database_url)
    assert health["worker-3"]["health"] == "online", health["worker-3"]

    await federation.stop_agent("worker-3")

    async def noticed() -> str | None:
        state = (await asyncio.to_thread(clusters_json, federation.database_url))["worker-3"]["health"]
        return state if state in ("stale", "offline") else None

    await wait_for(noticed, "worker-3 shown stale or offline by `mkctl clusters list`", top=federation)

    # The job's pods finish on worker-3 while its agent (their job's controller) is away; the worker
    # is read only to know when, by the pods' standard job-name label.
    worker = federation.kubes["worker-3"]
    selector = f"training.kubeflow.org/job-name={sample.name}"

    async def pods_done_on_worker() -> list[str] | NotYet:
        pods = (await worker.list(PODS, sample.namespace, label_selector=selector)).items
        phases = [p.get("status", {}).get("phase", "") for p in pods]
        return phases if len(phases) == 2 and set(phases) == {"Succeeded"} else NotYet(f"pod phases {phases}")

    await wait_for(pods_done_on_worker, "the job's pods to finish on worker-3", top=federation)
    job = await read_job(federation.manager, sample)
    assert job is not None and kind_of(job).finished(job) is None, "nobody could have reported the end yet"

    federation.start_agent("worker-3")

    async def mirrored() -> dict[str, Any] | None:
        job = await read_job(federation.manager, sample)
        return job if job and kind_of(job).finished(job) else None

    assert_mirrored(await wait_for(mirrored, "the end reported after the agent came back", top=federation))

    async def back_online() -> bool:
        health = await asyncio.to_thread(clusters_json, federation.database_url)
        return bool(health["worker-3"]["health"] == "online")

    await wait_for(back_online, "worker-3 online again", top=federation)


@pytest.mark.kubesim_only("mkctl demo starts its own kubesim clusters")
async def test_mkctl_demo_runs_to_the_end(tmp_path: Path, mqtt_url: str, database_url: str, topic_root: str) -> None:
    """``make demo`` as CI runs it: no TTY, plain lines, exit 0 when every job ended as expected."""
    env = {**os.environ, "COLUMNS": "160"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "mkctl.main", "demo", "--state-dir", str(tmp_path / "state"), "--timeout", "90",
        "--mqtt-url", mqtt_url, "--database-url", database_url, "--topic-root", topic_root,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=170)
    except TimeoutError:
        proc.kill()
        pytest.fail("mkctl demo did not end within 170 s")
    text = out.decode()
    assert proc.returncode == 0, text[-4000:]
    assert "every sample job reached its expected end" in text
    assert "too-large stays pending" in text and "other-controller was left alone" in text
    # make demo runs with queues: the borrow and the preemption are shown as they happen
    assert "3 ClusterQueues and their LocalQueues from demo/queues/" in text
    assert any("clusterqueue team-b" in line and "BORROWED cpu 2" in line for line in text.splitlines()), text[-4000:]
    assert "BORROWS team-b/borrower: Quota reserved in ClusterQueue team-b" in text
    preempted = [line for line in text.splitlines() if "PREEMPTED team-a/low-" in line]
    assert preempted and "(team-a/high, UID:" in preempted[0], text[-4000:]
    assert f"workloads list --database-url {shlex.quote(database_url)}" in text  # runnable as printed (tests/admin)
    assert "\x1b[" not in text, "no terminal escapes when stdout is not a TTY"

    # The admin's view of the same run, from the database the demo left behind.
    def placements() -> dict[str, dict[str, Any]]:
        result = CliRunner().invoke(app, ["placements", "list", "-o", "json", "--database-url", database_url])
        assert result.exit_code == 0, result.output
        return {f"{i['namespace']}/{i['name']}": i for i in json.loads(result.output)["items"]}

    rows = await asyncio.to_thread(placements)
    assert rows["default/too-large"]["state"] == "pending" and "nvidia.com/gpu" in rows["default/too-large"]["reason"]
    assert "default/other-controller" not in rows, "a job of another controller is never claimed"
    finished = {k for k, r in rows.items() if r["state"] == "finished"}
    assert {"default/pytorch-simple", "default/pi", "team-a/batch-pi", "default/driver-workers",
            "team-a/high", "team-a/low-1", "team-a/low-2", "team-b/borrower"} <= finished, rows


@pytest.mark.realcluster
async def test_managed_by_changed_after_claim_is_rejected_and_the_copy_removed(federation: Topology) -> None:
    """The CRD's transition rule refuses a new managedBy value (as a real server does), but without the
    admission policy nothing stops removing it; mkd then lets go of the Job, saying why. (Pods Running is
    all it needs: kwok-style nodes do that.)"""
    examples = jobs.load_examples()
    base = next(s for s in examples.samples if s.name == "pytorch-simple")
    manifest = copy.deepcopy(base.manifest)
    manifest["metadata"]["name"] = "handed-over"
    for spec in manifest["spec"]["pytorchReplicaSpecs"].values():
        spec["template"].setdefault("metadata", {}).setdefault("annotations", {})[
            "kubesim.mkd.dev/run-seconds"] = "60"
    sample = jobs.Sample(manifest, base.source, "Succeeded")
    await submit(federation, jobs.Examples(samples=[sample], namespaces={sample.namespace}))

    async def running() -> dict[str, Any] | NotYet:
        job = await read_job(federation.manager, sample)
        cond = jobs.condition(job, "Running") if job else None
        return job if job and cond else NotYet(str((job or {}).get("status")))

    job = await wait_for(running, "the job Running on the manager", top=federation)
    cluster = jobs.cluster_from(jobs.condition(job, labels.CONDITION_DISPATCHED))
    kind = kind_of(job)
    with pytest.raises(Invalid, match="managedBy is immutable"):
        await federation.manager.patch(resource_for(kind), sample.name,
                                       {"spec": {"runPolicy": {"managedBy": labels.TRAINING_OPERATOR}}},
                                       sample.namespace)
    try:
        await federation.manager.patch(resource_for(kind), sample.name,
                                       [{"op": "remove", "path": "/spec/runPolicy/managedBy"}], sample.namespace,
                                       patch_type="json")
    except Permanent as exc:  # Invalid (422) or Forbidden (403), as the policy's reason says
        if not REAL:
            raise
        pytest.skip(f"needs a manager without deploy/admission's managedBy policy, which refused the removal: {exc}")

    async def rejected() -> Mapping[str, Any] | NotYet:
        job = await read_job(federation.manager, sample)
        cond = jobs.condition(job, labels.CONDITION_REJECTED) if job else None
        return cond if cond and cond.get("status") == "True" else NotYet(str((job or {}).get("status")))

    cond = await wait_for(rejected, "MultiClusterRejected on the manager Job", top=federation)
    assert cond["reason"] == "ManagedByChanged" and "immutable" in cond["message"], cond

    async def copy_removed() -> bool | NotYet:
        found = await federation.kubes[cluster].list(resource_for(kind), sample.namespace)
        names = [j["metadata"]["name"] for j in found.items]
        return True if sample.name not in names else NotYet(f"still on {cluster}: {names}")

    await wait_for(copy_removed, f"the worker copy removed from {cluster}", top=federation)


def placements_json(database_url: str, job: str) -> dict[str, Any]:
    """``mkctl placements show NS/NAME -o json`` (in a thread: mkctl has its own event loop)."""
    result = CliRunner().invoke(app, ["placements", "show", job, "-o", "json", "--database-url", database_url])
    assert result.exit_code == 0, result.output
    shown: dict[str, Any] = json.loads(result.output)
    return shown


@pytest.mark.realcluster
async def test_suspending_a_placed_batch_job_suspends_its_copy_then_delete_removes_it(federation: Topology) -> None:
    """A batch Job's selector is immutable on the worker: the suspend must still reach the copy in place,
    with no requeue (one placement attempt), and deleting the Job afterwards removes the copy."""
    examples = jobs.load_examples()
    base = next(s for s in examples.samples if s.kind == "Job")
    manifest = copy.deepcopy(base.manifest)
    manifest["metadata"]["name"] = "nap-batch"
    manifest["spec"]["template"].setdefault("metadata", {}).setdefault("annotations", {}).update({
        "kubesim.mkd.dev/run-seconds": "600", "pod-complete.stage.kwok.x-k8s.io/delay": "600s"})  # kubesim's and kwok's
    sample = jobs.Sample(manifest, base.source, "Succeeded")
    await submit(federation, jobs.Examples(samples=[sample], namespaces={sample.namespace}))
    kind = kind_of(manifest)

    async def active() -> dict[str, Any] | NotYet:
        job = await read_job(federation.manager, sample)
        st = (job or {}).get("status") or {}
        return job if job and st.get("active") else NotYet(str(st))

    job = await wait_for(active, "the batch Job's pods active (mirrored)", top=federation)
    cluster = jobs.cluster_from(jobs.condition(job, labels.CONDITION_DISPATCHED))
    worker = federation.kubes[cluster]
    await federation.manager.patch(resource_for(kind), sample.name, {"spec": {"suspend": True}}, sample.namespace)

    async def copy_suspended() -> dict[str, Any] | NotYet:
        found = [j for j in (await worker.list(resource_for(kind), sample.namespace)).items
                 if j["metadata"]["name"] == sample.name]
        if len(found) != 1:
            return NotYet(f"copies on {cluster}: {len(found)}")
        copy_ = found[0]
        st = copy_.get("status") or {}
        return copy_ if copy_["spec"].get("suspend") is True and not st.get("active") else NotYet(str(st))

    await wait_for(copy_suspended, f"the copy on {cluster} suspended, its pods gone", top=federation)

    async def db_suspended() -> dict[str, Any] | NotYet:
        shown = await asyncio.to_thread(placements_json, federation.database_url,
                                        f"{sample.namespace}/{sample.name}")
        return shown if shown.get("state") == "suspended" else NotYet(str(shown.get("state")))

    shown = await wait_for(db_suspended, "the workload suspended in the database", top=federation)
    assert [p["state"] for p in shown["placements"]] == ["suspended"], shown["placements"]  # never requeued

    await federation.manager.delete(resource_for(kind), sample.name, sample.namespace)

    async def copy_removed() -> bool | NotYet:
        names = [j["metadata"]["name"] for j in (await worker.list(resource_for(kind), sample.namespace)).items]
        return True if sample.name not in names else NotYet(f"still on {cluster}: {names}")

    await wait_for(copy_removed, f"the copy removed from {cluster}", top=federation)


@pytest.mark.realcluster
async def test_the_demos_federation_runs_a_ready_fencer_per_worker_reading_its_agents_lease(
        tmp_path: Path, mqtt_url: str, database_url: str, topic_root: str) -> None:
    """``mkctl demo`` runs the topology of deploy/: next to each worker's agent a fencer (a task of its
    own), ready, and reading the lease record its agent writes at each renewal from the dispatcher."""
    import httpx

    from mkctl.demo import DemoOptions, topology_options

    options = topology_options(DemoOptions(state_dir=tmp_path / "state", mqtt_url=mqtt_url,
                                           database_url=database_url, timeout=60, keep_running=False,
                                           examples=None), topic_root)
    assert options.fencers
    if REAL:
        options.kubeconfigs = {k: Path(v) for k, v in parse_kubeconfigs(REAL).items()}
    async with Topology(options) as top:
        await top.wait_for_clusters()
        fencers = top.describe()["fencers"]
        assert sorted(fencers) == sorted(top.worker_names)
        async with httpx.AsyncClient(timeout=5) as client:
            async def all_ready_and_current() -> bool | NotYet:
                for url in fencers.values():
                    try:
                        ready = await client.get(f"{url}/readyz")
                        page = (await client.get(f"{url}/metrics")).text.splitlines()
                    except httpx.TransportError as exc:
                        return NotYet(f"{url}: {exc}")
                    left = [float(line.split()[1]) for line in page
                            if line.startswith("mkd_fencer_record_seconds_left ")]
                    if ready.status_code != 200 or not left or left[0] <= 0:
                        return NotYet(f"{url}: {ready.status_code} {ready.text}, record seconds left {left}")
                return True
            await wait_for(all_ready_and_current, "every fencer ready with a current lease record", top=top)
        top.check_running()
        await check_not_forbidden(top)
