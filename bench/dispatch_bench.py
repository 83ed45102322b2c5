"""Dispatcher throughput: N PyTorchJobs (1 master + 1 worker) from creation on the manager to accepted.

Set-up: kubesim (the manager cluster), the fake agents (accept every Place at once, heartbeat a
huge capacity) and the Job creator each run in their own process; the dispatcher runs here. Real
Mosquitto and PostgreSQL when reachable, else the embedded broker and SQLite (the output says
which). Figures: creation rate, jobs/s from the first creation to the last acceptance, latency
creation → accepted (p50 / p99 / max), and with ``--profile`` a cProfile summary of this process.

    .venv/bin/python bench/dispatch_bench.py -n 1000
    .venv/bin/python bench/dispatch_bench.py -n 10000 --profile
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import itertools
import multiprocessing
import os
import pstats
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dispatcher import db  # noqa: E402
from dispatcher.app import Dispatcher  # noqa: E402
from dispatcher.settings import DispatcherSettings  # noqa: E402
from federation import labels, messages, sealing, signing, topics  # noqa: E402
from federation.kube import CRDS, Kube, Resource  # noqa: E402
from federation.mqtt import MqttLink  # noqa: E402
from federation.settings import KubeSettings, MqttSettings, SigningSettings  # noqa: E402

PYTORCHJOBS = Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "pytorchjobs.kubeflow.org"},
    "spec": {"group": "kubeflow.org", "scope": "Namespaced",
             "names": {"plural": "pytorchjobs", "singular": "pytorchjob", "kind": "PyTorchJob"},
             "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]},
}
CLUSTERS = ("worker-1", "worker-2", "worker-3")
KEYS = {name: signing.generate() for name in ("dispatcher", *CLUSTERS)}
"""Every message is signed: the dispatcher's key pair and each fake agent's (made per run)."""
LOAD: list[float] = [0.0, 0.0, 0.0]


def reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def job(i: int) -> dict[str, Any]:
    def replica() -> dict[str, Any]:
        return {"replicas": 1, "restartPolicy": "OnFailure", "template": {"spec": {"containers": [
            {"name": "pytorch", "image": "example/train:1",
             "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": f"bench-{i:06d}", "namespace": "default"},
            "spec": {"runPolicy": {"managedBy": labels.MULTIKUEUE},
                     "pytorchReplicaSpecs": {"Master": replica(), "Worker": replica()}}}


# --- fake agents (own process) ----------------------------------------------------------------


async def _agents(mqtt_url: str, root: str, ready: Any, private: dict[str, str], cpu: int | None = None) -> None:
    """Accept every Place at once. ``cpu``: each cluster's CPUs (default: practically unbounded); its
    heartbeats then announce what the accepted Places left free (2 CPUs per benchmark Job)."""
    settings = MqttSettings(url=mqtt_url, topic_root=root)
    sealers = {c: signing.Sealer(signing.parse_private_key(private[c])) for c in CLUSTERS}
    places = {c: sealing.PlaceOpener(signing.parse_private_key(private[c])) for c in CLUSTERS}
    numbers = itertools.count(1)

    def sealed(topic: str, cluster: str, message: messages.ReportBase) -> bytes:
        return sealers[cluster].seal(topic, messages.encode(message), stream="bench", n=next(numbers))
    total = cpu if cpu is not None else 1000000
    accepted: dict[str, set[Any]] = {c: set() for c in CLUSTERS}  # a Place sent again counts once

    def cap(c: str) -> messages.Capacity:
        return messages.Capacity(allocatable={"cpu": str(total), "memory": "1000000Gi", "pods": "10000000"},
                                 free={"cpu": str(max(0, total - 2 * len(accepted[c]))), "memory": "1000000Gi", "pods": "10000000"},
                                 largest_node_free={"cpu": "1000", "memory": "1000Gi", "pods": "1000"})
    async with MqttLink(settings, client_id=f"bench-agents-{uuid.uuid4().hex[:6]}", persistent=False) as link:
        for c in CLUSTERS:
            await link.subscribe(topics.commands(c, root))

        async def beat() -> None:  # the dispatcher places nothing on a cluster silent for 30 s
            while True:
                for c in CLUSTERS:
                    hb = messages.Heartbeat(cluster=c, capacity=cap(c), agent_version="bench", interval_seconds=5)
                    await link.publish(topics.presence(c, root), sealed(topics.presence(c, root), c, hb), retain=True)
                await asyncio.sleep(5)
        beats = asyncio.ensure_future(beat())
        await asyncio.sleep(0.2)
        ready.set()
        seq = 0
        pending: set[asyncio.Task[None]] = set()
        async for msg in link.messages():
            cluster = topics.parse(msg.topic, root).cluster
            body = msg.payload[:msg.payload.rfind(b',"seal":')] + b"}"
            if sealing.is_sealed(body):  # a Place, encrypted to this cluster's key as the agent gets it
                body = places[cluster].open(msg.topic, body)
            cmd = messages.decode_command(body)
            if isinstance(cmd, messages.Place):
                accepted[cluster].add(cmd.placement)
                seq += 1
                ack = messages.Accepted(cluster=cluster, placement=cmd.placement, spec_version=cmd.spec_version,
                                        seq=seq)
                topic = topics.reports(cluster, root)
                t = asyncio.ensure_future(link.publish(topic, sealed(topic, cluster, ack)))
                pending.add(t)
                t.add_done_callback(pending.discard)
        beats.cancel()


def agents_main(mqtt_url: str, root: str, ready: Any, private: dict[str, str], cpu: int | None = None) -> None:
    asyncio.run(_agents(mqtt_url, root, ready, private, cpu))


# --- the Job creator (own process) -----------------------------------------------------------


async def _create(kubeconfig: str, n: int, concurrency: int, rate: float
                  ) -> tuple[list[tuple[str, float]], float, float]:
    out: list[tuple[str, float]] = []
    async with Kube(kubeconfig, settings=KubeSettings(max_concurrency=concurrency)) as kube:
        sem = asyncio.Semaphore(concurrency)

        async def make(i: int) -> None:
            if rate:
                await asyncio.sleep(max(0.0, t0 + i / rate - time.time()))
            async with sem:
                started = time.time()
                obj = await kube.create(PYTORCHJOBS, job(i), "default")
                out.append((obj["metadata"]["uid"], started))
        t0 = time.time()
        await asyncio.gather(*(make(i) for i in range(n)))
        return out, t0, time.time()


def creator_main(kubeconfig: str, n: int, concurrency: int, rate: float, go: Any, results: Any) -> None:
    go.wait()
    results.put(asyncio.run(_create(kubeconfig, n, concurrency, rate)))


# --- the run ------------------------------------------------------------------------------------


async def setup_manager(kubeconfig: Path) -> None:
    """The manager's PyTorchJob CRD, installed and served."""
    async with Kube(kubeconfig) as kube:
        await kube.create(CRDS, CRD)
        for _ in range(200):
            if await kube.served(PYTORCHJOBS):
                return
            await asyncio.sleep(0.05)


async def bench(n: int, mqtt_url: str, db_url: str, kubeconfig: Path, root: str, concurrency: int,
                profile: cProfile.Profile | None, creator: Any, go: Any, results: Any,
                others: dict[str, Any]) -> dict[str, Any]:
    settings = DispatcherSettings(
        kube=KubeSettings(kubeconfig=kubeconfig, max_concurrency=int(os.environ.get("BENCH_KUBE_THREADS", "4"))),
        database_url=db_url,
        mqtt=MqttSettings(url=mqtt_url, topic_root=root, client_id=f"bench-{uuid.uuid4().hex[:6]}"),
        kube_writers=int(os.environ.get("BENCH_KUBE_THREADS", "4")),
        signing=SigningSettings(private_key=KEYS["dispatcher"][0]),
        cluster_public_keys={c: KEYS[c][1] for c in CLUSTERS})
    accepted: dict[str, float] = {}
    all_done = asyncio.Event()

    def observe(type_: str, uid: str) -> None:
        if type_ == "accepted" and uid not in accepted:
            accepted[uid] = time.time()
            if len(accepted) >= n:
                all_done.set()

    stop = asyncio.Event()
    async with Dispatcher(settings) as d:
        assert d.engine is not None and d.writer is not None and d.intake is not None
        d.engine.observers.append(observe)
        task = asyncio.create_task(d.run(stop))
        await asyncio.wait_for(d.intake.ready.wait(), 30)
        cpu0 = cpu_seconds(others)
        if profile is not None:
            profile.enable()
        go.set()
        try:
            await asyncio.wait_for(all_done.wait(), timeout=max(60.0, n / 50))
        except TimeoutError:
            print(f"!! only {len(accepted)}/{n} accepted before the timeout", file=sys.stderr)
        t_accepted = time.time()
        await asyncio.wait_for(d.writer.wait_idle(), timeout=max(60.0, n / 50))
        t_written = time.time()
        if profile is not None:
            profile.disable()
        cpu1 = cpu_seconds(others)
        created, t0, t_created = await asyncio.to_thread(results.get, True, 120)
        stop.set()
        await asyncio.wait_for(task, 30)
        batches = d.engine.batches
    created_at = dict(created)
    lat = sorted(accepted[u] - created_at[u] for u in accepted if u in created_at)

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))] if lat else float("nan")
    return {
        "n": n, "accepted": len(accepted), "create_s": t_created - t0, "create_rate": n / (t_created - t0),
        "accept_s": t_accepted - t0, "rate": len(accepted) / (t_accepted - t0),
        "p50": pct(0.50), "p99": pct(0.99), "max": lat[-1] if lat else float("nan"),
        "conditions_written_s": t_written - t0, "batches": batches,
        "cpu": {k: cpu1[k] - cpu0.get(k, 0.0) for k in cpu1},
    }


def cpu_seconds(others: dict[str, Any]) -> dict[str, float]:
    """CPU seconds (user + system) used so far by each process of the run, and by PostgreSQL / Mosquitto."""
    import psutil
    out: dict[str, float] = {}
    for name, pid in others.items():
        try:
            t = psutil.Process(pid).cpu_times()
            out[name] = t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    for proc in psutil.process_iter(["name", "cpu_times"]):
        pname = proc.info["name"] or ""
        key = "postgres" if pname.startswith("postgres") else "mosquitto" if pname == "mosquitto" else None
        if key and proc.info["cpu_times"] is not None:
            t = proc.info["cpu_times"]
            out[key] = out.get(key, 0.0) + t.user + t.system
    return out


ADMIN_DATABASE = "postgresql://postgres@127.0.0.1:5432/test"
"""Where a benchmark creates and drops its own databases."""


async def fresh_postgres() -> tuple[str, str]:
    import asyncpg
    name = f"mkd_bench_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(ADMIN_DATABASE)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    return f"postgresql+asyncpg://postgres@127.0.0.1:5432/{name}", name


async def drop_postgres(name: str) -> None:
    import asyncpg
    admin = await asyncpg.connect(ADMIN_DATABASE)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@dataclass
class Environment:
    """What a dispatcher of a benchmark runs against (:func:`environment`)."""

    db_url: str
    mqtt_url: str
    root: str
    kubeconfig: Path
    notes: list[str]
    sim: subprocess.Popen[str]
    agents: Any
    ctx: Any


@contextlib.contextmanager
def environment(*, use_postgres: bool = True, need_mosquitto: bool = False,
                agents_cpu: int | None = None) -> Iterator[Environment]:
    """Everything a benchmark's dispatcher needs but itself, started and stopped: a database of its own
    (PostgreSQL 127.0.0.1:5432 when reachable and wanted: ``mkd_bench_<hex>``, created, migrated and
    dropped after; else SQLite), a broker (Mosquitto 127.0.0.1:1883, else an embedded one unless
    ``need_mosquitto``), kubesim as the manager cluster with the PyTorchJob CRD served, and the fake
    agents (``agents_cpu``: each cluster's CPUs; default practically unbounded), each in its own process."""
    tmp = Path(tempfile.mkdtemp(prefix="mkd-bench-"))
    root = f"mkd-bench-{uuid.uuid4().hex[:6]}/v1"
    notes = []
    pg_name = None
    if use_postgres and reachable("127.0.0.1", 5432):
        db_url, pg_name = asyncio.run(fresh_postgres())
        notes.append(f"database: PostgreSQL 127.0.0.1:5432 ({pg_name}, dropped after)")
    else:
        db_url = f"sqlite+aiosqlite:///{tmp / 'mkd.db'}"
        notes.append("database: SQLite (PostgreSQL not reachable or --sqlite)")
    broker_proc = None
    if reachable("127.0.0.1", 1883):
        mqtt_url = "mqtt://127.0.0.1:1883"
        notes.append("broker: Mosquitto 127.0.0.1:1883")
    elif need_mosquitto:
        raise SystemExit("this benchmark needs an MQTT broker on 127.0.0.1:1883 (Mosquitto)")
    else:
        port = 18830 + os.getpid() % 1000
        broker_proc = subprocess.Popen([sys.executable, "-c", (
            "import asyncio; from federation.embedded_broker import EmbeddedBroker\n"
            "async def m():\n"
            f"    async with EmbeddedBroker(port={port}):\n"
            "        await asyncio.Event().wait()\n"
            "asyncio.run(m())")], cwd=ROOT)
        mqtt_url = f"mqtt://127.0.0.1:{port}"
        for _ in range(100):
            if reachable("127.0.0.1", port):
                break
            time.sleep(0.1)
        notes.append("broker: embedded amqtt (Mosquitto not reachable)")
    sim = subprocess.Popen([sys.executable, "-m", "kubesim", "--clusters", "manager", "--nodes", "1",
                            "--state-dir", str(tmp / "sim")], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    agents = ctx.Process(target=agents_main, daemon=True,
                         args=(mqtt_url, root, ready, {c: KEYS[c][0] for c in CLUSTERS}, agents_cpu))
    try:
        assert sim.stdout is not None
        for line in sim.stdout:
            if "ready" in line:
                break
        kubeconfig = tmp / "sim" / "manager.kubeconfig"
        if not kubeconfig.exists():
            kubeconfig = next((tmp / "sim").glob("manager*kubeconfig*"))
        asyncio.run(setup_manager(kubeconfig))
        db.upgrade(db_url)
        agents.start()
        if not ready.wait(60):
            raise RuntimeError("fake agents did not start")
        yield Environment(db_url, mqtt_url, root, kubeconfig, notes, sim, agents, ctx)
    finally:
        with contextlib.suppress(Exception):
            agents.terminate()
        sim.terminate()
        with contextlib.suppress(Exception):
            sim.wait(10)
        if broker_proc is not None:
            broker_proc.terminate()
        if pg_name:
            asyncio.run(drop_postgres(pg_name))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", type=int, default=1000, help="PyTorchJobs to create")
    p.add_argument("--concurrency", type=int, default=32, help="creations in flight")
    p.add_argument("--rate", type=float, default=0.0,
                   help="create Jobs at this many per second (0: as fast as kubesim takes them)")
    p.add_argument("--profile", action="store_true", help="cProfile this process during the run")
    p.add_argument("--sqlite", action="store_true", help="use SQLite even when PostgreSQL is reachable")
    args = p.parse_args()
    LOAD[:] = list(os.getloadavg())
    creator: Any = None
    with environment(use_postgres=not args.sqlite) as env:
        try:
            go = env.ctx.Event()
            results = env.ctx.Queue()
            creator = env.ctx.Process(target=creator_main, daemon=True,
                                      args=(str(env.kubeconfig), args.n, args.concurrency, args.rate, go, results))
            creator.start()
            prof = cProfile.Profile() if args.profile else None
            others = {"dispatcher (this process)": os.getpid(), "kubesim": env.sim.pid, "fake agents": env.agents.pid,
                      "job creator": creator.pid}
            result = asyncio.run(bench(args.n, env.mqtt_url, env.db_url, env.kubeconfig, env.root, args.concurrency,
                                       prof, creator, go, results, others))
        finally:
            with contextlib.suppress(Exception):
                creator.terminate()
    notes = env.notes
    print(f"dispatch_bench: N={result['n']} ({'; '.join(notes)}; {os.cpu_count()} cores)")
    print(f"  created {result['n']} Jobs in {result['create_s']:.2f}s ({result['create_rate']:.0f}/s, "
          f"{args.concurrency} in flight, {f'paced at {args.rate:g}/s' if args.rate else 'unpaced'})")
    print(f"  accepted {result['accepted']}/{result['n']} in {result['accept_s']:.2f}s from the first creation: "
          f"{result['rate']:.0f} jobs/s")
    print(f"  latency creation -> accepted: p50 {result['p50'] * 1000:.0f} ms, p99 {result['p99'] * 1000:.0f} ms, "
          f"max {result['max'] * 1000:.0f} ms")
    print(f"  MultiClusterDispatched conditions all written after {result['conditions_written_s']:.2f}s; "
          f"{result['batches']} engine batches")
    wall = result["accept_s"]
    print(f"  CPU seconds during the run ({wall:.1f}s wall, {os.cpu_count()} cores = "
          f"{wall * (os.cpu_count() or 1):.1f} CPU-s available; load average before: {LOAD[0]:.1f}):")
    for name, sec in sorted(result["cpu"].items(), key=lambda kv: -kv[1]):
        print(f"    {name:28s} {sec:6.1f}")
    if prof is not None:
        out = io.StringIO()
        stats = pstats.Stats(prof, stream=out)
        stats.sort_stats(os.environ.get("BENCH_SORT", "tottime")).print_stats(*([os.environ["BENCH_FILTER"]] if os.environ.get("BENCH_FILTER") else []), 25)
        print("  profile (this process: the dispatcher), top 25 by own time:")
        print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
