"""Pods and logs read from the manager: first byte of ``mkctl logs``, follow latency, a 50 MB log's throughput,
the cost of 20 concurrent follows, and created → Running mirrored with and without them.

Runs the demo's federation in this process (kubesim manager and workers, dispatcher, agents, the broker named
by ``--mqtt-url`` or the embedded one, SQLite) and reads logs through the dispatcher's API as ``mkctl logs``
does. First byte: ``GET /logs?tail=1`` until the first byte, N times. Follow latency: a container prints a
line every 0.1 s; each line's kubelet timestamp (``timestamps=true``) against the time it reached the reader.
Throughput: a container prints 50 MB at its start, read whole. Cost of follows: the process's CPU over a
window with 20 follows of containers printing a line every 0.5 s, less the same window without them (the whole
federation's extra CPU: an upper bound of the agents'). Mirroring: Jobs created one after another, the time
until the manager's Job shows ``status.active``, p50 and p99, without and then with the 20 follows.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench.e2e_measure import pct
from federation import labels
from federation.errors import AlreadyExists
from federation.kube import JOBS, NAMESPACES
from mkctl.topology import Topology, TopologyOptions

NS = "bench-logs"


def job(name: str, annotations: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": NS},
            "spec": {"managedBy": labels.MULTIKUEUE, "completions": 1, "backoffLimit": 0, "template": {
                "metadata": {"annotations": annotations},
                "spec": {"restartPolicy": "Never", "containers": [{
                    "name": "main", "image": "busybox", "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}}}}


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def running(top: Topology, api: httpx.AsyncClient, name: str, within: float = 120) -> str:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        got = await api.get(f"/api/v1/workloads/{NS}/{name}/pods")
        if got.status_code == 200 and got.json()["pods"] and got.json()["pods"][0]["phase"] == "Running":
            return str(got.json()["cluster"])
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{name} not Running within {within}s")


async def first_byte(api: httpx.AsyncClient, name: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        began = time.monotonic()
        async with api.stream("GET", f"/api/v1/workloads/{NS}/{name}/logs", params={"tail": 1}) as got:
            async for _chunk in got.aiter_bytes():
                out.append(time.monotonic() - began)
                break
    return out


async def follow_latency(api: httpx.AsyncClient, name: str, seconds: float) -> list[float]:
    lags: list[float] = []
    buffer = b""
    deadline = time.monotonic() + seconds
    async with api.stream("GET", f"/api/v1/workloads/{NS}/{name}/logs",
                          params={"follow": "true", "timestamps": "true", "tail": 0}) as got:
        async for chunk in got.aiter_bytes():
            now = time.time()
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                stamp = line.split(b" ", 1)[0].decode()
                with contextlib.suppress(ValueError):
                    lags.append(now - datetime.fromisoformat(stamp[:26] + "+00:00").timestamp())
            if time.monotonic() > deadline:
                break
    return lags


async def throughput(api: httpx.AsyncClient, name: str) -> tuple[int, float, float]:
    began = time.monotonic()
    first = 0.0
    size = 0
    async with api.stream("GET", f"/api/v1/workloads/{NS}/{name}/logs") as got:
        async for chunk in got.aiter_bytes():
            if not size:
                first = time.monotonic() - began
            size += len(chunk)
    return size, time.monotonic() - began, first


async def hold_follows(api: httpx.AsyncClient, names: list[str], stop: asyncio.Event) -> list[int]:
    counts = [0] * len(names)

    async def one(i: int, name: str) -> None:
        async with api.stream("GET", f"/api/v1/workloads/{NS}/{name}/logs", params={"follow": "true"}) as got:
            async for chunk in got.aiter_bytes():
                counts[i] += chunk.count(b"\n")
                if stop.is_set():
                    return
    tasks = [asyncio.create_task(one(i, n)) for i, n in enumerate(names)]
    await stop.wait()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return counts


async def mirrored(top: Topology, prefix: str, n: int) -> list[float]:
    """Create ``n`` Jobs one after another; seconds from each create to ``status.active`` on the manager."""
    times: list[float] = []
    for i in range(n):
        name = f"{prefix}-{i}"
        began = time.monotonic()
        await top.manager.create(JOBS, job(name, {"kubesim.mkd.dev/run-seconds": "2"}), NS)
        while True:
            got = await top.manager.get(JOBS, name, NS)
            if (got.get("status") or {}).get("active") or (got.get("status") or {}).get("succeeded"):
                times.append(time.monotonic() - began)
                break
            await asyncio.sleep(0.02)
    return times


async def main(args: argparse.Namespace) -> None:
    state = Path(tempfile.mkdtemp(prefix="mkd-logs-bench-"))
    options = TopologyOptions(state_dir=state, mqtt_url=args.mqtt_url, database_url=None, topic_root="bench-logs/v1",
                              heartbeat_seconds=1.0, dispatcher_overrides={"log_streams_per_user": 64})
    async with Topology(options) as top:
        await top.wait_for_clusters()
        for cluster in top.cluster_names:
            with contextlib.suppress(AlreadyExists):
                await top.kubes[cluster].create(NAMESPACES, {"metadata": {"name": NS}})
        api = httpx.AsyncClient(base_url=f"http://127.0.0.1:{top.api_port}", timeout=120,
                                headers={"Authorization": f"Bearer {top.api_token}"})
        async with api:
            await top.manager.create(JOBS, job("lines", {"kubesim.mkd.dev/run-forever": "true",
                                                         "kubesim.mkd.dev/log": "step {attempt} loss=0.1",
                                                         "kubesim.mkd.dev/log-interval": "0.1"}), NS)
            await top.manager.create(JOBS, job("big", {"kubesim.mkd.dev/run-forever": "true",
                                                       "kubesim.mkd.dev/log-bytes": str(args.megabytes * 1_000_000)}), NS)
            await running(top, api, "lines")
            await running(top, api, "big")
            fb = await first_byte(api, "lines", args.samples)
            print(f"first byte of a log (tail=1), {len(fb)} reads: p50 {pct(fb, 0.5) * 1000:.0f} ms, "
                  f"p99 {pct(fb, 0.99) * 1000:.0f} ms, max {max(fb) * 1000:.0f} ms")
            lags = await follow_latency(api, "lines", args.follow_seconds)
            print(f"follow latency (printed on the worker → read on the manager), {len(lags)} lines: "
                  f"p50 {pct(lags, 0.5) * 1000:.0f} ms, p99 {pct(lags, 0.99) * 1000:.0f} ms")
            size, took, first = await throughput(api, "big")
            print(f"{size / 1e6:.1f} MB log read whole in {took:.2f} s: {size / 1e6 / took:.1f} MB/s "
                  f"(first byte {first * 1000:.0f} ms)")

            before = await mirrored(top, "alone", args.jobs)
            names = [f"chatty-{i}" for i in range(20)]
            for name in names:
                await top.manager.create(JOBS, job(name, {"kubesim.mkd.dev/run-forever": "true",
                                                          "kubesim.mkd.dev/log": "epoch {pod} loss=0.25",
                                                          "kubesim.mkd.dev/log-interval": "0.5"}), NS)
            for name in names:
                await running(top, api, name)
            await asyncio.sleep(2)
            c0, t0 = cpu(), time.monotonic()
            await asyncio.sleep(args.window)
            idle = (cpu() - c0) / (time.monotonic() - t0)
            stop = asyncio.Event()
            holder = asyncio.create_task(hold_follows(api, names, stop))
            await asyncio.sleep(3)
            c0, t0 = cpu(), time.monotonic()
            await asyncio.sleep(args.window)
            busy = (cpu() - c0) / (time.monotonic() - t0)
            during = await mirrored(top, "beside", args.jobs)
            stop.set()
            counts = await holder
            print(f"20 concurrent follows ({sum(counts)} lines read): the process's CPU {busy * 100:.1f} % of a core "
                  f"against {idle * 100:.1f} % without them: +{(busy - idle) * 100:.1f} % for the whole federation "
                  "(kubesim, dispatcher, agents, broker client)")
            print(f"created → Running mirrored, {args.jobs} Jobs one by one: without follows p50 "
                  f"{pct(before, 0.5) * 1000:.0f} ms p99 {pct(before, 0.99) * 1000:.0f} ms; with 20 follows p50 "
                  f"{pct(during, 0.5) * 1000:.0f} ms p99 {pct(during, 0.99) * 1000:.0f} ms "
                  f"(stdev {statistics.pstdev(before) * 1000:.0f} / {statistics.pstdev(during) * 1000:.0f} ms)")
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mqtt-url", default=None, help="a broker (default: the embedded one)")
    p.add_argument("--samples", type=int, default=20, help="first-byte reads")
    p.add_argument("--follow-seconds", type=float, default=20.0)
    p.add_argument("--megabytes", type=int, default=50)
    p.add_argument("--jobs", type=int, default=30, help="Jobs per mirroring run")
    p.add_argument("--window", type=float, default=10.0, help="seconds of each CPU window")
    return p.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
