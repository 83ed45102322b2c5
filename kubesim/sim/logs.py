"""What the simulated containers print: one log per container start, written over the run, as the kubelet keeps it.

A container's output comes from its pod's annotations (on the pod or its Job's template): ``kubesim.mkd.dev/log``
(or ``kubesim.mkd.dev/log.<container>`` for one container) is the text it prints, one line per text line, with
``{pod}``, ``{container}`` and ``{attempt}`` (the container start, from 1) filled in. The lines are spread evenly
over the run (the first at the start); with ``kubesim.mkd.dev/log-interval`` (seconds) a line is printed every
interval instead, cycling through the text, until the container exits (a run-forever container prints for
ever). ``kubesim.mkd.dev/log-bytes`` makes a container print that many bytes at its start (numbered lines of
100 bytes; for throughput tests). Without these a container whose command is ``echo`` prints its arguments,
and any other prints nothing. Lines are never stored: a line's text and time are computed from its number, so
a long or large log costs no memory. Each start is its own log (keyed by container ID), so ``previous`` reads
the start before the current one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubesim.sim.common import ANNOTATION_PREFIX, annotation

LOG = ANNOTATION_PREFIX + "log"
LOG_INTERVAL = ANNOTATION_PREFIX + "log-interval"
LOG_BYTES = ANNOTATION_PREFIX + "log-bytes"
FILLER_LINE = 100
"""Bytes per generated line of ``log-bytes`` output, newline included."""


@dataclass
class ContainerLog:
    """The output of one container start: its lines are a function of their number."""

    container_id: str
    started: float                 # wall clock (epoch seconds) of the start
    run_seconds: float | None      # None: runs until stopped
    texts: list[bytes]             # the lines of the annotation, placeholders filled in
    interval: float | None         # seconds between lines when cycling
    filler: int = 0                # lines of generated output written at the start
    finished: float | None = None  # wall clock of the exit
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    def total(self) -> int | None:
        """Lines this start writes in all (None: unbounded while it runs)."""
        if self.interval is None:
            return self.filler + len(self.texts)
        return None

    def at(self, n: int) -> float:
        """Wall-clock time the ``n``-th line (0-based) is written."""
        if n < self.filler:
            return self.started
        k = n - self.filler
        if self.interval is not None:
            return self.started + k * self.interval
        if self.run_seconds is None or not self.texts:
            return self.started
        return self.started + self.run_seconds * k / len(self.texts)

    def line(self, n: int) -> bytes:
        if n < self.filler:
            head = b"line %09d " % n
            return head + b"x" * (FILLER_LINE - len(head) - 1) + b"\n"
        k = n - self.filler
        return self.texts[k % len(self.texts)] if self.texts else b"\n"

    def written(self, now: float) -> int:
        """How many lines exist at ``now`` (all once the container has exited)."""
        stop = now if self.finished is None else min(now, self.finished)
        if stop < self.started:
            return 0
        total = self.total()
        if self.interval is not None:
            if not self.texts:
                return self.filler
            return self.filler + int((stop - self.started) / self.interval) + 1
        assert total is not None
        if self.finished is not None:
            return total
        lo, hi = 0, total  # lines are in time order: the first not yet written
        while lo < hi:
            mid = (lo + hi) // 2
            if self.at(mid) <= stop:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def first_since(self, since: float) -> int:
        """The first line written at or after ``since``."""
        if since <= self.started:
            return 0
        if self.interval is not None:
            k = int((since - self.started + self.interval - 1e-9) / self.interval)
            return self.filler + max(k, 0)
        total = self.total() or 0
        lo, hi = 0, total
        while lo < hi:
            mid = (lo + hi) // 2
            if self.at(mid) < since:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def lines(self, start: int, stop: int) -> Iterator[tuple[float, bytes]]:
        for n in range(start, stop):
            yield self.at(n), self.line(n)


class LogBook:
    """Every container start's log on one cluster, by container ID and name (what nodes keep in /var/log/pods)."""

    def __init__(self) -> None:
        self.runs: dict[str, ContainerLog] = {}
        self.by_pod: dict[str, list[str]] = {}   # pod uid -> its container IDs, for dropping them with the pod

    def start(self, pod: Mapping[str, Any], container: Mapping[str, Any], container_id: str, attempt: int,
              run_seconds: float | None) -> None:
        meta = pod.get("metadata") or {}
        name = str(container.get("name") or "")
        raw = annotation(pod, f"{LOG}.{name}")
        if raw is None:
            raw = annotation(pod, LOG)
        if raw is None:
            command = [str(a) for a in (container.get("command") or ())]
            if command and command[0].rsplit("/", 1)[-1] == "echo":
                raw = " ".join(command[1:] + [str(a) for a in container.get("args") or ()])
        texts: list[bytes] = []
        if raw is not None:
            filled = (raw.replace("{pod}", str(meta.get("name") or "")).replace("{container}", name)
                      .replace("{attempt}", str(attempt)))
            texts = [line.encode() + b"\n" for line in filled.splitlines()]
        interval = _positive(annotation(pod, LOG_INTERVAL))
        filler_bytes = _positive(annotation(pod, LOG_BYTES)) or 0
        self.runs[f"{container_id}/{name}"] = ContainerLog(
            container_id=container_id, started=time.time(), run_seconds=run_seconds, texts=texts,
            interval=interval, filler=int(filler_bytes + FILLER_LINE - 1) // FILLER_LINE)
        self.by_pod.setdefault(str(meta.get("uid") or ""), []).append(f"{container_id}/{name}")

    def get(self, container_id: str, name: str) -> ContainerLog | None:
        return self.runs.get(f"{container_id}/{name}")

    def finish(self, container_id: str, names: list[str]) -> None:
        for name in names:
            run = self.runs.get(f"{container_id}/{name}")
            if run is not None and run.finished is None:
                run.finished = time.time()
                run.ended.set()

    def close(self) -> None:
        """The kubelet stopped: every follow ends."""
        for run in self.runs.values():
            if run.finished is None:
                run.finished = time.time()
            run.ended.set()

    def drop_pod(self, uid: str) -> None:
        for cid in self.by_pod.pop(uid, ()):
            run = self.runs.pop(cid, None)
            if run is not None and run.finished is None:
                run.finished = time.time()
                run.ended.set()


def stamp(when: float) -> bytes:
    """The kubelet's timestamp prefix: RFC 3339 with nine fraction digits, UTC."""
    whole = int(when)
    nanos = round((when - whole) * 1e9)
    if nanos >= 1_000_000_000:
        whole, nanos = whole + 1, nanos - 1_000_000_000
    return (datetime.fromtimestamp(whole, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{nanos:09d}Z").encode()


def _positive(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if value > 0 else None
