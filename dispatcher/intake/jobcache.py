"""The engine's cache of manager Jobs, held compactly: a dispatcher knows 100,000 of them.

Every claimed Job is kept (its spec is what a Place carries, sent again after an Inventory), but it is read
rarely: when the Job is placed or its Place is sent again, when a status write has no newer baseline, when a
cluster's policy is checked for the first time. The watch event that only echoes mkd's own status write does
not refresh it (``dispatcher.intake.watch``): the kube writer keeps the status it wrote, so the cached status of a
Job mkd has written to may be older than the manager's. A Job decoded from JSON is about 10 KiB of Python
objects; compressed it is a tiny fraction of that (the dispatcher's RSS at 100,000 Workloads ≤ 300 MB). So
each Job is held as compressed bytes next to a small header (:class:`Head`) with what is read on every watch
event and every scheduling pass — its namespace, generation, managedBy and whether it is being deleted — and
decoded only on :meth:`JobCache.get`, into a fresh dict the caller may change without changing the cache.
"""

from __future__ import annotations

import sys
import threading
import zlib
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

import orjson

from federation.errors import Invalid
from federation.kinds.registry import by_name

MAX_DICTIONARIES = 64
_DICTIONARIES: list[bytes] = [b""]
"""id (the first byte of a packed value) -> preset dictionary; id 0: none."""
_BY_SHAPE: dict[Any, int] = {}
_REGISTER = threading.Lock()  # the KubeWriter packs from its threads too
_WINDOW = 32768  # DEFLATE looks back this far: only a dictionary's tail is used


def _shape(value: Any) -> Any:
    if not isinstance(value, dict):
        return None
    kind = value.get("kind")
    return kind if isinstance(kind, str) and kind else tuple(value)


def _dictionary(value: Any, data: bytes) -> int:
    shape = _shape(value)
    found = _BY_SHAPE.get(shape)
    if found is not None or shape is None:
        return found or 0
    with _REGISTER:
        found = _BY_SHAPE.get(shape)
        if found is None:
            if len(_DICTIONARIES) >= MAX_DICTIONARIES:
                return 0
            _DICTIONARIES.append(bytes(data[-_WINDOW:]))
            found = _BY_SHAPE[shape] = len(_DICTIONARIES) - 1
        return found


def pack(value: Any, prefix: bytes = b"") -> bytes:
    """``value`` as compressed JSON, exact-size: one byte naming the preset dictionary, then raw DEFLATE
    (after ``prefix``, when given: the cache's header).

    Compression (:func:`pack`) is raw DEFLATE with a preset dictionary: the first value packed of each
    shape (a Job's kind; else its top-level keys) becomes the dictionary of every later value of that
    shape. Jobs submitted from a few templates differ in their names, uids and timestamps only, so a
    PyTorchJob of 900 bytes of JSON packs into about 80 (plain zlib: 450), and faster. The dictionaries
    live as long as the process (at most ``MAX_DICTIONARIES``; beyond, values pack without one).
    """
    data = orjson.dumps(value)
    ident = _dictionary(value, data)
    zdict = _DICTIONARIES[ident]
    # level 1: most of the gain at a fraction of the CPU of higher levels
    c = (zlib.compressobj(1, zlib.DEFLATED, -15, 8, zlib.Z_DEFAULT_STRATEGY, zdict) if zdict
         else zlib.compressobj(1, zlib.DEFLATED, -15))
    return b"".join((prefix, _IDS[ident], c.compress(data), c.flush()))


_IDS = [bytes((i,)) for i in range(MAX_DICTIONARIES)]


def unpack(raw: bytes, start: int = 0) -> Any:
    """A fresh copy of what :func:`pack` packed (from ``start``: after a prefix)."""
    zdict = _DICTIONARIES[raw[start]]
    d = zlib.decompressobj(-15, zdict=zdict) if zdict else zlib.decompressobj(-15)
    return orjson.loads(d.decompress(memoryview(raw)[start + 1:]))


class Head:
    """What is read of a cached Job without decoding it (read from the first bytes of its entry)."""

    __slots__ = ("deleting", "generation", "managed_by", "namespace", "status")

    def __init__(self, namespace: str, generation: int, deleting: bool, managed_by: str | None,
                 status: bool = True) -> None:
        self.namespace = namespace
        self.generation = generation
        self.deleting = deleting
        self.managed_by = managed_by
        self.status = status
        """Whether the Job has a ``status`` member (a Job just created has none: its first status write
        needs no decoding to know it)."""

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> Head:
        meta = obj.get("metadata") or {}
        generation = meta.get("generation")
        return cls(sys.intern(str(meta.get("namespace") or "")),
                   generation if isinstance(generation, int) and generation >= 0 else 0,
                   bool(meta.get("deletionTimestamp")), _managed_by(obj, str(obj.get("kind") or "")),
                   "status" in obj)


class _Names:
    """A few distinct strings (namespaces, managedBy values) by a small index, ``limit`` at most."""

    def __init__(self, limit: int, *first: str | None) -> None:
        self.limit = limit
        self.names: list[str | None] = list(first)
        self.index: dict[str | None, int] = {n: i for i, n in enumerate(first)}

    def index_of(self, name: str | None) -> int | None:
        found = self.index.get(name)
        if found is None and len(self.names) < self.limit:
            found = self.index[name] = len(self.names)
            self.names.append(name)
        return found


def _managed_by(obj: Mapping[str, Any], kind: str) -> str | None:
    try:
        value = by_name(kind).managed_by(obj)
    except Invalid:  # not a kind mkd runs: nothing reads its managedBy
        return None
    return sys.intern(value) if value is not None else None


class JobCache(MutableMapping[str, dict[str, Any]]):
    """uid → manager Job (module docstring). ``cache[uid]`` / ``get`` decode a fresh copy; ``head``
    reads the header only.

    An entry is one bytes object: a header of a few bytes — managedBy (an index, 7 bits) and whether the
    Job is being deleted (1 bit), its namespace (an index, 2 bytes), its generation, whether the kube writer
    left a status with it and whether it has a status (a varint of ``generation << 2 | written << 1 |
    status``), then that written status (a varint length and the packed status, :meth:`set_written`) — then
    the packed Job; no object per Job beside it (100,000 of them). A Job whose namespace or
    managedBy does not fit an index (more than 65,535 namespaces, 127 managedBy values) is kept with a
    :class:`Head` object instead (and its written status beside it, as is that of a Job not cached).
    """

    def __init__(self) -> None:
        self._entries: dict[str, bytes | tuple[Head, bytes]] = {}
        self._namespaces = _Names(1 << 16, "")
        self._managers = _Names(1 << 7, None)
        self._written_aside: dict[str, bytes] = {}
        """The written status of a Job kept with a Head object, or not cached."""

    def __getitem__(self, uid: str) -> dict[str, Any]:
        entry = self._entries[uid]
        if isinstance(entry, tuple):
            return unpack(entry[1])  # type: ignore[no-any-return]
        return unpack(entry, _header_length(entry))  # type: ignore[no-any-return]

    def __setitem__(self, uid: str, obj: dict[str, Any]) -> None:
        self.put(uid, obj)

    def put(self, uid: str, obj: dict[str, Any], packed: bytes | None = None) -> None:
        """``cache[uid] = obj``; ``packed``: ``pack(obj)`` made already (the inbox's copy), not made again.
        The written status stays (:meth:`set_written`)."""
        written = self.written(uid)
        head = Head.of(obj)
        ns, manager = self._namespaces.index_of(head.namespace), self._managers.index_of(head.managed_by)
        if ns is None or manager is None:
            self._entries[uid] = (head, packed if packed is not None else pack(obj))
            if written is not None:
                self._written_aside[uid] = written
            return
        self._written_aside.pop(uid, None)
        value = head.generation << 2 | (written is not None) << 1 | head.status
        header = bytearray((manager | (0x80 if head.deleting else 0), ns & 0xFF, ns >> 8))
        _varint(header, value)
        if written is not None:
            _varint(header, len(written))
            header += written
        self._entries[uid] = bytes(header) + packed if packed is not None else pack(obj, bytes(header))

    def written(self, uid: str) -> bytes | None:
        """What the kube writer left with the Job (:meth:`set_written`), or None."""
        entry = self._entries.get(uid)
        if entry is None or isinstance(entry, tuple):
            return self._written_aside.get(uid)
        value, i = _read_varint(entry, 3)
        if not value & 2:
            return None
        length, i = _read_varint(entry, i)
        return entry[i:i + length]

    def set_written(self, uid: str, written: bytes | None) -> None:
        """Keep ``written`` (the kube writer's packed status of the Job after its last write; None: forget it)
        with the Job's entry: a claimed Job's status as mkd wrote it, in ~80 bytes of the entry and no object
        of its own (the dispatcher that claimed 100,000 Jobs wrote all of them)."""
        entry = self._entries.get(uid)
        if entry is None or isinstance(entry, tuple):
            if written is None:
                self._written_aside.pop(uid, None)
            else:
                self._written_aside[uid] = written
            return
        value, _ = _read_varint(entry, 3)
        job = _header_length(entry)
        header = bytearray(entry[:3])
        _varint(header, value & ~2 | (written is not None) << 1)
        if written is not None:
            _varint(header, len(written))
            header += written
        self._entries[uid] = bytes(header) + entry[job:]

    def __delitem__(self, uid: str) -> None:
        del self._entries[uid]
        self._written_aside.pop(uid, None)

    def __contains__(self, uid: object) -> bool:
        return uid in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def head(self, uid: str) -> Head | None:
        entry = self._entries.get(uid)
        if entry is None or isinstance(entry, tuple):
            return entry[0] if entry is not None else None
        value, _ = _read_varint(entry, 3)
        return Head(self._namespaces.names[entry[1] | entry[2] << 8] or "", value >> 2, entry[0] >= 0x80,
                    self._managers.names[entry[0] & 0x7F], bool(value & 1))

    def status(self, uid: str) -> dict[str, Any] | None:
        """The cached Job's ``status`` when it is a dict, else None (also for a Job not cached), decoded only
        when the Job has one."""
        head = self.head(uid)
        if head is None or not head.status:
            return None
        status = self[uid].get("status")
        return status if isinstance(status, dict) else None

    def held_bytes(self) -> int:
        """The cache's entries' total size (headers, the written statuses kept in them and compressed Jobs)."""
        return sum(len(e if isinstance(e, bytes) else e[1]) for e in self._entries.values())


def _varint(out: bytearray, value: int) -> None:
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)


def _read_varint(entry: bytes, i: int) -> tuple[int, int]:
    """The varint at ``entry[i:]`` and the index after it."""
    value, shift = 0, 0
    while True:
        byte = entry[i]
        value |= (byte & 0x7F) << shift
        i += 1
        if byte < 0x80:
            return value, i
        shift += 7


def _header_length(entry: bytes) -> int:
    value, i = _read_varint(entry, 3)
    if value & 2:  # the written status
        length, i = _read_varint(entry, i)
        i += length
    return i
