"""``python -m bench.chaos``: run chaos scenarios, print their figures and a summary table.

    .venv/bin/python -m bench.chaos                                # every scenario, 300 jobs each
    .venv/bin/python -m bench.chaos dispatcher-kill -n 5000 --kills 20 --rate 20
    .venv/bin/python -m bench.chaos --write-results --label after  # figures into bench/RESULTS.md

Each scenario starts its own federation of separate processes in ``--root`` (logs in
``<root>/<scenario>/logs``, kept after the run) and counts from the clusters and the database.
The exit code is 1 when any scenario lost, ran twice or left stuck a job.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.chaos.observe import Figures
from bench.chaos.procs import REPO
from bench.chaos.scenarios import SCENARIOS, Size, run_scenario


def figure_lines(f: Figures, size: Size) -> list[str]:
    out = [f"scenario {f.scenario}: {f.submitted} jobs at {size.rate:g}/s, pods run {size.run_seconds:g}s; "
           f"{len(f.faults)} faults; wall {f.wall:.0f}s",
           f"  submitted {f.submitted}  succeeded {f.done}  LOST {f.lost}  RUN TWICE AT ONCE {f.twice}  STUCK {f.stuck}"
           f"  crashes {f.crashes}",
           "  recovery (last fault end -> every job Succeeded on the manager): "
           + (f"{f.recovery:.1f}s" if f.recovery is not None else f"NOT within the deadline ({size.deadline:.0f}s)")]
    if f.stalls:
        ordered = sorted(f.stalls)
        out.append(f"  after each fault, first completion on the manager within: median {ordered[len(ordered) // 2]:.1f}s, "
                   f"max {ordered[-1]:.1f}s")
    if f.categories:
        out.append("  not Succeeded at the deadline (or Succeeded untruly): " + ", ".join(f"{k} {v}" for k, v in sorted(f.categories.items())))
        for k, ex in sorted(f.examples.items()):
            out += [f"    {k}: {e}" for e in ex]
    if f.twice:
        out.append(f"  run twice at once: {f.twice_pods} with pods Running on two clusters, "
                   f"{f.twice - f.twice_pods} with live (unfinished, unsuspended) copies on two clusters only")
    out.append(f"  re-placed (copies on >1 worker one after the other) {f.replaced}; "
               f"brief unconfirmed overlaps in the watch streams {f.brief}")
    out += [f"  twice: {d}" for d in f.twice_detail]
    out.append("  faults: " + "; ".join(f.faults) if f.faults else "  faults: none")
    out += [f"  note: {n}" for n in f.notes]
    return out


def summary(rows: list[tuple[Figures, Size]]) -> list[str]:
    out = ["| scenario | jobs | faults | lost | run twice (pods) | stuck | crashes | recovery | max stall | wall |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for f, _ in rows:
        rec = f"{f.recovery:.1f} s" if f.recovery is not None else "not by deadline"
        stall = f"{max(f.stalls):.1f} s" if f.stalls else "-"
        out.append(f"| {f.scenario} | {f.submitted} | {len(f.faults)} | {f.lost} | {f.twice} ({f.twice_pods}) | {f.stuck} | {f.crashes} | {rec} | "
                   f"{stall} | {f.wall:.0f} s |")
    return out


def machine() -> str:
    cpu = platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem = f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB"
    except (OSError, ValueError):
        mem = "?"
    return f"{os.cpu_count()} cores ({cpu}), {mem}, Python {platform.python_version()}"


def commit() -> str:
    """The checkout measured: HEAD, and the newest commit that touched the services' code."""
    stamp = REPO / ".chaos-commit"  # an export (git archive) measured while the worktree moves on
    if not (REPO / ".git").exists() and stamp.exists():
        return "export of " + stamp.read_text().strip()

    def last(*paths: str) -> str:
        done = subprocess.run(["git", "log", "-1", "--format=%h %s", "--", *paths], cwd=REPO, capture_output=True,
                              text=True, check=False)
        return done.stdout.strip()[:100] or "unknown"
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "dispatcher", "worker_agent", "federation"],
                           cwd=REPO, capture_output=True, text=True, check=False).stdout.strip()
    return (f"HEAD {last()}; services' code at {last('dispatcher', 'worker_agent', 'federation', 'migrations')}"
            + (" (with uncommitted changes)" if dirty else ""))


def write_results(path: Path, label: str, header: list[str], rows: list[tuple[Figures, Size]],
                  details: list[str]) -> None:
    begin, end = f"<!-- chaos:{label} -->", f"<!-- /chaos:{label} -->"
    body = [begin, f"### Chaos suite, {label} (`python -m bench.chaos`)", "", *header, "", *summary(rows), "",
            "<details><summary>per-scenario figures</summary>", "", "```", *details, "```", "", "</details>", end]
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmark results\n"
    if begin in text and end in text:
        head, _, rest = text.partition(begin)
        text = head + "\n".join(body) + rest.partition(end)[2]
    else:
        text = text.rstrip() + "\n\n" + "\n".join(body) + "\n"
    path.write_text(text, encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenarios", nargs="*", help=f"any of {', '.join(SCENARIOS)} (default: all)")
    parser.add_argument("-n", "--jobs", type=int, default=300)
    parser.add_argument("--rate", type=float, default=10.0, help="jobs created per second")
    parser.add_argument("--run-seconds", type=float, default=3.0, help="how long each job's pods run")
    parser.add_argument("--kills", type=int, default=5, help="dispatcher-kill: kill -9s during the stream")
    parser.add_argument("--outage", type=float, default=15.0, help="postgres-outage: first outage (the second is 2x)")
    parser.add_argument("--outages", type=int, default=2, help="postgres-outage: how many outages")
    parser.add_argument("--failover-down", type=float, default=15.0,
                        help="failover: seconds each dispatcher stays killed")
    parser.add_argument("--deadline", type=float, default=120.0,
                        help="seconds after the last fault by which every job must be Succeeded")
    parser.add_argument("--dispatcher-set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a dispatcher setting in every scenario (e.g. lease_seconds=20)")
    parser.add_argument("--bridge", action="store_true",
                        help="the agents on a Mosquitto of their own, bridged (QoS 1) to the dispatchers' "
                             "(docs/SCALING.md); a broker restart alternates between the two")
    parser.add_argument("--root", type=Path, help="where the federations live (default: a temp dir, kept)")
    parser.add_argument("--write-results", action="store_true", help="write the figures into bench/RESULTS.md")
    parser.add_argument("--label", default="latest", help="section of RESULTS.md to write (e.g. before, after)")
    parser.add_argument("--results", type=Path, default=REPO / "bench" / "RESULTS.md",
                        help="the file --write-results updates (e.g. the worktree's, when measuring an export)")
    args = parser.parse_args()
    # SIGTERM unwinds like ^C, so every World stops its processes (they run in sessions of their own).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    names = args.scenarios or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    logging.getLogger("federation.kube").setLevel(logging.ERROR)
    root = args.root or Path(tempfile.mkdtemp(prefix="mkd-chaos-"))
    size = Size(jobs=args.jobs, rate=args.rate, run_seconds=args.run_seconds, kills=args.kills, outage=args.outage,
                outages=args.outages, failover_down=args.failover_down, deadline=args.deadline,
                bridge=args.bridge)
    header = [f"Date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine {machine()}; "
              f"load average at start {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}; "
              f"measured: {commit()}; {args.jobs} jobs per scenario at {args.rate:g}/s, pods run "
              f"{args.run_seconds:g}s, deadline {args.deadline:.0f}s after the last fault"
              f"{'; agents on a Mosquitto bridged to the dispatchers' if args.bridge else ''}."]
    print(header[0], flush=True)
    rows: list[tuple[Figures, Size]] = []
    details: list[str] = []
    errors = 0
    for name in names:
        scenario = SCENARIOS[name]
        if args.dispatcher_set:
            extra = dict(kv.split("=", 1) for kv in args.dispatcher_set)
            scenario = dataclasses.replace(scenario, dispatcher={**scenario.dispatcher, **extra},
                                           small_dispatcher=None)
            if name == names[0]:
                header.append(f"Dispatcher settings overridden: {extra}.")
        if (why := scenario.skip_reason()) is not None:
            print(f"scenario {name}: SKIPPED ({why})", flush=True)
            details.append(f"scenario {name}: SKIPPED ({why})")
            continue
        print(f"scenario {name}: {scenario.title} (logs in {root / name / 'logs'})", flush=True)
        try:
            figures = asyncio.run(run_scenario(scenario, size, root / name))
        except Exception as exc:
            line = f"scenario {name}: ERROR {type(exc).__name__}: {exc}"
            print(line, flush=True)
            details.append(line)
            errors += 1
            continue
        s = Size(**{**size.__dict__, "run_seconds": scenario.run_seconds_for(size)})
        lines = figure_lines(figures, s)
        print("\n".join(lines), flush=True)
        details += [*lines, ""]
        rows.append((figures, s))
    header.append(f"Load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}.")
    print("\n" + "\n".join(summary(rows)), flush=True)
    if args.write_results:
        write_results(args.results, args.label, header, rows, details)
        print(f"written to {args.results} (section chaos:{args.label})")
    bad = any(f.lost or f.twice or f.stuck for f, _ in rows) or errors > 0
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
