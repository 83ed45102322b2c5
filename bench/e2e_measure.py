"""Pure helpers of ``bench/e2e_bench.py``: percentiles, the per-stage table, CPU-ms per job, py-spy tops.

Nothing here starts a process or talks to a cluster, so ``tests/test_bench_measure.py`` checks it fast.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson


def pct(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by nearest rank (ceil(q * n)); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[min(len(ordered), rank) - 1]


STAGES: tuple[tuple[str, str], ...] = (
    ("created", "created on the manager (bench: create call returned)"),
    ("claimed", "claimed (dispatcher event 'claimed')"),
    ("placed", "placed (dispatcher event 'placed')"),
    ("queued", "Place queued (outbox.created_at)"),
    ("published", "Place published (outbox.sent_at)"),
    ("accepted_sent", "Accepted sealed by the agent (seal t; not sent when the Status took its place)"),
    ("accepted", "accepted (placements.accepted_at)"),
    ("worker_running", "Running on the worker (bench watch)"),
    ("running_sent", "Status with startTime sealed by the agent (seal t)"),
    ("reported", "first Report with startTime (dispatcher event 'running')"),
    ("mirrored", "Running mirrored on the manager (bench watch)"),
)
"""(key, meaning) in the order a job passes them; every time is wall-clock seconds (time.time())."""


AGENT_STAGES = frozenset({"accepted_sent", "worker_running", "running_sent"})
"""The stages only ``e2e_bench --agent-stages`` observes (the worker watches and the Report tap)."""


REPORT_STAGES = {"accepted": "accepted_sent", "status": "running_sent"}
"""Report type -> the stage its first sealing marks (a Status only once it carries ``startTime``)."""


def report_stamps(payload: bytes, into: dict[str, dict[str, float]]) -> None:
    """Record, per workload uid, when the agent sealed its first Accepted and first Status with startTime.

    ``payload`` is one message from a ``<root>/+/reports`` topic, as the broker delivered it: JSON with
    the seal (``federation.signing``) as its last member, whose ``t`` is the sealing time in unix ms on
    the agent's clock. The Reports are found wherever they sit in the message (one Report, or several
    carried together), so the tap needs no change when the wire groups Reports.
    """
    try:
        message = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return
    if not isinstance(message, dict) or not isinstance(message.get("seal"), dict):
        return
    sealed = message["seal"].get("t")
    if not isinstance(sealed, int):
        return
    for report in _reports(message):
        stage = REPORT_STAGES.get(report.get("type", ""))
        placement = report.get("placement")
        if stage is None or not isinstance(placement, dict):
            continue
        if stage == "running_sent" and not (report.get("status") or {}).get("startTime"):
            continue
        into.setdefault(stage, {}).setdefault(str(placement.get("workload_uid")), sealed / 1000)


def _reports(node: Any) -> Iterable[dict[str, Any]]:
    if isinstance(node, dict):
        if "type" in node and "placement" in node:
            yield node
            return
        for value in node.values():
            yield from _reports(value)
    elif isinstance(node, list):
        for value in node:
            yield from _reports(value)


def stage_table(stamps: Mapping[str, Mapping[str, float]], stages: Sequence[tuple[str, str]] = STAGES) -> list[str]:
    """Per stage: how many jobs have it, p50/p99 since ``created`` and p50/p99 of the step from the stage before.

    ``stamps`` maps stage key -> job -> time. A step is measured only over jobs that have both stages;
    a negative step (the stages are recorded by different processes, and the 'running' event can come
    before the bench's watch sees Running) is kept as it is, so the table shows the overlap.
    """
    created = stamps.get(stages[0][0], {})
    out = [f"  {'stage':<58} {'jobs':>5}  {'since created p50':>17} {'p99':>8}  {'step p50':>9} {'p99':>8}"]
    previous: Mapping[str, float] | None = None
    for key, meaning in stages:
        at = stamps.get(key, {})
        since = [t - created[j] for j, t in at.items() if j in created]
        step = [t - previous[j] for j, t in at.items() if j in previous] if previous is not None else []
        out.append(f"  {meaning:<58} {len(at):>5}  {_ms(pct(since, 0.5)):>17} {_ms(pct(since, 0.99)):>8}"
                   f"  {_ms(pct(step, 0.5)):>9} {_ms(pct(step, 0.99)):>8}")
        if at:
            previous = at
    return out


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.0f} ms"


def cpu_lines(used: Mapping[str, float], jobs: int, wall: float, *, federation: Iterable[str]) -> list[str]:
    """CPU seconds and CPU-ms per job for each process, the total, and the federation's own sum."""
    fed = set(federation)
    out = [f"    {'process':<44} {'CPU s':>7} {'ms/job':>8}"]
    for name, seconds in sorted(used.items(), key=lambda kv: -kv[1]):
        out.append(f"    {name:<44} {seconds:>7.2f} {seconds * 1000 / max(jobs, 1):>8.2f}")
    total = sum(used.values())
    own = sum(v for k, v in used.items() if k in fed)
    out.append(f"    {'total':<44} {total:>7.2f} {total * 1000 / max(jobs, 1):>8.2f}"
               f"   ({wall:.1f} s wall x 2 cores = {2 * wall:.0f} CPU-s offered)")
    out.append(f"    {'dispatcher + agents':<44} {own:>7.2f} {own * 1000 / max(jobs, 1):>8.2f}   (goal <= 8 ms/job)")
    return out


def collapsed_top(path: Path, top: int = 20) -> list[tuple[str, int, int]]:
    """py-spy ``--format raw`` (collapsed stacks, ``frame;frame;... count``): the ``top`` frames by own samples.

    Returns (frame, own samples, samples where it is anywhere on the stack), most own samples first.
    """
    own: Counter[str] = Counter()
    anywhere: Counter[str] = Counter()
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        own[frames[-1]] += int(count)
        for frame in set(frames):
            anywhere[frame] += int(count)
    return [(frame, n, anywhere[frame]) for frame, n in own.most_common(top)]


POSTGRES = "postgresql (this run's backends)"
"""The CPU table's row of the PostgreSQL backends of a run (``e2e_bench.py`` tracks them by their pids)."""

PAIR_FIGURES: tuple[tuple[str, str, int], ...] = (
    ("e2e_rate", "end to end, jobs/s", 1),
    ("total_ms_per_job", "CPU-ms/job, every process", -1),
    ("dispatcher_agents_ms_per_job", "CPU-ms/job, dispatcher + agents", -1),
    ("dispatcher", "CPU-ms/job, dispatcher", -1),
    (POSTGRES, "CPU-ms/job, PostgreSQL", -1),
)
"""What ``pair_table`` compares: a figure of ``e2e_bench``'s ``--json`` (or a process of its ``cpu_ms_per_job``),
its label, and which way is better (1: higher, -1: lower)."""


def _figure(run: Mapping[str, Any], key: str) -> float:
    value = run.get(key)
    if value is None:
        value = (run.get("cpu_ms_per_job") or {}).get(key)
    return float("nan") if value is None else float(value)


def pair_table(pairs: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]], names: tuple[str, str] = ("A", "B")
               ) -> list[str]:
    """Runs made two at a time (A and B together on the same cores), compared pair by pair: each figure of A and
    of B, B's change against A in percent, and over all pairs the mean change and in how many B was better.

    Run together, both see the same machine at the same moment, so a change of a few percent shows that
    solo runs minutes apart hide (bench/RESULTS.md); every figure is for two
    federations sharing the cores, about half a solo run's rate."""
    a_name, b_name = names
    out = [f"  {'figure':<34} {'pair':>4} {a_name:>10} {b_name:>10} {'change':>8}"]
    for key, label, better in PAIR_FIGURES:
        if all(math.isnan(_figure(run, key)) for pair in pairs for run in pair):
            continue  # a figure no run has (a process not measured there)
        changes: list[float] = []
        for i, (a, b) in enumerate(pairs, 1):
            x, y = _figure(a, key), _figure(b, key)
            change = (y - x) / x * 100 if x and not math.isnan(x) and not math.isnan(y) else float("nan")
            if not math.isnan(change):
                changes.append(change)
            out.append(f"  {label:<34} {i:>4} {x:>10.2f} {y:>10.2f} {change:>+7.1f}%")
        if changes:
            wins = sum(1 for c in changes if c * better > 0)
            out.append(f"  {label:<34} {'mean':>4} {'':>10} {'':>10} {sum(changes) / len(changes):>+7.1f}%"
                       f"   ({b_name} better in {wins} of {len(changes)})")
    incomplete = [f"{name} in pair {i}" for i, pair in enumerate(pairs, 1) for name, run in zip(names, pair, strict=True)
                  if not run.get("complete", True)]
    if incomplete:
        out.append(f"  INCOMPLETE runs (jobs not seen Running on the manager in time): {', '.join(incomplete)}")
    return out
