"""Stored object records and timestamps shared by the store modules.

A ``Rec`` is one stored object: its serialized JSON bytes plus the few fields that selectors, watches and
garbage collection read without parsing.
"""

from __future__ import annotations

import copy
import time
from datetime import UTC, datetime
from typing import Any

import orjson

_stamp: list[Any] = [0, ""]


def now() -> str:
    """RFC 3339 UTC timestamp with seconds precision (formatted once per second: it is on the hot path)."""
    t = int(time.time())
    if _stamp[0] != t:
        _stamp[0], _stamp[1] = t, datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return str(_stamp[1])


class Rec:
    """One stored object: its JSON bytes and what selectors, GC and watches need without parsing."""

    __slots__ = ("labels", "name", "ns", "owners", "raw", "rv", "uid")

    def __init__(self, raw: bytes, ns: str, name: str, rv: int, uid: str,
                 labels: dict[str, str] | None, owners: tuple[str, ...]) -> None:
        self.raw = raw
        self.ns = ns
        self.name = name
        self.rv = rv
        self.uid = uid
        self.labels = labels
        self.owners = owners

    def obj(self) -> dict[str, Any]:
        return orjson.loads(self.raw)  # type: ignore[no-any-return]


_ATOMS = (str, int, float, bool, type(None))


def json_copy(value: Any) -> Any:
    """A deep copy of a JSON tree (dicts, lists, scalars; anything else by ``copy.deepcopy``): what patches
    and defaults copy on every request, several times faster than ``copy.deepcopy``'s general machinery."""
    t = type(value)
    if t is dict:
        return {k: json_copy(v) for k, v in value.items()}
    if t is list:
        return [json_copy(v) for v in value]
    if t in _ATOMS:
        return value
    return copy.deepcopy(value)
