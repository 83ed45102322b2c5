"""Fencing on the agent: without a lease renewal it suspends its Jobs before the lease ends, starts
nothing new, and resumes only what the dispatcher's Resync still lists once a renewal comes back."""

from __future__ import annotations

import asyncio
from datetime import datetime

from federation import labels
from federation.messages import Heartbeat, Lease, Resync
from tests.agent.conftest import CLUSTER, PYTORCHJOBS, AgentHarness, place
from tests.agent.test_agent_inbox import forever


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
        for _ in range(100):
            job = await harness.get(PYTORCHJOBS, name, "team-a")
            if suspended(job):
                break
            await asyncio.sleep(0.1)
        assert suspended(job) and job["metadata"]["annotations"][labels.FENCED_ANNOTATION] == "true"
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
    for _ in range(100):
        job = await harness.get(PYTORCHJOBS, "pytorch-simple", "team-a")
        if job is not None and not suspended(job):
            break
        await asyncio.sleep(0.1)
    assert job is not None and not suspended(job)
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
    await asyncio.sleep(1.0)
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
    for _ in range(200):
        if len(await pods()) == 2:
            break
        await asyncio.sleep(0.05)
    assert len(await pods()) == 2
    held = True
    agent.apply.may_start = lambda: not held
    for pod in await pods():  # pods to create again, while there is no lease
        await harness.kube.delete(PODS, pod["metadata"]["name"], "team-a")
    await asyncio.sleep(8.0)  # several passes find no lease
    assert await pods() == []
    held = False
    agent._lease_regained()  # what a renewal after fencing does
    for _ in range(40):
        if len(await pods()) == 2:
            break
        await asyncio.sleep(0.05)
    assert len(await pods()) == 2
