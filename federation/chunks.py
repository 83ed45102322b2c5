"""Resync and Inventory at any size: split into parts under the payload limit, acted on only whole.

A Resync lists every placement the dispatcher expects on a cluster, an Inventory every Job an agent
runs; at ~100 bytes an entry, one MQTT payload (``MAX_PAYLOAD_BYTES``) holds about ten thousand.
:func:`split` cuts such a message into parts that each encode below ``budget`` bytes (room is left
for the stream number and a signature); every part carries the same ``chunk.id`` and its
``part`` of ``parts``. :class:`Assembler` on the receiving side collects the parts and returns the
whole message once all are in. It never acts on a partial list: a Resync missing a part would make
the agent delete Jobs that the missing part lists. A lost part leaves its message incomplete;
the report-stream hole (or the next reconnect's Inventory) brings a fresh one, and the incomplete
one is forgotten when ``keep`` newer messages have started or it is older than ``ttl`` seconds.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from typing import TypeVar

from federation.messages import MAX_PAYLOAD_BYTES, Chunk, Inventory, MessageRefused, Resync

ListMessage = TypeVar("ListMessage", Resync, Inventory)
BUDGET = MAX_PAYLOAD_BYTES * 3 // 4
"""Bytes per part: a quarter of the limit stays free for stream numbers and a signature envelope."""


def _size(message: Resync | Inventory) -> int:
    return len(message.model_dump_json().encode())  # encode() would refuse what is above the limit


def _items_field(message: Resync | Inventory) -> str:
    return "expected" if isinstance(message, Resync) else "items"


def split(message: ListMessage, *, budget: int = BUDGET) -> list[ListMessage]:
    """``message`` as one or more parts, each encoding to at most ``budget`` bytes."""
    if _size(message) <= budget:
        return [message]
    field = _items_field(message)
    items = list(getattr(message, field))
    empty = _size(message.model_copy(update={field: []}))
    chunks: list[list[object]] = []
    start = 0
    size = max(1, (_size(message) - empty) // max(1, len(items)))  # entries are about the same size
    while start < len(items):
        n = max(1, (budget - empty - 200) // size)  # as many as the average says; halved until it fits
        while True:
            part = items[start:start + n]
            if _size(message.model_copy(update={field: part})) <= budget:
                break
            if n == 1:
                raise MessageRefused(f"one {field} entry alone is above {budget} bytes")
            n = max(1, n // 2)
        chunks.append(part)
        start += len(part)
    ident = uuid.uuid4().hex
    return [message.model_copy(update={field: part, "chunk": Chunk(id=ident, part=i, parts=len(chunks))})
            for i, part in enumerate(chunks, start=1)]


class Assembler:
    """Collects the parts of chunked Resyncs / Inventories (see the module docstring)."""

    def __init__(self, *, keep: int = 8, ttl: float = 300.0) -> None:
        self.keep = keep
        self.ttl = ttl
        self._open: OrderedDict[tuple[str, str], tuple[float, dict[int, Resync | Inventory]]] = OrderedDict()
        self.incomplete_dropped = 0

    def add(self, message: ListMessage, now: float) -> ListMessage | None:
        """The whole message once its last part is in (at once for an unchunked one), else None."""
        chunk = message.chunk
        if chunk.parts == 1:
            return message
        if not 1 <= chunk.part <= chunk.parts or not chunk.id:
            return None
        self._expire(now)
        key = (message.cluster, chunk.id)
        started, parts = self._open.get(key, (now, {}))
        parts[chunk.part] = message
        self._open[key] = (started, parts)
        if len(parts) < chunk.parts:
            while len(self._open) > self.keep:
                self._open.popitem(last=False)
                self.incomplete_dropped += 1
            return None
        del self._open[key]
        field = _items_field(message)
        whole = [entry for i in range(1, chunk.parts + 1) for entry in getattr(parts[i], field)]
        first = parts[1]
        return first.model_copy(update={field: whole, "chunk": Chunk()})  # type: ignore[return-value]

    def _expire(self, now: float) -> None:
        for key, (started, _) in list(self._open.items()):
            if now - started > self.ttl:
                del self._open[key]
                self.incomplete_dropped += 1
