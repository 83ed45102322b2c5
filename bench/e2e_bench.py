"""End-to-end throughput: PyTorchJobs from creation on the manager to Running on a worker and back.

    .venv/bin/python bench/e2e_bench.py                # 1,000 jobs
    .venv/bin/python bench/e2e_bench.py -n 1000 -n 10000 --write-results
    .venv/bin/python bench/e2e_bench.py -n 1000 --rate 100   # paced: 100 jobs/s offered, for the p99 latency

Topology: four kubesim clusters, each in its own process (``python -m kubesim``), a dispatcher and three
agents each in its own process (``mkctl dispatcher`` / ``mkctl agent``), so no two of them share a GIL; real
Mosquitto and PostgreSQL when they answer on 127.0.0.1 (else the embedded broker, in this process, and SQLite
— the output says so). This process only creates the jobs and watches them.
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

from bench.dispatch_bench import ADMIN_DATABASE, drop_postgres, fresh_postgres  # noqa: E402
from bench.e2e_measure import (  # noqa: E402
    AGENT_STAGES,
    POSTGRES,
    STAGES,
    collapsed_top,
    cpu_lines,
    pct,
    report_stamps,
    stage_table,
)
from federation import eventloop, gctune, labels, signing, topics  # noqa: E402
from federation.errors import AlreadyExists  # noqa: E402
from federation.kinds.crds import load_crds  # noqa: E402
from federation.kinds.registry import by_name  # noqa: E402
from federation.kube import CRDS, NAMESPACES, Kube, Resource  # noqa: E402
from federation.settings import KubeSettings  # noqa: E402

PYTORCHJOBS = Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
WORKERS = ("worker-1", "worker-2", "worker-3")
NAMESPACE = "bench"
FLOOR_NAMESPACE = "bench-floor"
CONCURRENCY = 64
"""Creations in flight at once, for the end-to-end run and the floor alike."""
LATE_SECONDS = 300.0
"""After the deadline, how long an incomplete run keeps watching to tell late mirrors from lost ones."""


def reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# What each service did, per job, read off its own /metrics before and after the end-to-end phase:
# (label in the table, service, metric family with its labels as Prometheus prints them, or a prefix of it)
WORK = (("manager status writes (written)", "dispatcher", 'mkd_kube_writes_total{result="written"}'),
        ("manager status writes (unchanged)", "dispatcher", 'mkd_kube_writes_total{result="unchanged"}'),
        ("Reports received", "dispatcher", "mkd_reports_received_total"),
        ("Report messages (batches)", "dispatcher", "mkd_report_messages_received_total"),
        ("Commands published", "dispatcher", "mkd_outbox_commands_published_total"),
        ("Command messages (batches)", "dispatcher", "mkd_outbox_messages_published_total"),
        ("engine batches (transactions)", "dispatcher", "mkd_engine_batches_total"),
        ("agent watch echoes not decoded", "agents", "mkd_agent_watch_echoes_total"),
        ("agent reconcile passes", "agents", 'mkd_agent_reconcile_duration_seconds_count{kind="PyTorchJob"}'),
        ("agent API calls", "agents", "mkd_agent_api_calls_total{"))


def scrape(port: int) -> dict[str, float]:
    """The samples of one service's /metrics (name{labels} -> value); empty when it does not answer."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                out[key] = float(value)
    return out


def work_per_job(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]],
                 n: int) -> list[tuple[str, float]]:
    """Per job, what the services did during the phase (``before``/``after``: samples by service name)."""
    rows: list[tuple[str, float]] = []
    for label, service, key in WORK:
        names = [s for s in after if s == service or (service == "agents" and s.startswith("agent-"))]
        total = 0.0
        by_verb: dict[str, float] = {}
        for name in names:
            for k, v in after[name].items():
                if k == key or (key.endswith("{") and k.startswith(key)):
                    d = v - before.get(name, {}).get(k, 0.0)
                    total += d
                    if key.endswith("{"):
                        verb = k.partition('verb="')[2].partition('"')[0]
                        by_verb[verb] = by_verb.get(verb, 0.0) + d
        rows.append((label, total / max(n, 1)))
        rows += [(f"  {verb}", v / max(n, 1)) for verb, v in sorted(by_verb.items()) if v]
    return rows


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
    stopped: set[str] = field(default_factory=set)
    """Processes stopped on purpose (``stop_some``): not a failure, not metered again."""

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

    def pids(self, names: tuple[str, ...] | None = None) -> dict[str, int]:
        """The processes started and not stopped on purpose (``stop_some``), or those of ``names``."""
        return {name: proc.pid for name, proc in self.procs
                if (names is None and name not in self.stopped) or (names is not None and name in names)}

    async def stop_some(self, names: tuple[str, ...]) -> None:
        """Stop these processes (by their own pid), e.g. the federation before the floor runs."""
        chosen = [proc for name, proc in self.procs if name in names and proc.returncode is None]
        self.stopped.update(names)
        for proc in chosen:
            proc.terminate()
        for proc in chosen:
            try:
                await asyncio.wait_for(proc.wait(), timeout=15)
            except TimeoutError:
                proc.kill()

    def check(self) -> None:
        for name, proc in self.procs:
            if proc.returncode is not None and name not in self.stopped:
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


class CpuMeter:
    """CPU seconds (user + system, all threads) that each tracked process used since it was tracked.

    Sampled again at every ``sample()``: a process that exits keeps its last reading. Processes
    first seen after ``start()`` (PostgreSQL backends the dispatcher opens later) count from zero.
    """

    def __init__(self) -> None:
        self.base: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.label: dict[int, str] = {}
        self.started = False

    @staticmethod
    def _read(pid: int) -> float | None:
        import psutil

        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.Error:
            return None
        return float(t.user + t.system)

    def track(self, label: str, pid: int) -> None:
        if pid in self.label:
            return
        now = self._read(pid)
        if now is None:
            return
        self.label[pid] = label
        self.base[pid] = now if not self.started else 0.0
        self.last[pid] = now

    def start(self) -> None:
        self.started = True

    def sample(self) -> None:
        for pid in self.label:
            now = self._read(pid)
            if now is not None:
                self.last[pid] = now

    def used(self) -> dict[str, float]:
        self.sample()
        out: dict[str, float] = {}
        for pid, label in self.label.items():
            out[label] = out.get(label, 0.0) + max(0.0, self.last[pid] - self.base[pid])
        return out


def listener_pid(port: int) -> int | None:
    """The pid listening on 127.0.0.1:``port`` (the shared Mosquitto), or None when not visible."""
    import psutil

    with contextlib.suppress(psutil.Error):
        for c in psutil.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
                return int(c.pid)
    return None


async def meter(procs: Processes, database: str | None, mosquitto: bool) -> CpuMeter:
    """A CpuMeter over the run's processes, this one, the shared Mosquitto and this database's backends."""
    m = CpuMeter()
    for name, pid in procs.pids().items():
        m.track(name, pid)
    m.track("bench (this process)", os.getpid())
    broker = listener_pid(1883) if mosquitto else None
    if broker is not None:
        m.track("mosquitto (shared: others' traffic too)", broker)
    if database:
        await track_backends(m, database)
    m.start()
    return m


async def track_backends(m: CpuMeter, database: str, conn: Any = None) -> None:
    """Track the backends of ``database`` now connected; through ``conn`` when given (an asyncpg connection to
    the ``test`` database), else through a connection of its own."""
    import asyncpg

    with contextlib.suppress(Exception):
        own = conn is None
        if own:
            conn = await asyncpg.connect(ADMIN_DATABASE)
        try:
            rows = await conn.fetch("SELECT pid FROM pg_stat_activity WHERE datname = $1", database)
        finally:
            if own:
                await conn.close()
        for r in rows:
            m.track(POSTGRES, int(r["pid"]))


async def keep_sampling(m: CpuMeter, database: str | None) -> None:
    """Every second: new backends of this run's database, and fresh readings (backends come and go).

    One connection for the whole run: a new one each second made PostgreSQL start a backend each second, CPU
    the run's processes then lacked and nobody counted."""
    import asyncpg

    conn = None
    if database:
        with contextlib.suppress(Exception):
            conn = await asyncpg.connect(ADMIN_DATABASE)
    try:
        while True:
            await asyncio.sleep(1.0)
            if database:
                await track_backends(m, database, conn)
            m.sample()
    finally:
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()


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
    """Record when each job is first seen Running (one informer per cluster). Compact: the informer keeps no copy
    of each job (every decoded job stayed alive for the collector to walk): 0.12 -> 0.09 CPU-ms per job in this process."""
    async for event in kube.informer(PYTORCHJOBS, namespace, compact=True):
        name = event.object["metadata"]["name"]
        if name not in into and running(event.object):
            into[name] = time.time()
            if done is not None and len(into) >= expected:
                done.set()


async def create_all(kube_for: Any, manifests: list[dict[str, Any]], created: dict[str, float],
                     rate: float | None = None) -> float:
    """Create every manifest (CONCURRENCY in flight); returns the elapsed seconds.

    ``rate``: paced, job i is not created before ``i / rate`` seconds after the start (an offered load,
    as users submitting at that rate); None: as fast as the manager's API takes them.
    """
    queue: asyncio.Queue[tuple[int, dict[str, Any]]] = asyncio.Queue()
    for i, m in enumerate(manifests):
        queue.put_nowait((i, m))
    begin = time.monotonic()

    async def worker() -> None:
        while not queue.empty():
            i, m = queue.get_nowait()
            if rate:
                await asyncio.sleep(max(0.0, begin + i / rate - time.monotonic()))
            kube = kube_for(m)
            await kube.create(PYTORCHJOBS, m, m["metadata"]["namespace"])
            created[m["metadata"]["name"]] = time.time()

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return time.monotonic() - started


async def tap_reports(mqtt_url: str, topic_root: str, into: dict[str, dict[str, float]],
                      subscribed: asyncio.Event) -> None:
    """Listen to every agent's Reports beside the dispatcher and note when each was sealed (per workload uid).

    A clean session of its own: the dispatcher's subscription and queue are not touched. The seal's time is
    the agent's clock, the same machine's as every other stage.
    """
    from federation.mqtt import MqttLink
    from federation.settings import MqttSettings

    settings = MqttSettings(url=mqtt_url, topic_root=topic_root)
    async with MqttLink(settings, client_id=f"{topic_root.split('/')[0]}-tap", persistent=False) as link:
        await link.subscribe(topics.all_reports(topic_root))
        subscribed.set()
        async for msg in link.messages():
            report_stamps(msg.payload, into)


async def dispatcher_stamps(database_url: str, namespace: str,
                            by_uid: dict[str, dict[str, float]] | None = None) -> dict[str, dict[str, float]]:
    """Per stage, job name -> wall-clock time, from the dispatcher's tables (read after the run).

    ``by_uid`` adds stages recorded per workload uid elsewhere (the Report tap), named here by their Job.
    """
    import sqlalchemy as sa
    from sqlalchemy.ext.asyncio import AsyncSession

    from dispatcher.db import make_engine
    from dispatcher.db.models import events, outbox, placements, workloads

    engine = make_engine(database_url)
    out: dict[str, dict[str, float]] = {k: {} for k in ("claimed", "placed", "queued", "published", "accepted",
                                                        "reported")}
    try:
        async with AsyncSession(engine) as session:
            names = {r.uid: r.name for r in (await session.execute(
                sa.select(workloads.c.uid, workloads.c.name).where(workloads.c.namespace == namespace))).all()}
            for etype, key in (("claimed", "claimed"), ("placed", "placed"), ("running", "reported")):
                rows = await session.execute(
                    sa.select(events.c.workload_uid, sa.func.min(events.c.at))
                    .where(events.c.type == etype).group_by(events.c.workload_uid))
                for uid, at in rows.all():
                    if uid in names and at is not None:
                        out[key][names[uid]] = at.timestamp()
            rows = await session.execute(
                sa.select(outbox.c.workload_uid, sa.func.min(outbox.c.created_at), sa.func.min(outbox.c.sent_at))
                .where(outbox.c.workload_uid.is_not(None)).group_by(outbox.c.workload_uid))
            for row in rows.all():
                uid, queued, sent = tuple(row)
                if uid in names:
                    if queued is not None:
                        out["queued"][names[uid]] = queued.timestamp()
                    if sent is not None:
                        out["published"][names[uid]] = sent.timestamp()
            rows = await session.execute(
                sa.select(placements.c.workload_uid, sa.func.min(placements.c.accepted_at))
                .group_by(placements.c.workload_uid))
            for uid, accepted in rows.all():
                if uid in names and accepted is not None:
                    out["accepted"][names[uid]] = accepted.timestamp()
            for stage, times in (by_uid or {}).items():
                out[stage] = {names[uid]: t for uid, t in times.items() if uid in names}
    finally:
        await engine.dispose()
    return out


async def floor_run(kubes: dict[str, Kube], n: int) -> tuple[float, int]:
    """The same work with no federation: per job the user's create and the writes mkd causes.

    Returns (elapsed seconds, Kubernetes writes made). The worker copy, its children and its status
    are what ``prepare_for_worker`` and the agent's own PyTorchJob reconciler produce, with the labels the
    dispatcher and the annotations the agent stamp on them; no dispatcher
    or agent is running (they are stopped before this), so nothing else touches these objects.
    """
    from datetime import UTC, datetime

    from dispatcher.workload import stamp
    from federation.kube import PODS, SERVICES
    from worker_agent.reconcilers import conditions as cond
    from worker_agent.reconcilers.base import Observed
    from worker_agent.reconcilers.pytorch import PyTorchJobReconciler

    kind = by_name("PyTorchJob")
    rec = PyTorchJobReconciler()
    writes = 0
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)

    async def one(i: int) -> None:
        nonlocal writes
        name = f"floor-{i:05d}"
        manager, worker = kubes["manager"], kubes[WORKERS[i % len(WORKERS)]]
        on_manager = await manager.create(PYTORCHJOBS, job(name, FLOOR_NAMESPACE, labels.MULTIKUEUE), FLOOR_NAMESPACE)
        uid = on_manager["metadata"]["uid"]
        body = kind.prepare_for_worker(on_manager, stamp=stamp(origin="bench-floor", uid=uid, attempt=1, epoch=1,
                                                               kind=kind.name), managed_by=None)
        # what the agent adds to the copy and to each child it creates (worker_agent/inbox.py, apply.py)
        body["metadata"]["annotations"] = {**(body["metadata"].get("annotations") or {}),
                                           labels.SPEC_VERSION_ANNOTATION: "1", labels.CREATED_BY: "bench-floor"}
        copy_ = await worker.create(PYTORCHJOBS, body, FLOOR_NAMESPACE)
        plan = rec.render(Observed(job=copy_, children={}, now=datetime.now(UTC)))
        owner = {"apiVersion": copy_["apiVersion"], "kind": copy_["kind"], "name": name,
                 "uid": copy_["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
        for res, child in plan.creates:
            assert res in (PODS, SERVICES), res
            meta = child.setdefault("metadata", {})
            meta["ownerReferences"] = [owner]
            meta["annotations"] = {**(meta.get("annotations") or {}), labels.CREATED_BY: "bench-floor"}
            await worker.create(res, child, FLOOR_NAMESPACE)
        status = dict(plan.status or {})
        for entry in (status.get("replicaStatuses") or {}).values():
            entry["active"] = 1
        cond.set_condition(status, cond.RUNNING, "True", rec.reason("Running"),
                           f"PyTorchJob {name} is running.", datetime.now(UTC))
        written = await worker.replace(PYTORCHJOBS, {**copy_, "status": status}, FLOOR_NAMESPACE,
                                       subresource="status")
        await manager.patch(PYTORCHJOBS, name, {"status": written.get("status")}, FLOOR_NAMESPACE,
                            subresource="status")
        writes += 4 + len(plan.creates)

    async def worker_loop() -> None:
        while not queue.empty():
            await one(queue.get_nowait())

    started = time.monotonic()
    await asyncio.gather(*(worker_loop() for _ in range(CONCURRENCY)))
    return time.monotonic() - started, writes


FEDERATION = ("dispatcher", *(f"agent-{w}" for w in WORKERS))


@dataclass
class Result:
    n: int
    e2e_rate: float
    create_rate: float
    floor_rate: float
    floor_writes: int
    stamps: dict[str, dict[str, float]]
    backends: str
    placed: dict[str, int]
    cpu: dict[str, float]
    wall: float
    floor_cpu: dict[str, float]
    floor_wall: float
    missing: str
    load: tuple[str, str] = ("", "")
    profiles: dict[str, list[tuple[str, int, int]]] = field(default_factory=dict)
    work: list[tuple[str, float]] = field(default_factory=list)
    rate: float | None = None
    """Offered load (jobs/s) of a paced run; None: created as fast as the manager's API takes them."""
    floor_before_rate: float = 0.0
    """The floor run before the federation started (the one in ``floor_rate`` ran after it stopped)."""
    floor_before_cpu: dict[str, float] = field(default_factory=dict)
    floor_before_wall: float = 0.0

    @property
    def floor_mean(self) -> float:
        """The mean of the floor's rate before and after the end-to-end phase (the ratio's reference)."""
        rates = [r for r in (self.floor_before_rate, self.floor_rate) if r]
        return sum(rates) / len(rates) if rates else float("nan")

    def figures(self) -> dict[str, Any]:
        """The run's headline figures as JSON data (``--json``; what ``bench/e2e_pair.py`` compares)."""
        per_job = {name: seconds * 1000 / max(self.n, 1) for name, seconds in self.cpu.items()}
        return {"n": self.n, "e2e_rate": self.e2e_rate, "floor_rate": self.floor_mean,
                "ratio": self.e2e_rate / self.floor_mean, "wall": self.wall, "complete": not self.missing,
                "cpu_ms_per_job": per_job, "total_ms_per_job": sum(per_job.values()),
                "dispatcher_agents_ms_per_job": sum(v for k, v in per_job.items() if k in FEDERATION)}

    def lines(self) -> list[str]:
        ratio = self.e2e_rate / self.floor_mean
        each = ", ".join(f"{self.e2e_rate / r:.2f} against the floor {when}" for when, r in
                         (("before", self.floor_before_rate), ("after", self.floor_rate)) if r)
        out = [f"N = {self.n} PyTorchJobs (1 master + 1 worker) across {len(WORKERS)} workers; {self.backends}",
               f"  load average before: {self.load[0]}; after: {self.load[1]}",
               f"  end to end     {self.e2e_rate:8.1f} jobs/s  (created on manager -> Running mirrored on manager)",
               f"  creation       {self.create_rate:8.1f} jobs/s  (manager API, {CONCURRENCY} in flight"
               + (f"; paced: {self.rate:g} jobs/s offered)" if self.rate else ")"),
               f"  floor          {self.floor_mean:8.1f} jobs/s  (same work, one client, {CONCURRENCY} jobs in flight:"
               f" {self.floor_writes / max(self.n, 1):.0f} writes/job; the mean of {self.floor_before_rate:.1f} before"
               f" the end-to-end phase and {self.floor_rate:.1f} after it)",
               f"  ratio          {ratio:8.2f} x floor  (goal >= 0.5 x floor, and >= 150 jobs/s; {each})",
               f"  placed         {', '.join(f'{k}: {v}' for k, v in sorted(self.placed.items()))}"]
        if self.missing:
            out.append(f"  {self.missing}")
        out.append(f"  CPU during the end-to-end phase ({self.wall:.1f} s wall), per process:")
        out += cpu_lines(self.cpu, self.n, self.wall, federation=FEDERATION)
        if self.work:
            out.append("  work per job during the end-to-end phase (each service's /metrics):")
            out += [f"    {label:<44} {v:7.2f}" for label, v in self.work]
        if self.floor_before_cpu:
            out.append(f"  CPU during the floor before ({self.floor_before_wall:.1f} s wall; on four clusters of its own,"
                       " before the federation started):")
            out += cpu_lines(self.floor_before_cpu, self.n, self.floor_before_wall, federation=FEDERATION)
        out.append(f"  CPU during the floor after ({self.floor_wall:.1f} s wall; dispatcher and agents stopped):")
        out += cpu_lines(self.floor_cpu, self.n, self.floor_wall, federation=FEDERATION)
        out.append("  stages (wall clock of this machine; dispatcher rows have its clock, watches this one's):")
        out += stage_table(self.stamps, [s for s in STAGES if s[0] in self.stamps or s[0] not in AGENT_STAGES])
        if "worker_running" in self.stamps:
            legs = {"leg 1 manager->worker Running": ("created", "worker_running"),
                    "leg 2 worker->manager mirror": ("worker_running", "mirrored"), "total": ("created", "mirrored")}
        else:
            out.append("  (agent-side stages not observed: --agent-stages adds them, at ~0.25-0.3 CPU-ms/job in this process)")
            legs = {"leg 1 manager->Report recorded": ("created", "reported"),
                    "leg 2 Report->manager mirror": ("reported", "mirrored"), "total": ("created", "mirrored")}
        for name, (a, b) in legs.items():
            leg = [max(0.0, t - self.stamps[a][k]) for k, t in self.stamps[b].items() if k in self.stamps[a]]
            out.append(f"  {name:<30} p50 {pct(leg, 0.5) * 1000:8.0f} ms   p99 {pct(leg, 0.99) * 1000:8.0f} ms"
                       f"   max {max(leg, default=float('nan')) * 1000:8.0f} ms")
        for proc, top in self.profiles.items():
            out.append(f"  py-spy top {len(top)} frames of {proc} (own samples; samples on stack):")
            out += [f"    {own:6d} {anywhere:6d}  {frame}" for frame, own, anywhere in top] or ["    (no samples)"]
        return out


async def run(n: int, state: Path, nodes: int, dispatcher_args: list[str], agent_args: list[str],
              py_spy: bool = False, rate: float | None = None, py_spy_kubesims: bool = False,
              agent_stages: bool = False) -> Result:
    logs = state / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    procs = Processes(logs)
    stack = contextlib.AsyncExitStack()
    dbname: str | None = None
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
            database_url, dbname = await fresh_postgres()
        else:
            database_url = f"sqlite+aiosqlite:///{state / 'mkd.db'}"
        backends = ("Mosquitto" if use_mosquitto else "embedded broker (Mosquitto NOT reachable)") + " + " + \
                   ("PostgreSQL" if use_postgres else "SQLite (PostgreSQL NOT reachable)")
        topic_root = f"mkd-bench-{uuid.uuid4().hex[:6]}/v1"
        from dispatcher import db

        await db.upgrade_async(database_url)

        # --- clusters, each in its own process ---
        configs, kubes = await clusters(procs, stack, state, nodes, "", (NAMESPACE, FLOOR_NAMESPACE))

        # --- the floor, once before the federation starts: a shared machine's speed drifts over minutes, and the
        # ratio is taken against the mean of a floor before and one after the end-to-end phase. It runs on four
        # clusters of its own, stopped before the federation starts (its manager Jobs are multikueue's, and
        # kubesim takes minutes to delete 80,000 objects).
        before_seconds, before_used = await floor_before(procs, state, nodes, n, use_mosquitto)

        # --- the services, each in its own process ---
        mkctl = [sys.executable, "-m", "mkctl.main"]
        common = ["--mqtt-url", mqtt_url, "--mqtt-topic-root", topic_root, "--origin", "bench"]
        # Client ids unique to this run: a persistent MQTT session keeps its old subscriptions and queue.
        tag = topic_root.split("/")[0]
        # every message is signed: a key pair per service, the agents' public keys trusted by the dispatcher
        keys = {name: signing.generate() for name in ("dispatcher", *WORKERS)}
        ports = {name: free_port() for name in FEDERATION}
        await procs.start("dispatcher", *mkctl, "dispatcher", "--kubeconfig", str(configs["manager"]),
                          "--database-url", database_url, "--mqtt-client-id", f"{tag}-dispatcher", *common,
                          "--signing-private-key", keys["dispatcher"][0],
                          "--cluster-public-keys", json.dumps({w: keys[w][1] for w in WORKERS}),
                          "--api-port", str(ports["dispatcher"]), *dispatcher_args)
        # The agents start once the dispatcher listens: what an agent sends before that (its first heartbeat
        # and Inventory) no subscription keeps, so the dispatcher meets its report stream part-way and answers
        # with a Resync, which lands in the burst and has every agent report its jobs again.
        await wait_for_log(logs / "dispatcher.log", "listening to the agents' Reports", procs)
        for w in WORKERS:
            await procs.start(f"agent-{w}", *mkctl, "agent", "--cluster-name", w, "--kubeconfig", str(configs[w]),
                              "--mqtt-client-id", f"{tag}-agent-{w}", "--heartbeat-interval-seconds", "2", *common,
                              "--signing-private-key", keys[w][0],
                              "--dispatcher-public-keys", json.dumps([keys["dispatcher"][1]]),
                              "--metrics-port", str(ports[f"agent-{w}"]), *agent_args)
        await wait_clusters_online(database_url, procs)

        # --- end to end ---
        times = Times()
        watchers = [asyncio.create_task(follow(kubes["manager"], NAMESPACE, times.on_manager, n,
                                               times.all_on_manager))]
        sealed: dict[str, dict[str, float]] = {}
        if agent_stages:
            watchers += [asyncio.create_task(follow(kubes[w], NAMESPACE, times.on_worker, n)) for w in WORKERS]
            tapped = asyncio.Event()
            watchers.append(asyncio.create_task(tap_reports(mqtt_url, topic_root, sealed, tapped)))
            await asyncio.wait_for(tapped.wait(), timeout=30)
        manifests = [job(f"job-{i:05d}", NAMESPACE, labels.MULTIKUEUE) for i in range(n)]
        load_before = uptime()
        counted = {name: await asyncio.to_thread(scrape, port) for name, port in ports.items()}
        cpu = await meter(procs, dbname, use_mosquitto)
        sampler = asyncio.create_task(keep_sampling(cpu, dbname))
        spies = await start_py_spy(procs, logs, py_spy_kubesims) if py_spy or py_spy_kubesims else {}
        started = time.monotonic()
        create_seconds = await create_all(lambda _: kubes["manager"], manifests, times.created, rate)
        deadline = time.monotonic() + max(120.0, n / 10)
        while not times.all_on_manager.is_set():
            procs.check()
            if time.monotonic() > deadline:  # report what did arrive, and how much did not
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(times.all_on_manager.wait(), timeout=1.0)
        wall = time.monotonic() - started
        sampler.cancel()
        used = cpu.used()
        work = work_per_job(counted, {name: await asyncio.to_thread(scrape, port) for name, port in ports.items()}, n)
        profiles = await stop_py_spy(spies)
        load_after = uptime()
        missing = ""
        if len(times.on_manager) < n:
            # Late or lost? Keep watching (the federation still runs) for as long again as the run took,
            # at most LATE_SECONDS: a mirror that arrives now was late; one that never does was lost.
            # A fresh list at the end tells a lost mirror (the manager never got it) from a missed watch event.
            on_time = len(times.on_manager)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(times.all_on_manager.wait(), timeout=min(wall, LATE_SECONDS))
            listed = (await kubes["manager"].list(PYTORCHJOBS, NAMESPACE)).items
            running_now = sum(1 for j in listed if running(j))
            late = len(times.on_manager) - on_time
            missing = (f"INCOMPLETE: {n - on_time} of {n} not seen Running on the manager within {wall:.0f} s; "
                       f"{late} of them arrived in the {min(wall, LATE_SECONDS):.0f} s after (late), "
                       f"{n - on_time - late} never (lost); "
                       + (f"{len(times.on_worker)} Running on workers; " if agent_stages else "") + "a fresh "
                       f"list of the manager finds {running_now} Running")
            times.on_manager = dict(list(times.on_manager.items())[:on_time])  # the figures below: on time only
        for t in watchers:
            t.cancel()
        first = min(times.created.values())
        e2e_rate = len(times.on_manager) / (max(times.on_manager.values(), default=first + 1) - first)
        stamps = {"created": times.created, **await dispatcher_stamps(database_url, NAMESPACE, sealed),
                  "mirrored": times.on_manager}
        if agent_stages:
            stamps["worker_running"] = times.on_worker
        placed = {w: len((await kubes[w].list(PYTORCHJOBS, NAMESPACE)).items) for w in WORKERS}

        # --- the floor: the same work with no federation (dispatcher and agents stopped first) ---
        await procs.stop_some(FEDERATION)
        floor_cpu = await meter(procs, None, use_mosquitto)
        floor_seconds, floor_writes = await floor_run(kubes, n)
        floor_used = floor_cpu.used()
        return Result(n, e2e_rate, n / create_seconds, n / floor_seconds, floor_writes, stamps, backends, placed,
                      used, wall, floor_used, floor_seconds, missing, (load_before, load_after), profiles, work,
                      rate, n / before_seconds, before_used, before_seconds)
    finally:
        await procs.stop()
        await stack.aclose()
        if dbname:  # this run's own database, every figure read from it: not left on the shared server
            with contextlib.suppress(Exception):
                await drop_postgres(dbname)


async def clusters(procs: Processes, stack: contextlib.AsyncExitStack, state: Path, nodes: int, prefix: str,
                   namespaces: tuple[str, ...]) -> tuple[dict[str, Path], dict[str, Kube]]:
    """The manager and the workers, each a kubesim of its own (``<prefix><name>``), with the job CRDs and
    ``namespaces``: their kubeconfigs and clients (closed with ``stack``), by name."""
    names = ("manager", *WORKERS)
    configs = dict(zip(names, await asyncio.gather(
        *(start_kubesim(procs, prefix + name, state, nodes) for name in names)), strict=True))
    settings = KubeSettings(max_concurrency=CONCURRENCY)
    kubes = {name: await stack.enter_async_context(Kube(configs[name], settings=settings)) for name in names}
    for name in names:
        for crd in load_crds():
            with contextlib.suppress(AlreadyExists):
                await kubes[name].create(CRDS, crd)
        for ns in namespaces:
            with contextlib.suppress(AlreadyExists):
                await kubes[name].create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                                      "metadata": {"name": ns}})
    return configs, kubes


async def floor_before(procs: Processes, state: Path, nodes: int, n: int, mosquitto: bool
                       ) -> tuple[float, dict[str, float]]:
    """The floor on four fresh clusters of its own (``floor-<name>``), stopped after: (seconds, CPU per process)."""
    async with contextlib.AsyncExitStack() as stack:
        _, kubes = await clusters(procs, stack, state / "floor", nodes, "floor-", (FLOOR_NAMESPACE,))
        cpu = await meter(procs, None, mosquitto)
        seconds, _ = await floor_run(kubes, n)
        used = cpu.used()
    await procs.stop_some(tuple(f"kubesim-floor-{name}" for name in kubes))
    return seconds, {k: v for k, v in used.items() if not (k.startswith("kubesim-") and "floor-" not in k)}


def uptime() -> str:
    """The load averages (1, 5, 15 min) as ``uptime`` prints them."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f}"


async def start_py_spy(procs: Processes, logs: Path, kubesims: bool = False
                       ) -> dict[str, tuple[asyncio.subprocess.Process, Path]]:
    """py-spy record (collapsed stacks) of the dispatcher and one agent (with ``kubesims``, also the manager's
    and the first worker's kubesim); empty when py-spy is not installed.

    ``--gil``: only the thread holding the GIL is sampled, i.e. where Python CPU goes; without it the
    threads blocked in socket reads (watches, urllib3 responses) fill the top of the table.
    """
    import shutil

    exe = Path(sys.executable).with_name("py-spy")
    if not exe.exists() and shutil.which("py-spy"):
        exe = Path(str(shutil.which("py-spy")))
    if not exe.exists():
        print("py-spy not installed in this environment: no profile", flush=True)
        return {}
    out: dict[str, tuple[asyncio.subprocess.Process, Path]] = {}
    names = ("dispatcher", f"agent-{WORKERS[0]}") + (("kubesim-manager", f"kubesim-{WORKERS[0]}") if kubesims else ())
    for name, pid in procs.pids(names).items():
        path = logs / f"py-spy-{name}.txt"
        proc = await asyncio.create_subprocess_exec(
            str(exe), "record", "--pid", str(pid), "--format", "raw", "--rate", os.environ.get("E2E_PY_SPY_RATE", "50"), "--nonblocking", "--gil",
            "--output", str(path), stdout=asyncio.subprocess.DEVNULL, stderr=(logs / f"py-spy-{name}.log").open("w"))
        out[name] = (proc, path)
    return out


async def stop_py_spy(spies: dict[str, tuple[asyncio.subprocess.Process, Path]]) -> dict[str, list[tuple[str, int, int]]]:
    import signal

    tops: dict[str, list[tuple[str, int, int]]] = {}
    for name, (proc, path) in spies.items():
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        try:
            await asyncio.wait_for(proc.wait(), timeout=30)
        except TimeoutError:
            proc.kill()
        tops[name] = collapsed_top(path) if path.exists() else []
    return tops


async def wait_for_log(path: Path, text: str, procs: Processes, within: float = 60.0) -> None:
    """Wait until a line of the log at ``path`` contains ``text``."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        procs.check()
        with contextlib.suppress(OSError):
            if text in await asyncio.to_thread(path.read_text, errors="replace"):
                return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{path.name} did not say {text!r} within {within:g} s")


async def wait_clusters_online(database_url: str, procs: Processes, within: float = 180.0) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession

    from dispatcher.db import make_engine
    from dispatcher.db.queries import listing

    engine = make_engine(database_url)
    try:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            procs.check()
            with contextlib.suppress(Exception):
                async with AsyncSession(engine) as session:
                    rows = await listing.list_clusters(session)
                if sum(1 for r in rows if r.online) >= len(WORKERS):
                    return
            await asyncio.sleep(0.5)
        raise RuntimeError(f"the agents' heartbeats did not reach the dispatcher within {within:g} s")
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
    """Per job (1 Master + 1 Worker, pods running for an hour so they stay Running):
      leg 1 = created on the manager → Running on its worker (claim, place, outbox, MQTT, agent, pods)
      leg 2 = Running on the worker → Running mirrored on the manager (status Report, mirror write)
    jobs/s = N / (last Running on the manager − first creation). In the same run, once before the dispatcher
    and the agents start (on four fresh clusters of its own, stopped after) and once after they are stopped
    (on the federation's clusters), the **floor**: the same work with no federation (the ratio is taken
    against the mean of the two: a shared machine's speed drifts over minutes, and one floor run after the
    end-to-end phase gave ratios of 0.44 to 0.70 for the same code within a minute). One client (this
    process, the same ``federation.kube.Kube``, the same concurrency) does per job the Kubernetes writes
    the federation causes, and the user's create: create the job on the manager, create its worker copy
    (``prepare_for_worker``) on a worker, create the Services and Pods the agent's PyTorchJob reconciler
    renders for it (1 Master + 1 Worker: 2 Services, 2 Pods, with owner references), one status write on
    the worker job (status subresource, Running) and one on the manager job (merge patch, the mirror).
    Goal: end to end ≥ 0.5 × floor and ≥ 150 jobs/s.

    Also printed: CPU-ms per job for each process (dispatcher, agents, kubesims, Mosquitto, the
    PostgreSQL backends serving this run's database, the benchmark) in each phase, and per-stage
    timestamps for every job (from the dispatcher's tables, the benchmark's watches, and a tap on the
    agents' Report topics that notes when each agent sealed its Accepted and its first Status with
    startTime: see ``bench/e2e_measure.STAGES``) as p50/p99, so the table shows where jobs wait.

    What this process watches during the end-to-end phase competes with the federation for the two cores, and
    the floor has no such observer. By default it watches the manager only (the run ends when every job is
    Running there) and reads the other stages from the dispatcher's tables after the run. ``--agent-stages``
    adds the agent-side stages (a PyTorchJob watch on each worker and the Report tap: Accepted sealed, Running
    on the worker, Status with startTime sealed, and legs 1 and 2 split at Running on the worker); they cost
    this process about 0.25-0.3 CPU-ms per job beside the federation, which lowers the end-to-end rate and the
    ratio of that run (bench/RESULTS.md). ``--py-spy`` records
    the dispatcher and one agent during the end-to-end phase and prints their top frames
    (``--py-spy-kubesims``: the manager's and the first worker's kubesim too).
    """
    gctune.tune()  # this process watches four clusters and the Reports: the services' collector settings too
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, action="append", help="jobs per run (repeatable); default 1000")
    parser.add_argument("--state-dir", type=Path, default=REPO / "state" / "e2e-bench")
    parser.add_argument("--nodes", type=int, default=4, help="nodes per worker cluster")
    parser.add_argument("--write-results", action="store_true", help="update bench/RESULTS.md")
    parser.add_argument("--dispatcher-args", default="", help="extra mkctl dispatcher flags (one string)")
    parser.add_argument("--py-spy", action="store_true",
                        help="record the dispatcher and one agent with py-spy during the end-to-end phase")
    parser.add_argument("--py-spy-kubesims", action="store_true",
                        help="as --py-spy, and record the manager's and the first worker's kubesim too")
    parser.add_argument("--agent-args", default="", help="extra mkctl agent flags (one string)")
    parser.add_argument("--rate", type=float, default=None,
                        help="paced: offer this many jobs/s (the latency goal is at 100) instead of "
                             "creating as fast as the manager's API takes them")
    parser.add_argument("--json", type=Path, default=None,
                        help="also write each run's headline figures to this file (a JSON list)")
    parser.add_argument("--agent-stages", action="store_true",
                        help="also watch every worker and tap the agents' Reports for the agent-side stages "
                             "(~0.25-0.3 CPU-ms/job in this process, beside the federation: a lower rate and ratio)")
    args = parser.parse_args()
    import logging

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    print(f"machine: {machine()}")
    results = []
    for n in args.n or [1000]:
        result = eventloop.run(run(n, args.state_dir / f"n{n}-{uuid.uuid4().hex[:4]}", args.nodes,
                                 args.dispatcher_args.split(), args.agent_args.split(), args.py_spy, args.rate,
                                 args.py_spy_kubesims, args.agent_stages))
        print("\n".join(result.lines()), flush=True)
        results.append(result)
    if args.json is not None:
        args.json.write_text(json.dumps([r.figures() for r in results], indent=1))
    if args.write_results:
        write_results(results)


if __name__ == "__main__":
    main()
