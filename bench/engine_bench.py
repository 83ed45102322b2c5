"""The dispatcher's engine alone: CPU per job of its decisions, without MQTT, the manager cluster or agents.

    .venv/bin/python bench/engine_bench.py -n 2000            # PostgreSQL when reachable, else SQLite
    .venv/bin/python bench/engine_bench.py -n 2000 --profile  # and a cProfile (CPU time) of the engine
    .venv/bin/python bench/engine_bench.py --clusters 1000    # placement over a fleet of 1,000 clusters

One process: a fresh database, an :class:`~dispatcher.engine.loop.Engine` with three clusters that sent a
heartbeat, and batches fed straight to ``Engine.handle`` as the e2e run brings them: Job claims (each
batch also places them and queues their Place), then the agents' Accepted, a Status without
``startTime`` and a Status with it (the first two Reports of a Job usually arrive in one batch).
The manager writes the engine hands to the KubeWriter are queued, never sent. Printed: CPU
milliseconds per job (``time.process_time``, so the load of the machine matters less than for the
e2e run's figures) for each step and in total, and the number of SQL statements per batch. For
comparing two versions of the engine; the e2e run (bench/e2e_bench.py) says what a job costs.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import socket
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import event  # noqa: E402

from bench.dispatch_bench import drop_postgres, fresh_postgres  # noqa: E402
from bench.e2e_bench import job as e2e_job  # noqa: E402
from dispatcher import db  # noqa: E402
from dispatcher.db.queries import listing  # noqa: E402
from dispatcher.db.queries import workloads as workload_q  # noqa: E402
from dispatcher.engine.batch import JobChange, ReportIn  # noqa: E402
from dispatcher.engine.loop import Engine  # noqa: E402
from dispatcher.intake.jobcache import JobCache  # noqa: E402
from dispatcher.mirror.kubewriter import KubeWriter  # noqa: E402
from dispatcher.settings import DispatcherSettings  # noqa: E402
from federation import gctune, labels, messages, signing  # noqa: E402
from federation.clock import SystemClock  # noqa: E402
from federation.kinds.pytorch import PYTORCHJOB  # noqa: E402
from federation.settings import SigningSettings  # noqa: E402

CLUSTERS = ("worker-1", "worker-2", "worker-3")


def cluster_names(n: int) -> tuple[str, ...]:
    """The default three, or ``n`` clusters (``--clusters``: what a placement pass over a fleet costs)."""
    return CLUSTERS if n == len(CLUSTERS) else tuple(f"c{i:04d}" for i in range(n))


def job(i: int) -> dict[str, Any]:
    """The e2e run's PyTorchJob (1 Master + 1 Worker), as the manager's API server lists it."""
    obj = e2e_job(f"bench-{i}", "bench", labels.MULTIKUEUE)
    obj["metadata"].update({"uid": str(uuid.uuid4()), "generation": 1, "resourceVersion": str(1000 + i),
                            "creationTimestamp": "2026-01-01T00:00:00Z"})
    return obj


def heartbeat(cluster: str) -> messages.Heartbeat:
    alloc = {"cpu": "10000", "memory": "100000Gi", "pods": "100000"}
    nodes = [messages.NodeFree(name=f"{cluster}-n{i}", free={"cpu": "2500", "memory": "25000Gi", "pods": "25000"})
             for i in range(4)]
    return messages.Heartbeat(cluster=cluster, capacity=messages.Capacity(
        allocatable=alloc, free=alloc, largest_node_free={"cpu": "2500", "memory": "25000Gi", "pods": "25000"},
        nodes=nodes), kinds_reconciled=["PyTorchJob"])


async def run(n: int, batch: int, url: str, profile: cProfile.Profile | None,
              clusters: tuple[str, ...] = CLUSTERS) -> dict[str, Any]:
    await db.upgrade_async(url)
    keys = {name: signing.generate() for name in ("dispatcher", *clusters)}
    settings = DispatcherSettings(database_url=url, signing=SigningSettings(private_key=keys["dispatcher"][0]),
                                  cluster_public_keys={c: keys[c][1] for c in clusters})
    sql = db.make_engine(url)
    statements = [0]

    @event.listens_for(sql.sync_engine, "before_cursor_execute")
    def count(*_: Any) -> None:
        statements[0] += 1

    clock = SystemClock()
    cache = JobCache()
    writer = KubeWriter(None, cache, clock, resource_for=lambda kind: kind)  # queued, never sent
    engine = Engine(settings, db.sessionmaker(sql), None, writer, clock, cache=cache)
    cpu: dict[str, float] = {"claim+place": 0.0, "accepted": 0.0, "status": 0.0}
    batches: dict[str, int] = dict.fromkeys(cpu, 0)
    try:
        await engine.start()
        await engine.handle([ReportIn(heartbeat(c), datetime.now(UTC)) for c in clusters])
        seq = 0
        statements[0] = 0
        if profile is not None:
            profile.enable()
        for start in range(0, n, batch):
            jobs = [job(i) for i in range(start, min(n, start + batch))]
            beats = [ReportIn(heartbeat(c), datetime.now(UTC)) for c in clusters] if start % (10 * batch) == 0 else []
            t = time.process_time()
            await engine.handle([*beats, *(JobChange(PYTORCHJOB, j) for j in jobs)])  # heartbeats keep coming
            cpu["claim+place"] += time.process_time() - t
            batches["claim+place"] += 1
            async with engine.sessions() as s:  # where each Job went (the agents' side of the run)
                rows, _ = await workload_q.load_current(s, [j["metadata"]["uid"] for j in jobs])
            accepted, status = [], []
            unplaced = [r for r in rows.values() if r.cluster is None]
            if unplaced:
                raise SystemExit(f"{len(unplaced)} Jobs not placed: {unplaced[0].state} {unplaced[0].reason!r}")
            for uid, r in rows.items():
                key = messages.PlacementKey(workload_uid=uid, attempt=r.attempt, epoch=engine.epoch)
                seq += 1
                accepted.append(ReportIn(messages.Accepted(cluster=r.cluster, placement=key, spec_version=1, seq=seq),
                                         datetime.now(UTC)))
                seq += 1
                status.append(ReportIn(messages.Status(cluster=r.cluster, placement=key, seq=seq, status={
                    "conditions": [{"type": "Created", "status": "True", "reason": "PyTorchJobCreated",
                                    "message": "created", "lastUpdateTime": "2026-01-01T00:00:01Z",
                                    "lastTransitionTime": "2026-01-01T00:00:01Z"}]}), datetime.now(UTC)))
                seq += 1
                status.append(ReportIn(messages.Status(cluster=r.cluster, placement=key, seq=seq, status={
                    "startTime": "2026-01-01T00:00:02Z", "replicaStatuses": {"Master": {"active": 1},
                                                                             "Worker": {"active": 1}},
                    "conditions": [{"type": "Created", "status": "True", "reason": "PyTorchJobCreated",
                                    "message": "created", "lastUpdateTime": "2026-01-01T00:00:01Z",
                                    "lastTransitionTime": "2026-01-01T00:00:01Z"},
                                   {"type": "Running", "status": "True", "reason": "PyTorchJobRunning",
                                    "message": "running", "lastUpdateTime": "2026-01-01T00:00:02Z",
                                    "lastTransitionTime": "2026-01-01T00:00:02Z"}]}), datetime.now(UTC)))
            t = time.process_time()
            await engine.handle(accepted)
            cpu["accepted"] += time.process_time() - t
            batches["accepted"] += 1
            t = time.process_time()
            await engine.handle(status)
            cpu["status"] += time.process_time() - t
            batches["status"] += 1
        if profile is not None:
            profile.disable()
        async with engine.sessions() as s:
            counts = await listing.workload_counts(s)
    finally:
        await sql.dispose()
    return {"cpu": cpu, "batches": batches, "statements": statements[0], "counts": counts}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", type=int, default=2000, help="jobs")
    p.add_argument("--batch", type=int, default=50, help="jobs per batch (the e2e run's batches hold 30-50 items)")
    p.add_argument("--profile", action="store_true", help="cProfile (CPU time) of the run")
    p.add_argument("--sqlite", action="store_true", help="SQLite even when PostgreSQL is reachable")
    p.add_argument("--clusters", type=int, default=len(CLUSTERS),
                   help="worker clusters that sent a heartbeat (each beats again every 10 batches)")
    args = p.parse_args()
    pg_name = None
    reachable = False
    if not args.sqlite:
        with socket.socket() as sock:
            sock.settimeout(0.5)
            reachable = sock.connect_ex(("127.0.0.1", 5432)) == 0
    if reachable:
        url, pg_name = asyncio.run(fresh_postgres())
    else:
        url = f"sqlite+aiosqlite:///{tempfile.mkdtemp(prefix='mkd-engine-bench-')}/mkd.db"
    profile = cProfile.Profile(time.process_time) if args.profile else None
    load = os.getloadavg()[0]
    gctune.tune()  # the collector's settings mkctl's service runner gives the dispatcher
    try:
        out = asyncio.run(run(args.n, args.batch, url, profile, cluster_names(args.clusters)))
    finally:
        if pg_name is not None:
            asyncio.run(drop_postgres(pg_name))
    total = sum(out["cpu"].values())
    print(f"engine_bench: N={args.n}, {args.clusters} clusters, {args.batch} jobs per batch, "
          f"{'PostgreSQL' if pg_name else 'SQLite'}, "
          f"load average {load:.1f}; Workloads: {out['counts']}")
    for step, seconds in out["cpu"].items():
        print(f"  {step:12s} {seconds * 1000 / args.n:6.3f} CPU-ms/job")
    nb = sum(out["batches"].values())
    print(f"  {'total':12s} {total * 1000 / args.n:6.3f} CPU-ms/job; {out['statements'] / nb:.1f} SQL statements "
          f"per batch ({nb} batches)")
    if profile is not None:
        pstats.Stats(profile).sort_stats("tottime").print_stats(30)
        pstats.Stats(profile).sort_stats("cumulative").print_stats(60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
