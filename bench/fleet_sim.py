"""Simulated worker clusters for ``bench/fleet_bench.py``: a real agent's wire side without a cluster behind it.

Each simulated cluster has its own signing key (registered with the dispatcher), its own MQTT connection
with a persistent session and a will (an offline Heartbeat, sealed), and speaks with mkd's own message,
signing and sealing code (``federation.messages``, ``federation.signing``, ``federation.sealing``): on
connect it subscribes to its commands and sends an Inventory of the Jobs it runs, then a Heartbeat every
interval with a node inventory (8-64 nodes, some with GPUs of two types) whose free figures follow the Jobs
it runs. A Place (sealed to the cluster's key, opened here) is answered with Accepted and a running Status;
the Job ends after a drawn time with a Succeeded Status. Leases, Resyncs and Deletes are counted and obeyed.
A process runs many such clusters; the parent asks it for its figures over a pipe.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from federation import messages, sealing, signing, topics
from federation.mqtt import MqttLink, Will
from federation.settings import MqttSettings

GPU_TYPES = ("nvidia-a100", "nvidia-h100")
CPU_PER_NODE = 64
CPU_PER_JOB = 2
"""The benchmark's PyTorchJob asks for 1 CPU in each of its two replicas."""


@dataclass
class Job:
    key: messages.PlacementKey
    spec_version: int
    ref: messages.JobRef
    seq: int
    ends: float


@dataclass
class Cluster:
    name: str
    sealer: signing.Sealer
    places: sealing.PlaceOpener
    nodes: list[messages.NodeFree]
    jobs: dict[str, Job] = field(default_factory=dict)
    stream: str = ""
    n: int = 0
    silent: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_lease: float = 0.0
    leases: int = 0
    resyncs: int = 0
    last_resync: float = 0.0


def make_nodes(name: str, rng: random.Random) -> list[messages.NodeFree]:
    out = []
    gpu_share = rng.choice((0.0, 0.25, 0.5))
    for i in range(rng.randint(8, 64)):
        labels = {"kubernetes.io/hostname": f"{name}-n{i}"}
        alloc = {"cpu": str(CPU_PER_NODE), "memory": "256Gi", "pods": "110"}
        if rng.random() < gpu_share:
            labels["nvidia.com/gpu.product"] = GPU_TYPES[i % 2]
            alloc["nvidia.com/gpu"] = "8"
        out.append(messages.NodeFree(name=f"{name}-n{i}", labels=labels, free=dict(alloc), allocatable=alloc))
    return out


class Fleet:
    def __init__(self, mqtt_url: str, root: str, keys: dict[str, str], dispatcher_key: str, interval: float,
                 run_seconds: tuple[float, float], seed: int) -> None:
        self.settings = MqttSettings(url=mqtt_url, topic_root=root)
        self.root = root
        self.interval = interval
        self.run_seconds = run_seconds
        self.rng = random.Random(seed)
        self.dispatcher_keys = [signing.parse_public_key(dispatcher_key)]
        self.opener = signing.Opener()
        self.clusters = {}
        for name, private in keys.items():
            key = signing.parse_private_key(private)
            self.clusters[name] = Cluster(name, signing.Sealer(key), sealing.PlaceOpener(key),
                                          make_nodes(name, self.rng))
        self.placed: dict[str, list[tuple[str, float]]] = {}
        """Workload uid -> (cluster, time) of every Place received."""
        self.msgs_in = 0
        self.msgs_out = 0
        self.finished = 0
        self.refused = 0
        self.connected = 0
        self.linked_at_ms = time.time_ns() // 1_000_000

    # --- sending ----------------------------------------------------------------------------
    def capacity(self, c: Cluster) -> messages.Capacity:
        used = len(c.jobs) * CPU_PER_JOB
        nodes = []
        for node in c.nodes:
            take = min(used, int(node.allocatable["cpu"]))
            used -= take
            free = dict(node.allocatable)
            free["cpu"] = str(int(node.allocatable["cpu"]) - take)
            nodes.append(node.model_copy(update={"free": free}))
        total: dict[str, int] = {}
        free_total: dict[str, int] = {}
        for node in nodes:
            for r in ("cpu", "nvidia.com/gpu"):
                if r in node.allocatable:
                    total[r] = total.get(r, 0) + int(node.allocatable[r])
                    free_total[r] = free_total.get(r, 0) + int(node.free[r])
        largest = max(nodes, key=lambda nd: int(nd.free["cpu"]))
        return messages.Capacity(
            allocatable={**{k: str(v) for k, v in total.items()}, "memory": f"{256 * len(nodes)}Gi"},
            free={**{k: str(v) for k, v in free_total.items()}, "memory": f"{256 * len(nodes)}Gi"},
            largest_node_free=largest.free, nodes=nodes)

    async def send(self, c: Cluster, topic: str, report: messages.ReportBase, retain: bool = False,
                   link: MqttLink | None = None) -> None:
        async with c.lock:  # one numbered stream per link: numbered and published in order
            c.n += 1
            payload = c.sealer.seal(topic, messages.encode_numbered(report, c.stream, c.n), stream=c.stream, n=c.n)
            assert link is not None
            await link.publish(topic, payload, retain=retain)
            self.msgs_out += 1

    def heartbeat(self, c: Cluster, online: bool = True) -> messages.Heartbeat:
        return messages.Heartbeat(cluster=c.name, online=online, agent_version="fleet-sim",
                                  interval_seconds=self.interval,
                                  capacity=self.capacity(c) if online else messages.Capacity(),
                                  kinds_reconciled=["PyTorchJob"], running=len(c.jobs))

    # --- one cluster's link -----------------------------------------------------------------
    async def run_cluster(self, c: Cluster) -> None:
        presence = topics.presence(c.name, self.root)
        reports = topics.reports(c.name, self.root)
        while True:
            c.stream, c.n = uuid.uuid4().hex[:16], 0
            offline = messages.encode_numbered(self.heartbeat(c, online=False), c.stream, 0)
            will = Will(presence, c.sealer.seal(presence, offline, stream=c.stream, n=0), retain=True)
            try:
                async with MqttLink(self.settings, client_id=f"fleet-{c.name}", will=will) as link:
                    self.connected += 1
                    await link.subscribe(topics.commands(c.name, self.root))
                    items = [messages.InventoryItem(placement=j.key, spec_version=j.spec_version, job=j.ref,
                                                    last_seq=j.seq) for j in c.jobs.values()]
                    await self.send(c, reports, messages.Inventory(cluster=c.name, items=items), link=link)
                    beats = asyncio.ensure_future(self.beat(c, link, presence))
                    ends = asyncio.ensure_future(self.ender(c, link, reports))
                    try:
                        async for msg in link.messages():
                            self.msgs_in += 1
                            if not c.silent:
                                await self.command(c, link, reports, msg.topic, msg.payload)
                    finally:
                        beats.cancel()
                        ends.cancel()
                        self.connected -= 1
            except Exception:
                await asyncio.sleep(1.0 + random.random())

    async def beat(self, c: Cluster, link: MqttLink, presence: str) -> None:
        await asyncio.sleep(random.random() * self.interval)  # spread like agents started at random times
        while True:
            if not c.silent:
                await self.send(c, presence, self.heartbeat(c), retain=True, link=link)
            await asyncio.sleep(self.interval)

    async def ender(self, c: Cluster, link: MqttLink, reports: str) -> None:
        while True:
            await asyncio.sleep(0.5)
            if c.silent:
                continue
            now = time.monotonic()
            for uid, job in list(c.jobs.items()):
                if job.ends <= now:
                    job.seq += 1
                    del c.jobs[uid]
                    status = {"conditions": [{"type": "Succeeded", "status": "True", "reason": "PyTorchJobSucceeded"}]}
                    await self.send(c, reports, messages.Status(cluster=c.name, placement=job.key, seq=job.seq,
                                                                status=status, finished="Succeeded"), link=link)
                    self.finished += 1

    async def command(self, c: Cluster, link: MqttLink, reports: str, topic: str, payload: bytes) -> None:
        try:
            opened = self.opener.open(topic, payload, self.dispatcher_keys)
            bodies = messages.split_commands(opened.body)
        except (signing.Refused, messages.MessageRefused):
            self.refused += 1
            return
        for body in bodies:
            if sealing.is_sealed(body):
                try:
                    body = c.places.open(topic, body)
                except signing.Refused:
                    self.refused += 1
                    continue
            cmd = messages.decode_command(body)
            if isinstance(cmd, messages.Lease):
                c.leases += 1
                c.last_lease = time.time()
            elif isinstance(cmd, messages.Resync):
                c.resyncs += 1
                c.last_resync = time.time()
                if cmd.chunk.parts == 1:
                    keep = {(k.workload_uid, k.attempt) for k in cmd.expected}
                    for uid, job in list(c.jobs.items()):
                        if (job.key.workload_uid, job.key.attempt) not in keep:
                            del c.jobs[uid]
            elif isinstance(cmd, messages.Delete):
                c.jobs.pop(cmd.placement.workload_uid, None)
            elif isinstance(cmd, messages.Place):
                uid = cmd.placement.workload_uid
                self.placed.setdefault(uid, []).append((c.name, time.time()))
                known = c.jobs.get(uid)
                if known is None or known.key != cmd.placement:
                    c.jobs[uid] = Job(cmd.placement, cmd.spec_version, cmd.job, 0,
                                      time.monotonic() + self.rng.uniform(*self.run_seconds))
                job = c.jobs[uid]
                job.seq += 1
                await self.send(c, reports, messages.Accepted(cluster=c.name, placement=cmd.placement,
                                                              spec_version=cmd.spec_version, seq=job.seq), link=link)
                job.seq += 1
                await self.send(c, reports, messages.Status(
                    cluster=c.name, placement=cmd.placement, seq=job.seq,
                    status={"conditions": [{"type": "Running", "status": "True"}]}), link=link)

    def figures(self) -> dict[str, Any]:
        return {"placed": self.placed, "msgs_in": self.msgs_in, "msgs_out": self.msgs_out,
                "finished": self.finished, "refused": self.refused, "connected": self.connected,
                "running": {c.name: list(c.jobs) for c in self.clusters.values()},
                "leases": {c.name: (c.leases, c.last_lease) for c in self.clusters.values()},
                "resyncs": {c.name: (c.resyncs, c.last_resync) for c in self.clusters.values()}}

    async def serve(self, conn: Any) -> None:
        tasks = []
        for c in self.clusters.values():
            tasks.append(asyncio.ensure_future(self.run_cluster(c)))
            await asyncio.sleep(0.005)  # connects spread a little, as agents are not started at one instant
        while True:
            request = await asyncio.to_thread(conn.recv)
            what, arg = request
            if what == "figures":
                conn.send(self.figures())
            elif what == "silence":
                self.clusters[arg].silent = True
                conn.send(True)
            elif what == "stop":
                for t in tasks:
                    t.cancel()
                conn.send(True)
                return


def fleet_main(mqtt_url: str, root: str, keys: dict[str, str], dispatcher_key: str, interval: float,
               run_seconds: tuple[float, float], seed: int, conn: Any) -> None:
    fleet = Fleet(mqtt_url, root, keys, dispatcher_key, interval, run_seconds, seed)
    asyncio.run(fleet.serve(conn))
