"""The outbox rows this engine committed, queued in memory for the publisher, within a byte budget.

The engine commits Command rows and hands them to the publisher here, so the publisher need not read
them back (:mod:`dispatcher.wire.outbox`). A burst can commit far more Places than agents may take at once
(the unanswered-Place budget): at 100,000 Jobs claimed in a burst, tens of thousands of sealed Places
would wait in memory. So a row keeps its Command bytes only while the bytes held stay within
``outbox_memory_bytes``; past that it waits as its id, topic and Place key alone, and the publisher
reads its bytes back from the database when it takes it. Order and flow control are the same either
way: the database copy is what survives a crash in both cases.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

Row = tuple[int, str, bytes | None, tuple[str, int] | None]
"""(outbox id, topic, Command bytes or None when left in the database, Place key or None)."""


class FreshRows:
    """Committed outbox rows in id order: the engine adds, the publisher peeks and drops from the front."""

    __slots__ = ("_rows", "held", "max_bytes", "spilled")

    def __init__(self, max_bytes: int) -> None:
        self._rows: deque[Row] = deque()
        self.max_bytes = max_bytes
        self.held = 0
        """Command bytes held in memory now."""
        self.spilled = 0
        """Rows queued without their bytes since start (read back from the database when taken)."""

    def add(self, row_id: int, topic: str, payload: bytes, key: tuple[str, int] | None) -> None:
        if self.held + len(payload) <= self.max_bytes:
            self.held += len(payload)
            self._rows.append((row_id, topic, payload, key))
        else:
            self.spilled += 1
            self._rows.append((row_id, topic, None, key))

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[Row]:
        """The rows from the front; the caller must not add or drop while iterating."""
        return iter(self._rows)

    def place_keys(self) -> set[tuple[str, int]]:
        """The (workload uid, attempt) of every Place waiting here: not published yet, so not unanswered."""
        return {row[3] for row in self._rows if row[3] is not None}

    def first_id(self) -> int | None:
        """The id of the row at the front (the lowest), or None when empty."""
        return self._rows[0][0] if self._rows else None

    def drop(self, n: int) -> None:
        """Forget the first ``n`` rows (taken by the publisher)."""
        rows = self._rows
        for _ in range(min(n, len(rows))):
            payload = rows.popleft()[2]
            if payload is not None:
                self.held -= len(payload)
