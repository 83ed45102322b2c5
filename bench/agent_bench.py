"""Agent benchmark: PyTorchJobs (1 master + 3 workers) per second reconciled to Running, and RSS at 5,000 jobs.

Three processes, as in production: ``python -m kubesim`` (one cluster), the agent (this file with ``--agent``,
settings from ``MKD_AGENT_*``), and this driver, which plays the dispatcher: it publishes Place Commands on
the broker (Mosquitto when reachable, else an embedded broker in this process) and reads the agent's Status
reports. Pods run forever (``kubesim.mkd.dev/run-forever``), so every job stays active.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from federation import sealing, signing  # noqa: E402
from federation.kinds.crds import load_crds  # noqa: E402
from federation.kube import CRDS, Kube, Resource  # noqa: E402
from federation.messages import (  # noqa: E402
    Heartbeat,
    JobRef,
    Lease,
    Place,
    PlacementKey,
    Status,
    decode_reports,
    encode,
)
from federation.mqtt import MqttLink  # noqa: E402
from federation.settings import MqttSettings  # noqa: E402

CLUSTER = "worker-1"
AGENT_KEY = signing.generate()
DISPATCHER_KEY = signing.generate()
NS = "bench"
PYTORCHJOBS = Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
LEASE_SECONDS = 600.0
"""The lease granted with each heartbeat (the dispatcher's default ``lease_seconds``)."""


def manifest(name: str) -> dict[str, Any]:
    def replica(n: int) -> dict[str, Any]:
        return {"replicas": n, "restartPolicy": "OnFailure",
                "template": {"metadata": {"annotations": {"kubesim.mkd.dev/run-forever": "true"}},
                             "spec": {"containers": [{"name": "pytorch", "image": "pytorch/pytorch:2.3",
                                                      "command": ["torchrun", "train.py"]}]}}}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name, "namespace": NS},
            "spec": {"pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(3)}}}


def place(i: int) -> Place:
    name = f"job-{i:05d}"
    return Place(placement=PlacementKey(workload_uid=f"wl-{i}", attempt=1, epoch=1), spec_version=1,
                 job=JobRef(kind="PyTorchJob", api_version="kubeflow.org/v1", namespace=NS, name=name),
                 manifest=manifest(name))


def running(report: Status) -> bool:
    return any(c.get("type") == "Running" and c.get("status") == "True"
               for c in report.status.get("conditions") or [])


def start_kubesim(state: Path) -> tuple[subprocess.Popen[str], Path]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "kubesim", "--clusters", CLUSTER, "--nodes", "10", "--node-cpu", "2000",
         "--node-memory", "8000Gi", "--node-pods", "3000", "--state-dir", str(state)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    kubeconfig = None
    assert proc.stdout is not None
    for line in proc.stdout:
        if "kubeconfig" in line:
            kubeconfig = Path(line.rsplit(" ", 1)[1].strip())
        if "ready" in line:
            break
    assert kubeconfig is not None, "kubesim did not start"
    return proc, kubeconfig


def mosquitto() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 1883), timeout=0.5):
            return True
    except OSError:
        return False


async def install_crds(kubeconfig: Path) -> None:
    async with Kube(kubeconfig) as kube:
        for crd in load_crds():
            await kube.create(CRDS, crd)
        for _ in range(200):
            if await kube.served(PYTORCHJOBS):
                return
            await asyncio.sleep(0.05)


async def drive(url: str, root: str, kubeconfig: Path, burst: int, total: int) -> None:
    env = {**os.environ, "MKD_AGENT_CLUSTER_NAME": CLUSTER, "MKD_AGENT_KUBECONFIG": str(kubeconfig),
           "MKD_AGENT_MQTT__URL": url, "MKD_AGENT_MQTT__TOPIC_ROOT": root,
           "MKD_AGENT_MQTT__CLIENT_ID": f"bench-agent-{uuid.uuid4().hex[:6]}",
           "MKD_AGENT_KUBE__MAX_CONCURRENCY": "32", "MKD_AGENT_CONCURRENCY": "32",
           # every message is signed: the agent's key, and the key of the dispatcher this bench plays
           "MKD_AGENT_SIGNING__PRIVATE_KEY": AGENT_KEY[0],
           "MKD_AGENT_DISPATCHER_PUBLIC_KEYS": json.dumps([DISPATCHER_KEY[1]])}
    sealer = signing.Sealer(signing.parse_private_key(DISPATCHER_KEY[0]))
    places = sealing.PlaceSealer()  # Places go encrypted to the agent's key, as the dispatcher sends them
    to = sealing.recipients([signing.parse_public_key(AGENT_KEY[1])])
    numbers = itertools.count(1)
    settings = MqttSettings(url=url, topic_root=root)
    running_at: dict[str, float] = {}
    inventory = asyncio.Event()
    async with MqttLink(settings, client_id=f"bench-dispatcher-{uuid.uuid4().hex[:6]}") as link:
        await link.subscribe(f"{root}/{CLUSTER}/reports")
        await link.subscribe(f"{root}/{CLUSTER}/presence")
        pending: set[asyncio.Task[None]] = set()

        def renew(hb: Heartbeat) -> None:
            """Renew the agent's lease as the dispatcher does for every heartbeat (fencing: an agent
            without renewals suspends its Jobs, dispatcher/clusters/health.py)."""
            topic = f"{root}/{CLUSTER}/commands"
            lease = Lease(cluster=CLUSTER, epoch=1, heartbeat_sent_at=hb.sent_at, seconds=LEASE_SECONDS)
            task = asyncio.ensure_future(link.publish(topic, sealer.seal(topic, encode(lease), stream="e1",
                                                                         n=next(numbers))))
            pending.add(task)
            task.add_done_callback(pending.discard)

        async def collect() -> None:
            async for message in link.messages():
                for report in decode_reports(message.payload[:message.payload.rfind(b',"seal":')] + b"}"):
                    if isinstance(report, Heartbeat):
                        if report.online:
                            renew(report)
                    elif report.type == "inventory":
                        inventory.set()
                    elif isinstance(report, Status) and running(report):
                        running_at.setdefault(report.placement.workload_uid, time.perf_counter())

        collector = asyncio.create_task(collect())
        agent = subprocess.Popen([sys.executable, __file__, "--agent"], cwd=ROOT, env=env)  # noqa: ASYNC220
        try:
            await asyncio.wait_for(inventory.wait(), 60)
            proc = psutil.Process(agent.pid)
            print(f"agent RSS idle: {proc.memory_info().rss / 2**20:.0f} MiB")

            async def wave(start: int, stop: int, limit: float) -> float:
                t0 = time.perf_counter()
                for i in range(start, stop):
                    topic = f"{root}/{CLUSTER}/commands"
                    body = places.seal(topic, encode(place(i)), to)
                    await link.publish(topic, sealer.seal(topic, body, stream="e1", n=next(numbers)))
                deadline = t0 + limit
                while sum(1 for i in range(start, stop) if f"wl-{i}" in running_at) < stop - start:
                    if time.perf_counter() > deadline:
                        done = sum(1 for i in range(start, stop) if f"wl-{i}" in running_at)
                        print(f"  timeout: {done}/{stop - start} Running")
                        break
                    await asyncio.sleep(0.1)
                return max(running_at.get(f"wl-{i}", t0) for i in range(start, stop)) - t0

            seconds = await wave(0, burst, 600)
            print(f"phase 1: {burst} PyTorchJobs (1 master + 3 workers) Running in {seconds:.1f} s "
                  f"= {burst / seconds:.1f} jobs/s (~{burst * 8 / seconds:.0f} object creates/s "
                  f"+ status writes)")
            print(f"agent RSS after phase 1: {proc.memory_info().rss / 2**20:.0f} MiB")
            step = 1000
            for start in range(burst, total, step):
                stop = min(total, start + step)
                secs = await wave(start, stop, 900)
                print(f"  {stop} jobs placed; last {stop - start} Running in {secs:.1f} s "
                      f"({(stop - start) / secs:.1f} jobs/s); RSS {proc.memory_info().rss / 2**20:.0f} MiB")
            await asyncio.sleep(5)
            print(f"phase 2: agent RSS at {total} active jobs ({total * 4} pods, {total * 4} Services): "
                  f"{proc.memory_info().rss / 2**20:.0f} MiB; agent CPU time "
                  f"{sum(proc.cpu_times()[:2]):.0f} s")
        finally:
            agent.terminate()
            try:
                agent.wait(20)
            except subprocess.TimeoutExpired:
                agent.kill()
            collector.cancel()


def run_agent() -> None:
    import logging
    import signal

    from federation import eventloop, gctune
    from worker_agent.app import run
    from worker_agent.settings import AgentSettings

    logging.basicConfig(level=logging.WARNING)
    gctune.tune()  # the collector's settings mkctl's service runner gives the agent

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        await run(AgentSettings(), stop=stop)  # type: ignore[call-arg]

    eventloop.run(main())  # as ``mkctl agent`` runs it


def main() -> None:
    """Phase 1 sends ``--burst`` jobs at once and times from the first Place until every job's Status carries
    ``Running=True`` (jobs/s; each job is 8 object creates + status writes). Phase 2 places jobs up to
    ``--total`` and reports the agent's RSS once all are Running.

        .venv/bin/python bench/agent_bench.py [--burst 500] [--total 5000]
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent", action="store_true", help="(internal) run the agent from MKD_AGENT_* env")
    parser.add_argument("--burst", type=int, default=500)
    parser.add_argument("--total", type=int, default=5000)
    args = parser.parse_args()
    if args.agent:
        run_agent()
        return
    with tempfile.TemporaryDirectory() as tmp:
        sim, kubeconfig = start_kubesim(Path(tmp))
        try:
            asyncio.run(install_crds(kubeconfig))
            root = f"bench-{uuid.uuid4().hex[:8]}/v1"
            if mosquitto():
                print("broker: Mosquitto 127.0.0.1:1883")
                asyncio.run(drive("mqtt://127.0.0.1:1883", root, kubeconfig, args.burst, args.total))
            else:
                from federation.embedded_broker import EmbeddedBroker

                async def embedded() -> None:
                    async with EmbeddedBroker() as broker:
                        print(f"broker: embedded amqtt {broker.url}")
                        await drive(broker.url, root, kubeconfig, args.burst, args.total)
                asyncio.run(embedded())
            print(f"kubesim RSS: {psutil.Process(sim.pid).memory_info().rss / 2**20:.0f} MiB")
        finally:
            sim.terminate()
            try:
                sim.wait(20)
            except subprocess.TimeoutExpired:
                sim.kill()


if __name__ == "__main__":
    main()
