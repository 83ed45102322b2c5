"""Who may speak to the dispatcher: the clusters' public keys and the seal check on every Report.

``Identity`` holds the dispatcher's own :class:`~federation.signing.Sealer` (Commands are signed as the
outbox publishes them, stream ``e<epoch>``: a row alone with n = its row id, several rows for one
cluster as one batch with a new outbox id, ``seal_rows``; a batch goes only to an agent whose live
stream sent a batch of Reports, ``takes_batches``) and the keys of the
clusters: those registered in the database (``mkctl clusters register``, read again every
``cluster_keys_refresh_seconds``) and those in ``cluster_public_keys``. A Report is accepted only
when its topic's cluster has a key and the seal checks out (``federation.signing.Opener``: key,
signature, clock window, no repeat). A cluster with no key is never created: its messages are
refused, counted (reason ``unregistered``) and written to ``cluster_refusals`` for ``mkctl clusters
list``. A will message (sealed when the agent's link opened, n 0) marks a cluster offline only when
it belongs to the stream the cluster is speaking on now: an old one replayed is refused as ``stale_will``.
Every Place is encrypted to the keys of its cluster before it is sealed (``federation.sealing``); a
cluster with no key gets none (:class:`~federation.sealing.NoKey`, naming ``mkctl clusters register``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.db.queries import clusters as cluster_q
from dispatcher.settings import DispatcherSettings
from federation import messages, topics
from federation.errors import Invalid
from federation.refusals import refused
from federation.sealing import NoKey, PlaceSealer
from federation.signing import (
    Opened,
    Opener,
    Refused,
    Sealer,
    key_id,
    load_private_key,
    parse_public_key,
    peek,
)

log = logging.getLogger(__name__)


class Identity:
    def __init__(self, settings: DispatcherSettings) -> None:
        self.settings = settings
        signing = settings.signing
        self.sealer = Sealer(load_private_key(
            signing.private_key.get_secret_value() if signing.private_key else None, signing.private_key_file,
            "signing"))
        self.opener = Opener(max_age_seconds=signing.max_age_seconds)
        self.places = PlaceSealer()
        self.static: dict[str, Ed25519PublicKey] = {
            name: parse_public_key(text, f"cluster_public_keys.{name}")
            for name, text in settings.cluster_public_keys.items()}
        self.keys: dict[str, dict[str, Ed25519PublicKey]] = {}
        self._registered: dict[str, str] = {}
        self._rebuild()
        self.streams: dict[str, str] = {}
        """Per cluster, the stream its newest accepted Report was sealed on (its live link)."""
        self._batching: dict[str, str] = {}
        """Per cluster, the stream on which it last sent a batch of Reports (``takes_batches``)."""
        self.pending: dict[str, tuple[str, str, int, datetime]] = {}
        """Refused senders not yet written to the database: name -> (reason, message, count, last)."""

    def _rebuild(self) -> None:
        keys: dict[str, dict[str, Ed25519PublicKey]] = {}
        for name, text in self._registered.items():
            try:
                key = parse_public_key(text, f"clusters.{name}.public_key")
            except Invalid as exc:
                log.error("cluster %s: registered key unusable: %s", name, exc)
                continue
            keys.setdefault(name, {})[key_id(key)] = key
        for name, key in self.static.items():
            keys.setdefault(name, {})[key_id(key)] = key
        self.keys = keys

    def registered(self, keys: dict[str, str]) -> None:
        """The database's view of registered clusters (name -> public key text)."""
        if keys != self._registered:
            self._registered = dict(keys)
            self._rebuild()

    async def refresh(self, sessions: async_sessionmaker[AsyncSession], now: datetime) -> None:
        """Read registered keys again; write the refused senders gathered since the last call."""
        pending, self.pending = self.pending, {}
        async with sessions.begin() as s:
            if pending:
                await cluster_q.record_refusals(s, pending)
            keys = await cluster_q.cluster_keys(s)
        self.registered(keys)

    def seal(self, topic: str, body: bytes, *, epoch: int, n: int) -> bytes:
        return self.sealer.seal(topic, body, stream=f"e{epoch}", n=n)

    def seal_rows(self, topic: str, rows: list[tuple[int, bytes]], *, epoch: int, fresh: Callable[[], int]) -> bytes:
        """Outbox rows (id, Command bytes) for one cluster as one signed message: a single row alone,
        numbered by its row id (published again, it is the same message: a repeat the agent refuses);
        several as a batch (``messages.encode_commands``) numbered by ``fresh()``, a new outbox id."""
        if len(rows) == 1:
            return self.seal(topic, rows[0][1], epoch=epoch, n=rows[0][0])
        return self.seal(topic, messages.encode_commands([body for _, body in rows]), epoch=epoch, n=fresh())

    def batches(self, cluster: str, stream: str) -> None:
        """``cluster`` sent a batch of Reports on ``stream``: an agent that opens batched Commands too."""
        self._batching[cluster] = stream

    def takes_batches(self, cluster: str) -> bool:
        """Whether Commands to ``cluster`` may go in batches: its live stream (the link it speaks on now) sent
        a batch of Reports. An agent of an earlier version never does, so it gets one Command per message."""
        stream = self._batching.get(cluster)
        return stream is not None and stream == self.streams.get(cluster)

    def seal_place(self, cluster: str, topic: str, body: bytes) -> bytes:
        """A Place's JSON encrypted to every key of ``cluster`` (two while its key is rotated); NoKey without one."""
        keys = self.keys.get(cluster)
        if not keys:
            raise NoKey(cluster)
        return self.places.seal(topic, body, keys)

    def open(self, cluster: str, channel: str, topic: str, payload: bytes, now: datetime) -> Opened:
        """The Report's bytes once its sender is known and its seal checks out; raises Refused."""
        keys = self.keys.get(cluster)
        if not keys:
            refused("unregistered")
            _, _, n, _ = self.pending.get(cluster, ("", "", 0, now))
            message = (f"no public key is registered for cluster {cluster!r}; "
                       f"register it with `mkctl clusters register {cluster} --public-key ...`")
            self.pending[cluster] = ("unregistered", message, n + 1, now)
            raise Refused("unregistered", message)
        claimed = peek(payload) if channel == "presence" else None  # only a heartbeat is a will message
        will = claimed is not None and claimed[1] == 0
        opened = self.opener.open(topic, payload, keys, check_age=not will)
        if will:
            if self.streams.get(cluster) != opened.stream:
                refused("stale_will")
                raise Refused("stale_will", f"an offline message of {cluster}'s stream {opened.stream!r}, "
                                            "which is not the stream it speaks on now (a replay, or an old link)")
        else:
            self.streams[cluster] = opened.stream
        return opened


class OutboxSealing:
    """The outbox publisher's signing (``dispatcher.wire.outbox.Sealing``): this identity, the engine's current
    epoch and its outbox ids (callables: both are set when the engine starts)."""

    def __init__(self, identity: Identity, *, epoch: Callable[[], int], fresh: Callable[[], int], root: str) -> None:
        self.identity = identity
        self.epoch = epoch
        self.fresh = fresh
        self.root = root

    def rows(self, topic: str, rows: list[tuple[int, bytes]]) -> bytes:
        return self.identity.seal_rows(topic, rows, epoch=self.epoch(), fresh=self.fresh)

    def batches(self, topic: str) -> bool:
        try:
            return self.identity.takes_batches(topics.parse(topic, self.root).cluster)
        except Invalid:
            return False
