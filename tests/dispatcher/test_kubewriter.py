"""The KubeWriter remembers only the status it wrote last: mkd's conditions and the worker's part are read
back from it (as after a restart from the listed Job). Checked on kubesim through the kubernetes client.

How long work waits to share a write is the writer's clock: those tests run it on a FakeClock, so "it
still waits" is checked once the writer has nothing queued or in flight (``settled``), not after a sleep."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from dispatcher.intake.jobcache import JobCache
from dispatcher.mirror.kubewriter import JobKey, KubeWriter
from dispatcher.workload import condition, passing, removal, reset
from federation import labels
from federation.clock import Clock, FakeClock, SystemClock
from federation.kube import EVENTS, JOBS, Kube
from tests.dispatcher.harness import PYTORCHJOBS, eventually, pytorchjob

T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def job_and_writer(kube: Kube, name: str, *, through: Any = None, clock: Clock | None = None,
                         **settings: Any) -> tuple[JobKey, KubeWriter, asyncio.Task[None]]:
    """A PyTorchJob ``name`` on kubesim, in a Job cache, and a KubeWriter over them (writing ``through``
    another client when given, on ``clock``), running."""
    job = await kube.create(PYTORCHJOBS, pytorchjob(name), "default")
    key = JobKey(job["metadata"]["uid"], "PyTorchJob", "default", name)
    cache = JobCache()
    cache[key.uid] = job
    writer = KubeWriter(through or kube, cache, clock or SystemClock(), **settings)
    return key, writer, asyncio.create_task(writer.run())


async def settled(writer: KubeWriter) -> None:
    """Until the writer has nothing queued and nothing in flight: what is left waits (its clock stands still)."""
    await eventually(lambda: writer.settled, what="the writer to have nothing queued or in flight")


async def test_conditions_and_mirrors_keep_each_other_and_transition_times(kube: Kube) -> None:
    job = await kube.create(PYTORCHJOBS, pytorchjob("w"), "default")
    key = JobKey(job["metadata"]["uid"], "PyTorchJob", "default", "w")
    cache = JobCache()
    cache[key.uid] = job
    writer = KubeWriter(kube, cache, SystemClock(), workers=2)
    task = asyncio.create_task(writer.run())

    async def status() -> dict[str, Any]:
        await writer.wait_idle()
        return (await kube.get(PYTORCHJOBS, "w", "default")).get("status") or {}
    try:
        writer.condition(key, condition(labels.CONDITION_DISPATCHED, False, "NoFittingCluster", "wait", T0))
        st = await status()
        assert [c["type"] for c in st["conditions"]] == [labels.CONDITION_DISPATCHED]

        later = T0 + timedelta(minutes=1)
        writer.condition(key, condition(labels.CONDITION_DISPATCHED, True, "Placed", "placed on worker-1", later))
        worker = {"startTime": "2026-01-01T00:02:00Z", "replicaStatuses": {"Master": {"active": 1}},
                  "conditions": [{"type": "Running", "status": "True", "reason": "PyTorchJobRunning",
                                  "message": "running", "lastTransitionTime": "2026-01-01T00:02:00Z"}]}
        writer.mirror(key, worker)
        st = await status()
        assert [c["type"] for c in st["conditions"]] == [labels.CONDITION_DISPATCHED, "Running"]
        assert st["conditions"][0]["status"] == "True" and st["conditions"][0]["lastTransitionTime"] == "2026-01-01T00:01:00Z"
        assert st["replicaStatuses"] == {"Master": {"active": 1}}

        # a condition alone keeps the worker's part; the same status keeps its transition time
        writer.condition(key, condition(labels.CONDITION_DISPATCHED, True, "Placed", "placed again",
                                        T0 + timedelta(minutes=5)))
        writer.condition(key, condition(labels.CONDITION_REJECTED, False, "Corrected", "valid", T0))
        st = await status()
        # mkd's False conditions before its True ones (the last of them is the STATE of a Job with none of its own)
        assert [c["type"] for c in st["conditions"]] == [labels.CONDITION_REJECTED, labels.CONDITION_DISPATCHED,
                                                         "Running"]
        assert st["conditions"][1]["message"] == "placed again"
        assert st["conditions"][1]["lastTransitionTime"] == "2026-01-01T00:01:00Z"
        assert st["startTime"] == "2026-01-01T00:02:00Z" and st["replicaStatuses"] == {"Master": {"active": 1}}

        # the worker's status replaces its part (nested keys it dropped are gone); mkd's conditions stay first
        writer.mirror(key, {"replicaStatuses": {"Master": {"succeeded": 1}}, "conditions": [
            {"type": "Succeeded", "status": "True", "reason": "PyTorchJobSucceeded", "message": "done",
             "lastTransitionTime": "2026-01-01T00:09:00Z"}]})
        st = await status()
        assert [c["type"] for c in st["conditions"]] == [labels.CONDITION_REJECTED, labels.CONDITION_DISPATCHED,
                                                         "Succeeded"]
        assert "startTime" not in st and st["replicaStatuses"] == {"Master": {"succeeded": 1}}

        # the same again changes nothing: no write
        writes = writer.writes
        writer.condition(key, condition(labels.CONDITION_REJECTED, False, "Corrected", "valid", T0))
        await status()
        assert writer.writes == writes and writer.unchanged >= 1

        # a restarted dispatcher's writer (nothing remembered) reads both back from the listed Job
        cache[key.uid] = await kube.get(PYTORCHJOBS, "w", "default")
        fresh = KubeWriter(kube, cache, SystemClock(), workers=1)
        task2 = asyncio.create_task(fresh.run())
        try:
            fresh.condition(key, condition(labels.CONDITION_DISPATCHED, True, "Placed", "after restart",
                                           T0 + timedelta(hours=1)))
            await fresh.wait_idle()
            st = (await kube.get(PYTORCHJOBS, "w", "default"))["status"]
            assert [c["type"] for c in st["conditions"]] == [labels.CONDITION_REJECTED,
                                                             labels.CONDITION_DISPATCHED, "Succeeded"]
            assert st["conditions"][1]["lastTransitionTime"] == "2026-01-01T00:01:00Z"
            assert st["replicaStatuses"] == {"Master": {"succeeded": 1}}
        finally:
            task2.cancel()
    finally:
        task.cancel()


async def test_a_condition_alone_waits_for_the_jobs_status_and_shares_its_write(kube: Kube) -> None:
    job = await kube.create(PYTORCHJOBS, pytorchjob("linger"), "default")
    key = JobKey(job["metadata"]["uid"], "PyTorchJob", "default", "linger")
    cache = JobCache()
    cache[key.uid] = job
    clock = FakeClock()
    writer = KubeWriter(kube, cache, clock, workers=2, condition_linger=3600)  # only work on it ends the wait
    task = asyncio.create_task(writer.run())
    try:
        writer.condition(key, condition(labels.CONDITION_DISPATCHED, True, "Placed", "placed on worker-1", T0))
        clock.advance(3599)
        await settled(writer)
        assert writer.writes == 0 and writer.backlog == 1  # waiting for the worker's status
        writer.mirror(key, {"conditions": [{"type": "Created", "status": "True", "reason": "PyTorchJobCreated",
                                            "message": "created", "lastTransitionTime": "2026-01-01T00:00:01Z"}]})
        await asyncio.wait_for(writer.wait_idle(), 30)
        assert writer.writes == 1  # the condition and the status in one write
        st = (await kube.get(PYTORCHJOBS, "linger", "default"))["status"]
        assert [c["type"] for c in st["conditions"]] == [labels.CONDITION_DISPATCHED, "Created"]

        writer.condition(key, condition(labels.CONDITION_REJECTED, True, "InvalidJob", "bad", T0))
        await settled(writer)
        assert writer.writes == 1
        writer.event(key, "Warning", "InvalidJob", "bad")  # an Event goes at once, and takes the condition along
        await asyncio.wait_for(writer.wait_idle(), 30)
        assert writer.writes == 2
        st = (await kube.get(PYTORCHJOBS, "linger", "default"))["status"]
        assert [c["type"] for c in st["conditions"]] == [labels.CONDITION_DISPATCHED, labels.CONDITION_REJECTED,
                                                         "Created"]  # both True: in MKD_CONDITIONS' order
    finally:
        task.cancel()


async def test_a_reset_flips_only_what_holds_and_a_removal_takes_a_condition_off(kube: Kube) -> None:
    """Kueue's resetActiveCondition: a condition is set False ("Previously: ...") only where the Job has it
    True, judged against what the Job shows (or what is queued for it and not written yet)."""
    key, writer, task = await job_and_writer(kube, "resets", workers=1, condition_linger=0)

    async def conds() -> dict[str, tuple[str, str, str]]:
        await writer.wait_idle()
        st = (await kube.get(PYTORCHJOBS, "resets", "default")).get("status") or {}
        return {c["type"]: (c["status"], c["reason"], c["message"]) for c in st.get("conditions") or []}
    later = T0 + timedelta(minutes=1)
    try:
        writer.condition(key, reset(labels.CONDITION_EVICTED, "QuotaReserved", "", T0, previously=True))
        writer.condition(key, condition(labels.CONDITION_PENDING, True, "NoFittingCluster", "wait", T0))
        assert await conds() == {labels.CONDITION_PENDING: ("True", "NoFittingCluster", "wait")}  # nothing to reset

        writer.condition(key, condition(labels.CONDITION_EVICTED, True, "Preempted", "by high", T0))
        await conds()
        writer.condition(key, reset(labels.CONDITION_EVICTED, "QuotaReserved", "", later, previously=True))
        writer.condition(key, reset(labels.CONDITION_ADMITTED, "NoReservation", "none", later))
        writer.condition(key, removal(labels.CONDITION_PENDING))
        assert await conds() == {labels.CONDITION_EVICTED: ("False", "QuotaReserved", "Previously: by high")}

        # queued together before a write: the reset resolves against the condition queued True
        writer.condition(key, condition(labels.CONDITION_PREEMPTED, True, "InClusterQueue", "by urgent", T0))
        writer.condition(key, reset(labels.CONDITION_PREEMPTED, "QuotaReserved", "", later, previously=True))
        writer.condition(key, reset(labels.CONDITION_EVICTED, "QuotaReserved", "", later, previously=True))
        got = await conds()
        assert got[labels.CONDITION_PREEMPTED] == ("False", "QuotaReserved", "Previously: by urgent")
        assert got[labels.CONDITION_EVICTED] == ("False", "QuotaReserved", "Previously: by high")  # False: kept
    finally:
        task.cancel()


def _created(at: str = "2026-01-01T00:00:01Z") -> dict[str, Any]:
    return {"startTime": at, "conditions": [{"type": "Created", "status": "True", "reason": "PyTorchJobCreated",
                                             "message": "created", "lastTransitionTime": at}]}


def _running() -> dict[str, Any]:
    st = _created()
    st["replicaStatuses"] = {"Master": {"active": 1}}
    st["conditions"].append({"type": "Running", "status": "True", "reason": "PyTorchJobRunning",
                             "message": "running", "lastTransitionTime": "2026-01-01T00:00:02Z"})
    return st


def test_a_status_passes_when_the_job_has_no_condition_of_its_own_or_only_created() -> None:
    assert passing({}) and passing({"active": 1, "startTime": "2026-01-01T00:00:01Z"})
    assert passing(_created())
    assert passing({"conditions": [condition(labels.CONDITION_DISPATCHED, True, "Placed", "placed", T0),
                                   {"type": "Running", "status": "False"}]})
    assert not passing(_running())
    assert not passing({"conditions": [{"type": "Suspended", "status": "True"}]})
    assert not passing({"conditions": [{"type": "Complete", "status": "True"}]})


async def _running_takes_along_what_waited(kube: Kube, writer: KubeWriter, key: JobKey) -> None:
    """Running goes at once, in one write with the Accepted's condition and Created that waited for it."""
    writer.mirror(key, _running(), finished=False)
    await asyncio.wait_for(writer.wait_idle(), 30)
    assert writer.writes == 1
    st = (await kube.get(PYTORCHJOBS, key.name, key.namespace))["status"]
    assert [c["type"] for c in st["conditions"]] == [labels.CONDITION_DISPATCHED, "Created", "Running"]


async def test_accepted_created_and_running_share_one_write(kube: Kube) -> None:
    key, writer, task = await job_and_writer(kube, "passing", clock=FakeClock(), workers=2, condition_linger=3600,
                                             status_linger=3600)
    try:
        writer.condition(key, condition(labels.CONDITION_DISPATCHED, True, "Placed", "placed on worker-1", T0))
        writer.mirror(key, _created(), finished=False)  # Created: the Job leaves it soon, it waits too
        await settled(writer)
        assert writer.writes == 0 and writer.backlog == 1
        await _running_takes_along_what_waited(kube, writer, key)

        more = _running()
        more["replicaStatuses"]["Worker"] = {"active": 1}
        writer.mirror(key, more, finished=False)  # still Running, counts changed: waits for more
        await settled(writer)
        assert writer.writes == 1 and writer.backlog == 1
        done = _running()
        done["conditions"].append({"type": "Succeeded", "status": "True", "reason": "PyTorchJobSucceeded",
                                   "message": "done", "lastTransitionTime": "2026-01-01T00:00:03Z"})
        writer.mirror(key, done)  # finished: at once, replacing what waited
        await asyncio.wait_for(writer.wait_idle(), 30)
        assert writer.writes == 2
        st = (await kube.get(PYTORCHJOBS, "passing", "default"))["status"]
        assert st["conditions"][-1]["type"] == "Succeeded" and "Worker" not in st["replicaStatuses"]
    finally:
        task.cancel()


async def _events_of(kube: Kube, name: str) -> list[str]:
    return [e["reason"] for e in (await kube.list(EVENTS, "default")).items if e["involvedObject"]["name"] == name]


async def test_an_event_goes_at_once_without_what_waits_for_the_workers_status(kube: Kube) -> None:
    """The Placed Event goes at once; the Accepted's condition and a Created status, which wait for the
    worker's next status, keep waiting instead of going with it, so Running still shares their write (a
    write queued for an Event took them along: two status writes per Job whenever the writer lagged)."""
    key, writer, task = await job_and_writer(kube, "evented", clock=FakeClock(), workers=1, condition_linger=3600,
                                             status_linger=3600)
    try:
        writer.event(key, "Normal", "Placed", "attempt 1 on worker-1")  # queued, not written yet
        writer.condition(key, condition(labels.CONDITION_DISPATCHED, True, "Accepted", "accepted", T0),
                         status_follows=True)
        writer.mirror(key, _created(), finished=False)
        await settled(writer)
        assert await _events_of(kube, "evented") == ["Placed"]
        assert writer.writes == 0 and writer.backlog == 1  # still waiting for the worker's next status
        writer.event(key, "Normal", "Noted", "another Event while they wait")
        await settled(writer)
        assert sorted(await _events_of(kube, "evented")) == ["Noted", "Placed"]
        assert writer.writes == 0 and writer.backlog == 1
        await _running_takes_along_what_waited(kube, writer, key)
    finally:
        task.cancel()


async def test_a_passing_status_alone_is_written_once_its_wait_is_over(kube: Kube) -> None:
    clock = FakeClock()
    key, writer, task = await job_and_writer(kube, "slow", clock=clock, workers=2, condition_linger=0.05,
                                             status_linger=0.3)
    try:
        writer.condition(key, condition(labels.CONDITION_DISPATCHED, True, "Placed", "placed on worker-1", T0))
        clock.advance(0.01)
        writer.mirror(key, _created(), finished=False)  # extends the condition's wait: both go together
        clock.advance(0.1)  # past the condition's own wait
        await settled(writer)
        assert writer.writes == 0 and writer.backlog == 1
        clock.advance(0.2)  # the status's wait is over
        await asyncio.wait_for(writer.wait_idle(), 30)
        assert writer.writes == 1
        st = (await kube.get(PYTORCHJOBS, "slow", "default"))["status"]
        assert [c["type"] for c in st["conditions"]] == [labels.CONDITION_DISPATCHED, "Created"]
    finally:
        task.cancel()


async def test_a_trainjob_never_gets_more_conditions_than_its_crd_holds(kube: Kube) -> None:
    """Trainer's CRD holds at most 8 conditions on a TrainJob and refuses a status above it whole (the
    mirror then never landed): mkd's least telling conditions give way, the Job's own are all kept."""
    import copy

    from federation.kinds.crds import load_crds
    from federation.kube import CRDS, Resource
    from tests.dispatcher.harness import eventually
    trainjobs = Resource("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob")
    crd = next(c for c in load_crds() if c["metadata"]["name"] == "trainjobs.trainer.kubeflow.org")
    await kube.create(CRDS, copy.deepcopy(crd))
    await eventually(lambda: kube.served(trainjobs), what="TrainJob CRD served")
    job = await kube.create(trainjobs, {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                        "metadata": {"name": "tj"}, "spec": {"managedBy": labels.MULTIKUEUE,
                                                                             "runtimeRef": {"name": "torch"}}},
                            "default")
    key = JobKey(job["metadata"]["uid"], "TrainJob", "default", "tj")
    cache = JobCache()
    cache[key.uid] = job
    writer = KubeWriter(kube, cache, SystemClock(), workers=1, condition_linger=0)
    task = asyncio.create_task(writer.run())
    try:
        # preempted, admitted again, corrected once, finished: eight of mkd's own
        for type_, status in ((labels.CONDITION_REQUEUED, True), (labels.CONDITION_EVICTED, False),
                              (labels.CONDITION_PREEMPTED, False), (labels.CONDITION_QUOTA_RESERVED, True),
                              (labels.CONDITION_ADMITTED, True), (labels.CONDITION_FINISHED, True),
                              (labels.CONDITION_DISPATCHED, True), (labels.CONDITION_REJECTED, False)):
            writer.condition(key, condition(type_, status, "R", "m", T0))
        own = [{"type": "Suspended", "status": "False", "reason": "Resumed", "message": "TrainJob is resumed",
                "lastTransitionTime": "2026-01-01T00:00:01Z"},
               {"type": "Complete", "status": "True", "reason": "AllJobsCompleted", "message": "done",
                "lastTransitionTime": "2026-01-01T00:09:00Z"}]
        writer.mirror(key, {"conditions": own})
        await writer.wait_idle()
        assert writer.failures == 0
        st = (await kube.get(trainjobs, "tj", "default"))["status"]
        types = [c["type"] for c in st["conditions"]]
        # the two "Previously: ..." of an old eviction gave way
        assert types == [labels.CONDITION_REJECTED, labels.CONDITION_REQUEUED, labels.CONDITION_QUOTA_RESERVED,
                         labels.CONDITION_ADMITTED, labels.CONDITION_FINISHED, labels.CONDITION_DISPATCHED,
                         "Suspended", "Complete"]
    finally:
        task.cancel()


async def test_statuses_that_keep_coming_do_not_hold_the_write_past_the_longest_wait(kube: Kube) -> None:
    """Each counts-only status may wait for the next, but the first of them waits at most ``status_linger``:
    a Job whose counts change more often than that still shows them."""
    clock = FakeClock()
    key, writer, task = await job_and_writer(kube, "busy", clock=clock, workers=1, condition_linger=0,
                                             status_linger=0.5)
    try:
        writer.mirror(key, _running(), finished=False)  # Running goes at once
        await asyncio.wait_for(writer.wait_idle(), 30)
        writes = writer.writes
        active = 1
        for _ in range(20):  # a new status every 0.1 s for 2 s
            active += 1
            more = _running()
            more["replicaStatuses"]["Master"] = {"active": active}
            writer.mirror(key, more, finished=False)  # same latest condition: it waits, and extends the wait
            clock.advance(0.1)
            await settled(writer)
            if writer.writes > writes:
                break
        assert writer.writes > writes, "a steady trickle of statuses kept the manager Job from being written"
        assert clock.monotonic() <= 0.5 + 1e-9, "written only after more than the longest wait"
    finally:
        task.cancel()


class _GatedEvents:
    """The kubesim client, its Events held until ``gate`` is set (a manager API the writer is behind on)."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()
        """Set once an Event write has begun (and waits at the gate)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kube, name)

    async def event(self, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        await self.gate.wait()
        return await self.kube.event(*args, **kwargs)


async def test_a_wait_for_the_workers_status_lasts_while_the_writer_is_behind(kube: Kube) -> None:
    """While more writes are queued than the writer has workers, the Accepted's wait for the worker's next
    status is extended (up to ``start_linger_max``) instead of ending: in 5,000-Job bursts on a loaded machine
    Created or Running came more than 2 s after the Accepted for a third to over half of the Jobs, each then
    written two or three times, while the writer was behind anyway."""
    slow = _GatedEvents(kube)
    clock = FakeClock()
    key, writer, task = await job_and_writer(kube, "behind", through=slow, clock=clock, workers=2,
                                             condition_linger=0.05, status_linger=0.5)
    try:
        for n in range(5):  # two in flight, three queued: more than the writer's workers
            writer.event(JobKey(f"other-{n}", "PyTorchJob", "default", f"other-{n}"), "Normal", "Placed", "p")
        writer.condition(key, condition(labels.CONDITION_DISPATCHED, True, "Accepted", "accepted", T0),
                         status_follows=True)
        await slow.entered.wait()
        clock.advance(0.7)  # its status_linger is over, while the writer is behind
        slow.gate.set()
        await _others_written(kube, 5)
        assert writer.writes == 0, "the Accepted went alone as the writer caught up"
        await _running_takes_along_what_waited(kube, writer, key)
    finally:
        task.cancel()


async def _others_written(kube: Kube, n: int) -> None:
    async def written() -> bool:
        return len([e for e in (await kube.list(EVENTS, "default")).items
                    if e["involvedObject"]["name"].startswith("other-")]) >= n
    await eventually(written, what="the held Events to be written")


async def test_an_accepted_that_comes_while_an_event_is_written_still_waits_for_the_status(kube: Kube) -> None:
    """The Accepted's condition (and a Created status) that come while the Job's Placed Event is being written
    wait for Running all the same: they went as soon as the Event was written, alone, and Running took a write
    of its own (a fifth to a third of the Jobs of a 5,000-Job burst, whose Events the writer was behind on)."""
    slow = _GatedEvents(kube)
    key, writer, task = await job_and_writer(kube, "busy-event", through=slow, clock=FakeClock(), workers=1,
                                             condition_linger=3600, status_linger=3600)
    try:
        writer.event(key, "Normal", "Placed", "attempt 1 on worker-1")
        await slow.entered.wait()  # the writer is at it
        writer.condition(key, condition(labels.CONDITION_DISPATCHED, True, "Accepted", "accepted", T0),
                         status_follows=True)
        writer.mirror(key, _created(), finished=False)
        slow.gate.set()
        await settled(writer)
        assert await _events_of(kube, "busy-event") == ["Placed"]
        assert writer.writes == 0 and writer.backlog == 1  # still waiting for the worker's next status
        await _running_takes_along_what_waited(kube, writer, key)
    finally:
        task.cancel()


async def test_the_conditions_given_are_never_changed_so_many_jobs_may_share_them(kube: Kube) -> None:
    """A placement pass gives the same condition dicts to every Workload waiting for the same reason
    (dispatcher/engine/rounds.py ``_shared``); the writer folds, resets and dates them into new dicts, never in place."""
    import copy

    key, writer, task = await job_and_writer(kube, "shared-a", workers=2)
    job_b = await kube.create(PYTORCHJOBS, pytorchjob("shared-b"), "default")
    key_b = JobKey(job_b["metadata"]["uid"], "PyTorchJob", "default", "shared-b")
    writer.cache[key_b.uid] = job_b
    try:
        first = [condition(labels.CONDITION_QUOTA_RESERVED, True, "QuotaReserved", "reserved", T0),
                 condition(labels.CONDITION_PENDING, True, "Waiting", "waits", T0)]
        later = T0 + timedelta(minutes=1)
        shared = [condition(labels.CONDITION_QUOTA_RESERVED, True, "QuotaReserved", "again", later),
                  reset(labels.CONDITION_QUOTA_RESERVED, "Pending", "released", later, previously=True),
                  removal(labels.CONDITION_PENDING),
                  condition(labels.CONDITION_DISPATCHED, False, "NoFittingCluster", "wait", later)]
        before = copy.deepcopy(shared)
        for c in first:
            writer.condition(key, c)  # the first Job holds them True already
        await writer.wait_idle()
        for k in (key, key_b):
            for c in shared:
                writer.condition(k, c)
        await writer.wait_idle()
        assert shared == before
        for name in ("shared-a", "shared-b"):  # each Job got what the list says, folded for it alone
            conds = {c["type"]: c for c in (await kube.get(PYTORCHJOBS, name, "default"))["status"]["conditions"]}
            reserved = conds[labels.CONDITION_QUOTA_RESERVED]
            assert (reserved["status"], reserved["message"]) == ("False", "Previously: again")
            assert labels.CONDITION_PENDING not in conds and conds[labels.CONDITION_DISPATCHED]["status"] == "False"
    finally:
        task.cancel()


async def test_a_new_copys_status_keeps_the_jobs_start_time_and_a_refused_write_is_not_dropped(kube: Kube) -> None:
    """After a re-placement the new worker copy reports a status without ``startTime`` (it has not started):
    the manager Job stays unsuspended, and a v1.36 server refuses a status without the ``startTime`` it had
    (``startTime cannot be removed for unsuspended job``). The mirror keeps it, and the conditions go along."""
    job = await kube.create(JOBS, {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "b"}, "spec": {
        "managedBy": labels.MULTIKUEUE, "template": {"spec": {"restartPolicy": "Never", "containers": [
            {"name": "c", "image": "busybox:1.36"}]}}}}, "default")
    key = JobKey(job["metadata"]["uid"], "Job", "default", "b")
    cache = JobCache()
    cache[key.uid] = job
    writer = KubeWriter(kube, cache, SystemClock())
    task = asyncio.create_task(writer.run())
    try:
        writer.mirror(key, {"startTime": "2026-01-01T00:02:00Z", "active": 1, "ready": 1, "terminating": 0,
                            "uncountedTerminatedPods": {}})
        await writer.wait_idle()
        # evicted and placed again: the new copy's first status has not started yet
        writer.condition(key, condition(labels.CONDITION_DISPATCHED, True, "Placed", "placed on worker-2",
                                        T0 + timedelta(minutes=3)))
        writer.mirror(key, {"active": 0, "ready": 0, "terminating": 0, "uncountedTerminatedPods": {}})
        await writer.wait_idle()
        st = (await kube.get(JOBS, "b", "default")).get("status") or {}
        assert st.get("startTime") == "2026-01-01T00:02:00Z"
        assert st.get("active") == 0
        assert [c["type"] for c in st.get("conditions") or []] == [labels.CONDITION_DISPATCHED]
        assert writer.failures == 0
    finally:
        task.cancel()


async def test_a_refused_worker_status_is_logged_and_the_conditions_still_go(kube: Kube, caplog: Any) -> None:
    """A worker status the API server refuses (here a completionTime before the Job's startTime) is not
    written; the refusal is logged with what it refused and counted, and mkd's conditions queued with it are
    written again without it."""
    job = await kube.create(JOBS, {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "r"}, "spec": {
        "managedBy": labels.MULTIKUEUE, "template": {"spec": {"restartPolicy": "Never", "containers": [
            {"name": "c", "image": "busybox:1.36"}]}}}}, "default")
    key = JobKey(job["metadata"]["uid"], "Job", "default", "r")
    cache = JobCache()
    cache[key.uid] = job
    writer = KubeWriter(kube, cache, SystemClock())
    task = asyncio.create_task(writer.run())
    try:
        writer.mirror(key, {"startTime": "2026-01-01T00:02:00Z", "active": 1})
        await writer.wait_idle()
        writer.condition(key, condition(labels.CONDITION_DISPATCHED, True, "Placed", "placed on worker-2", T0))
        writer.mirror(key, {"startTime": "2026-01-01T00:02:00Z", "completionTime": "2026-01-01T00:01:00Z",
                            "active": 0})
        await writer.wait_idle()
        st = (await kube.get(JOBS, "r", "default")).get("status") or {}
        assert [c["type"] for c in st.get("conditions") or []] == [labels.CONDITION_DISPATCHED]
        assert st.get("active") == 1 and "completionTime" not in st     # the refused worker status is not there
        assert writer.refused == 1
        assert any("refused the status of manager Job default/r" in r.getMessage()
                   and "status.completionTime" in r.getMessage() for r in caplog.records)
    finally:
        task.cancel()


async def test_a_workload_waiting_for_quota_never_shows_admitted_beside_quota_reserved_false(kube: Kube) -> None:
    """Kueue sets ``QuotaReserved=False`` only through ``UnsetQuotaReservationWithCondition``, which flips a True
    ``Admitted`` to False (``NoReservation``) with it: a Job whose Workload waits for quota never reads
    ``Admitted=True`` beside ``QuotaReserved=False``, even when what it got after its admission is only the
    wait (its eviction's write refused or lost)."""
    from dispatcher.mirror import conditions as jc
    key, writer, task = await job_and_writer(kube, "stale", workers=1, condition_linger=0)

    async def conds() -> dict[str, tuple[str, str]]:
        await writer.wait_idle()
        st = (await kube.get(PYTORCHJOBS, "stale", "default")).get("status") or {}
        return {c["type"]: (c["status"], c["reason"]) for c in st.get("conditions") or []}
    try:
        for c in jc.admitted(jc.quota_text("a", None), jc.admitted_text("worker-1"), T0):
            writer.condition(key, c)
        got = await conds()
        assert got[labels.CONDITION_QUOTA_RESERVED] == ("True", "QuotaReserved")
        assert got[labels.CONDITION_ADMITTED] == ("True", "Admitted")
        waits = ("couldn't assign flavors to pod set main: insufficient unused quota for cpu in flavor default, "
                 "1 more needed")
        for c in jc.waiting("QuotaNotReserved", waits, T0 + timedelta(minutes=1), step="queue"):
            writer.condition(key, c)
        got = await conds()
        assert got[labels.CONDITION_QUOTA_RESERVED] == ("False", "Pending")
        assert got[labels.CONDITION_ADMITTED] == ("False", "NoReservation")
    finally:
        task.cancel()
