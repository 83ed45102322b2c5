"""Fencing on the agent: without a lease renewal it suspends its Jobs before the lease ends, starts
nothing new, and resumes only what the dispatcher's Resync still lists once a renewal comes back."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from federation import labels
from federation.kinds.leaderworkerset import LEADERWORKERSET, SUSPENDED_REPLICAS
from federation.kube import resource_for
from federation.messages import Heartbeat, Lease, Resync
from tests.agent.conftest import CLUSTER, PYTORCHJOBS, AgentHarness, place
from tests.agent.test_agent_inbox import forever
from tests.waiting import eventually


def suspended(job: dict | None) -> bool:  # type: ignore[type-arg]
    return bool(job and ((job.get("spec") or {}).get("runPolicy") or {}).get("suspend") is True)


async def test_an_agent_without_renewals_suspends_its_jobs_and_resumes_only_what_a_resync_lists(
        harness: AgentHarness) -> None:
    await harness.stop_agent()
    await harness.start_agent(lease_startup_grace_seconds=4.0, lease_stop_before_seconds=1.0,
                              heartbeat_interval_seconds=0.5)
    keep, gone_job = place(forever(), uid="wl-keep"), forever()
    gone_job["metadata"]["name"] = "moved-away"
    gone = place(gone_job, uid="wl-moved")
    for cmd in (keep, gone):
        await harness.send(cmd)
        wanted = cmd.placement
        await harness.wait_report(lambda r: r.type == "accepted" and r.placement == wanted)  # noqa: B023
    # no dispatcher renews the lease: the start-up grace runs out and both are suspended, marked fenced
    for name in ("pytorch-simple", "moved-away"):
        async def suspended_now(name: str = name) -> dict[str, Any] | None:
            job = await harness.get(PYTORCHJOBS, name, "team-a")
            return job if suspended(job) else None
        job = await eventually(suspended_now, what=f"{name} suspended once the grace ran out")
        assert job["metadata"]["annotations"][labels.FENCED_ANNOTATION] == "true"
    # a fenced agent starts nothing new
    late = forever()
    late["metadata"]["name"] = "late"
    await harness.send(place(late, uid="wl-late"))
    refused = await harness.wait_report(lambda r: r.type == "rejected" and r.placement.workload_uid == "wl-late")
    assert refused.reason == "LeaseExpired" and not refused.permanent
    # the dispatcher is back: it renews the lease for a heartbeat; the agent asks for a Resync
    hb = harness.heartbeats()[-1]
    n = len(harness.reports)
    await harness.send(Lease(cluster=CLUSTER, epoch=1, heartbeat_sent_at=hb.sent_at, seconds=60))
    await harness.wait_report(lambda r: r.type == "inventory", after=n)
    # the Resync lists only wl-keep (wl-moved went elsewhere meanwhile): one resumed, one deleted
    await harness.send(Resync(cluster=CLUSTER, epoch=1, expected=[keep.placement]))
    async def running_again() -> dict[str, Any] | None:
        job = await harness.get(PYTORCHJOBS, "pytorch-simple", "team-a")
        return job if job is not None and not suspended(job) else None
    job = await eventually(running_again, what="the listed job resumed")
    assert labels.FENCED_ANNOTATION not in (job["metadata"].get("annotations") or {})
    await harness.wait_report(lambda r: r.type == "status" and r.gone and r.placement.workload_uid == "wl-moved")
    assert await harness.get(PYTORCHJOBS, "late", "team-a") is None


async def test_a_renewal_naming_an_unknown_heartbeat_changes_nothing(harness: AgentHarness) -> None:
    assert harness.agent is not None and harness.agent.lease is not None
    lease = harness.agent.lease
    before = lease.until
    assert not lease.granted(Lease(cluster=CLUSTER, epoch=1, heartbeat_sent_at=datetime(2020, 1, 1), seconds=600))
    assert lease.until == before
    hb = Heartbeat(cluster=CLUSTER)
    lease.heartbeat_sent(hb)
    assert lease.granted(Lease(cluster=CLUSTER, epoch=1, heartbeat_sent_at=hb.sent_at, seconds=600))
    assert 590 < lease.remaining() <= 600 and lease.holds()


async def test_a_resync_that_comes_after_the_lease_ran_out_again_is_asked_for_again() -> None:
    """The chaos suite's partition-net left Jobs suspended for good: the lease came back, the agent asked
    for a Resync, but by the time it arrived the (short, loaded) lease was over again, so nothing was
    resumed, and a later renewal never asked again. Every renewal must ask while a resume is owed."""
    from federation.clock import FakeClock
    from worker_agent.lease import LeaseKeeper

    clock = FakeClock()
    asked: list[float] = []
    keeper = LeaseKeeper(None, {}, {}, origin="mkd", clock=clock, startup_grace=1.0, stop_before=1.0,  # type: ignore[arg-type]
                         on_regained=lambda: asked.append(clock.monotonic()))

    def renew(seconds: float) -> None:
        hb = Heartbeat(cluster=CLUSTER, sent_at=clock.now())
        keeper.heartbeat_sent(hb)
        assert keeper.granted(Lease(cluster=CLUSTER, epoch=1, heartbeat_sent_at=hb.sent_at, seconds=seconds))

    clock._elapsed = 5.0  # the start-up grace ran out; the watchdog fenced every Job
    keeper.fenced = True
    renew(4.0)
    assert len(asked) == 1  # regained: asks for a Resync
    clock._elapsed = 20.0  # the Resync arrives after that lease already ran out
    assert await keeper.resume(set()) == 0
    renew(4.0)
    assert len(asked) == 2, "a renewal after a resume that could not run must ask for a Resync again"
    assert await keeper.resume(set()) == 0  # held now: the owed resume is done (nothing was fenced here)
    renew(4.0)
    assert len(asked) == 2  # nothing owed any more


async def test_jobs_fenced_before_the_informer_saw_it_are_resumed(harness: AgentHarness) -> None:
    """Under load the job informer lags behind the agent's own writes. The keeper resumed only Jobs whose
    *cached* copy carried the fenced mark, so a Resync that came before the watch event of the fencing
    patch resumed nothing, and those Jobs stayed suspended for good (partition-net's 'suspended')."""
    from federation.clock import FakeClock
    from federation.kinds.registry import by_name
    from worker_agent.cache import ObjectCache
    from worker_agent.lease import LeaseKeeper

    cmd = place(forever(), uid="wl-lagging")
    await harness.send(cmd)
    await harness.wait_report(lambda r: r.type == "accepted" and r.placement == cmd.placement)
    job = await harness.get(PYTORCHJOBS, "pytorch-simple", "team-a")
    assert job is not None
    cache = ObjectCache(PYTORCHJOBS.plural)  # fed by no informer: it stays as the Job was before fencing
    cache.upsert(job)
    clock = FakeClock()
    keeper = LeaseKeeper(harness.kube, {PYTORCHJOBS.plural: cache}, {"PyTorchJob": by_name("PyTorchJob")},
                         origin=harness.settings.origin, clock=clock, startup_grace=1.0, stop_before=1.0)
    clock._elapsed = 5.0
    assert await keeper.fence_all() == 1
    assert suspended(await harness.get(PYTORCHJOBS, "pytorch-simple", "team-a"))
    hb = Heartbeat(cluster=CLUSTER, sent_at=clock.now())
    keeper.heartbeat_sent(hb)
    assert keeper.granted(Lease(cluster=CLUSTER, epoch=1, heartbeat_sent_at=hb.sent_at, seconds=600))
    assert await keeper.resume({("wl-lagging", 1)}) == 1
    job = await harness.get(PYTORCHJOBS, "pytorch-simple", "team-a")
    assert job is not None and not suspended(job)
    assert labels.FENCED_ANNOTATION not in (job["metadata"].get("annotations") or {})


async def test_renewals_in_quick_succession_ask_for_one_resync_at_a_time(harness: AgentHarness) -> None:
    """Every renewal after fencing asks for a Resync with an Inventory. On a loaded machine the lease
    flapped and the agents sent Inventories in bursts (two within milliseconds, dozens a minute), each
    answered by a Resync that re-reports every Job: the dispatcher fell further behind and renewed later
    still. Until the Resync answering one Inventory arrives, further renewals wait for it."""
    agent = harness.agent
    assert agent is not None
    n = len(harness.reports)
    agent._regained.set()
    await harness.wait_report(lambda r: r.type == "inventory", after=n)
    m = len(harness.reports)
    agent._regained.set()  # a second renewal while the first Inventory is unanswered
    await asyncio.sleep(1.0)  # real time: a window in which the agent (system clock) must not ask again
    assert not [r for r in harness.reports[m:] if r.type == "inventory"]
    await harness.send(Resync(cluster=CLUSTER, epoch=1, expected=[]))
    await harness.wait_report(lambda r: r.type == "inventory", after=m)  # now it asks again


async def test_pods_wanted_while_the_lease_was_out_are_created_as_soon_as_it_is_back(harness: AgentHarness) -> None:
    """The apply loop creates nothing without a lease; it used to retry such a Job with the failure backoff
    (up to 30 s), so after the lease came back its pods waited for the next try: with a lease flapping under
    load, resumed Jobs did not run again before the chaos deadline. A regained lease wakes them at once."""
    from federation.kube import PODS

    agent = harness.agent
    assert agent is not None and agent.apply is not None
    cmd = place(forever(), uid="wl-waits-for-lease")
    await harness.send(cmd)
    await harness.wait_report(lambda r: r.type == "accepted" and r.placement == cmd.placement)

    async def pods() -> list[dict]:  # type: ignore[type-arg]
        listed = await harness.kube.list(PODS, "team-a")
        return [p for p in listed.items if not (p.get("metadata") or {}).get("deletionTimestamp")]
    async def two_pods() -> bool:
        return len(await pods()) == 2
    await eventually(two_pods, what="the job's two pods")
    held = True
    agent.apply.may_start = lambda: not held
    for pod in await pods():  # pods to create again, while there is no lease
        await harness.kube.delete(PODS, pod["metadata"]["name"], "team-a")
    await asyncio.sleep(8.0)  # several passes find no lease
    assert await pods() == []
    held = False
    agent._lease_regained()  # what a renewal after fencing does
    await eventually(two_pods, within=2.0, what="the pods created again once the lease is back")


async def _keeper_with_placed_jobs(harness: AgentHarness, uids: list[str]):  # type: ignore[no-untyped-def]
    """Jobs placed through the harness, and a keeper (fake clock, no record) over a cache of them that the
    test feeds as an informer would."""
    from federation.clock import FakeClock
    from federation.kinds.registry import by_name
    from worker_agent.cache import ObjectCache
    from worker_agent.lease import LeaseKeeper

    names = []
    for uid in uids:
        job = forever()
        job["metadata"]["name"] = uid
        cmd = place(job, uid=uid)
        await harness.send(cmd)
        await harness.wait_report(lambda r: r.type == "accepted" and r.placement == cmd.placement)  # noqa: B023
        names.append(uid)
    cache = ObjectCache(PYTORCHJOBS.plural)
    for name in names:
        got = await harness.get(PYTORCHJOBS, name, "team-a")
        assert got is not None
        cache.upsert(got)
    clock = FakeClock()
    keeper = LeaseKeeper(harness.kube, {PYTORCHJOBS.plural: cache}, {"PyTorchJob": by_name("PyTorchJob")},
                         origin=harness.settings.origin, clock=clock, startup_grace=1.0, stop_before=1.0)
    return keeper, cache, clock, names


def _renew(keeper, clock) -> None:  # type: ignore[no-untyped-def]
    hb = Heartbeat(cluster=CLUSTER, sent_at=clock.now())
    keeper.heartbeat_sent(hb)
    assert keeper.granted(Lease(cluster=CLUSTER, epoch=1, heartbeat_sent_at=hb.sent_at, seconds=600))


async def _resumed(harness: AgentHarness, name: str) -> bool:
    """Whether ``name`` resumes (within 5 s), and without its fenced mark."""
    async def running() -> dict[str, Any] | None:
        job = await harness.get(PYTORCHJOBS, name, "team-a")
        return job if job is not None and not suspended(job) else None
    try:
        job = await eventually(running, within=5.0, what=f"{name} resumed")
    except AssertionError:
        return False
    return FENCED not in (job["metadata"].get("annotations") or {})


FENCED = labels.FENCED_ANNOTATION


async def test_a_fence_sweep_still_running_when_the_resync_resumes_leaves_no_job_suspended(
        harness: AgentHarness) -> None:
    """(b) The watchdog's sweep patches Jobs one by one (102 of them took seconds under load). A renewal and
    its Resync came while it was still going: the Resync's resume ran before the in-flight patches landed,
    then the sweep went on suspending Jobs of a lease that held again, and nothing resumed them."""
    keeper, _cache, clock, names = await _keeper_with_placed_jobs(harness, ["wl-b1", "wl-b2"])
    expected = {(n, 1) for n in names}
    real_patch = harness.kube.patch
    raced = False

    async def patch(res, name, body, namespace=None):  # type: ignore[no-untyped-def]
        nonlocal raced
        if not raced:  # the first fence patch is in flight: the lease comes back and the Resync is handled
            raced = True
            _renew(keeper, clock)
            await keeper.resume(expected)
        return await real_patch(res, name, body, namespace)

    harness.kube.patch = patch  # type: ignore[method-assign]
    loop = asyncio.create_task(keeper.resume_loop())
    try:
        clock._elapsed = 5.0  # the start-up grace ran out: the watchdog sweeps
        keeper.fenced = True
        await keeper.fence_all()
        for name in names:
            assert await _resumed(harness, name), f"{name} stayed suspended with the lease held and listed"
    finally:
        harness.kube.patch = real_patch  # type: ignore[method-assign]
        loop.cancel()


async def test_a_job_the_fencer_suspends_after_the_resume_is_resumed_again(harness: AgentHarness) -> None:
    """(c) The fencer, a process of its own, sweeps while the record it read is out of date; its patches can
    land after the agent has written the record again and resumed what the Resync listed. The Job it
    suspended then stayed suspended for good: nothing asks for another Resync while the lease holds."""
    keeper, cache, clock, _names = await _keeper_with_placed_jobs(harness, ["wl-c1"])
    loop = asyncio.create_task(keeper.resume_loop())
    try:
        _renew(keeper, clock)
        await keeper.resume({("wl-c1", 1)})  # nothing fenced yet: nothing to resume
        # the fencer's late sweep: suspended and marked, seen by the agent's informer
        fenced = await harness.kube.patch(PYTORCHJOBS, "wl-c1", {
            "metadata": {"annotations": {FENCED: "true"}}, "spec": {"runPolicy": {"suspend": True}}}, "team-a")
        keeper.job_seen(PYTORCHJOBS.plural, fenced)  # as the agent's job watcher does, before upsert shrinks it
        cache.upsert(fenced)
        assert await _resumed(harness, "wl-c1"), "a Job fenced after the resume stayed suspended"
    finally:
        loop.cancel()


async def test_a_job_listed_while_the_record_was_out_of_date_is_resumed_once_it_is_written(
        harness: AgentHarness) -> None:
    """(d) A Resync that lists a fenced Job before the lease record is current cannot resume it (the fencer
    would stop it again); once the record is written it must be resumed without waiting for another
    Resync."""
    keeper, _cache, clock, _names = await _keeper_with_placed_jobs(harness, ["wl-d1"])
    keeper.record_in = ("mkd-system", CLUSTER)  # a record is kept, and is out of date
    loop = asyncio.create_task(keeper.resume_loop())
    try:
        clock._elapsed = 5.0
        keeper.fenced = True
        assert await keeper.fence_all() == 1
        _renew(keeper, clock)
        assert await keeper.resume({("wl-d1", 1)}) == 0  # the record is not current: not yet
        job = await harness.get(PYTORCHJOBS, "wl-d1", "team-a")
        assert suspended(job)
        from worker_agent import leaserecord
        keeper.recorded = leaserecord.Held("mkd-agent/x", clock.now(), 300)  # what record_loop keeps once written
        keeper.record_written()
        assert await _resumed(harness, "wl-d1"), "the Job listed before the record was written stayed suspended"
    finally:
        loop.cancel()


async def test_a_resync_from_before_the_lease_ran_out_again_resumes_nothing(harness: AgentHarness) -> None:
    """The level-triggered resume must not act on a listing older than the last fencing: the dispatcher may
    have placed those Jobs elsewhere since."""
    keeper, _cache, clock, _names = await _keeper_with_placed_jobs(harness, ["wl-e1"])
    loop = asyncio.create_task(keeper.resume_loop())
    try:
        _renew(keeper, clock)
        await keeper.resume({("wl-e1", 1)})
        clock._elapsed = 1000.0  # the lease ran out: the watchdog fences
        keeper.lease_lost()
        assert await keeper.fence_all() == 1
        _renew(keeper, clock)  # back, but no Resync yet
        await asyncio.sleep(0.5)  # real time: the resume loop, had it acted on the old listing, would have by now
        assert suspended(await harness.get(PYTORCHJOBS, "wl-e1", "team-a"))
    finally:
        loop.cancel()


async def test_a_leaderworkerset_is_fenced_by_scaling_it_to_zero_groups_and_scaled_back(
        harness: AgentHarness) -> None:
    """LWS has no suspend: without renewals its copy goes to zero groups (the count kept), and the Resync that
    lists it again brings the groups back; a kind with a suspend field is unaffected."""
    await harness.stop_agent()
    await harness.start_agent(lease_startup_grace_seconds=4.0, lease_stop_before_seconds=1.0,
                              heartbeat_interval_seconds=0.5)
    worker = {"spec": {"containers": [{"name": "w", "image": "busybox", "resources": {"requests": {"cpu": "100m"}}}]}}
    lws = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
           "metadata": {"name": "serve", "labels": {labels.QUEUE_NAME: "default"}},
           "spec": {"replicas": 2, "leaderWorkerTemplate": {"size": 2, "workerTemplate": worker}}}
    cmd = place(lws, uid="wl-lws")
    await harness.send(cmd)
    await harness.wait_report(lambda r: r.type == "accepted" and r.placement == cmd.placement)
    res = resource_for(LEADERWORKERSET)

    async def scaled_to_zero() -> dict[str, Any] | None:
        job = await harness.kube.get(res, "serve", "team-a")
        return job if job["spec"]["replicas"] == 0 else None

    job = await eventually(scaled_to_zero, what="the LWS scaled to zero groups once the grace ran out")
    assert job["metadata"]["annotations"][labels.FENCED_ANNOTATION] == "true"
    assert job["metadata"]["annotations"][SUSPENDED_REPLICAS] == "2"
    hb = harness.heartbeats()[-1]
    n = len(harness.reports)
    await harness.send(Lease(cluster=CLUSTER, epoch=1, heartbeat_sent_at=hb.sent_at, seconds=60))
    await harness.wait_report(lambda r: r.type == "inventory", after=n)
    await harness.send(Resync(cluster=CLUSTER, epoch=1, expected=[cmd.placement]))

    async def scaled_back() -> dict[str, Any] | None:
        job = await harness.kube.get(res, "serve", "team-a")
        return job if job["spec"]["replicas"] == 2 else None

    job = await eventually(scaled_back, what="the LWS's two groups back")
    notes = job["metadata"].get("annotations") or {}
    assert labels.FENCED_ANNOTATION not in notes and SUSPENDED_REPLICAS not in notes


async def test_a_copy_whose_create_outlived_the_lease_is_fenced_at_once(harness: AgentHarness) -> None:
    """The chaos suite's ``partition`` ran a LeaderWorkerSet twice: its Place passed the lease check just
    before the agent was frozen (SIGSTOP), the create went out 22 s later on SIGCONT, long after the lease,
    its record and the watchdog's sweep, while the dispatcher had moved the unanswered Place elsewhere. A
    check before an API call cannot cover the stall between the two: a copy the create answers after the
    lease ran out is fenced before anything else (a Resync that still lists it resumes it)."""
    assert harness.agent is not None and harness.agent.lease is not None
    lease = harness.agent.lease
    kube = harness.agent.inbox.kube
    res = resource_for(LEADERWORKERSET)
    original = kube.create

    async def frozen_mid_create(r: Any, body: Any, *args: Any, **kwargs: Any) -> Any:
        if r.plural == res.plural:  # checked and held; the process stops here and wakes after the lease
            lease.until = lease.clock.monotonic() - 30.0
            lease.fenced = True  # the watchdog woke first and swept: the copy was not made yet
        return await original(r, body, *args, **kwargs)

    kube.create = frozen_mid_create  # type: ignore[method-assign]
    worker = {"spec": {"containers": [{"name": "w", "image": "busybox", "resources": {"requests": {"cpu": "100m"}}}]}}
    lws = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
           "metadata": {"name": "late-serve", "labels": {labels.QUEUE_NAME: "default"}},
           "spec": {"replicas": 2, "leaderWorkerTemplate": {"size": 2, "workerTemplate": worker}}}
    cmd = place(lws, uid="wl-late-lws")
    await harness.send(cmd)
    await harness.wait_report(lambda r: r.type in ("accepted", "rejected") and r.placement == cmd.placement)
    job = await harness.kube.get(res, "late-serve", "team-a")
    assert job["spec"]["replicas"] == 0, "a copy created after the lease ran out was left running"
    assert job["metadata"]["annotations"][labels.FENCED_ANNOTATION] == "true"
    assert job["metadata"]["annotations"][SUSPENDED_REPLICAS] == "2"
