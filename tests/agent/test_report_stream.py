"""The agent numbers its Reports per link (stream), so the dispatcher can tell loss from delay."""

from __future__ import annotations

import asyncio
from typing import Any

from federation.clock import FakeClock
from federation.errors import Transport
from federation.messages import Capacity, Heartbeat, PlacementKey, Status, decode_reports
from worker_agent.reports import Outbox


class RecordingLink:
    """Stands in for an MqttLink: records what was published, or fails the first ``fail`` publishes."""

    def __init__(self, fail: int = 0) -> None:
        self.published: list[Any] = []
        self.messages: list[tuple[str, bytes]] = []
        self.fail = fail
        self.calls = 0
        self.called = asyncio.Event()
        self.alive = True

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        self.calls += 1
        self.called.set()
        if self.fail:
            self.fail -= 1
            self.alive = False
            raise Transport("connection lost")
        self.messages.append((topic, payload))
        self.published.extend(decode_reports(payload))

    async def wait_reports(self, count: int) -> None:
        async with asyncio.timeout(5):
            while len(self.published) < count:
                self.called.clear()
                await self.called.wait()

    async def wait_calls(self, count: int) -> None:
        async with asyncio.timeout(5):
            while self.calls < count:
                self.called.clear()
                await self.called.wait()


def status(i: int) -> Status:
    return Status(cluster="w1", placement=PlacementKey(workload_uid=f"u{i}", attempt=1, epoch=1), seq=i, status={})


async def drain(outbox: Outbox, link: RecordingLink, count: int) -> None:
    """Run one sender until ``count`` Reports are published."""
    sender = asyncio.create_task(outbox.run_sender())
    try:
        await link.wait_reports(count)
    finally:
        sender.cancel()


async def test_reports_are_numbered_consecutively_on_one_stream() -> None:
    outbox, link = Outbox(), RecordingLink()
    outbox.attach(link)  # type: ignore[arg-type]
    for i in range(5):
        outbox.put("t/reports", status(i))
    outbox.put("t/presence", Heartbeat(cluster="w1", capacity=Capacity()), retain=True)
    await drain(outbox, link, 6)
    assert [r.n for r in link.published] == [1, 2, 3, 4, 5, 6]
    assert {r.stream for r in link.published} == {outbox.stream} and len(outbox.stream) == 16


async def test_a_new_link_starts_a_new_stream_and_a_failed_report_is_renumbered() -> None:
    outbox, first = Outbox(), RecordingLink(fail=1)
    outbox.attach(first)  # type: ignore[arg-type]
    old_stream = outbox.stream
    outbox.put("t/reports", status(1))
    sender = asyncio.create_task(outbox.run_sender())
    await first.wait_calls(1)
    await asyncio.sleep(0)  # let the sender put the report back
    sender.cancel()
    assert first.published == [] and outbox.pending() == 1  # put back, not lost

    second = RecordingLink()
    outbox.attach(second)  # type: ignore[arg-type]
    assert outbox.stream != old_stream
    await drain(outbox, second, 1)
    assert second.published[0].n == 1 and second.published[0].stream == outbox.stream


async def test_a_report_too_large_to_send_is_logged_and_the_sender_carries_on() -> None:
    outbox, link = Outbox(), RecordingLink()
    outbox.attach(link)  # type: ignore[arg-type]
    huge = Status(cluster="w1", placement=PlacementKey(workload_uid="big", attempt=1, epoch=1), seq=1,
                  status={"message": "x" * 1_100_000})
    outbox.put("t/reports", huge)
    outbox.put("t/reports", status(2))
    sender = asyncio.create_task(outbox.run_sender())
    try:
        await link.wait_calls(1)
        assert not sender.done()  # it used to die on the encode error, and every later Report with it
    finally:
        sender.cancel()
    assert [(r.placement.workload_uid, r.n) for r in link.published] == [("u2", 1)]


async def test_the_newest_heartbeat_goes_out_before_a_backlog_of_reports() -> None:
    """The lease runs from when a heartbeat was queued (worker_agent.lease): one waiting behind a backlog
    of Reports (after a reconnect, say) came back with its lease nearly spent, and the agent fenced its
    Jobs although the dispatcher answered every heartbeat. Only the newest heartbeat matters, and first."""
    outbox, link = Outbox(), RecordingLink()
    outbox.attach(link)  # type: ignore[arg-type]
    for i in range(50):
        outbox.put("t/reports", status(i))
    old = Heartbeat(cluster="w1", capacity=Capacity(), running=1)
    new = Heartbeat(cluster="w1", capacity=Capacity(), running=2)
    outbox.put_heartbeat("t/presence", old)
    outbox.put_heartbeat("t/presence", new)
    assert outbox.pending() == 51
    await drain(outbox, link, 51)
    first = link.published[0]
    assert isinstance(first, Heartbeat) and first.running == 2
    assert [r.n for r in link.published] == list(range(1, 52))
    assert sum(isinstance(r, Heartbeat) for r in link.published) == 1


def test_a_fresh_copy_with_no_status_yet_sends_no_status_report() -> None:
    """The Accepted says the copy exists; an empty .status mirrors nothing (one Report per job saved)."""
    from federation import labels
    from federation.kinds.registry import by_name
    from worker_agent.reports import Reporter
    from worker_agent.seq import Sequencer

    outbox = Outbox()
    reporter = Reporter("w1", "mkd/v1/w1/reports", outbox, "o")
    reporter.seq = Sequencer(8192)
    kind = by_name("PyTorchJob")

    def job(attempt: int, status: dict[str, Any] | None) -> dict[str, Any]:
        obj: dict[str, Any] = {"metadata": {"name": "j", "namespace": "ns", "labels": {
            labels.ORIGIN: "o", labels.WORKLOAD_UID: "u1", labels.PLACEMENT_ATTEMPT: str(attempt), labels.EPOCH: "1"}}}
        if status is not None:
            obj["status"] = status
        return obj

    def sent() -> list[Any]:
        return [item[1] for item in outbox._items]

    reporter.job_changed(kind, job(1, None))
    reporter.job_changed(kind, job(1, {}))
    assert sent() == []
    created = {"conditions": [{"type": "Created", "status": "True"}]}
    reporter.job_changed(kind, job(1, created))
    assert [r.status for r in sent()] == [created]
    outbox._take()  # published
    reporter.job_changed(kind, job(1, {}))  # a status that was emptied is a change: reported
    assert [r.status for r in sent()] == [{}]
    reporter.job_changed(kind, job(2, {}))  # a new attempt's fresh copy: nothing yet
    assert len(sent()) == 1
    reporter.job_changed(kind, job(2, {}), force=True)  # a Resync asks for every expected placement
    assert len(sent()) == 2
    reporter.job_changed(kind, job(2, {}), deleted=True)  # gone is always reported (replacing the one queued)
    assert len(sent()) == 2 and sent()[-1].gone
    outbox._take()
    outbox._take()
    big = {"conditions": [], "x": 2**70}  # not JSON orjson writes: the status is still told apart
    told: list[Any] = []
    for status in (big, dict(big), {**big, "x": 2**70 + 1}, {"x": 2**70 + 1, "conditions": []}):
        reporter.job_changed(kind, job(3, status))
        told += [outbox._take()[1].status for _ in range(len(outbox._items))]
    assert told == [big, {**big, "x": 2**70 + 1}, {"x": 2**70 + 1, "conditions": []}]  # the order counts, as before


def test_a_new_copy_seen_undecoded_tells_what_job_changed_would_of_a_copy_with_no_status() -> None:
    """``Reporter.new_copy_seen`` (the inbox's create echoed, not decoded): nothing sent and the job counted as
    running, as ``job_changed`` of the empty copy; False when a Status of this very attempt was sent last (an
    emptied status is a change, so the copy must be decoded and reported)."""
    from federation import labels
    from federation.kinds.registry import by_name
    from federation.messages import PlacementKey
    from worker_agent.reports import Reporter
    from worker_agent.seq import Sequencer

    outbox = Outbox()
    reporter = Reporter("w1", "mkd/v1/w1/reports", outbox, "o")
    reporter.seq = Sequencer(8192)
    assert reporter.new_copy_seen(PlacementKey(workload_uid="u1", attempt=1, epoch=1))
    assert not outbox._items and reporter.running() == 1
    job = {"metadata": {"name": "j", "namespace": "ns", "labels": {
        labels.ORIGIN: "o", labels.WORKLOAD_UID: "u1", labels.PLACEMENT_ATTEMPT: "1", labels.EPOCH: "1"}},
        "status": {"conditions": [{"type": "Created", "status": "True"}]}}
    reporter.job_changed(by_name("PyTorchJob"), job)
    assert len(outbox._items) == 1
    assert not reporter.new_copy_seen(PlacementKey(workload_uid="u1", attempt=1, epoch=1))
    assert reporter.new_copy_seen(PlacementKey(workload_uid="u1", attempt=2, epoch=1))
    assert len(outbox._items) == 1


async def test_a_status_still_queued_is_replaced_by_the_newer_one_in_its_place() -> None:
    """Under a backlog, the dispatcher gets each placement's newest whole status once, in the older one's turn."""
    outbox, link = Outbox(), RecordingLink(fail=1)

    def of(uid: str, seq: int, phase: str) -> Status:
        return Status(cluster="w1", placement=PlacementKey(workload_uid=uid, attempt=1, epoch=1), seq=seq,
                      status={"phase": phase})

    outbox.put("t/reports", of("a", 1, "Created"))
    outbox.put("t/reports", of("b", 2, "Created"))
    outbox.put("t/reports", of("a", 3, "Pending"))
    outbox.put("t/reports", of("a", 4, "Running"))
    assert outbox.pending() == 2 and outbox.coalesced == 2
    outbox.attach(link)  # type: ignore[arg-type]
    sender = asyncio.create_task(outbox.run_sender())
    await link.wait_calls(1)  # the first publish fails: "a" goes back to the front ...
    await asyncio.sleep(0)
    sender.cancel()
    assert outbox.pending() == 2
    outbox.put("t/reports", of("a", 5, "Succeeded"))  # ... and a newer status of "a" replaces it there
    assert outbox.pending() == 2
    second = RecordingLink()
    outbox.attach(second)  # type: ignore[arg-type]
    await drain(outbox, second, 2)
    published = [(r.placement.workload_uid, r.seq, r.status["phase"]) for r in second.published]
    assert published == [("a", 5, "Succeeded"), ("b", 2, "Created")]


# --- several Reports per message ---------------------------------------------------------


async def test_reports_waiting_together_go_as_one_message_sealed_once_with_the_last_number() -> None:
    seals: list[tuple[str, str, int]] = []

    def seal(topic: str, body: bytes, stream: str, n: int) -> bytes:
        seals.append((topic, stream, n))
        return body
    outbox, link = Outbox(seal=seal), RecordingLink()
    outbox.attach(link)  # type: ignore[arg-type]
    for i in range(5):
        outbox.put("t/reports", status(i))
    await drain(outbox, link, 5)
    assert len(link.messages) == 1 and link.messages[0][1].startswith(b'{"v":1,"type":"reports","items":[')
    assert [(r.placement.workload_uid, r.n, r.stream) for r in link.published] == [
        (f"u{i}", i + 1, outbox.stream) for i in range(5)]
    assert seals == [("t/reports", outbox.stream, 5)]
    assert (outbox.sent, outbox.messages) == (5, 1)


async def test_a_batch_is_bounded_in_count_and_in_bytes() -> None:
    from federation.messages import MAX_BATCH_BYTES, MAX_REPORTS_PER_MESSAGE
    outbox, link = Outbox(), RecordingLink()
    outbox.attach(link)  # type: ignore[arg-type]
    many = MAX_REPORTS_PER_MESSAGE + 10
    for i in range(many):
        outbox.put("t/reports", status(i))
    await drain(outbox, link, many)
    assert [len(decode_reports(p)) for _, p in link.messages] == [MAX_REPORTS_PER_MESSAGE, 10]

    outbox, link = Outbox(), RecordingLink()
    outbox.attach(link)  # type: ignore[arg-type]
    big = MAX_BATCH_BYTES // 3
    for i in range(7):
        outbox.put("t/reports", Status(cluster="w1", placement=PlacementKey(workload_uid=f"b{i}", attempt=1, epoch=1),
                                       seq=i, status={"message": "x" * big}))
    await drain(outbox, link, 7)
    assert all(len(p) <= MAX_BATCH_BYTES + 1024 for _, p in link.messages)
    assert sum(len(decode_reports(p)) for _, p in link.messages) == 7 and len(link.messages) >= 3
    assert [r.n for r in link.published] == list(range(1, 8))  # numbered in order across the messages


async def test_a_failed_batch_is_put_back_in_order_and_a_newer_status_replaces_its_own() -> None:
    outbox, first = Outbox(), RecordingLink(fail=1)
    outbox.attach(first)  # type: ignore[arg-type]
    for i in range(4):
        outbox.put("t/reports", status(i))
    sender = asyncio.create_task(outbox.run_sender())
    await first.wait_calls(1)
    await asyncio.sleep(0)  # let the sender put the batch back
    sender.cancel()
    assert first.published == [] and outbox.pending() == 4
    newer = Status(cluster="w1", placement=PlacementKey(workload_uid="u2", attempt=1, epoch=1), seq=99, status={})
    outbox.put("t/reports", newer)  # replaces u2's Status put back, in its place
    second = RecordingLink()
    outbox.attach(second)  # type: ignore[arg-type]
    await drain(outbox, second, 4)
    assert [(r.placement.workload_uid, r.seq, r.n) for r in second.published] == [
        ("u0", 0, 1), ("u1", 1, 2), ("u2", 99, 3), ("u3", 3, 4)]
    assert len(second.messages) == 1


class HeldLink(RecordingLink):
    """Holds every PUBACK until ``release`` is set (a broker round trip); with ``hold_retained`` False a
    retained message (the heartbeat on the presence topic) passes at once."""

    def __init__(self, *, hold_retained: bool) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.hold_retained = hold_retained

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        await super().publish(topic, payload, retain=retain)
        if self.hold_retained or not retain:
            await self.release.wait()


async def test_the_heartbeat_goes_alone_before_the_batch_and_a_retained_report_is_never_batched() -> None:
    outbox, link = Outbox(), RecordingLink()
    outbox.attach(link)  # type: ignore[arg-type]
    for i in range(3):
        outbox.put("t/reports", status(i))
    outbox.put_heartbeat("t/presence", Heartbeat(cluster="w1", capacity=Capacity()))
    await drain(outbox, link, 4)
    assert [(t, len(decode_reports(p))) for t, p in link.messages] == [("t/presence", 1), ("t/reports", 3)]
    assert link.messages[0][1].startswith(b'{"v":1,"stream":')  # a single Report: the retained presence


async def test_reports_queued_while_batches_await_their_puback_go_as_one_and_a_heartbeat_does_not_wait() -> None:
    outbox, link = Outbox(max_in_flight=1), HeldLink(hold_retained=False)
    outbox.attach(link)  # type: ignore[arg-type]
    senders = [asyncio.create_task(outbox.run_sender()) for _ in range(4)]
    try:
        outbox.put("t/reports", status(0))
        await link.wait_reports(1)  # out, awaiting its PUBACK: the one slot is taken
        for i in range(1, 6):
            outbox.put("t/reports", status(i))
        outbox.put_heartbeat("t/presence", Heartbeat(cluster="w1", capacity=Capacity()))
        await link.wait_reports(2)
        assert isinstance(link.published[1], Heartbeat)  # past the limit, ahead of the queued Reports
        assert len(link.messages) == 2 and outbox.pending() == 5
        link.release.set()
        await link.wait_reports(7)
    finally:
        for sender in senders:
            sender.cancel()
    assert [len(decode_reports(p)) for _, p in link.messages] == [1, 1, 5]
    assert [r.n for r in link.published] == list(range(1, 8))


async def test_a_report_wakes_one_parked_sender_and_a_backlog_fills_every_free_slot() -> None:
    from federation.messages import MAX_REPORTS_PER_MESSAGE

    outbox, link = Outbox(max_in_flight=2), HeldLink(hold_retained=True)
    outbox.attach(link)  # type: ignore[arg-type]
    senders = [asyncio.create_task(outbox.run_sender()) for _ in range(8)]
    try:
        for _ in range(3):
            await asyncio.sleep(0)
        assert sum(not w.done() for w in outbox._waiters) == 8  # all parked
        outbox.put("t/reports", status(0))
        await link.wait_reports(1)
        assert sum(not w.done() for w in outbox._waiters) == 7  # one woke (and is publishing), not eight
        link.release.set()
        for _ in range(3):
            await asyncio.sleep(0)
        link.release.clear()
        backlog = 2 * MAX_REPORTS_PER_MESSAGE + 5
        for i in range(backlog):
            outbox.put("t/reports", status(i + 1))
        await link.wait_calls(3)  # two slots: two full batches out at once, the rest waits for a PUBACK
        assert [len(decode_reports(p)) for _, p in link.messages[1:]] == [MAX_REPORTS_PER_MESSAGE] * 2
        link.release.set()
        await link.wait_reports(backlog + 1)
    finally:
        for sender in senders:
            sender.cancel()
    assert [r.n for r in link.published] == list(range(1, backlog + 2))


# --- an Accepted held for the placement's first Status -------------------------------------------


def _accepted(uid: str, seq: int, spec_version: int = 1) -> Any:
    from federation.messages import Accepted

    return Accepted(cluster="w1", placement=PlacementKey(workload_uid=uid, attempt=1, epoch=1), seq=seq,
                    spec_version=spec_version)


def _of(uid: str, seq: int, phase: str) -> Status:
    return Status(cluster="w1", placement=PlacementKey(workload_uid=uid, attempt=1, epoch=1), seq=seq,
                  status={"phase": phase})


async def test_an_accepted_followed_by_a_status_within_the_hold_goes_as_that_status_alone() -> None:
    """The Status says the copy exists (the dispatcher takes a Status of a placement still 'sent' as its
    Accepted, dispatcher/engine/answers.py): one Report instead of two. An Accepted no Status follows within the
    hold goes when the hold ends; nothing is lost."""
    clock = FakeClock()
    outbox, link = Outbox(accept_hold=0.3, clock=clock), RecordingLink()
    outbox.attach(link)  # type: ignore[arg-type]
    outbox.put("t/reports", _accepted("a", 1))
    outbox.put("t/reports", _accepted("b", 2))
    assert outbox.pending() == 0 and outbox.held() == 2  # nothing to send yet
    outbox.put("t/reports", _of("a", 3, "Running"))
    assert outbox.pending() == 1 and outbox.held() == 1 and outbox.folded == 1
    await drain(outbox, link, 1)
    clock.advance(0.29)
    assert outbox.held() == 1 and outbox.pending() == 0  # b's Accepted waits for its hold
    clock.advance(0.01)
    assert outbox.held() == 0 and outbox.pending() == 1
    await drain(outbox, link, 2)
    assert [(r.type, r.placement.workload_uid) for r in link.published] == [("status", "a"), ("accepted", "b")]


async def test_an_accepted_goes_before_a_rejection_or_an_inventory_and_a_second_accepted() -> None:
    """Order holds for what is not a Status: a Rejected of the placement, an Inventory (every held one), a
    later Accepted of the same placement (an edit) each release what is held first."""
    from federation.messages import Inventory, Rejected

    outbox = Outbox(accept_hold=30)
    outbox.put("t/reports", _accepted("a", 1))
    outbox.put("t/reports", Rejected(cluster="w1", placement=PlacementKey(workload_uid="a", attempt=1, epoch=1),
                                     seq=2, spec_version=1, reason="Invalid", message="no"))
    outbox.put("t/reports", _accepted("b", 3))
    outbox.put("t/reports", _accepted("b", 4, spec_version=2))
    outbox.put("t/reports", _accepted("c", 5))
    outbox.put("t/reports", Inventory(cluster="w1", items=[]))
    sent = [(item[1].type, getattr(getattr(item[1], "placement", None), "workload_uid", None),
             getattr(item[1], "seq", None)) for item in outbox._items]
    assert sent == [("accepted", "a", 1), ("rejected", "a", 2), ("accepted", "b", 3), ("accepted", "b", 4),
                    ("accepted", "c", 5), ("inventory", None, None)]
    assert outbox.held() == 0 and outbox.folded == 0


async def test_held_accepteds_are_released_on_request_and_none_without_a_hold() -> None:
    outbox = Outbox(accept_hold=30)
    outbox.put("t/reports", _accepted("a", 1))
    outbox.release_held()  # a stopping agent sends what it holds
    assert outbox.pending() == 1 and outbox.held() == 0
    plain = Outbox()  # accept_hold 0: sent at once, as before
    plain.put("t/reports", _accepted("a", 1))
    plain.put("t/reports", _of("a", 2, "Running"))
    assert plain.pending() == 2 and plain.folded == 0
