"""PostgreSQL at fleet size: the admin API's reads, the engine's start-up reads and history pruning on a database
holding 1,000 clusters and 1,000,000 finished Workloads, each timed and EXPLAINed.

Builds a database of its own on the machine's PostgreSQL (127.0.0.1:5432, dropped at the end unless
``--keep``) with mkd's schema (``db.upgrade``), then fills it in SQL: N clusters with heartbeat-sized
capacities (8-64 nodes, as ``bench/fleet_sim.py`` makes them), W Workloads whose Jobs ended (half of them
deleted on the manager since, the rest finished or failed), each with its placement and three history
events, plus the live ones (running and pending) a busy fleet holds. Then it times, through the same
functions the HTTP API and ``mkctl`` call (median of ``--repeat``), and EXPLAINs (ANALYZE, BUFFERS) each
statement they run:

- ``GET /api/v1/workloads`` (first page, and filtered by namespace, state, cluster), ``GET
  /api/v1/workloads/{ns}/{name}``, ``GET /api/v1/clusters``, ``GET /api/v1/events``, ``GET /api/v1/pending``;
- the engine's rebuild at start-up (every Workload whose Job may still exist, the placements holding
  capacity, the clusters' times);
- one history pruning turn with nothing past the retention, and with a month's deletions to remove.

    .venv/bin/python bench/fleet_db_bench.py --json bench/fleet_db_results.jsonl   # 1,000 clusters, 1,000,000 Workloads
    .venv/bin/python bench/fleet_db_bench.py -w 100000 --explain   # smaller, with every plan printed
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import sqlalchemy as sa  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine  # noqa: E402

from bench.dispatch_bench import ADMIN_DATABASE, drop_postgres  # noqa: E402
from bench.fleet_sim import make_nodes  # noqa: E402
from dispatcher import db, readmodel  # noqa: E402
from dispatcher.db import admin as dbadmin  # noqa: E402
from dispatcher.db import history  # noqa: E402
from dispatcher.db.models import clusters  # noqa: E402
from dispatcher.db.queries import clusters as cluster_q  # noqa: E402
from dispatcher.db.queries import placements as placement_q  # noqa: E402
from dispatcher.db.queries import workloads as workload_q  # noqa: E402
from federation import messages  # noqa: E402
from federation.clock import FakeClock  # noqa: E402


def load() -> str:
    return "load {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} {load()}] {text}", flush=True)


async def fill(url: str, n_clusters: int, n_done: int, running: int, pending: int, now: datetime) -> None:
    engine = create_async_engine(url)
    rng = random.Random(7)
    try:
        async with async_sessionmaker(engine).begin() as s:
            rows = []
            for i in range(n_clusters):
                name = f"c{i:04d}"
                nodes = make_nodes(name, rng)
                alloc = {"cpu": str(sum(int(nd.allocatable["cpu"]) for nd in nodes)), "memory": f"{256 * len(nodes)}Gi"}
                cap = messages.Capacity(allocatable=alloc, free=alloc, largest_node_free=nodes[0].free, nodes=nodes)
                rows.append({"name": name, "labels": {"zone": f"z{i % 8}"}, "capacity": cap.model_dump(),
                             "kinds": ["Job", "PyTorchJob"], "online": True, "agent_version": "bench",
                             "interval_seconds": 10.0, "last_heartbeat": now, "lost_since": None, "updated_at": now,
                             "lease_until": now + timedelta(seconds=600), "public_key": "k", "registered_at": now})
            await s.execute(sa.insert(clusters), rows)
        # Workloads in SQL: i < n_done ended (even i deleted since, else finished, every 20th failed), then
        # `running`, then `pending`; created one every 5 seconds back from now (58 days for 1,000,000), namespaces team-0..49.
        total = n_done + running + pending
        state = (f"CASE WHEN i < {n_done} THEN (CASE WHEN i % 2 = 0 THEN 'deleted' WHEN i % 20 = 1 THEN 'failed' "
                 f"ELSE 'finished' END) WHEN i < {n_done + running} THEN 'running' ELSE 'pending' END")
        async with engine.begin() as conn:
            await conn.execute(sa.text(
                "INSERT INTO workloads (uid, namespace, name, kind, api_version, queue, priority, state, reason, "
                "spec_version, generation, suspended, requests, podsets, attempt, cluster, excluded, created_at, "
                "updated_at, labels, queued_at, queue_seq, cluster_queue) "
                f"SELECT 'uid-' || i, 'team-' || (i % 50), 'job-' || i, 'PyTorchJob', 'kubeflow.org/v1', 'lq', 0, "
                f"{state}, '', 1, 1, false, '{{\"cpu\": \"8\", \"memory\": \"32Gi\"}}'::json, "
                "'[{\"name\": \"worker\", \"count\": 2, \"requests\": {\"cpu\": \"4\", \"memory\": \"16Gi\"}}]'::json, "
                f"CASE WHEN i < {n_done + running} THEN 1 ELSE 0 END, "
                f"CASE WHEN i < {n_done + running} THEN 'c' || lpad((i % {n_clusters})::text, 4, '0') END, "
                "'[]'::json, CAST(:now AS timestamptz) - make_interval(secs => (CAST(:total AS integer) - i) * 5), CAST(:now AS timestamptz) - make_interval(secs => (CAST(:total AS integer) - i) * 5) "
                "+ interval '10 minutes', json_build_object('team', 'team-' || (i % 50)), "
                "CAST(:now AS timestamptz) - make_interval(secs => (CAST(:total AS integer) - i) * 5), i, 'cq' "
                "FROM generate_series(0, CAST(:total AS integer) - 1) AS i"), {"now": now, "total": total})
            await conn.execute(sa.text(
                "INSERT INTO placements (workload_uid, attempt, cluster, epoch, state, reason, spec_version, "
                "created_at, accepted_at, finished_at) "
                "SELECT uid, 1, cluster, 1, CASE state WHEN 'deleted' THEN 'deleted' WHEN 'failed' THEN 'failed' "
                "WHEN 'running' THEN 'running' ELSE 'finished' END, 'fits: c0001 and 12 more', 1, created_at, "
                "created_at + interval '1 second', CASE WHEN state <> 'running' THEN updated_at END "
                "FROM workloads WHERE attempt = 1"))
            await conn.execute(sa.text(
                "INSERT INTO events (workload_uid, at, type, cluster, reason, message) "
                "SELECT w.uid, w.created_at + make_interval(secs => e.k), e.t, w.cluster, '', e.t || ' ' || w.name "
                "FROM workloads w, (VALUES (0, 'claimed'), (1, 'placed'), (600, 'finished')) AS e(k, t) "
                "WHERE w.attempt = 1 AND (e.t <> 'finished' OR w.state <> 'running')"))
            await conn.execute(sa.text(
                "INSERT INTO events (workload_uid, at, type, cluster, reason, message) "
                "SELECT NULL, CAST(:now AS timestamptz) - make_interval(secs => i * 60), 'cluster_lost', "
                f"'c' || lpad((i % {n_clusters})::text, 4, '0'), 'HeartbeatTimeout', 'no heartbeat for 30s' "
                "FROM generate_series(0, 20000) AS i"), {"now": now})
        async with engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.execute(sa.text("VACUUM ANALYZE"))
    finally:
        await engine.dispose()


async def fresh_database() -> tuple[str, str]:
    import uuid

    import asyncpg
    name = f"mkd_fleet_db_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(ADMIN_DATABASE)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    return f"postgresql+asyncpg://postgres@127.0.0.1:5432/{name}", name


class Capture:
    """The statements (and their parameters) a call runs, for EXPLAIN."""

    def __init__(self, engine: Any) -> None:
        self.on = False
        self.seen: list[tuple[str, Any]] = []
        sa.event.listen(engine.sync_engine, "before_cursor_execute", self._before)

    def _before(self, conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        if self.on and not statement.lstrip().upper().startswith(("EXPLAIN", "BEGIN", "COMMIT", "ROLLBACK")):
            self.seen.append((statement, parameters))


async def timed(sessions: async_sessionmaker[AsyncSession], capture: Capture, repeat: int,
                call: Callable[[AsyncSession], Awaitable[Any]]) -> tuple[float, float, list[tuple[str, Any]]]:
    times = []
    stmts: list[tuple[str, Any]] = []
    for i in range(repeat):
        capture.seen, capture.on = [], i == 0
        async with sessions() as s:
            t0 = time.perf_counter()
            await call(s)
            times.append(1000 * (time.perf_counter() - t0))
        capture.on = False
        if i == 0:
            stmts = capture.seen
    return statistics.median(times), max(times), stmts


async def explain(engine: Any, statement: str, parameters: Any) -> str:
    async with engine.connect() as conn:
        raw = await conn.get_raw_connection()
        result = await raw.driver_connection.fetch("EXPLAIN (ANALYZE, BUFFERS) " + statement, *(parameters or ()))
        await conn.rollback()
    return "\n".join(r[0] for r in result)


def plan_summary(plan: str) -> str:
    """The plan's top node, its execution time, and whether it reads a whole big table."""
    lines = plan.splitlines()
    top = lines[0].strip().split("  (")[0] if lines else ""
    total = next((ln.split(":")[1].strip() for ln in lines if ln.startswith("Execution Time")), "?")
    seq = sorted({ln.split("Seq Scan on ")[1].split()[0] for ln in lines if "Seq Scan on " in ln})
    return f"{top}; {total}" + (f"; seq scan on {', '.join(seq)}" if seq else "")


async def measure(url: str, args: argparse.Namespace, now: datetime) -> dict[str, Any]:
    engine = create_async_engine(url)
    sessions = async_sessionmaker(engine)
    capture = Capture(engine)
    out: dict[str, Any] = {}
    ns, name = "team-7", f"job-{args.workloads // 2 + 7}"
    calls: dict[str, Callable[[AsyncSession], Awaitable[Any]]] = {
        "GET /workloads (first 500, total)": lambda s: _list(s, dbadmin.WorkloadFilter()),
        "GET /workloads?namespace=team-7": lambda s: _list(s, dbadmin.WorkloadFilter(namespace=ns)),
        "GET /workloads?state=running": lambda s: _list(s, dbadmin.WorkloadFilter(state="running")),
        "GET /workloads?state=pending": lambda s: _list(s, dbadmin.WorkloadFilter(state="pending")),
        "GET /workloads?cluster=c0042": lambda s: _list(s, dbadmin.WorkloadFilter(cluster="c0042")),
        f"GET /workloads/{ns}/{name}": lambda s: readmodel.workload(s, f"{ns}/{name}", None, now),
        "GET /clusters": lambda s: readmodel.clusters(s, now),
        "GET /events (newest 500)": lambda s: readmodel.events(s),
        "GET /pending": lambda s: readmodel.pending(s),
        "rebuild: live Workloads (uid, kind, namespace)": lambda s: _live(s),
        "rebuild: placements holding capacity": lambda s: placement_q.active_placements(s),
        "rebuild: clusters": lambda s: cluster_q.cluster_times(s),
    }
    try:
        for label, call in calls.items():
            median, worst, stmts = await timed(sessions, capture, args.repeat, call)
            plans = [(st, await explain(engine, st, p)) for st, p in stmts]
            out[label] = {"median_ms": median, "max_ms": worst, "plans": [plan_summary(p) for _, p in plans]}
            say(f"{label}: median {median:.1f} ms, max {worst:.1f} ms ({len(stmts)} statements)")
            for st, plan in plans:
                print(f"    {plan_summary(plan)}  <- {' '.join(st.split())[:140]}")
                if args.explain:
                    print("      " + plan.replace("\n", "\n      "))
        # pruning: nothing past the retention (the turn every 5 minutes costs this), then a month of deletions
        for label, retention in (("prune turn, nothing to remove", 10 * 365 * 86_400.0),
                                 ("prune turn, deletions older than 30 days", 30 * 86_400.0)):
            pruner = history.HistoryPruner(sessions, FakeClock(now), retention)
            t0 = time.perf_counter()
            removed = await pruner.turn()
            ms = 1000 * (time.perf_counter() - t0)
            out[label] = {"ms": ms, "removed": removed}
            say(f"{label}: {ms:.0f} ms, {removed} Workloads removed ({1000 * removed / max(ms, 1e-9):.0f}/s)")
        async with sessions() as s:
            before = now - timedelta(days=30)
            stmt = (f"SELECT uid FROM workloads WHERE state = 'deleted' AND updated_at < '{before.isoformat()}' "
                    "AND NOT EXISTS (SELECT 1 FROM placements WHERE placements.workload_uid = workloads.uid AND "
                    "placements.state IN ('sent', 'accepted', 'running', 'suspended')) LIMIT 2000")
            plan = await explain(engine, stmt, ())
            print(f"    prune select: {plan_summary(plan)}")
            if args.explain:
                print("      " + plan.replace("\n", "\n      "))
            sizes = (await s.execute(sa.text(
                "SELECT relname, n_live_tup, pg_total_relation_size(relid) FROM pg_stat_user_tables "
                "WHERE relname IN ('workloads', 'placements', 'events', 'clusters') ORDER BY relname"))).all()
        out["tables"] = {r[0]: {"rows": int(r[1]), "mb": round(int(r[2]) / 1e6)} for r in sizes}
        say("tables after pruning: " + ", ".join(f"{k} {v['rows']:,} rows {v['mb']} MB" for k, v in out["tables"].items()))
    finally:
        await engine.dispose()
    return out


async def _list(s: AsyncSession, f: dbadmin.WorkloadFilter) -> None:
    """What ``GET /api/v1/workloads`` reads: a page of 500 and the total."""
    await readmodel.workloads(s, f, limit=500, offset=0)
    await readmodel.workload_total(s, f)


async def _live(s: AsyncSession) -> None:
    await workload_q.known_workloads(s)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", "--clusters", type=int, default=1000)
    p.add_argument("-w", "--workloads", type=int, default=1_000_000, help="Workloads whose Jobs ended")
    p.add_argument("--running", type=int, default=5000)
    p.add_argument("--pending", type=int, default=10_000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--explain", action="store_true", help="print every plan in full")
    p.add_argument("--keep", action="store_true", help="keep the database (its name is printed)")
    p.add_argument("--json", type=Path, help="append the figures as one JSON line to this file")
    args = p.parse_args(argv)
    now = datetime.now(UTC).replace(microsecond=0)
    url, name = asyncio.run(fresh_database())
    say(f"fleet_db_bench: database {name}, {args.clusters} clusters, {args.workloads:,} ended Workloads, "
        f"{args.running} running, {args.pending} pending")
    try:
        db.upgrade(url)
        t0 = time.time()
        asyncio.run(fill(url, args.clusters, args.workloads, args.running, args.pending, now))
        say(f"filled in {time.time() - t0:.0f}s")
        out = asyncio.run(measure(url, args, now))
    finally:
        if not args.keep:
            asyncio.run(drop_postgres(name))
    if args.json:
        with args.json.open("a") as fh:
            fh.write(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load": load(),
                                 "clusters": args.clusters, "workloads": args.workloads, **out}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
