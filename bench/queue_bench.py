"""Scheduler figures: one scheduling pass, admissions/s when quota frees, memory at 100,000 pending.

The pure scheduler (``dispatcher.queueing``) alone, in this process: 50 ClusterQueues in 5 cohorts (10 each;
10 % of each queue's quota lendable, borrowing limited), one LocalQueue per ClusterQueue, 20 worker clusters
of 100 nodes (32 CPU, 128 Gi each), and 100,000 pending Workloads (2,000 per ClusterQueue; 1-4 pods of 1-4
CPU; four priorities). Quota binds, not capacity, as in a federation whose teams share it. Figures, each
printed with its target:
"""

from __future__ import annotations

import argparse
import inspect
import os
import random
import resource
import sys
import time
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dispatcher.placement import ClusterView, Need, NodeView, PodSetDemand, subtract_from_nodes  # noqa: E402
from dispatcher.queueing.catalog import Catalog  # noqa: E402
from dispatcher.queueing.scheduler import Entry, Queues  # noqa: E402

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def rss_mb() -> tuple[float, float]:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with open("/proc/self/status") as f:
        now = next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024
    return peak, now


def build_catalog(cohorts: int, per_cohort: int, cpu_quota: int) -> Catalog:
    c = Catalog()
    c.apply("ResourceFlavor", {"metadata": {"name": "default"}})
    for k in range(cohorts):
        for i in range(per_cohort):
            name = f"cq-{k}-{i}"
            c.apply("ClusterQueue", {"metadata": {"name": name}, "spec": {
                "cohortName": f"cohort-{k}", "namespaceSelector": {},
                "queueingStrategy": "BestEffortFIFO" if i % 2 else "StrictFIFO",
                "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [{"name": "default", "resources": [
                    {"name": "cpu", "nominalQuota": str(cpu_quota), "borrowingLimit": str(cpu_quota // 2),
                     "lendingLimit": str(cpu_quota // 10)},
                    {"name": "memory", "nominalQuota": f"{cpu_quota * 4}Gi"}]}]}]}})
            c.apply("LocalQueue", {"metadata": {"namespace": f"ns-{k}-{i}", "name": "q"},
                                   "spec": {"clusterQueue": name}})
            c.apply("Namespace", {"metadata": {"name": f"ns-{k}-{i}"}})
    return c


def build_clusters(n: int, nodes: int) -> list[ClusterView]:
    out = []
    for i in range(n):
        node_list = [NodeView(f"n{j}", {"zone": f"z{j % 4}"}, (),
                              {"cpu": Decimal(32), "memory": Decimal(128 * 2**30), "pods": Decimal(110)})
                     for j in range(nodes)]
        total = {"cpu": Decimal(32 * nodes), "memory": Decimal(128 * 2**30 * nodes), "pods": Decimal(110 * nodes)}
        out.append(ClusterView(f"worker-{i}", True, NOW, dict(total), dict(total),
                               {"cpu": Decimal(32), "memory": Decimal(128 * 2**30)}, None, {}, node_list))
    return out


def shapes() -> list[Need]:
    """A few dozen distinct shapes, shared by every Workload of that shape (as the engine's cache does)."""
    out = []
    for pods in (1, 2, 4):
        for cpu in (1, 2, 4):
            per_pod = {"cpu": Decimal(cpu), "memory": Decimal(cpu * 2 * 2**30), "pods": Decimal(1)}
            ps = PodSetDemand("worker", pods, per_pod)
            out.append(Need("PyTorchJob", {k: v * pods for k, v in per_pod.items()}, (("worker", per_pod),), (ps,)))
    return out


def main() -> None:
    """- **fill**: the first passes from empty usage (admissions/s, CPU-s per admission);
    - **one pass** at 100,000 pending with everything that fits admitted: wall and CPU ms;
    - **admissions/s when capacity frees**: 5,000 admitted Workloads finish (their quota and their room
      on the clusters come back, as the agents' next heartbeats say), passes run until nothing more is
      admitted;
    - **RSS** of the process with 100,000 pending (ru_maxrss and the current VmRSS).

        .venv/bin/python bench/queue_bench.py            # the figures for bench/RESULTS.md
        .venv/bin/python bench/queue_bench.py -n 20000   # a smaller run
    """
    ap = argparse.ArgumentParser(description=f"{__doc__}\n{inspect.cleandoc(main.__doc__ or '')}", formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=100_000, help="pending Workloads (default 100,000)")
    ap.add_argument("--cohorts", type=int, default=5)
    ap.add_argument("--per-cohort", type=int, default=10)
    ap.add_argument("--clusters", type=int, default=20)
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--quota", type=int, default=1000, help="CPU nominal quota per ClusterQueue")
    ap.add_argument("--free", type=int, default=5000, help="admitted Workloads that finish at once")
    args = ap.parse_args()
    rng = random.Random(11)
    base_rss = rss_mb()[1]
    catalog = build_catalog(args.cohorts, args.per_cohort, args.quota)
    queues = Queues(catalog, max_attempts_per_pass=2000)
    clusters = build_clusters(args.clusters, args.nodes)
    needs = shapes()
    cqs = list(catalog.local_queues)
    t = time.perf_counter()
    for i in range(args.n):
        ns, lq = cqs[i % len(cqs)]
        queues.add(Entry(uid=f"uid-{i:06d}", namespace=ns, name=f"job-{i}", queue=lq, priority=rng.choice((0, 0, 10, 100)),
                         queued_at=NOW.timestamp() + i / 1000, seq=i, need=rng.choice(needs)))
    enqueue = time.perf_counter() - t
    peak, now_rss = rss_mb()
    print(f"{args.n:,} pending Workloads in {len(catalog.cluster_queues)} ClusterQueues / {args.cohorts} cohorts, "
          f"{args.clusters} clusters x {args.nodes} nodes; enqueued in {enqueue:.2f} s")
    print(f"RSS with {args.n:,} pending: {now_rss:.0f} MB (peak {peak:.0f} MB; {now_rss - base_rss:.0f} MB above the "
          f"empty interpreter + imports)  target <= 300 MB: {'ok' if now_rss <= 300 else 'MISSED'}")

    placed: dict[str, tuple[str, Need]] = {}

    def run_passes(label: str) -> list[str]:
        admitted: list[str] = []
        wall = cpu = 0.0
        passes = 0
        while True:
            w0, c0 = time.perf_counter(), time.process_time()
            result = queues.schedule(clusters, now=NOW, timeout=1e9)
            wall += time.perf_counter() - w0
            cpu += time.process_time() - c0
            passes += 1
            if passes == 1:
                print(f"  {label}, first pass: {len(queues.entries) + len(result.admitted):,} pending, "
                      f"{len(result.admitted):,} admitted, {(time.perf_counter() - w0) * 1e3:.0f} ms wall, "
                      f"{(time.process_time() - c0) * 1e3:.0f} ms CPU")
            admitted += [a.entry.uid for a in result.admitted]
            placed.update((a.entry.uid, (a.cluster, a.need)) for a in result.admitted)
            if not result.admitted:
                break
        rate = len(admitted) / wall if wall else 0.0
        cpu_rate = len(admitted) / cpu if cpu else 0.0
        print(f"{label}: {len(admitted):,} admitted in {passes} passes, {wall:.2f} s wall, {cpu:.2f} CPU-s: "
              f"{rate:,.0f} admissions/s wall, {cpu_rate:,.0f}/s per CPU-s ({cpu / max(len(admitted), 1) * 1e6:.0f} "
              f"CPU-us each)  target >= 1,000/s: {'ok' if rate >= 1000 else 'MISSED'}")
        return admitted

    def one_pass(label: str) -> None:
        w0, c0 = time.perf_counter(), time.process_time()
        result = queues.schedule(clusters, now=NOW, timeout=1e9)
        wall_ms, cpu_ms = (time.perf_counter() - w0) * 1e3, (time.process_time() - c0) * 1e3
        print(f"one scheduling pass, {label}, {len(queues.entries):,} pending: {wall_ms:.1f} ms wall, {cpu_ms:.1f} ms "
              f"CPU, {result.attempts} heads tried, {len(result.admitted)} admitted  target <= 100 ms: "
              f"{'ok' if wall_ms <= 100 else 'MISSED'}")

    admitted = run_passes("fill (from empty usage)")
    one_pass("just after the fill (up to 2,000 heads newly set aside)")
    while queues.schedule(clusters, now=NOW, timeout=1e9).attempts >= queues.max_attempts:
        pass  # every head that cannot be admitted is set aside once
    one_pass("steady state (every head that cannot be admitted already set aside)")
    freed = rng.sample(admitted, min(args.free, len(admitted)))
    for uid in freed:
        queues.release(uid)
        del placed[uid]
    # the agents' next heartbeats: the clusters as the Workloads still running leave them
    clusters[:] = build_clusters(args.clusters, args.nodes)
    views = {c.name: c for c in clusters}
    for cluster, need in placed.values():
        view = views[cluster]
        view.free = {k: v - need.total.get(k, Decimal(0)) for k, v in view.free.items()}
        view.nodes = subtract_from_nodes(view.nodes, need.total, need)
    queues.capacity_changed()
    again = run_passes(f"after {len(freed):,} admitted Workloads finish (their cohorts' set-aside heads return)")
    print(f"admitted again after the release: {len(again):,}")
    peak, now_rss = rss_mb()
    print(f"RSS at the end: {now_rss:.0f} MB (peak {peak:.0f} MB); load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
