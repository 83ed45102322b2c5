"""The log-stream broker (dispatcher/wire/podstreams.py) on its own: the Ask it signs, frames put in order, a frame of the wrong key or a replay ignored, a hole or a lost cluster ending the stream with an error, limits, and a stop Ask when the reader leaves early."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from dispatcher.settings import DispatcherSettings
from dispatcher.wire import podstreams
from dispatcher.wire.podstreams import PodStreams, StreamError
from federation import topics
from federation.clock import SystemClock
from federation.messages import Ask, JobRef, PlacementKey, decode_command
from federation.podstream import Frame, FrameSealer
from federation.signing import Opener, Sealer, key_id, parse_private_key, parse_public_key
from tests import keys

ROOT = "t-streams/v1"


class World:
    """A broker with the dispatcher's and worker-1's keys; ``published`` holds the Asks it sent."""

    def __init__(self, lost: dict[str, datetime] | None = None, **overrides: Any) -> None:
        settings = DispatcherSettings(mqtt={"topic_root": ROOT}, signing={"private_key": keys.private("dispatcher")},
                                      **overrides)
        dispatcher_key = parse_private_key(keys.private("dispatcher"))
        agent_key = parse_private_key(keys.private("worker-1"))
        agent_public = parse_public_key(keys.public("worker-1"))
        self.identity = SimpleNamespace(sealer=Sealer(dispatcher_key), keys={"worker-1": {key_id(agent_public): agent_public}})
        self.published: list[tuple[str, bytes]] = []
        self.lost = lost if lost is not None else {}

        async def publish(topic: str, payload: bytes) -> None:
            self.published.append((topic, payload))
        self.broker = PodStreams(settings, self.identity, publish, SystemClock(), client_id="t", epoch=lambda: 7,
                                 lost=self.lost.get)
        self.frames = FrameSealer(Sealer(agent_key), {key_id(dispatcher_key.public_key()): dispatcher_key.public_key()})
        self.topic = topics.streams("worker-1", ROOT)

    def ask(self) -> Ask:
        return self.broker.new_ask(what="logs", placement=PlacementKey(workload_uid="u1", attempt=1, epoch=7),
                                   job=JobRef(kind="Job", api_version="batch/v1", namespace="ns", name="train"))

    def answer(self, ident: str, seq: int, kind: Any, data: bytes = b"", **fields: Any) -> None:
        self.broker.receive(self.topic, self.frames.seal(self.topic, Frame(ident, seq, kind, fields, data)))

    def asks(self) -> list[Ask]:
        opener = Opener()
        out = []
        for topic, payload in self.published:
            body = opener.open(topic, payload, [self.identity.sealer.key.public_key()]).body
            command = decode_command(body)
            assert isinstance(command, Ask)
            out.append(command)
        return out


async def test_frames_come_in_order_and_a_replay_or_a_forged_frame_is_ignored() -> None:
    w = World()
    ask = w.ask()
    frames = w.broker.ask("worker-1", "alice", ask)
    first = asyncio.ensure_future(anext(frames))
    await asyncio.sleep(0.01)
    sent = w.asks()
    assert [a.id for a in sent] == [ask.id] and sent[0].what == "logs"  # signed by the dispatcher, on q<epoch>
    w.answer(ask.id, 3, "data", b"c")
    w.answer(ask.id, 2, "data", b"b")
    w.answer(ask.id, 1, "data", b"a", pod="p", container="main")
    payload = w.frames.seal(w.topic, Frame(ask.id, 4, "data", {}, b"d"))
    w.broker.receive(w.topic, payload)
    w.broker.receive(w.topic, payload)  # the same frame again: a replay
    forged = FrameSealer(Sealer(parse_private_key(keys.private("worker-2"))), w.frames.keys)
    w.broker.receive(w.topic, forged.seal(w.topic, Frame(ask.id, 5, "data", {}, b"forged")))
    w.answer(ask.id, 5, "end", reason="completed")
    got = [await first] + [f async for f in frames]
    assert b"".join(f.data for f in got) == b"abcd" and got[-1].kind == "end"
    assert w.broker.refused == 2 and not w.broker.streams


async def test_a_hole_that_stays_ends_the_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(podstreams, "QUIET_SECONDS", 0.05)
    monkeypatch.setattr(podstreams, "GAP_SECONDS", 0.1)
    w = World()
    ask = w.ask()
    frames = w.broker.ask("worker-1", "alice", ask)
    first = asyncio.ensure_future(anext(frames))
    await asyncio.sleep(0.01)
    w.answer(ask.id, 1, "data", b"a")
    w.answer(ask.id, 3, "data", b"c")  # 2 never comes
    assert (await first).data == b"a"
    with pytest.raises(StreamError) as info:
        await anext(frames)
    assert info.value.reason == "lost" and "were lost on the way" in info.value.message


async def test_a_lost_cluster_ends_a_quiet_stream_saying_since_when(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(podstreams, "QUIET_SECONDS", 0.05)
    lost: dict[str, datetime] = {}
    w = World(lost)
    ask = w.ask()
    frames = w.broker.ask("worker-1", "alice", ask)
    first = asyncio.ensure_future(anext(frames))
    await asyncio.sleep(0.01)
    w.answer(ask.id, 1, "data", b"a")
    await first
    lost["worker-1"] = datetime(2026, 12, 4, 22, 0, 0, tzinfo=UTC)
    with pytest.raises(StreamError) as info:
        await anext(frames)
    assert info.value.status == 503 and "went offline (since 2026-12-04 22:00:00 UTC)" in info.value.message
    with pytest.raises(StreamError) as again:  # and a new Ask is refused at once, without sending anything
        await anext(w.broker.ask("worker-1", "alice", w.ask()))
    assert again.value.reason == "cluster_offline"
    assert [a.what for a in w.asks()] == ["logs", "stop"]  # the first one told to stop, the second never sent


async def test_limits_per_user_and_per_cluster_and_a_stop_when_the_reader_leaves() -> None:
    w = World(log_streams_per_user=1, log_streams_per_cluster=2)
    one = w.ask()
    held = w.broker.ask("worker-1", "alice", one)
    pending = asyncio.ensure_future(anext(held))
    await asyncio.sleep(0.01)
    with pytest.raises(StreamError) as mine:
        await anext(w.broker.ask("worker-1", "alice", w.ask()))
    assert mine.value.status == 429 and "user 'alice' has 1 streams open" in mine.value.message
    other = w.broker.ask("worker-1", "bob", w.ask())
    pending_bob = asyncio.ensure_future(anext(other))
    await asyncio.sleep(0.01)
    with pytest.raises(StreamError) as full:
        await anext(w.broker.ask("worker-1", "carol", w.ask()))
    assert "2 streams from cluster worker-1 are open" in full.value.message
    w.answer(one.id, 1, "data", b"x")
    assert (await pending).data == b"x"
    await held.aclose()  # the reader left before the end: the agent is told to stop
    stops = [a for a in w.asks() if a.what == "stop"]
    assert [a.id for a in stops] == [one.id]
    pending_bob.cancel()
