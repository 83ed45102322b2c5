"""The apply loop's queue: a job changed during its own pass gets exactly one more pass, however many changes
came meanwhile and just after (the watch echoes of the pass's own writes)."""

from __future__ import annotations

import asyncio

from federation.clock import SystemClock
from worker_agent.apply import ApplyLoop, JobKey

KEY: JobKey = ("PyTorchJob", "ns", "j")


class CountingLoop(ApplyLoop):
    """Reconciles by counting; the first pass hears of three changes while it runs. The next pass's delay is
    ended by the test (``due``), not by the clock."""

    def __init__(self) -> None:
        super().__init__(None, {"PyTorchJob": object()}, {}, {}, SystemClock(), concurrency=2)  # type: ignore[arg-type]
        self.seen: list[JobKey] = []
        self.due = asyncio.Event()
        self.second = asyncio.Event()

    async def reconcile(self, key: JobKey) -> float | None:
        self.seen.append(key)
        if len(self.seen) == 1:
            for _ in range(3):  # the echoes of this pass's creates and status write
                self.enqueue(key)
        else:
            self.second.set()
        return None

    def _release(self, key: JobKey) -> None:
        self.due.set()


async def test_changes_during_a_pass_and_just_after_cost_one_more_pass() -> None:
    loop = CountingLoop()
    worker = asyncio.create_task(loop.run())
    try:
        loop.enqueue(KEY)
        await asyncio.wait_for(loop.due.wait(), 10)  # the first pass is over; its next one is due
        loop.enqueue(KEY)  # a late echo: joins the pass that is due, queues nothing of its own
        assert loop._queue.qsize() == 0 and loop.seen == [KEY]
        ApplyLoop._release(loop, KEY)
        await asyncio.wait_for(loop.second.wait(), 10)
        await asyncio.sleep(0.2)  # a second copy, had one been queued, would run now
        assert loop.seen == [KEY, KEY]
    finally:
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
