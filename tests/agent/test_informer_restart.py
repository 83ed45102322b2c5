"""An informer task that fails is restarted by the Supervisor with a new informer: what was deleted while none
watched leaves the agent's cache then (a DELETED from the first list), or the agent believes it exists for good.

The agent runs on a Kube whose informer of one resource can be cut (it raises, as a failing informer task
does) and whose next informer of it waits on a gate before it lists, so the deletion falls deterministically
into the time no informer watched.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from federation.kube import SERVICES, Kube, Resource, WatchEvent
from tests import waiting
from tests.agent.conftest import PYTORCHJOBS, AgentHarness, place
from tests.agent.render_harness import example
from tests.agent.test_agent_pytorch import FOREVER, with_annotations
from worker_agent.app import Agent


class CutInformer(Kube):
    """A Kube whose informer of ``plural`` fails when ``cut`` is set; the one started after it waits for ``gate``."""

    plural: str
    cut: asyncio.Event
    restarted: asyncio.Event
    gate: asyncio.Event
    calls = 0

    def informer(self, res: Resource, namespace: str | None = None, **kw: Any) -> AsyncIterator[WatchEvent]:
        if res.plural != self.plural:
            return super().informer(res, namespace, **kw)
        return self._cuttable(super().informer(res, namespace, **kw))

    async def _cuttable(self, inner: AsyncIterator[WatchEvent]) -> AsyncIterator[WatchEvent]:
        self.calls += 1
        if self.calls > 1:
            self.restarted.set()
            await self.gate.wait()
        cut = asyncio.ensure_future(self.cut.wait())
        try:
            while True:
                step = asyncio.ensure_future(inner.__anext__())
                await asyncio.wait({step, cut}, return_when=asyncio.FIRST_COMPLETED)
                if not step.done():
                    step.cancel()
                    await asyncio.gather(step, return_exceptions=True)
                    self.cut.clear()
                    raise RuntimeError(f"{self.plural} informer cut")
                yield step.result()
        finally:
            cut.cancel()


async def restart_cuttable(h: AgentHarness, res: Resource) -> CutInformer:
    """Stop the agent and start it again on a Kube whose informer of ``res`` can be cut."""
    await h.stop_agent()
    made: asyncio.Future[CutInformer] = asyncio.get_running_loop().create_future()

    async def run(stop: asyncio.Event) -> None:
        async with CutInformer.from_settings(h.settings.kube_settings()) as kube:
            assert isinstance(kube, CutInformer)
            kube.plural, kube.cut, kube.restarted, kube.gate = res.plural, asyncio.Event(), asyncio.Event(), \
                asyncio.Event()
            made.set_result(kube)
            h.agent = Agent(h.settings, kube)
            await h.agent.run(stop)

    h._run_agent = run  # type: ignore[method-assign]
    await h.start_agent()
    return await made


async def eventually(check: Any, within: float = 15.0) -> None:
    await waiting.eventually(check, within, what=check.__name__)


async def cut_while(kube: CutInformer, deleted: Any) -> None:
    """Cut the informer, run ``deleted`` once the task failed and its successor waits, then let it list."""
    kube.cut.set()
    await asyncio.wait_for(kube.restarted.wait(), 15)
    await deleted()
    kube.gate.set()


async def test_a_service_deleted_while_its_informer_was_down_is_made_again(harness: AgentHarness) -> None:
    kube = await restart_cuttable(harness, SERVICES)
    await harness.send(place(with_annotations(example("pytorch-simple.yaml"), **{FOREVER: "true"})))
    await harness.wait_report(lambda r: r.type == "accepted")
    key = ("team-a", "pytorch-simple-worker-0")
    assert harness.agent is not None
    cache = harness.agent.caches[SERVICES.plural]

    async def cached() -> bool:
        return cache.header(key) is not None
    await eventually(cached)
    old = await harness.get(SERVICES, key[1], key[0])
    assert old is not None

    async def delete() -> None:
        await harness.kube.delete(SERVICES, key[1], key[0])
    await cut_while(kube, delete)

    # the new informer's list says the Service is gone: the job's pass makes it again
    async def made_again() -> bool:
        svc = await harness.get(SERVICES, key[1], key[0])
        return svc is not None and svc["metadata"]["uid"] != old["metadata"]["uid"]
    await eventually(made_again)

    async def cache_has_new() -> bool:
        header = cache.header(key)
        return header is not None and header["metadata"]["uid"] != old["metadata"]["uid"]
    await eventually(cache_has_new)
    assert kube.calls == 2


async def test_a_job_deleted_while_its_informer_was_down_is_reported_gone(harness: AgentHarness) -> None:
    kube = await restart_cuttable(harness, PYTORCHJOBS)
    cmd = place(with_annotations(example("pytorch-simple.yaml"), **{FOREVER: "true"}))
    await harness.send(cmd)
    await harness.wait_report(lambda r: r.type == "accepted")
    await harness.wait_report(lambda r: r.type == "heartbeat" and r.online and r.running == 1)
    assert harness.agent is not None
    job = await harness.get(PYTORCHJOBS, "pytorch-simple", "team-a")
    assert job is not None
    uid = job["metadata"]["uid"]
    assert uid in harness.agent.by_uid
    seen = len(harness.reports)

    async def delete() -> None:
        await harness.kube.delete(PYTORCHJOBS, "pytorch-simple", "team-a")
    await cut_while(kube, delete)

    gone = await harness.wait_report(lambda r: r.type == "status" and r.gone, after=seen)
    assert gone.placement == cmd.placement
    await harness.wait_report(lambda r: r.type == "heartbeat" and r.online and r.running == 0, after=seen)
    assert harness.agent.caches[PYTORCHJOBS.plural].header(("team-a", "pytorch-simple")) is None
    assert uid not in harness.agent.by_uid
    assert kube.calls == 2
