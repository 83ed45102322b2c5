"""End-to-end throughput: PyTorchJobs from creation on the manager to Running on a worker and back.

    .venv/bin/python bench/e2e_bench.py                # 1,000 jobs
    .venv/bin/python bench/e2e_bench.py -n 1000 -n 10000 --write-results

Topology: four kubesim clusters, each in its own process (``python -m kubesim``), a dispatcher and
three agents each in its own process (``mkctl dispatcher`` / ``mkctl agent``), so no two of them share
a GIL; real Mosquitto and PostgreSQL when they answer on 127.0.0.1 (else the embedded broker, in this
process, and SQLite — the output says so). This process only creates the jobs and watches them.

Per job (1 Master + 1 Worker, pods running for an hour so they stay Running):
  leg 1 = created on the manager → Running on its worker (claim, place, outbox, MQTT, agent, pods)
  leg 2 = Running on the worker → Running mirrored on the manager (status Report, mirror write)
jobs/s = N / (last Running on the manager − first creation). In the same run, the **floor**: the same
N objects written straight into the worker clusters with the same client and concurrency (create
only), the rate no federation could beat. Goal: end-to-end ≥ 0.8 × floor and ≥ 150 jobs/s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import socket
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from federation import labels, signing  # noqa: E402
from federation.errors import AlreadyExists  # noqa: E402
from federation.kinds.crds import load_crds  # noqa: E402
from federation.kube import CRDS, NAMESPACES, Kube, Resource  # noqa: E402
from federation.settings import KubeSettings  # noqa: E402

PYTORCHJOBS = Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
WORKERS = ("worker-1", "worker-2", "worker-3")
NAMESPACE = "bench"
FLOOR_NAMESPACE = "bench-floor"
CONCURRENCY = 64
"""Creations in flight at once, for the end-to-end run and the floor alike."""


def reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def job(name: str, namespace: str, managed_by: str | None) -> dict[str, Any]:
    def replica() -> dict[str, Any]:
        return {"replicas": 1, "restartPolicy": "OnFailure", "template": {
            "metadata": {"annotations": {"kubesim.mkd.dev/run-seconds": "3600"}},
            "spec": {"containers": [{"name": "pytorch", "image": "docker.io/kubeflowkatib/pytorch-mnist:v1beta1",
                                     "command": ["python3", "/opt/pytorch-mnist/mnist.py", "--epochs=1"],
                                     "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}}}

    run_policy: dict[str, Any] = {"cleanPodPolicy": "None"}
    if managed_by:
        run_policy["managedBy"] = managed_by
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"runPolicy": run_policy, "pytorchReplicaSpecs": {"Master": replica(), "Worker": replica()}}}


def running(obj: dict[str, Any]) -> bool:
    return any(c.get("type") == "Running" and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or [])


# --- processes ---------------------------------------------------------------------------------------


@dataclass
class Processes:
    logs: Path
    procs: list[tuple[str, asyncio.subprocess.Process]] = field(default_factory=list)

    async def start(self, name: str, *args: str, ready: str | None = None, within: float = 60.0) -> list[str]:
        """Start ``args``; with ``ready``, wait for a stdout line containing it and return the lines so far."""
        log = (self.logs / f"{name}.log").open("w")
        proc = await asyncio.create_subprocess_exec(
            *args, stdout=asyncio.subprocess.PIPE if ready else log, stderr=log, cwd=str(REPO),
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.procs.append((name, proc))
        if ready is None:
            return []
        assert proc.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            raw = await asyncio.wait_for(proc.stdout.readline(), timeout=deadline - time.monotonic())
            if not raw:
                raise RuntimeError(f"{name} exited before it was ready; see {self.logs / (name + '.log')}")
            lines.append(raw.decode().rstrip())
            if ready in lines[-1]:
                asyncio.get_running_loop().create_task(self._drain(proc, log))
                return lines
        raise RuntimeError(f"{name} not ready within {within}s")

    @staticmethod
    async def _drain(proc: asyncio.subprocess.Process, log: Any) -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            log.write(line.decode())

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time (user + system) each process has used so far: where the two cores went."""
        import psutil

        out: dict[str, float] = {}
        for name, proc in self.procs:
            with contextlib.suppress(psutil.Error):
                times = psutil.Process(proc.pid).cpu_times()
                out[name] = times.user + times.system
        return out

    def check(self) -> None:
        for name, proc in self.procs:
            if proc.returncode is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}; see {self.logs / (name + '.log')}")

    async def stop(self) -> None:
        for _, proc in reversed(self.procs):
            if proc.returncode is None:
                proc.terminate()
        for _, proc in self.procs:
            try:
                await asyncio.wait_for(proc.wait(), timeout=15)
            except TimeoutError:
                proc.kill()


async def start_kubesim(procs: Processes, name: str, state: Path, nodes: int) -> Path:
    lines = await procs.start(
        f"kubesim-{name}", sys.executable, "-m", "kubesim", "--clusters", name, "--nodes", str(nodes),
        "--node-cpu", "4000", "--node-memory", "16000Gi", "--node-pods", "20000",
        "--state-dir", str(state / "sim"), ready="kubesim: ready")
    for line in lines:
        if f"cluster {name} " in line:
            return Path(line.rsplit("kubeconfig ", 1)[1])
    raise RuntimeError(f"kubesim {name}: no kubeconfig line in {lines}")


# --- measuring --------------------------------------------------------------------------------------


@dataclass
class Times:
    created: dict[str, float] = field(default_factory=dict)
    on_worker: dict[str, float] = field(default_factory=dict)
    on_manager: dict[str, float] = field(default_factory=dict)
    all_on_manager: asyncio.Event = field(default_factory=asyncio.Event)


async def follow(kube: Kube, namespace: str, into: dict[str, float], expected: int,
                 done: asyncio.Event | None = None) -> None:
    """Record when each job is first seen Running (one informer per cluster)."""
    async for event in kube.informer(PYTORCHJOBS, namespace):
        name = event.object["metadata"]["name"]
        if name not in into and running(event.object):
            into[name] = time.monotonic()
            if done is not None and len(into) >= expected:
                done.set()


async def create_all(kube_for: Any, manifests: list[dict[str, Any]], created: dict[str, float]) -> float:
    """Create every manifest (CONCURRENCY in flight); returns the elapsed seconds."""
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for m in manifests:
        queue.put_nowait(m)

    async def worker() -> None:
        while not queue.empty():
            m = queue.get_nowait()
            kube = kube_for(m)
            await kube.create(PYTORCHJOBS, m, m["metadata"]["namespace"])
            created[m["metadata"]["name"]] = time.monotonic()

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return time.monotonic() - started


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Result:
    n: int
    e2e_rate: float
    create_rate: float
    floor_rate: float
    leg1: list[float]
    leg2: list[float]
    total: list[float]
    backends: str
    placed: dict[str, int]
    cpu: dict[str, float]
    wall: float
    missing: str

    def lines(self) -> list[str]:
        ratio = self.e2e_rate / self.floor_rate if self.floor_rate else float("nan")
        out = [f"N = {self.n} PyTorchJobs (1 master + 1 worker) across {len(WORKERS)} workers; {self.backends}",
               f"  end to end     {self.e2e_rate:8.1f} jobs/s  (created on manager -> Running mirrored on manager)",
               f"  creation       {self.create_rate:8.1f} jobs/s  (manager API, {CONCURRENCY} in flight)",
               f"  floor          {self.floor_rate:8.1f} jobs/s  (same objects straight into the workers)",
               f"  ratio          {ratio:8.2f} x floor  (goal >= 0.8, and >= 150 jobs/s)",
               f"  placed         {', '.join(f'{k}: {v}' for k, v in sorted(self.placed.items()))}"]
        if self.missing:
            out.append(f"  {self.missing}")
        busy = sorted(self.cpu.items(), key=lambda kv: -kv[1])
        out.append(f"  CPU seconds during the end-to-end phase ({self.wall:.0f} s wall, 2 cores): "
                   + ", ".join(f"{k} {v:.0f}" for k, v in busy))
        for name, leg in (("leg 1 manager->worker Running", self.leg1), ("leg 2 worker->manager mirror", self.leg2),
                          ("total", self.total)):
            out.append(f"  {name:<30} p50 {pct(leg, 0.5) * 1000:8.0f} ms   p99 {pct(leg, 0.99) * 1000:8.0f} ms"
                       f"   max {max(leg, default=float('nan')) * 1000:8.0f} ms")
        return out


async def run(n: int, state: Path, nodes: int, dispatcher_args: list[str], agent_args: list[str]) -> Result:
    logs = state / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    procs = Processes(logs)
    stack = contextlib.AsyncExitStack()
    try:
        # --- backends ---
        use_mosquitto = reachable("127.0.0.1", 1883) and not os.environ.get("MKD_TEST_NO_SERVICES")
        use_postgres = reachable("127.0.0.1", 5432) and not os.environ.get("MKD_TEST_NO_SERVICES")
        if use_mosquitto:
            mqtt_url = "mqtt://127.0.0.1:1883"
        else:
            from federation.embedded_broker import EmbeddedBroker

            mqtt_url = (await stack.enter_async_context(EmbeddedBroker())).url
        if use_postgres:
            import asyncpg

            dbname = f"mkd_bench_{uuid.uuid4().hex[:8]}"
            admin = await asyncpg.connect("postgresql://postgres@127.0.0.1:5432/test")
            await admin.execute(f'CREATE DATABASE "{dbname}"')
            await admin.close()
            database_url = f"postgresql+asyncpg://postgres@127.0.0.1:5432/{dbname}"
        else:
            database_url = f"sqlite+aiosqlite:///{state / 'mkd.db'}"
        backends = ("Mosquitto" if use_mosquitto else "embedded broker (Mosquitto NOT reachable)") + " + " + \
                   ("PostgreSQL" if use_postgres else "SQLite (PostgreSQL NOT reachable)")
        topic_root = f"mkd-bench-{uuid.uuid4().hex[:6]}/v1"
        from dispatcher import db

        await db.upgrade_async(database_url)

        # --- clusters, each in its own process ---
        names = ("manager", *WORKERS)
        configs = dict(zip(names, await asyncio.gather(
            *(start_kubesim(procs, name, state, nodes) for name in names)), strict=True))
        settings = KubeSettings(max_concurrency=CONCURRENCY)
        kubes = {name: await stack.enter_async_context(Kube(configs[name], settings=settings)) for name in names}
        for name in names:
            for crd in load_crds():
                with contextlib.suppress(AlreadyExists):
                    await kubes[name].create(CRDS, crd)
            for ns in (NAMESPACE, FLOOR_NAMESPACE):
                with contextlib.suppress(AlreadyExists):
                    await kubes[name].create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                                          "metadata": {"name": ns}})

        # --- the services, each in its own process ---
        mkctl = [sys.executable, "-m", "mkctl.main"]
        common = ["--mqtt-url", mqtt_url, "--mqtt-topic-root", topic_root, "--origin", "bench"]
        # Client ids unique to this run: a persistent MQTT session keeps its old subscriptions and queue.
        tag = topic_root.split("/")[0]
        # every message is signed: a key pair per service, the agents' public keys trusted by the dispatcher
        keys = {name: signing.generate() for name in ("dispatcher", *WORKERS)}
        await procs.start("dispatcher", *mkctl, "dispatcher", "--kubeconfig", str(configs["manager"]),
                          "--database-url", database_url, "--mqtt-client-id", f"{tag}-dispatcher", *common,
                          "--signing-private-key", keys["dispatcher"][0],
                          "--cluster-public-keys", json.dumps({w: keys[w][1] for w in WORKERS}), *dispatcher_args)
        for w in WORKERS:
            await procs.start(f"agent-{w}", *mkctl, "agent", "--cluster-name", w, "--kubeconfig", str(configs[w]),
                              "--mqtt-client-id", f"{tag}-agent-{w}", "--heartbeat-interval-seconds", "2", *common,
                              "--signing-private-key", keys[w][0],
                              "--dispatcher-public-keys", json.dumps([keys["dispatcher"][1]]), *agent_args)
        await wait_clusters_online(database_url, procs)

        # --- end to end ---
        times = Times()
        watchers = [asyncio.create_task(follow(kubes["manager"], NAMESPACE, times.on_manager, n,
                                               times.all_on_manager))]
        watchers += [asyncio.create_task(follow(kubes[w], NAMESPACE, times.on_worker, n)) for w in WORKERS]
        manifests = [job(f"job-{i:05d}", NAMESPACE, labels.MULTIKUEUE) for i in range(n)]
        cpu_before = procs.cpu_seconds()
        started = time.monotonic()
        create_seconds = await create_all(lambda _: kubes["manager"], manifests, times.created)
        deadline = time.monotonic() + max(120.0, n / 10)
        while not times.all_on_manager.is_set():
            procs.check()
            if time.monotonic() > deadline:  # report what did arrive, and how much did not
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(times.all_on_manager.wait(), timeout=1.0)
        for t in watchers:
            t.cancel()
        wall = time.monotonic() - started
        cpu_after = procs.cpu_seconds()
        cpu = {k: cpu_after[k] - cpu_before.get(k, 0.0) for k in cpu_after}
        self_cpu = os.times()
        cpu["bench (this process, whole run)"] = self_cpu.user + self_cpu.system
        first = min(times.created.values())
        e2e_rate = len(times.on_manager) / (max(times.on_manager.values(), default=first + 1) - first)
        missing = ""
        if len(times.on_manager) < n:
            # A fresh list tells a lost mirror (the manager never got it) from a missed watch event.
            listed = (await kubes["manager"].list(PYTORCHJOBS, NAMESPACE)).items
            running_now = sum(1 for j in listed if running(j))
            missing = (f"INCOMPLETE: {n - len(times.on_manager)} of {n} never seen Running on the manager within "
                       f"{deadline - started:.0f} s ({len(times.on_worker)} were Running on workers; a fresh list "
                       f"of the manager finds {running_now} Running)")
        keys = [k for k in times.created if k in times.on_worker and k in times.on_manager]
        leg1 = [times.on_worker[k] - times.created[k] for k in keys]
        leg2 = [max(0.0, times.on_manager[k] - times.on_worker[k]) for k in keys]
        total = [times.on_manager[k] - times.created[k] for k in keys]
        placed = {w: len((await kubes[w].list(PYTORCHJOBS, NAMESPACE)).items) for w in WORKERS}

        # --- the floor: same objects, same client, straight into the workers ---
        floor = [job(f"floor-{i:05d}", FLOOR_NAMESPACE, labels.TRAINING_OPERATOR) for i in range(n)]
        floor_seconds = await create_all(lambda m: kubes[WORKERS[int(m["metadata"]["name"][6:]) % 3]], floor, {})
        return Result(n, e2e_rate, n / create_seconds, n / floor_seconds, leg1, leg2, total, backends, placed,
                      cpu, wall, missing)
    finally:
        await procs.stop()
        await stack.aclose()


async def wait_clusters_online(database_url: str, procs: Processes, within: float = 60.0) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession

    from dispatcher.db import make_engine, queries

    engine = make_engine(database_url)
    try:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            procs.check()
            with contextlib.suppress(Exception):
                async with AsyncSession(engine) as session:
                    rows = await queries.list_clusters(session)
                if sum(1 for r in rows if r.online) >= len(WORKERS):
                    return
            await asyncio.sleep(0.5)
        raise RuntimeError("the agents' heartbeats did not reach the dispatcher within 60 s")
    finally:
        await engine.dispose()


def machine() -> str:
    try:
        import psutil

        mem = f"{psutil.virtual_memory().total / 2**30:.0f} GiB"
    except ImportError:
        mem = "?"
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} cores ({cpu}), {mem} RAM, Python {platform.python_version()}, {platform.system()}"


def write_results(results: list[Result]) -> None:
    path = REPO / "bench" / "RESULTS.md"
    begin, end = "<!-- e2e_bench -->", "<!-- /e2e_bench -->"
    body = [begin, "## End to end (`bench/e2e_bench.py`)", "", f"Machine: {machine()}.", "", "```"]
    for r in results:
        body += [*r.lines(), ""]
    body[-1] = "```"
    body.append(end)
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmark results\n"
    if begin in text and end in text:
        head, _, rest = text.partition(begin)
        text = head + "\n".join(body) + rest.partition(end)[2]
    else:
        text = text.rstrip() + "\n\n" + "\n".join(body) + "\n"
    path.write_text(text, encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, action="append", help="jobs per run (repeatable); default 1000")
    parser.add_argument("--state-dir", type=Path, default=REPO / "state" / "e2e-bench")
    parser.add_argument("--nodes", type=int, default=4, help="nodes per worker cluster")
    parser.add_argument("--write-results", action="store_true", help="update bench/RESULTS.md")
    parser.add_argument("--dispatcher-args", default="", help="extra mkctl dispatcher flags (one string)")
    parser.add_argument("--agent-args", default="", help="extra mkctl agent flags (one string)")
    args = parser.parse_args()
    import logging

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    print(f"machine: {machine()}")
    results = []
    for n in args.n or [1000]:
        result = asyncio.run(run(n, args.state_dir / f"n{n}-{uuid.uuid4().hex[:4]}", args.nodes,
                                 args.dispatcher_args.split(), args.agent_args.split()))
        print("\n".join(result.lines()), flush=True)
        results.append(result)
    if args.write_results:
        write_results(results)


if __name__ == "__main__":
    main()
