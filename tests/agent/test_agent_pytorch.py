"""The agent end to end on kubesim: Commands in over MQTT, PyTorchJobs run by the agent, Reports out."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from federation import labels
from federation.kube import EVENTS, NAMESPACES, PODS, SERVICES
from tests.agent.conftest import PYTORCHJOBS, AgentHarness, conditions, place
from tests.agent.render_harness import example
from tests.waiting import eventually

RUN = "kubesim.mkd.dev/run-seconds"


def with_annotations(job: dict[str, Any], **annotations: str) -> dict[str, Any]:
    job = copy.deepcopy(job)
    job["metadata"].pop("uid", None)
    for rs in job["spec"]["pytorchReplicaSpecs"].values():
        meta = rs["template"].setdefault("metadata", {})
        meta["annotations"] = {**meta.get("annotations", {}), **annotations}
    return job


async def test_simple_runs_to_success_with_upstream_shape(harness: AgentHarness) -> None:
    job = with_annotations(example("pytorch-simple.yaml"), **{RUN: "1.0"})
    cmd = place(job)
    await harness.send(cmd)
    accepted = await harness.wait_report(lambda r: r.type == "accepted")
    assert accepted.placement == cmd.placement and accepted.spec_version == 1
    running = await harness.wait_report(
        lambda r: r.type == "status" and ("Running", "True", "PyTorchJobRunning") in conditions(r.status))
    assert running.finished is None
    master = await harness.get(PODS, "pytorch-simple-master-0", "team-a")
    assert master is not None
    env = [(e["name"], e.get("value")) for e in master["spec"]["containers"][0]["env"]]
    assert env[:3] == [("PYTHONUNBUFFERED", "1"), ("MASTER_PORT", "23456"), ("PET_MASTER_PORT", "23456")]
    (owner,) = master["metadata"]["ownerReferences"]
    assert owner["kind"] == "PyTorchJob" and owner["controller"] and owner["blockOwnerDeletion"]
    svc = await harness.get(SERVICES, "pytorch-simple-worker-0", "team-a")
    assert svc is not None and svc["spec"]["clusterIP"] == "None"
    done = await harness.wait_report(lambda r: r.type == "status" and r.finished == "Succeeded")
    assert conditions(done.status) == [("Created", "True", "PyTorchJobCreated"),
                                       ("Running", "False", "PyTorchJobRunning"),
                                       ("Succeeded", "True", "PyTorchJobSucceeded")]
    assert done.status["completionTime"] and done.status["startTime"]
    seqs = [r.seq for r in harness.statuses(cmd.placement.workload_uid)]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    stored = await harness.get(PYTORCHJOBS, "pytorch-simple", "team-a")
    assert stored is not None
    assert stored["metadata"]["labels"][labels.ORIGIN] == "mkd"
    assert stored["metadata"]["labels"][labels.WORKLOAD_UID] == "wl-pytorch-simple"
    final = await harness.wait_report(  # the finished pass moves active into succeeded
        lambda r: r.type == "status" and r.finished == "Succeeded"
        and all(e.get("succeeded") == 1 for e in r.status["replicaStatuses"].values()))
    assert final.status["replicaStatuses"]["Worker"].get("active") is None
    stored = await harness.get(PYTORCHJOBS, "pytorch-simple", "team-a")
    assert stored is not None and stored["status"] == final.status


EXIT = "kubesim.mkd.dev/exit-code"
FAILS = "kubesim.mkd.dev/fail-attempts"
FOREVER = "kubesim.mkd.dev/run-forever"


def worker_annotations(job: dict[str, Any], **annotations: str) -> dict[str, Any]:
    job = copy.deepcopy(job)
    meta = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"].setdefault("metadata", {})
    meta["annotations"] = {**meta.get("annotations", {}), **annotations}
    return job


def with_policy(job: dict[str, Any], policy: str) -> dict[str, Any]:
    job = copy.deepcopy(job)
    for rs in job["spec"]["pytorchReplicaSpecs"].values():
        rs["restartPolicy"] = policy
    return job


def has(condition: tuple[str, str, str]) -> Any:
    return lambda r: r.type == "status" and condition in conditions(r.status)


async def test_never_failed_worker_fails_job(harness: AgentHarness) -> None:
    job = with_annotations(example("pytorch-sendrecv.yaml"), **{FOREVER: "true"})
    job = worker_annotations(with_policy(job, "Never"), **{FOREVER: "false", RUN: "0.3", EXIT: "1", FAILS: "1"})
    await harness.send(place(job))
    failed = await harness.wait_report(lambda r: r.type == "status" and r.finished == "Failed")
    assert conditions(failed.status)[-1] == ("Failed", "True", "PyTorchJobFailed")
    assert "Worker replica(s) failed." in failed.status["conditions"][-1]["message"]
    assert failed.status["completionTime"]


async def test_exit_code_permanent_fails_and_retryable_restarts(harness: AgentHarness) -> None:
    permanent = worker_annotations(with_policy(with_annotations(example("pytorch-simple.yaml"), **{FOREVER: "true"}),
                                               "ExitCode"), **{FOREVER: "false", RUN: "0.2", EXIT: "3", FAILS: "1"})
    await harness.send(place(permanent))
    failed = await harness.wait_report(lambda r: r.type == "status" and r.finished == "Failed")
    assert conditions(failed.status)[-1] == ("Failed", "True", "PyTorchJobFailed")
    assert failed.status["completionTime"]  # deliberate difference from upstream

    retry = copy.deepcopy(permanent)
    retry["metadata"]["name"] = "pytorch-retry"
    retry = worker_annotations(retry, **{EXIT: "137"})
    cmd = place(retry)
    await harness.send(cmd)
    restarting = await harness.wait_report(has(("Restarting", "True", "PyTorchJobRestarting")))
    assert ("Running", "True", "PyTorchJobRunning") not in conditions(restarting.status)
    again = await harness.wait_report(has(("Running", "True", "PyTorchJobRunning")),
                                      after=harness.reports.index(restarting))
    assert all(c[0] != "Restarting" for c in conditions(again.status))
    assert again.finished is None


async def test_on_failure_restarts_in_place_then_succeeds(harness: AgentHarness) -> None:
    job = with_annotations(example("pytorch-simple.yaml"), **{RUN: "0.3"})
    job = worker_annotations(job, **{EXIT: "1", FAILS: "1"})
    await harness.send(place(job))
    done = await harness.wait_report(lambda r: r.type == "status" and r.finished == "Succeeded")
    assert all(c[0] != "Failed" for c in conditions(done.status))


async def test_suspend_resume_by_spec_version(harness: AgentHarness) -> None:
    job = with_annotations(example("pytorch-simple.yaml"), **{FOREVER: "true"})
    await harness.send(place(job))
    await harness.wait_report(has(("Running", "True", "PyTorchJobRunning")))
    suspended = copy.deepcopy(job)
    suspended["spec"]["runPolicy"] = {"suspend": True}
    await harness.send(place(suspended, spec_version=2))
    acc = await harness.wait_report(lambda r: r.type == "accepted" and r.spec_version == 2)
    assert acc.placement.attempt == 1
    status = await harness.wait_report(has(("Suspended", "True", "PyTorchJobSuspended")))
    assert conditions(status.status)[-2:] == [("Running", "False", "PyTorchJobSuspended"),
                                              ("Suspended", "True", "PyTorchJobSuspended")]
    async def master_pod_gone() -> bool:
        return await harness.get(PODS, "pytorch-simple-master-0", "team-a") is None
    await eventually(master_pod_gone, what="the suspended job's master pod to be deleted")
    assert await harness.get(SERVICES, "pytorch-simple-master-0", "team-a") is None
    resumed = copy.deepcopy(job)
    resumed["spec"]["runPolicy"] = {"suspend": False}
    await harness.send(place(resumed, spec_version=3))
    back = await harness.wait_report(has(("Suspended", "False", "PyTorchJobResumed")))
    assert back.status["startTime"] >= status.status["startTime"]
    await harness.wait_report(has(("Running", "True", "PyTorchJobRunning")), after=harness.reports.index(back))


async def test_active_deadline_fires_on_time_without_events(harness: AgentHarness) -> None:
    job = with_annotations(example("pytorch-simple.yaml"), **{FOREVER: "true"})
    job["spec"]["runPolicy"] = {"activeDeadlineSeconds": 2, "cleanPodPolicy": "All"}
    await harness.send(place(job))
    failed = await harness.wait_report(lambda r: r.type == "status" and r.finished == "Failed", within=10)
    assert failed.status["conditions"][-1]["message"] == (
        "Job pytorch-simple has failed because it was active longer than specified deadline")


async def test_ttl_deletes_finished_job_and_reports_gone(harness: AgentHarness) -> None:
    job = with_annotations(example("pytorch-simple.yaml"), **{RUN: "0.2"})
    job["spec"]["runPolicy"] = {"ttlSecondsAfterFinished": 1}
    await harness.send(place(job))
    await harness.wait_report(lambda r: r.type == "status" and r.finished == "Succeeded")
    gone = await harness.wait_report(lambda r: r.type == "status" and r.gone, within=10)
    assert gone.finished == "Succeeded"
    assert await harness.get(PYTORCHJOBS, "pytorch-simple", "team-a") is None


async def test_service_rule_and_user_service(harness: AgentHarness) -> None:
    await harness.kube.create(NAMESPACES, {"metadata": {"name": "team-a"}})
    job = with_annotations(example("pytorch-sendrecv.yaml"), **{FOREVER: "true"})
    name = job["metadata"]["name"]
    claim = {"training.kubeflow.org/operator-name": "pytorchjob-controller",
             "training.kubeflow.org/job-name": name,
             "training.kubeflow.org/replica-type": "worker", "training.kubeflow.org/replica-index": "1"}
    for svc in ("claim-a", "claim-b"):
        await harness.kube.create(SERVICES, {"metadata": {"name": svc, "labels": claim},
                                             "spec": {"ports": [{"port": 80}]}}, "team-a")
    user = {"metadata": {"name": "metrics", "labels": {"app": "metrics", "training.kubeflow.org/job-name": name}},
            "spec": {"ports": [{"port": 9090}], "selector": {"training.kubeflow.org/job-name": name}}}
    await harness.kube.create(SERVICES, user, "team-a")
    await harness.send(place(job))
    running = await harness.wait_report(has(("Running", "True", "PyTorchJobRunning")))
    assert "too many services for worker 1" in running.status["message"]
    names = {s["metadata"]["name"] for s in (await harness.kube.list(SERVICES, "team-a")).items}
    assert f"{name}-worker-1" not in names
    assert {f"{name}-master-0", f"{name}-worker-0", f"{name}-worker-2", "claim-a", "claim-b", "metrics"} <= names
    events = (await harness.kube.list(EVENTS, "team-a")).items
    assert any(e["reason"] == "TooManyServices" and "worker 1" in e["message"] for e in events)
    assert (await harness.get(SERVICES, "metrics", "team-a") or {}).get("spec", {}).get("ports")[0]["port"] == 9090


EXPECTED = {
    "pytorch-simple.yaml": ({"pytorch-simple-master-0": {"RANK": "0", "WORLD_SIZE": "2", "PET_NNODES": "2"},
                             "pytorch-simple-worker-0": {"RANK": "1", "WORLD_SIZE": "2", "PET_NNODES": "2"}}),
    "pytorch-sendrecv.yaml": ({f"pytorch-dist-basic-sendrecv-worker-{i}": {"RANK": str(i + 1), "WORLD_SIZE": "4"}
                               for i in range(3)}),
    "pytorch-cpu-demo.yaml": ({"torchrun-cpu-master-0": {"WORLD_SIZE": "4", "PET_NPROC_PER_NODE": "2"}}),
    "pytorch-elastic-echo.yaml": ({f"elastic-example-echo-worker-{i}": {
        "PET_NNODES": "1:2", "PET_RDZV_ENDPOINT": "elastic-example-echo-worker-0:23456",
        "PET_RDZV_BACKEND": "c10d", "PET_MAX_RESTARTS": "100"} for i in range(2)}),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_example_shapes_on_kubesim(harness: AgentHarness, name: str) -> None:
    job = with_annotations(example(name), **{FOREVER: "true"})
    await harness.send(place(job))
    status = await harness.wait_report(lambda r: r.type == "status" and any(
        c[0] == "Running" and c[1] == "True" for c in conditions(r.status)))
    job_name = job["metadata"]["name"]
    pods = {p["metadata"]["name"]: p for p in (await harness.kube.list(PODS, "team-a")).items}
    services = {s["metadata"]["name"]: s for s in (await harness.kube.list(SERVICES, "team-a")).items}
    assert set(pods) == set(services)
    for pod_name, wanted in EXPECTED[name].items():
        pod = pods[pod_name]
        env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
        assert {k: env.get(k) for k in wanted} == wanted
        assert env["PYTHONUNBUFFERED"] == "1"
        svc = services[pod_name]
        keys = ("operator-name", "job-name", "replica-type", "replica-index")
        assert svc["spec"]["selector"] == {f"training.kubeflow.org/{k}": pod["metadata"]["labels"][
            f"training.kubeflow.org/{k}"] for k in keys}
        assert svc["spec"]["clusterIP"] == "None" and not svc["spec"].get("publishNotReadyAddresses")
    for rtype, entry in status.status["replicaStatuses"].items():
        assert entry["selector"] == (f"training.kubeflow.org/job-name={job_name},training.kubeflow.org/"
                                     f"operator-name=pytorchjob-controller,training.kubeflow.org/"
                                     f"replica-type={rtype.lower()}")


START = "kubesim.mkd.dev/start-seconds"


def count_status_writes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The agent's status writes of PyTorchJobs, as the names written, in order (the agent's ``Kube``)."""
    from federation.kube import Kube

    written: list[str] = []
    replace = Kube.replace

    async def counted(self: Kube, res: Any, body: dict[str, Any], *args: Any, **kw: Any) -> Any:
        if res.plural == PYTORCHJOBS.plural and kw.get("subresource") == "status":
            written.append(str(body["metadata"]["name"]))
        return await replace(self, res, body, *args, **kw)

    monkeypatch.setattr(Kube, "replace", counted)
    return written


def both_active(r: Any) -> bool:
    return r.type == "status" and all(
        e.get("active") == 1 for e in (r.status.get("replicaStatuses") or {}).values()) and bool(
        r.status.get("replicaStatuses"))


async def test_a_created_status_waits_for_running_and_both_go_in_one_write(
        harness: AgentHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pods that run within ``status_hold_seconds`` (1 s) of the first pass: Created is not written
    alone, it goes in the same write as Running, with the first pass's time (as upstream's create predicate sets
    it in the cached object, which the first status write persists); every write is one Status Report."""
    written = count_status_writes(monkeypatch)
    job = with_annotations(example("pytorch-simple.yaml"), **{FOREVER: "true", START: "0.3"})
    cmd = place(job)
    await harness.send(cmd)
    accepted = await harness.wait_report(lambda r: r.type == "accepted")
    await harness.wait_report(both_active)
    first = harness.statuses(cmd.placement.workload_uid)[0]
    assert [c[0] for c in conditions(first.status)] == ["Created", "Running"]
    created, run = first.status["conditions"]
    assert created["lastTransitionTime"] <= run["lastTransitionTime"]
    assert first.status["startTime"] == created["lastTransitionTime"]
    assert len(written) == len(harness.statuses(cmd.placement.workload_uid)) <= 2  # Master, then Worker active
    assert accepted.seq < first.seq
    assert harness.agent is not None
    assert harness.agent.echoes_handled > 0  # children's create echoes taken undecoded (unless one beat its answer)
    passes = harness.agent.apply.passes if harness.agent.apply else -1
    await asyncio.sleep(1.2)  # past the hold: its timer went with the write, and brings no pass that renders nothing
    assert harness.agent.apply is not None and harness.agent.apply.passes == passes


async def place_held(harness: AgentHarness, monkeypatch: pytest.MonkeyPatch, hold: float,
                     start: str) -> tuple[list[str], Any]:
    """An agent with ``status_hold_seconds`` ``hold`` given pytorch-simple, whose pods start ``start`` seconds after
    binding: the status writes counted (``count_status_writes``) and the Place sent."""
    written = count_status_writes(monkeypatch)
    await harness.stop_agent()
    await harness.start_agent(status_hold_seconds=hold)
    cmd = place(with_annotations(example("pytorch-simple.yaml"), **{FOREVER: "true", START: start}))
    await harness.send(cmd)
    return written, cmd


async def test_a_created_status_goes_alone_once_the_hold_is_over(
        harness: AgentHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pods that take longer than the hold: Created is written (and reported) alone when the hold is over, then
    Running in a write of its own, Created's time and ``startTime`` kept from the first pass."""
    written, cmd = await place_held(harness, monkeypatch, 0.4, "2.0")
    await harness.wait_report(lambda r: r.type == "accepted")
    created = await harness.wait_report(has(("Created", "True", "PyTorchJobCreated")))
    assert [c[0] for c in conditions(created.status)] == ["Created"]
    assert written == ["pytorch-simple"]
    await harness.wait_report(both_active)
    first, *later = harness.statuses(cmd.placement.workload_uid)
    assert first is created and later
    running = later[0]
    assert [c[0] for c in conditions(running.status)] == ["Created", "Running"]
    assert running.status["conditions"][0] == created.status["conditions"][0]
    assert running.status["startTime"] == created.status["startTime"]
    assert len(written) == 1 + len(later)


async def test_with_no_hold_created_is_written_at_once_as_upstream_does(
        harness: AgentHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    """``status_hold_seconds: 0``: the first pass writes Created with the Services and Pods, as upstream does."""
    written, cmd = await place_held(harness, monkeypatch, 0, "1.0")
    await harness.wait_report(both_active)
    first, *later = harness.statuses(cmd.placement.workload_uid)
    assert [c[0] for c in conditions(first.status)] == ["Created"] and later
    assert len(written) == 1 + len(later)


async def test_a_held_created_status_is_written_on_a_graceful_stop(
        harness: AgentHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent stopping while it holds a Created status writes it (and reports it) before it goes, with the
    first pass's time: the next agent would render its own, later."""
    written, _ = await place_held(harness, monkeypatch, 30, "60")
    await harness.wait_report(lambda r: r.type == "accepted")
    async def rendered() -> bool:  # the first pass has rendered (its Pods are created) and holds the status
        return await harness.get(PODS, "pytorch-simple-worker-0", "team-a") is not None
    await eventually(rendered, what="the first pass to create the worker pod")
    assert written == []
    await harness.stop_agent()
    created = await harness.wait_report(has(("Created", "True", "PyTorchJobCreated")))
    assert written == ["pytorch-simple"]
    stored = await harness.get(PYTORCHJOBS, "pytorch-simple", "team-a")
    assert stored is not None and stored["status"] == created.status
    await harness.start_agent()


async def place_staggered(harness: AgentHarness, monkeypatch: pytest.MonkeyPatch, hold: float, master: str,
                          worker: str) -> tuple[list[str], Any]:
    """As ``place_held``, with the Master's pods starting ``master`` and the Worker's ``worker`` seconds after
    binding."""
    written = count_status_writes(monkeypatch)
    await harness.stop_agent()
    await harness.start_agent(status_hold_seconds=hold)
    job = worker_annotations(with_annotations(example("pytorch-simple.yaml"), **{FOREVER: "true", START: master}),
                             **{START: worker})
    cmd = place(job)
    await harness.send(cmd)
    return written, cmd


def master_only(r: Any) -> bool:
    if r.type != "status":
        return False
    entries = r.status.get("replicaStatuses") or {}
    return (entries.get("Master") or {}).get("active") == 1 and not (
        entries.get("Worker") or {}).get("active")


async def test_running_waits_for_the_replicas_starting_within_the_hold(
        harness: AgentHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Master running while its Worker is still starting makes a Running status the loop holds, as it
    holds Created: the Worker running half a second later brings one status write, Created and Running with
    both replicas active, instead of one for the Master and one for the Worker (upstream's, with no hold)."""
    written, cmd = await place_staggered(harness, monkeypatch, 1.0, "0.05", "0.5")
    await harness.wait_report(both_active)
    statuses = harness.statuses(cmd.placement.workload_uid)
    assert written == ["pytorch-simple"] and len(statuses) == 1
    assert [c[0] for c in conditions(statuses[0].status)] == ["Created", "Running"]


async def test_running_with_a_replica_still_starting_is_written_once_the_hold_is_over(
        harness: AgentHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Worker that starts after the hold: the Master's Running goes alone when the hold is over, the Worker's
    start in a write of its own, Running's time kept from the pass that rendered it."""
    written, cmd = await place_staggered(harness, monkeypatch, 0.4, "0.05", "2.5")
    first = await harness.wait_report(master_only)
    assert [c[0] for c in conditions(first.status)] == ["Created", "Running"]
    both = await harness.wait_report(both_active)
    assert both.status["conditions"] == first.status["conditions"]
    assert len(written) == len(harness.statuses(cmd.placement.workload_uid)) == 2


async def test_with_no_hold_the_masters_running_is_written_at_once_as_upstream_does(
        harness: AgentHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    """``status_hold_seconds: 0``: Running with the Master alone is written as soon as it renders, as upstream."""
    written, cmd = await place_staggered(harness, monkeypatch, 0, "0.05", "1.0")
    await harness.wait_report(master_only)
    await harness.wait_report(both_active)
    assert len(written) == len(harness.statuses(cmd.placement.workload_uid)) >= 3  # Created, Master, Worker


async def three_running(harness: AgentHarness, prefix: str) -> list[Any]:
    """Three PyTorchJobs ``<prefix>-0..2`` whose pods run at once and for good, placed; returns their Places once each
    has reported both replicas active."""
    cmds = []
    for i in range(3):
        job = with_annotations(example("pytorch-simple.yaml"), **{FOREVER: "true", START: "0"})
        job["metadata"]["name"] = f"{prefix}-{i}"
        cmds.append(place(job))
        await harness.send(cmds[-1])
    for cmd in cmds:
        await harness.wait_report(lambda r, uid=cmd.placement.workload_uid: both_active(r)
                                  and r.placement.workload_uid == uid)
    return cmds


async def test_the_echo_of_a_status_write_is_taken_undecoded_and_changes_nothing(
        harness: AgentHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job watch's echo of the apply loop's own status write is recognised by its resourceVersion
    before decoding (as children's echoes are) and handled as the decoded one was: no Report of its own, no pass
    that renders nothing. The job watch's lines reach the agent only while no status write waits for its answer, so
    every echo comes after its answer (on a loaded machine most would beat it, and an echo that beats its answer is
    decoded as before, which the other tests here cover)."""
    import federation.kube

    hand_over = federation.kube._WatchStream._hand_over

    def after_answers(stream: Any) -> None:
        agent = harness.agent
        if "pytorchjobs" in stream.path and agent is not None and agent.apply is not None and agent.apply._writing:
            asyncio.get_running_loop().call_later(0.01, after_answers, stream)
        else:
            hand_over(stream)

    monkeypatch.setattr(federation.kube._WatchStream, "_hand_over", after_answers)
    cmds = await three_running(harness, "echo")
    assert harness.agent is not None and harness.agent.apply is not None and harness.agent.inbox is not None
    assert not harness.agent.inbox.created  # each copy's create echo taken, or decoded before its answer came
    agent = harness.agent
    await eventually(lambda: agent.job_echoes_handled >= 1,  # the last write's echo comes a moment after its answer
                     what="the echo of the agent's last status write")
    reports = {cmd.placement.workload_uid: len(harness.statuses(cmd.placement.workload_uid)) for cmd in cmds}
    passes = harness.agent.apply.passes
    await asyncio.sleep(1.2)  # past the hold: nothing more to report or render
    assert harness.agent.apply.passes == passes
    assert {uid: len(harness.statuses(uid)) for uid in reports} == reports
    for cmd in cmds:
        copy_ = await harness.get(PYTORCHJOBS, cmd.job.name, cmd.job.namespace)
        assert copy_ is not None and [c[0] for c in conditions(copy_["status"])] == ["Created", "Running"]


async def test_the_echo_of_the_copy_the_inbox_created_is_taken_undecoded_and_starts_the_job(
        harness: AgentHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job watch's ADDED echo of the copy the inbox just created (no status, not fenced) is recognised
    by its resourceVersion before decoding, as the apply loop's own writes are, and does what the decoded one did:
    the job gets its first pass (its pods are created and it runs) and the inbox, the Reporter and the owner index
    know it. The job watch's lines reach the agent only once all three creates have their answers, so that every
    create's answer comes first (an echo that beats its answer is decoded as before, which the others cover)."""
    import federation.kube

    hand_over = federation.kube._WatchStream._hand_over

    def after_answers(stream: Any) -> None:
        agent = harness.agent
        answered = 0 if agent is None or agent.inbox is None else len(agent.inbox.created) + agent.copy_echoes_handled
        if "pytorchjobs" in stream.path and answered < 3:
            asyncio.get_running_loop().call_later(0.01, after_answers, stream)
        else:
            hand_over(stream)

    monkeypatch.setattr(federation.kube._WatchStream, "_hand_over", after_answers)
    cmds = await three_running(harness, "copy-echo")
    agent = harness.agent
    assert agent is not None and agent.inbox is not None
    assert agent.copy_echoes_handled == 3
    assert not agent.inbox.created  # each taken when its echo came
    for cmd in cmds:
        copy_ = await harness.get(PYTORCHJOBS, cmd.job.name, cmd.job.namespace)
        assert copy_ is not None
        assert agent.by_uid[copy_["metadata"]["uid"]] == ("PyTorchJob", cmd.job.namespace, cmd.job.name)
        assert agent.inbox.workloads[cmd.placement.workload_uid].attempt == cmd.placement.attempt
    assert agent.reporter.running() == 3


async def test_an_accepted_is_told_by_the_first_status_when_it_comes_within_the_accept_hold(
        harness: AgentHarness) -> None:
    """``accept_hold_seconds`` (longer than ``status_hold_seconds``' 1 s; 5 here, so a loaded machine's
    slow passes still fall within it): no Accepted goes for a Job whose first Status comes within it, pods running
    at once or a Created held and written when its hold is over; that Status says the copy exists (the dispatcher
    takes it as the Accepted). With a hold shorter than the first status takes, the Accepted goes alone once it is
    over, then the Status."""

    def job(name: str, start: str) -> Any:
        manifest = with_annotations(example("pytorch-simple.yaml"), **{FOREVER: "true", START: start})
        manifest["metadata"]["name"] = name
        return place(manifest)

    def answers(cmd: Any) -> list[str]:
        return [r.type for r in harness.reports if getattr(r, "placement", None) == cmd.placement]

    await harness.stop_agent()
    await harness.start_agent(accept_hold_seconds=5)
    quick, slow = job("pytorch-quick", "0.2"), job("pytorch-slow", "4.0")
    await harness.send(quick)
    await harness.send(slow)
    await harness.wait_report(lambda r: r.type == "status" and r.placement == quick.placement)
    first = await harness.wait_report(lambda r: r.type == "status" and r.placement == slow.placement)
    assert [c[0] for c in conditions(first.status)] == ["Created"]  # the held Created, written alone
    assert "accepted" not in answers(quick) and answers(slow) == ["status"]
    assert harness.agent is not None and harness.agent.outbox.folded == 2 and harness.agent.outbox.held() == 0

    await harness.stop_agent()
    await harness.start_agent(accept_hold_seconds=0.3)
    later = job("pytorch-later", "4.0")
    sent = asyncio.get_running_loop().time()
    await harness.send(later)
    accepted = await harness.wait_report(lambda r: r.type == "accepted" and r.placement == later.placement)
    assert asyncio.get_running_loop().time() - sent >= 0.25  # held, then alone
    status = await harness.wait_report(lambda r: r.type == "status" and r.placement == later.placement)
    assert accepted.seq < status.seq and answers(later) == ["accepted", "status"]
