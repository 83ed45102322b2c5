"""Answers to an Ask (``federation.messages.Ask``) on a cluster's streams topic: numbered frames, each encrypted
to the dispatcher's keys and signed by the agent. A frame is a JSON header line
(``{"v":1,"type":"answer","id":<ask id>,"seq":<n>,"kind":"data|pods|end|error",...}``) and, for log data, the
raw bytes after it. ``seq`` counts from 1 per Ask, so the receiver writes frames in order and notices a hole
(a lost frame ends the stream with an error rather than a silent gap); ``pods`` carries the copy's pods and
their Events in the header, ``end`` its ``reason`` (``completed``, ``idle``, ``stopped``), ``error`` a
``reason`` and a ``message`` the user reads. Logs may hold secrets, so every frame is sealed as Places are
(``federation.sealing``: to the dispatcher's keys) before it is signed (``federation.signing``) on stream
``a<id>`` with n = seq: a broker subscriber reads no line, and a frame cannot be moved to another cluster's
topic, altered or replayed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from federation.messages import MessageRefused
from federation.sealing import PlaceOpener, PlaceSealer, is_sealed
from federation.signing import Opener, Refused, Sealer

MAX_DATA = 64 * 1024
"""Log bytes per frame at most (a frame stays far below the broker's message limit)."""
Kind = Literal["data", "pods", "end", "error"]
KINDS: tuple[Kind, ...] = ("data", "pods", "end", "error")


@dataclass(frozen=True)
class Frame:
    id: str
    seq: int
    kind: Kind
    fields: dict[str, Any]
    data: bytes = b""


def encode(frame: Frame) -> bytes:
    head = {"v": 1, "type": "answer", "id": frame.id, "seq": frame.seq, "kind": frame.kind, **frame.fields}
    return orjson.dumps(head) + b"\n" + frame.data


def decode(body: bytes) -> Frame:
    head, sep, data = body.partition(b"\n")
    try:
        raw = orjson.loads(head)
    except orjson.JSONDecodeError as exc:
        raise MessageRefused(f"answer frame header is not JSON: {exc}") from None
    if not sep or not isinstance(raw, dict) or raw.get("v") != 1 or raw.get("type") != "answer":
        raise MessageRefused("not an answer frame")
    ident, seq, kind = raw.pop("id", None), raw.pop("seq", None), raw.pop("kind", None)
    if not isinstance(ident, str) or type(seq) is not int or seq < 1 or kind not in KINDS:
        raise MessageRefused("answer frame without a valid id, seq or kind")
    raw.pop("v"), raw.pop("type")
    return Frame(ident, seq, kind, raw, data)


class FrameSealer:
    """The agent's side: encrypts frames to the dispatcher's keys and signs them."""

    def __init__(self, sealer: Sealer, dispatcher_keys: Mapping[str, Ed25519PublicKey]) -> None:
        self.sealer = sealer
        self.keys = dict(dispatcher_keys)
        self.places = PlaceSealer()

    def seal(self, topic: str, frame: Frame) -> bytes:
        return self.sealer.seal(topic, self.places.seal(topic, encode(frame), self.keys), stream=f"a{frame.id}",
                                n=frame.seq)


class FrameOpener:
    """The dispatcher's side: checks the agent's signature, then decrypts with the dispatcher's key."""

    def __init__(self, key: Ed25519PrivateKey, *, max_age_seconds: float = 300.0) -> None:
        self.opener = Opener(max_age_seconds=max_age_seconds)
        self.places = PlaceOpener(key)

    def open(self, topic: str, payload: bytes, cluster_keys: Mapping[str, Ed25519PublicKey]) -> Frame:
        """The frame; raises :class:`~federation.signing.Refused` or ``MessageRefused``."""
        opened = self.opener.open(topic, payload, cluster_keys)
        if not is_sealed(opened.body):
            raise Refused("unsealed", "an answer frame must be encrypted to the dispatcher's key")
        frame = decode(self.places.open(topic, opened.body))
        if opened.stream != f"a{frame.id}" or opened.n != frame.seq:
            raise Refused("malformed", "the frame's seal does not match its id and number")
        return frame
