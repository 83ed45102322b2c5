"""The apply loop's queue: a job changed during its own pass gets exactly one more pass, however many changes
came meanwhile and just after (the watch echoes of the pass's own writes)."""

from __future__ import annotations

import asyncio

from federation.clock import SystemClock
from tests.waiting import eventually, settled
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
        await settled()  # a second copy, had one been queued, would have run
        assert loop.seen == [KEY, KEY]
    finally:
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)


class BlockedLoop(ApplyLoop):
    """Passes that end only when the test says so (``go``): the loop falls behind on purpose."""

    def __init__(self, backlog_max: int) -> None:
        super().__init__(None, {"PyTorchJob": object()}, {}, {}, SystemClock(), concurrency=1,  # type: ignore[arg-type]
                         backlog_max=backlog_max)
        self.go = asyncio.Event()
        self.passed: list[JobKey] = []

    async def reconcile(self, key: JobKey) -> float | None:
        await self.go.wait()
        self.passed.append(key)
        return None


async def test_a_new_job_comes_in_only_once_the_loop_has_room_for_it() -> None:
    """In 10,000-job bursts the agents created every placed job at once and got to its children and
    status tens of seconds later (7,000 jobs accepted and not started across three agents). A new job now waits
    (``admission``, around its create) while ``backlog_max`` passes wait; waiters woken together come in one by
    one as the room allows, the first to wait first."""
    loop = BlockedLoop(backlog_max=3)
    worker = asyncio.create_task(loop.run())
    came: list[int] = []
    peaks: list[int] = []

    async def new_job(n: int) -> None:
        async with loop.admission():
            came.append(n)
            loop.enqueue(("PyTorchJob", "ns", f"new-{n}"))  # as the created job's watch event does
            peaks.append(loop._queue.qsize())

    try:
        for n in range(4):  # one pass running (blocked), three waiting: the loop is full
            loop.enqueue(("PyTorchJob", "ns", f"old-{n}"))
        await settled()  # the loop's tasks take what they can (none may take more)
        assert loop._queue.qsize() == 3
        waiters = [asyncio.create_task(new_job(n)) for n in range(5)]
        await settled()  # a new job, had one been let in while the loop is full, would have come
        assert came == [], "a new job came in while the loop was full"
        loop.go.set()  # the loop catches up: the new jobs come in as it does, never more than it has room for
        await asyncio.wait_for(asyncio.gather(*waiters), 10)
        assert came == [0, 1, 2, 3, 4] and max(peaks) <= 3
        await eventually(lambda: len(loop.passed) == 9, what="the nine passes")
        assert [k[2] for k in loop.passed] == [*(f"old-{n}" for n in range(4)), *(f"new-{n}" for n in range(5))]
    finally:
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
