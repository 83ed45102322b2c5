"""What-if figure: a week of 100,000 Jobs replayed over 50 clusters of 100 nodes, time and peak RSS on one core.

A synthetic federation: 50 worker clusters of 100 nodes (64 CPU, 512 Gi, 8 GPU each), 10 ClusterQueues in
two cohorts (GPU quota lendable and borrowable, preemption within the ClusterQueue and by reclaim), one
LocalQueue each, two priorities; 100,000 Jobs arriving over seven days (1-4 pods of 1, 2, 4 or 8 GPUs,
runs from 0.2 to 1.8 times the mean that asks for 80 % of the federation's GPUs over the week). The trace goes through
``trace.parse`` (as ``mkctl whatif --trace`` reads it), then ``sim.simulate`` and ``report.summarize``.
Targets: at most 60 s and 1 GB peak RSS. ``--jobs``, ``--clusters``, ``--nodes`` scale it down.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402

from dispatcher.whatif import config, report, sim, trace  # noqa: E402

DAY = 86400.0
QUEUES = 10


def objects(clusters: int, nodes: int) -> list[tuple[str, int, object]]:
    gpus = clusters * nodes * 8
    docs: list[object] = [{"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "gpu"}}]
    for name, value in (("low", 10), ("high", 100)):
        docs.append({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
                     "metadata": {"name": name}, "value": value})
    share = gpus // QUEUES
    for i in range(QUEUES):
        docs.append({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": f"team-{i}"},
                     "spec": {"cohortName": f"org-{i % 2}", "namespaceSelector": {},
                              "preemption": {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Any"},
                              "resourceGroups": [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"], "flavors": [
                                  {"name": "gpu", "resources": [
                                      {"name": "cpu", "nominalQuota": str(share * 8)},
                                      {"name": "memory", "nominalQuota": f"{share * 64}Gi"},
                                      {"name": "nvidia.com/gpu", "nominalQuota": str(share),
                                       "borrowingLimit": str(share)}]}]}]}})
        docs.append({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                     "metadata": {"namespace": f"team-{i}", "name": "jobs"}, "spec": {"clusterQueue": f"team-{i}"}})
    for c in range(clusters):
        docs.append({"apiVersion": "whatif.mkd.dev/v1", "kind": "WorkerCluster", "metadata": {"name": f"w{c:02d}"},
                     "spec": {"nodes": [{"name": "gpu", "count": nodes,
                                         "allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8",
                                                         "pods": "110"}}]}})
    return [("bench", i + 1, d) for i, d in enumerate(docs)]


def trace_lines(jobs: int, clusters: int, nodes: int, seed: int) -> list[bytes]:
    rnd = random.Random(seed)
    gpus = clusters * nodes * 8
    span = 7 * DAY
    # GPU-seconds asked for: 80 % of the federation's over the week
    mean_gpus = sum((1 + 2 + 4 + 8) / 4 * p for p in (1, 2, 3, 4)) / 4
    mean_run = 0.8 * gpus * span / jobs / mean_gpus
    out = []
    t = 0.0
    for n in range(jobs):
        t += rnd.expovariate(jobs / span)
        per_pod = rnd.choice((1, 2, 4, 8))
        pods = rnd.randint(1, 4)
        run = rnd.uniform(0.2, 1.8) * mean_run
        team = rnd.randrange(QUEUES)
        out.append(orjson.dumps({
            "name": f"job-{n}", "namespace": f"team-{team}", "queue": "jobs", "kind": "PyTorchJob", "arrival": round(t, 3),
            "runSeconds": round(run), "priorityClass": "high" if rnd.random() < 0.1 else "low",
            "podSets": [{"name": "worker", "count": pods, "requests": {"cpu": str(per_pod * 7),
                                                                       "memory": f"{per_pod * 60}Gi",
                                                                       "nvidia.com/gpu": str(per_pod)}}]}))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--clusters", type=int, default=50)
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    lines = trace_lines(args.jobs, args.clusters, args.nodes, args.seed)
    cfg = config.load_documents(objects(args.clusters, args.nodes))
    started = time.process_time()
    wall = time.perf_counter()
    jobs = trace.parse(lines)
    del lines
    parsed = time.process_time() - started

    def progress(done: int, total: int, t: float) -> None:
        print(f"  {done:,} of {total:,} Jobs done, day {t / DAY:.1f}, {time.perf_counter() - wall:.0f} s",
              file=sys.stderr, flush=True)

    run = sim.simulate(jobs, cfg, progress=progress, progress_every=max(args.jobs // 10, 1))
    rep = report.summarize(run)
    cpu = time.process_time() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    util = sum(c["utilisation"].get("nvidia.com/gpu", 0.0) for c in rep["clusters"].values()) / max(len(rep["clusters"]), 1)
    print(f"{args.jobs:,} Jobs, {args.clusters} clusters x {args.nodes} nodes: {cpu:.1f} s CPU "
          f"(parse {parsed:.1f} s; target <= 60), {time.perf_counter() - wall:.1f} s wall, peak RSS {peak:.0f} MB "
          f"(target <= 1024); {run.passes:,} passes, {rep['admitted']:,} admitted, "
          f"{rep['preemptions']['total']:,} preemptions, {len(rep['neverRan']):,} never ran, "
          f"makespan {rep['makespanSeconds'] / DAY:.2f} days, GPU utilisation {util:.0%}; "
          f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
