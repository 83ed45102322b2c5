"""The engine's inbox: heartbeats go ahead of the Reports and Job changes waiting.

Each heartbeat the engine handles is answered with a Lease that runs from when the agent sent it
(worker_agent.lease). In the chaos suite's partitions (500 jobs, load 15-30 on 2 cores) heartbeats waited
10-14 s behind the Reports queued before them, so every 8 s lease was spent before its renewal arrived and
healthy agents fenced their Jobs again and again. Among themselves heartbeats keep their order.
"""

from __future__ import annotations

from datetime import UTC, datetime

from dispatcher.engine.batch import ReportIn, Tick, engine_inbox
from federation.messages import Heartbeat, PlacementKey, Status

NOW = datetime(2026, 11, 24, tzinfo=UTC)


def status(i: int) -> ReportIn:
    return ReportIn(Status(cluster="worker-1", placement=PlacementKey(workload_uid=f"u{i}", attempt=1, epoch=1),
                           seq=i, status={}), NOW)


def beat(cluster: str, running: int) -> ReportIn:
    return ReportIn(Heartbeat(cluster=cluster, running=running), NOW)


def test_heartbeats_are_taken_before_what_waited_longer_and_in_their_own_order() -> None:
    inbox = engine_inbox()
    for i in range(100):
        inbox.put_nowait(status(i))
    inbox.put_nowait(beat("worker-1", 1))
    inbox.put_nowait(Tick())
    inbox.put_nowait(beat("worker-2", 2))
    inbox.put_nowait(beat("worker-1", 3))
    taken = [inbox.get_nowait() for _ in range(inbox.qsize())]
    beats = [i.report.running for i in taken[:3] if isinstance(i, ReportIn) and isinstance(i.report, Heartbeat)]
    assert beats == [1, 2, 3]
    rest = taken[3:]
    assert [i.report.seq for i in rest[:100] if isinstance(i, ReportIn) and isinstance(i.report, Status)] == \
        list(range(100))
    assert isinstance(rest[-1], Tick)
    inbox.put_nowait(status(200))
    inbox.put_nowait(beat("worker-3", 4))
    first = inbox.get_nowait()
    assert isinstance(first, ReportIn) and isinstance(first.report, Heartbeat)  # the count of leading beats held
    second = inbox.get_nowait()
    assert isinstance(second, ReportIn) and isinstance(second.report, Status)
