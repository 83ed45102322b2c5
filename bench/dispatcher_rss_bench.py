"""Dispatcher memory: resident set size (RSS) of a dispatcher that knows N Workloads (≤ 300 MB at 100,000).

Set-up: kubesim (the manager cluster), the Job creator and three fake agents (``bench/dispatch_bench.py``'s:
they accept every Place at once and announce what is left free) each in their own process; the dispatcher runs
in a process of its own, started the way ``mkctl dispatcher`` starts it (``dispatcher.app.Dispatcher``
entered, then ``run(stop)`` until SIGTERM) with a reporter task beside it. The agents' CPUs fit ``--placed``
of the Jobs; the rest stay pending in their queue, so the dispatcher knows both kinds (pending Workloads are
the larger part of its state per Workload: their queue entries and needs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import multiprocessing
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.dispatch_bench import CLUSTERS, KEYS, creator_main, environment  # noqa: E402

GOAL_MB = 300.0
"""Dispatcher RSS at 100,000 Workloads known."""
TRACE_TOP = 40
TRACE_FRAMES = int(os.environ.get("RSS_BENCH_TRACE_FRAMES", "1"))
"""With --tracemalloc: frames kept per allocation; above 1 the top tracebacks are printed too."""


# --- the dispatcher (own process) --------------------------------------------------------------


def status_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak) of a process, in KiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


def holders(d: Any) -> list[tuple[str, float, int]]:
    """Who holds the dispatcher's memory: the bytes (MB) and objects reachable from each of the engine's,
    the kube writer's and the queueing state's attributes, then the rest of the dispatcher; an object is
    counted once, with the first holder that reaches it (code, types and modules are left out: imports)."""
    import collections
    import gc
    import types

    skip = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.CodeType)
    seen: set[int] = set()
    kinds: collections.Counter[tuple[str, int]] = collections.Counter()

    def size(root: Any) -> tuple[float, int]:
        total, count, todo = 0, 0, [root]
        while todo:
            o = todo.pop()
            if id(o) in seen or isinstance(o, skip):
                continue
            seen.add(id(o))
            n = sys.getsizeof(o)
            kinds[(type(o).__name__, -(-n // 16) * 16)] += 1
            total += n
            count += 1
            todo.extend(gc.get_referents(o))
        return total / 1e6, count

    roots: list[tuple[str, Any]] = []
    q = d.engine.queueing
    roots += [(f"queues.{k}", v) for k, v in vars(q.queues).items()]
    roots += [(f"queueing.{k}", v) for k, v in vars(q).items() if k != "queues"]
    roots += [(f"writer.{k}", v) for k, v in vars(d.writer).items()]
    roots += [(f"engine.{k}", v) for k, v in vars(d.engine).items() if k not in ("queueing", "writer")]
    roots += [("dispatcher (the rest)", d)]
    out = [(name, *size(obj)) for name, obj in roots]
    print("by type and size", kinds.most_common(30), file=sys.stderr)
    return sorted((o for o in out if o[1] >= 0.2), key=lambda o: -o[1])


def census(top: int) -> list[tuple[str, int]]:
    """The most common types among the objects the garbage collector tracks (tuples by length)."""
    import collections
    import gc

    counts: collections.Counter[str] = collections.Counter()
    for o in gc.get_objects():
        name = type(o).__name__
        counts[f"{name}{len(o) if name == 'tuple' else ''}"] += 1
    return counts.most_common(top)


async def _dispatcher(settings_json: str, conn: Any, trace: bool) -> None:
    from dispatcher.app import Dispatcher
    from dispatcher.settings import DispatcherSettings

    if trace:
        import tracemalloc
        tracemalloc.start(TRACE_FRAMES)
    settings = DispatcherSettings.model_validate_json(settings_json)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with Dispatcher(settings) as d:  # what dispatcher.app.run does for ``mkctl dispatcher``
        assert d.engine is not None and d.intake is not None and d.writer is not None
        engine, intake, writer = d.engine, d.intake, d.writer

        async def report() -> None:
            reports = 0
            while True:
                await asyncio.sleep(1.0)
                conn.send({"known": len(engine.known), "cache": len(engine.cache),
                           "pending": len(engine.queueing.queues.entries), "inbox": engine.inbox.qsize(),
                           "unpublished": len(engine.fresh),  # Commands committed, waiting for the publisher
                           "writes": writer.backlog, "rss": status_kib(os.getpid())["VmRSS"] // 1024,
                           "listed": intake.ready.is_set(), "started": d.startup.done})
                reports += 1
                if os.environ.get("RSS_BENCH_CENSUS") and reports % 10 == 0:  # what the burst holds, every 10 s
                    import collections
                    import tracemalloc
                    if tracemalloc.is_tracing():
                        snap = tracemalloc.take_snapshot()
                        by_line: collections.Counter[str] = collections.Counter()
                        by_line64: collections.Counter[str] = collections.Counter()
                        for tr in snap.traces:
                            f = tr.traceback[0]
                            where = f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno}"
                            by_line[where] += tr.size
                            if 48 < tr.size <= 64:
                                by_line64[where] += 1
                        print("burst lines", [(w, round(n / 1e6, 1)) for w, n in by_line.most_common(15)],
                              file=sys.stderr, flush=True)
                        print("burst 64-byte blocks", by_line64.most_common(15), file=sys.stderr, flush=True)
                        del snap
                    print("burst census", status_kib(os.getpid())["VmRSS"] // 1024, engine.inbox.qsize(),
                          len(engine.fresh), len(engine.unanswered), writer.backlog, census(14),
                          file=sys.stderr, flush=True)
                if conn.poll():
                    if conn.recv() == "trim":  # what glibc would give back now (--probe-trim)
                        import ctypes
                        before = status_kib(os.getpid())["VmRSS"]
                        if os.environ.get("RSS_BENCH_MALLOCSTATS"):
                            ctypes.CDLL("libc.so.6").malloc_stats()
                        ctypes.CDLL("libc.so.6").malloc_trim(0)
                        if os.environ.get("RSS_BENCH_MALLOCSTATS"):
                            sys._debugmallocstats()
                            ctypes.CDLL("libc.so.6").malloc_stats()
                            print("census", census(25), file=sys.stderr, flush=True)
                            print("holders", holders(d), file=sys.stderr, flush=True)
                        conn.send({"trimmed": (before, status_kib(os.getpid())["VmRSS"])})
                    elif trace:
                        import tracemalloc
                        snap = tracemalloc.take_snapshot()
                        stats = snap.statistics("lineno")
                        total = sum(s.size for s in stats)
                        lines = [f"total traced {total / 1e6:.1f} MB in {sum(s.count for s in stats):,} blocks",
                                 *(str(s) for s in stats[:TRACE_TOP])]
                        if TRACE_FRAMES > 1:  # where the largest lines were called from
                            for st in snap.statistics("traceback")[:TRACE_TOP // 2]:
                                lines += [f"{st.size / 1024:.0f} KiB in {st.count} blocks from:",
                                          *(f"      {f.filename}:{f.lineno}" for f in st.traceback)]
                        conn.send({"trace": lines})
        reporter = asyncio.create_task(report())
        try:
            await d.run(stop)
        finally:
            reporter.cancel()


def dispatcher_main(settings_json: str, conn: Any, trace: bool) -> None:
    from dispatcher.app import Dispatcher  # noqa: F401  (imported before the freeze, as mkctl's runner has it)
    from federation import gctune

    gctune.tune()  # the collector's settings mkctl's service runner gives the dispatcher
    asyncio.run(_dispatcher(settings_json, conn, trace))


class Running:
    """A dispatcher process and the last state it reported."""

    def __init__(self, settings_json: str, trace: bool = False) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=dispatcher_main, args=(settings_json, child, trace), daemon=True)
        self.proc.start()
        self.state: dict[str, Any] = {}

    def poll(self, wait: float) -> dict[str, Any]:
        deadline = time.monotonic() + wait
        while self.conn.poll(max(0.0, deadline - time.monotonic())):
            msg = self.conn.recv()
            if "trace" in msg or "trimmed" in msg:
                return msg  # type: ignore[no-any-return]
            self.state = msg
        return self.state

    def settle(self, n: int, timeout: float, what: str) -> None:
        """Wait until the dispatcher knows ``n`` Workloads, has listed the manager, its inbox is (nearly)
        empty, the Commands it committed are published (a Place waits in memory while the agents'
        unanswered-Place budget is spent) and the number of pending Workloads has not changed, five
        reports in a row, and then the kube writer's backlog too: its steady state."""
        deadline, calm, last_print, pending = time.monotonic() + timeout, 0, 0.0, -1
        engine_calm, writing = 0, True
        while time.monotonic() < deadline:
            if not self.proc.is_alive():
                raise RuntimeError(f"the dispatcher exited ({self.proc.exitcode}) while {what}")
            s = self.poll(1.5)
            done = (s.get("started") and s.get("listed") and s.get("known", 0) >= n
                    and s.get("inbox", 1000) <= 50 and s.get("unpublished", 1000) <= 50  # heartbeats, late answers
                    and s.get("pending") == pending)
            pending = s.get("pending", -1)
            engine_calm = engine_calm + 1 if done else 0
            if engine_calm >= 5 and writing and n and self.proc.pid is not None:
                writing = False  # what the benchmark measured before it waited for the kube writer too
                kib = status_kib(self.proc.pid)
                print(f"  engine idle (kube writer backlog {s.get('writes')}): RSS {mb(kib['VmRSS']):.0f} MB, "
                      f"peak {mb(kib['VmHWM']):.0f} MB", flush=True)
            calm = calm + 1 if done and s.get("writes", 1000) <= 50 else 0  # the writes to the manager Jobs too
            if calm >= 5:
                return
            if time.monotonic() - last_print > 15:
                last_print = time.monotonic()
                print(f"  ... {what}: {s}", flush=True)
        raise RuntimeError(f"not settled after {timeout:.0f}s while {what}: {self.state}")

    def print_trace(self, label: str) -> None:
        self.conn.send("trace")
        for _ in range(30):
            msg = self.poll(2.0)
            if "trace" in msg:
                print(f"  tracemalloc, top {TRACE_TOP} lines by memory held ({label} dispatcher):")
                for line in msg["trace"]:
                    print(f"    {line}")
                return

    def probe_trim(self) -> None:
        self.conn.send("trim")
        for _ in range(30):
            msg = self.poll(2.0)
            if "trimmed" in msg:
                before, after = msg["trimmed"]
                print(f"    probe: glibc malloc_trim(0) took RSS from {mb(before):.0f} to {mb(after):.0f} MB", flush=True)
                return

    def stop(self) -> None:
        if self.proc.is_alive() and self.proc.pid is not None:
            os.kill(self.proc.pid, signal.SIGTERM)
        self.proc.join(60)
        if self.proc.is_alive():
            self.proc.kill()


# --- the run ------------------------------------------------------------------------------------


def mb(kib: int) -> float:
    return kib * 1024 / 1e6


WINDOW_SECONDS = 30.0
"""How long the steady state is watched after it is reached: the RSS of an idle dispatcher moves (glibc's
free heap grows between the ``memory`` task's trims), so the goal is judged on the window's highest reading."""


def show(label: str, pid: int, state: dict[str, Any], n: int, empty_kib: int) -> dict[str, int]:
    """Print RSS and peak, the bytes per Workload over the empty dispatcher's RSS and, for a run of
    another size, the RSS that rate gives at 100,000 (a projection, said as such). The RSS is read every
    0.5 s for ``WINDOW_SECONDS`` of the steady state; the figure is the highest reading (the first and the
    lowest are printed beside it)."""
    first = status_kib(pid)["VmRSS"]
    readings = [first]
    end = time.monotonic() + WINDOW_SECONDS
    while time.monotonic() < end:
        time.sleep(0.5)
        readings.append(status_kib(pid)["VmRSS"])
    kib = {**status_kib(pid), "VmRSS": max(readings)}
    print(f"  {label}, steady state watched {WINDOW_SECONDS:.0f}s: RSS first {mb(first):.0f} MB, "
          f"lowest {mb(min(readings)):.0f} MB, highest {mb(max(readings)):.0f} MB (the figure below)", flush=True)
    rss = mb(kib["VmRSS"])
    per = (kib["VmRSS"] - empty_kib) * 1024 / max(1, n)
    at_goal = rss if n == 100_000 else mb(empty_kib) + per * 100_000 / 1e6
    verdict = "meets" if at_goal <= GOAL_MB else "MISSES"
    print(f"  {label}: RSS {rss:.0f} MB ({kib['VmRSS'] / 1024:.0f} MiB), peak {mb(kib['VmHWM']):.0f} MB; "
          f"{state.get('known')} Workloads known, {state.get('pending')} pending; "
          f"{per:.0f} bytes per Workload over the empty dispatcher's {mb(empty_kib):.0f} MB", flush=True)
    print(f"    goal RSS <= {GOAL_MB:.0f} MB at 100,000 Workloads known: {verdict} the goal"
          + ("" if n == 100_000 else f" (projected: {at_goal:.0f} MB at 100,000 from this run of {n:,})"),
          flush=True)
    return kib


PHASES = (("claimed", "the dispatcher that claimed them", "claiming"),
          ("restarted", "rebuilt from SQL, every Job listed", "restarting"))


def run(n: int, placed_fraction: float, use_postgres: bool, trace: bool, concurrency: int,
        probe_trim: bool = False) -> dict[str, Any]:
    from dispatcher.settings import DispatcherSettings

    load = os.getloadavg()
    placed = int(n * placed_fraction)
    cpu = 2 * -(-placed // len(CLUSTERS))  # each cluster fits a third of the placed Jobs (2 CPUs each)
    placed = min(n, cpu // 2 * len(CLUSTERS))
    result: dict[str, Any] = {"n": n, "placed": placed, "load_before": load}
    creator: Any = None
    dispatcher: Running | None = None
    with environment(use_postgres=use_postgres, need_mosquitto=True, agents_cpu=cpu) as env:
        try:
            settings = json.dumps({  # plain values: a dump of the settings would mask the private key
                "kube": {"kubeconfig": str(env.kubeconfig)}, "database_url": env.db_url,
                "mqtt": {"url": env.mqtt_url, "topic_root": env.root, "client_id": f"rss-bench-{uuid.uuid4().hex[:6]}"},
                "signing": {"private_key": KEYS["dispatcher"][0]},
                "cluster_public_keys": {c: KEYS[c][1] for c in CLUSTERS}})
            DispatcherSettings.model_validate_json(settings)  # a mistake shows here, not in the child
            print(f"dispatcher_rss_bench: N={n:,} ({placed:,} fit the agents, the rest stay pending); "
                  f"{'; '.join(env.notes)}; {os.cpu_count()} cores; load average {load[0]:.1f} {load[1]:.1f} "
                  f"{load[2]:.1f}", flush=True)
            empty = 0
            for phase, label, doing in PHASES:
                t0 = time.monotonic()
                dispatcher = Running(settings, trace)
                if phase == "claimed":  # a dispatcher knowing nothing, then the Jobs are created
                    dispatcher.settle(0, 120, "starting")
                    assert dispatcher.proc.pid is not None
                    empty = result["empty_kib"] = status_kib(dispatcher.proc.pid)["VmRSS"]
                    print(f"  started, knowing nothing: RSS {mb(empty):.0f} MB", flush=True)
                    go, results = env.ctx.Event(), env.ctx.Queue()
                    creator = env.ctx.Process(target=creator_main, daemon=True,
                                              args=(str(env.kubeconfig), n, concurrency, 0.0, go, results))
                    creator.start()
                    t0 = time.monotonic()
                    go.set()
                dispatcher.settle(n, max(600.0, n / 20), doing)
                result[f"{phase}_s"] = time.monotonic() - t0
                print(f"  {phase} {n:,} Jobs in {result[f'{phase}_s']:.0f}s", flush=True)
                assert dispatcher.proc.pid is not None
                result[phase] = show(f"{phase} ({label})", dispatcher.proc.pid, dispatcher.state, n, empty)
                if trace:
                    dispatcher.print_trace(phase)
                if probe_trim:
                    dispatcher.probe_trim()
                dispatcher.stop()  # the next phase: a new dispatcher on the same database and manager
                dispatcher = None
        finally:
            if dispatcher is not None:
                dispatcher.stop()
            with contextlib.suppress(Exception):
                creator.terminate()
    return result


def main(argv: list[str] | None = None) -> int:
    """Two figures, both read from ``/proc/PID/status`` (VmRSS now, VmHWM the peak):

    1. **claimed**: the dispatcher that claimed every Job from the manager cluster as it was created,
       placed what fits and holds the rest pending, once it knows all N and is idle;
    2. **restarted**: that dispatcher stopped and a new one started against the same database and
       manager cluster: it rebuilds its view from SQL and lists every Job from the manager (what a
       dispatcher does after every upgrade or failover), measured once its intake has listed
       everything and its engine is idle. Its peak includes the start-up listing.

    Both figures are taken in the dispatcher's steady state: inbox drained, every committed Command
    published (a Place waits in memory, sealed, while the agents' unanswered-Place budget is spent) and
    the kube writer's backlog written (after 100,000 claims it writes the manager Jobs' conditions and
    Events for minutes: ~35,000 Jobs' work waited in memory when the engine was idle); the RSS when the
    engine alone was idle is printed too (what this benchmark measured before). The steady state is then
    watched for 30 s (RSS read every 0.5 s) and each figure is its highest reading: an idle dispatcher's RSS
    moves by tens of MB as glibc's free heap grows between the ``memory`` task's trims, so one reading would
    depend on the moment it was taken.
    ``--probe-trim`` then calls glibc's ``malloc_trim(0)`` in it and prints the RSS after (the dispatcher's
    ``memory`` task does the same every 30 s and once a burst has drained); with ``RSS_BENCH_MALLOCSTATS=1``
    also CPython's and glibc's allocator statistics, a census of the objects the garbage collector tracks and
    who holds what (the bytes reachable from each of the engine's, the kube writer's and the queueing state's
    attributes, and the objects by type and size; on its stderr). ``RSS_BENCH_CENSUS=1`` prints every 10 s
    what the dispatcher holds during the burst (the work waiting, the tracked objects; with ``--tracemalloc``
    the lines that allocated the most and the 64-byte blocks' lines).

    With ``--tracemalloc`` both dispatchers trace their allocations and print the top lines (tracing
    costs memory and time itself: the RSS figures of such a run are not the ones to record). A run of
    another size than 100,000 also prints the RSS its bytes per Workload project at 100,000.

        .venv/bin/python bench/dispatcher_rss_bench.py -n 100000
        .venv/bin/python bench/dispatcher_rss_bench.py -n 2000 --tracemalloc
    """
    p = argparse.ArgumentParser(description=f"{__doc__}\n{inspect.cleandoc(main.__doc__ or '')}", formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", type=int, default=100_000, help="PyTorchJobs (Workloads) the dispatcher comes to know")
    p.add_argument("--placed", type=float, default=0.5, help="the fraction of Jobs the agents' capacity fits")
    p.add_argument("--sqlite", action="store_true", help="use SQLite even when PostgreSQL is reachable")
    p.add_argument("--tracemalloc", action="store_true", help="print where the restarted dispatcher's memory is")
    p.add_argument("--probe-trim", action="store_true",
                   help="after each figure, call glibc's malloc_trim(0) in the dispatcher and print the RSS after")
    p.add_argument("--concurrency", type=int, default=32, help="creations in flight")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: still stop the processes, drop the database
    run(args.n, args.placed, not args.sqlite, args.tracemalloc, args.concurrency, args.probe_trim)
    return 0


if __name__ == "__main__":
    sys.exit(main())
