"""The log-stream broker: asks agents about placed Jobs' pods and logs, and hands the answers to the HTTP requests
waiting for them.

An Ask (``federation.messages.Ask``) is signed like every Command, on a stream of its own (``q<epoch>``, so it
never takes a number of the outbox's), and published at once on the outbox's link; it is not stored (it is
worth nothing after its HTTP request went away). The answers arrive on ``<root>/+/streams`` over a connection
of this broker's own, so they never delay a Report, each frame checked (the cluster's key), decrypted (the
dispatcher's) and put in order by its number (``federation.podstream``). Limits: streams at once per cluster
and per user; a stream that hears nothing for ``quiet_seconds`` checks its cluster, and a lost cluster ends it
with an error saying since when; a follow whose reader left is told to stop (an Ask ``stop``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from federation import topics
from federation.clock import Clock
from federation.errors import FederationError, Transport
from federation.messages import Ask, MessageRefused, encode
from federation.mqtt import LinkHealth, MqttLink
from federation.podstream import Frame, FrameOpener
from federation.signing import Refused

log = logging.getLogger(__name__)

FIRST_ANSWER_SECONDS = 15.0
"""How long an Ask waits for its first frame before the user is told the agent does not answer."""
QUIET_SECONDS = 5.0
"""A stream that hears nothing this long checks whether its cluster is still there."""
GAP_SECONDS = 3.0
"""A hole in a stream's numbers that stays this long means frames were lost: the stream ends saying so."""


class StreamError(Exception):
    """A stream that cannot start or went wrong: ``status`` for HTTP, ``reason`` for programs, ``message``."""

    def __init__(self, status: int, reason: str, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message
        self.fields = fields


@dataclass
class _Stream:
    ask: Ask
    cluster: str
    user: str
    queue: asyncio.Queue[Frame] = field(default_factory=asyncio.Queue)
    next_seq: int = 1
    early: dict[int, Frame] = field(default_factory=dict)
    gap_since: float | None = None
    ended: bool = False
    """The agent ended the stream (an ``end``, ``pods`` or ``error`` frame came): nothing to stop."""


class PodStreams:
    """One per dispatcher; ``run`` (a supervised task) keeps the answer subscription up."""

    def __init__(self, settings: Any, identity: Any, publish: Callable[[str, bytes], Any], clock: Clock, *,
                 client_id: str, epoch: Callable[[], int], lost: Callable[[str], datetime | None]) -> None:
        self.settings = settings
        self.identity = identity
        self.publish = publish
        self.clock = clock
        self.client_id = client_id
        self.epoch = epoch
        self.lost = lost
        self.root = settings.mqtt.topic_root
        self.frames = FrameOpener(identity.sealer.key, max_age_seconds=settings.signing.max_age_seconds)
        self.max_per_cluster = settings.log_streams_per_cluster
        self.max_per_user = settings.log_streams_per_user
        self.rate = settings.log_stream_rate
        self.idle_seconds = settings.log_follow_idle_seconds
        self.streams: dict[str, _Stream] = {}
        self._numbers = itertools.count(1)
        self.subscribed = asyncio.Event()
        self.refused = 0

    # --- the answer subscription ------------------------------------------------------------------
    async def run(self) -> None:
        health = LinkHealth(self.settings.mqtt, self.clock)
        while True:
            try:
                async with MqttLink(self.settings.mqtt, client_id=self.client_id, persistent=False) as link:
                    await link.subscribe(topics.all_streams(self.root))
                    health.connected_now()
                    self.subscribed.set()
                    async for message in link.messages():
                        self.receive(message.topic, message.payload)
            except Transport as exc:
                health.failed(exc)
                log.warning("answer stream link lost (%s); retrying in %.1fs", exc, health.next_delay())
            finally:
                self.subscribed.clear()
                for stream in list(self.streams.values()):
                    self._fail(stream, StreamError(503, "broker", "the dispatcher's connection to the broker dropped "
                                                                  "during the stream; ask again"))
            await self.clock.sleep(health.next_delay())

    def receive(self, topic: str, payload: bytes) -> None:
        try:
            cluster = topics.parse(topic, self.root).cluster
            keys = self.identity.keys.get(cluster)
            if not keys:
                raise Refused("unregistered", f"no key registered for cluster {cluster}")
            frame = self.frames.open(topic, payload, keys)
        except (MessageRefused, FederationError) as exc:
            self.refused += 1
            log.warning("answer frame on %s refused: %s", topic, exc)
            return
        stream = self.streams.get(frame.id)
        if stream is None or stream.cluster != cluster:
            return  # its reader left (the agent is told to stop), or another dispatcher's
        if frame.seq < stream.next_seq or frame.seq in stream.early:
            return
        stream.early[frame.seq] = frame
        while stream.next_seq in stream.early:
            stream.queue.put_nowait(stream.early.pop(stream.next_seq))
            stream.next_seq += 1
        stream.gap_since = self.clock.monotonic() if stream.early else None

    def _fail(self, stream: _Stream, error: StreamError) -> None:
        stream.queue.put_nowait(Frame(stream.ask.id, 0, "error", {"reason": error.reason, "message": error.message,
                                                                  "status": error.status}))

    # --- asking -----------------------------------------------------------------------------------
    async def ask(self, cluster: str, user: str, ask: Ask) -> AsyncIterator[Frame]:
        """The frames answering ``ask`` on ``cluster`` in order, ending after ``end`` (or raising StreamError);
        closing the iterator early tells the agent to stop."""
        since = self.lost(cluster)
        if since is not None:
            raise StreamError(503, "cluster_offline", f"cluster {cluster} is offline since {since:%Y-%m-%d %H:%M:%S} "
                                                      "UTC: its pods cannot be reached until its agent is back")
        on_cluster = sum(1 for s in self.streams.values() if s.cluster == cluster)
        if on_cluster >= self.max_per_cluster:
            raise StreamError(429, "busy", f"{on_cluster} streams from cluster {cluster} are open (the "
                                           "dispatcher's log_streams_per_cluster); try again when one ends")
        mine = sum(1 for s in self.streams.values() if s.user == user)
        if mine >= self.max_per_user:
            raise StreamError(429, "busy", f"user {user!r} has {mine} streams open (log_streams_per_user); "
                                           "close one first")
        stream = _Stream(ask, cluster, user)
        self.streams[ask.id] = stream
        topic = topics.commands(cluster, self.root)
        try:
            try:
                await self.publish(topic, self.identity.sealer.seal(topic, encode(ask), stream=f"q{self.epoch()}",
                                                                     n=next(self._numbers)))
            except Transport as exc:
                raise StreamError(503, "broker", f"the Ask could not be sent to cluster {cluster}: {exc}") from None
            first = True
            while True:
                frame = await self._next(stream, FIRST_ANSWER_SECONDS if first else QUIET_SECONDS, first)
                if frame is None:
                    continue
                first = False
                if frame.kind == "error":
                    fields = dict(frame.fields)
                    reason, message = str(fields.pop("reason", "error")), str(fields.pop("message", ""))
                    status = int(fields.pop("status", 0) or _STATUS.get(reason, 502))
                    raise StreamError(status, reason, message, **fields)
                yield frame
                if frame.kind in ("end", "pods"):
                    return
        finally:
            self.streams.pop(ask.id, None)
            if not stream.ended:
                with contextlib.suppress(Exception):
                    stop = Ask(id=ask.id, what="stop", placement=ask.placement, job=ask.job)
                    await self.publish(topic, self.identity.sealer.seal(topic, encode(stop), stream=f"q{self.epoch()}",
                                                                         n=next(self._numbers)))

    async def _next(self, stream: _Stream, wait: float, first: bool) -> Frame | None:
        try:
            frame = await asyncio.wait_for(stream.queue.get(), wait)
        except TimeoutError:
            since = self.lost(stream.cluster)
            if since is not None:
                raise StreamError(503, "cluster_offline", f"cluster {stream.cluster} went offline (since "
                                                          f"{since:%Y-%m-%d %H:%M:%S} UTC); the stream ended") from None
            if stream.gap_since is not None and self.clock.monotonic() - stream.gap_since > GAP_SECONDS:
                raise StreamError(502, "lost", f"answer frames from cluster {stream.cluster} were lost on the way; "
                                               "ask again") from None
            if first:
                raise StreamError(504, "no_answer", f"the agent of cluster {stream.cluster} did not answer within "
                                                    f"{FIRST_ANSWER_SECONDS:.0f}s (an agent of an earlier version, "
                                                    "or it is overloaded)") from None
            return None
        if frame.kind in ("end", "pods", "error"):
            stream.ended = True
        return frame

    def new_ask(self, **fields: Any) -> Ask:
        return Ask(id=secrets.token_hex(12), rate=self.rate, idle_seconds=self.idle_seconds, **fields)


_STATUS = {"no_copy": 404, "pod_not_found": 404, "no_pods": 404, "container_not_found": 400, "refused": 400,
           "pod_gone": 410, "busy": 429, "unknown_kind": 400, "worker_api": 502}
"""HTTP status of an agent's refusal, by reason."""
