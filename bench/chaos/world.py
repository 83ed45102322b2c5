"""One chaos federation: every part a separate process, started from this checkout.

:class:`World` starts, in order: the broker (a private Mosquitto, or the embedded amqtt broker in a
process of its own when Mosquitto is not installed), the database (a private PostgreSQL, or a SQLite
file when the server binaries are missing), the kubesim clusters (``python -m kubesim``: one process
per cluster, or one for all of them in the small test size), mkd's CRDs and the job namespace, then
``mkctl dispatcher`` (one or more), ``mkctl agent`` for each worker and next to it, as a process of its
own, ``mkctl fencer`` (when the checkout has one), which stops the Jobs of a frozen agent. Settings are passed as CLI
flags, and only for fields the settings classes of this checkout have, so the same scenario runs
before and after a settings change. The World itself never reads mkd's counters; the
:mod:`bench.chaos.observe` module counts from the clusters and the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.chaos.procs import (
    PrivateMosquitto,
    PrivatePostgres,
    Service,
    bridge_to,
    free_port,
    missing_binaries,
    port_open,
    python_service,
    wait_until,
)

MANAGER = "manager"
WORKERS = ("worker-1", "worker-2", "worker-3")
NAMESPACE = "chaos"
ORIGIN = "chaos"
DECLARED = Path(__file__).resolve().parents[2] / "examples" / "trainingrun"
"""A kind from configuration in the mix: its CRD and declarations file (every service's ``kinds_file``)."""
KINDS_FILE = DECLARED / "kinds.yaml"


@dataclass
class WorldOptions:
    root: Path
    dispatchers: int = 1
    postgres: bool = True
    """A private PostgreSQL (else SQLite); the PostgreSQL-outage scenario requires it."""
    mosquitto: bool = True
    """A private Mosquitto (else the embedded amqtt broker in its own process)."""
    kubesim_per_cluster: bool = True
    """One kubesim process per cluster (full size) or one for all four (small size: faster start)."""
    nodes: int = 2
    node_cpu: str = "200"
    dispatcher: dict[str, Any] = field(default_factory=dict)
    """Dispatcher settings (field name -> value; nested groups as dicts)."""
    agent: dict[str, Any] = field(default_factory=dict)
    bridge: bool = False
    """The agents on a Mosquitto of their own, bridged (QoS 1, persistent session, retained presence) to the
    dispatchers' Mosquitto as docs/SCALING.md sets it up; a broker restart alternates between the two."""
    proxies: bool = True
    """Each agent reaches the broker through a relay process of its own (``bench.chaos.proxy``) that
    can cut the link silently: the network partition scenario."""


def settings_flags(cls: Any, values: dict[str, Any], prefix: str = "") -> tuple[list[str], list[str]]:
    """CLI flags for ``values`` (``mkctl.flags`` naming); returns (flags, names this checkout lacks)."""
    out: list[str] = []
    unknown: list[str] = []
    fields = cls.model_fields
    for key, value in values.items():
        if key not in fields:
            unknown.append(prefix + key)
            continue
        if isinstance(value, dict):
            annotation = fields[key].annotation
            sub, miss = settings_flags(annotation, value, f"{prefix}{key}_")
            out += sub
            unknown += miss
            continue
        flag = "--" + (prefix + key).replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + flag[2:])
        else:
            out += [flag, str(value)]
    return out, unknown


class World:
    """The running federation (see the module docstring). Use as an async context manager."""

    def __init__(self, options: WorldOptions) -> None:
        self.o = options
        self.root = options.root
        self.logs = options.root / "logs"
        self.tag = f"chaos-{uuid.uuid4().hex[:6]}"
        self.topic_root = f"{self.tag}/v1"
        self.mosquitto: PrivateMosquitto | None = None
        self.site: PrivateMosquitto | None = None
        """The agents' broker when bridged (``WorldOptions.bridge``)."""
        self.restarts = 0
        self.broker: Service | None = None
        self.broker_port = 0
        self.postgres: PrivatePostgres | None = None
        self.database_url = ""
        self.kubesims: list[Service] = []
        self.kubeconfigs: dict[str, Path] = {}
        self.dispatchers: list[Service] = []
        self.agents: dict[str, Service] = {}
        self.fencers: dict[str, Service] = {}
        """worker -> its fencer (none in a checkout without ``mkctl fencer``)."""
        self.proxies: dict[str, tuple[Service, int]] = {}
        """worker -> (relay process, its port)."""
        self.notes: list[str] = []
        from federation import signing

        # every message is signed: a key pair for the dispatchers and one per agent, made per world
        self.keys = {name: signing.generate() for name in ("dispatcher", *WORKERS)}
        """What this World fell back to or could not set (printed with the figures)."""

    # --- lifecycle ---------------------------------------------------------------------------------
    async def __aenter__(self) -> World:
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            await self._start()
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        # SIGTERM everything at once, then wait: sequential staged shutdowns would take a minute.
        services = [*self.agents.values(), *self.fencers.values(), *self.dispatchers, *self.kubesims, *(p for p, _ in self.proxies.values())]
        if self.broker is not None:
            services.append(self.broker)
        await asyncio.gather(*(asyncio.to_thread(s.terminate, 10) for s in services), return_exceptions=True)
        for broker in (self.mosquitto, self.site):
            if broker is not None:
                with contextlib.suppress(Exception):
                    broker.stop()
        if self.postgres is not None:
            with contextlib.suppress(Exception):
                self.postgres.stop()

    async def _start(self) -> None:
        started = time.monotonic()
        await asyncio.gather(self._start_broker(), self._start_database(), self._start_kubesim())
        await self._prepare_clusters()
        if self.o.proxies:
            await self._start_proxies()
        for i in range(self.o.dispatchers):
            self.add_dispatcher(i)
        for w in WORKERS:
            self.add_agent(w)
            self.add_fencer(w)
        await self.wait_online()
        self.notes.append(f"federation up in {time.monotonic() - started:.1f} s")

    async def _start_broker(self) -> None:
        if self.o.mosquitto and missing_binaries(mosquitto=True) is None:
            self.mosquitto = PrivateMosquitto(self.root, self.logs)
            await self.mosquitto.start()
            self.broker_port = self.mosquitto.port
            if self.o.bridge:
                self.site = PrivateMosquitto(self.root / "site", self.logs)
                bridge_to(self.site, self.broker_port, self.topic_root, f"{self.tag}-site")
                await self.site.start()
                self.notes.append("brokers: the agents on their own Mosquitto, bridged to the dispatchers'")
            return
        if self.o.bridge:
            raise RuntimeError("a bridged world needs Mosquitto installed")
        self.notes.append("broker: embedded amqtt in its own process (Mosquitto not installed; no persistence)")
        self.broker_port = free_port()
        self.broker = python_service("broker", ["-m", "bench.chaos.broker", "--port", str(self.broker_port)],
                                     self.logs)
        self.broker.start()
        await wait_until(lambda: port_open(self.broker_port), "embedded broker", 30, self.broker)

    @property
    def mqtt_url(self) -> str:
        return f"mqtt://127.0.0.1:{self.broker_port}"

    @property
    def agents_port(self) -> int:
        """The port of the broker the agents use (the site broker when bridged)."""
        return self.site.port if self.site is not None else self.broker_port

    async def _start_proxies(self) -> None:
        for w in WORKERS:
            port = free_port()
            s = python_service(f"proxy-{w}", ["-m", "bench.chaos.proxy", "--port", str(port),
                                              "--upstream-port", str(self.agents_port)], self.logs)
            s.start()
            self.proxies[w] = (s, port)
        for w, (s, port) in self.proxies.items():
            await wait_until(lambda port=port: port_open(port), f"relay for {w}", 30, s)

    def agent_mqtt_url(self, cluster: str) -> str:
        if cluster in self.proxies:
            return f"mqtt://127.0.0.1:{self.proxies[cluster][1]}"
        return f"mqtt://127.0.0.1:{self.agents_port}"

    async def restart_broker(self, *, kill: bool = False, down_seconds: float = 0.0) -> None:
        if self.mosquitto is not None:
            # bridged: the agents' broker, then the dispatchers', in turn
            broker = self.site if self.site is not None and self.restarts % 2 == 0 else self.mosquitto
            self.restarts += 1
            await broker.restart(kill=kill, down_seconds=down_seconds)
            return
        assert self.broker is not None
        if kill:
            self.broker.kill()
        else:
            self.broker.terminate()
        await asyncio.sleep(down_seconds)
        self.broker.start()
        await wait_until(lambda: port_open(self.broker_port), "embedded broker", 30, self.broker)

    async def _start_database(self) -> None:
        if self.o.postgres and missing_binaries(postgres=True) is None:
            self.postgres = PrivatePostgres(self.root, self.logs)
            await asyncio.to_thread(self.postgres.init)
            await self.postgres.start()
            self.database_url = self.postgres.url
        else:
            self.notes.append("database: SQLite (PostgreSQL server binaries not installed)")
            self.database_url = f"sqlite+aiosqlite:///{self.root / 'mkd.db'}"
        from dispatcher import db

        await db.upgrade_async(self.database_url)

    async def _start_kubesim(self) -> None:
        sim_dir = self.root / "sim"
        groups = [[c] for c in (MANAGER, *WORKERS)] if self.o.kubesim_per_cluster else [[MANAGER, *WORKERS]]
        for group in groups:
            name = "kubesim-" + ("-".join(group) if len(group) == 1 else "all")
            # the manager runs no LWS controller (an LWS has no managedBy: one there would run it too)
            without = ["--without", f"{MANAGER}=leaderworkerset"] if MANAGER in group else []
            s = python_service(name, ["-m", "kubesim", "--clusters", ",".join(group), "--nodes", str(self.o.nodes),
                                      "--node-cpu", self.o.node_cpu, "--node-memory", "4000Gi",
                                      "--node-pods", "5000", "--state-dir", str(sim_dir), *without], self.logs)
            s.start()
            self.kubesims.append(s)

        def ready() -> bool:
            return all("kubesim: ready" in s.log_tail(200) for s in self.kubesims)
        await wait_until(ready, "kubesim clusters", 60, self.kubesims[0])
        for name in (MANAGER, *WORKERS):
            self.kubeconfigs[name] = sim_dir / f"{name}.kubeconfig"

    async def _prepare_clusters(self) -> None:
        import yaml

        from federation.errors import AlreadyExists
        from federation.kinds.crds import load_crds
        from federation.kube import CONFIGMAPS, CRDS, NAMESPACES, Kube

        declared_crd = yaml.safe_load((DECLARED / "crd.yaml").read_text(encoding="utf-8"))
        for name, path in self.kubeconfigs.items():
            async with Kube(path) as kube:
                for crd in [*load_crds(), declared_crd]:
                    with contextlib.suppress(AlreadyExists):
                        await kube.create(CRDS, crd)
                if name != MANAGER:  # kubesim's generic operator runs the declared kind there, as its operator would
                    with contextlib.suppress(AlreadyExists):
                        await kube.create(CONFIGMAPS, {
                            "apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": "kubesim-generic-operator", "namespace": "kube-system"},
                            "data": {"kinds.yaml": KINDS_FILE.read_text(encoding="utf-8")}}, "kube-system")
                with contextlib.suppress(AlreadyExists):
                    await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                                   "metadata": {"name": NAMESPACE}})

    # --- services -----------------------------------------------------------------------------------
    def _flags(self, cls: Any, values: dict[str, Any], who: str) -> list[str]:
        flags, unknown = settings_flags(cls, values)
        for u in unknown:
            note = f"{who}: this checkout has no setting {u!r}; not set"
            if note not in self.notes:
                self.notes.append(note)
        return flags

    def dispatcher_values(self, i: int) -> dict[str, Any]:
        values: dict[str, Any] = {
            "kubeconfig": str(self.kubeconfigs[MANAGER]),
            "database_url": self.database_url,
            "mqtt": {"url": self.mqtt_url, "topic_root": self.topic_root, "client_id": f"{self.tag}-dispatcher-{i}",
                     "backoff_max": 2.0, "keepalive": 10},
            "origin": ORIGIN,
            "heartbeat_timeout_seconds": 6.0,
            "placement_retry_seconds": 2.0,
            "capacity_settle_seconds": 1.0,
            "report_gap_grace_seconds": 2.0,
            "place_resend_seconds": 10.0,
            "signing": {"private_key": self.keys["dispatcher"][0]},
            "cluster_public_keys": json.dumps({w: self.keys[w][1] for w in WORKERS}),  # a map flag: JSON
            "kinds_file": str(KINDS_FILE),
        }
        for k, v in self.o.dispatcher.items():
            if isinstance(v, dict) and isinstance(values.get(k), dict):
                values[k] = {**values[k], **v}
            else:
                values[k] = v
        return values

    def _dispatcher_argv(self, i: int) -> list[str]:
        from dispatcher.settings import DispatcherSettings

        values = self.dispatcher_values(i)
        kubeconfig = values.pop("kubeconfig")
        flags = ["--kubeconfig", kubeconfig, *self._flags(DispatcherSettings, values, "dispatcher")]
        return python_service("", ["-m", "mkctl.main", "dispatcher", *flags], self.logs).argv

    def add_dispatcher(self, i: int) -> Service:
        s = python_service(f"dispatcher-{i}", [], self.logs)
        s.argv = self._dispatcher_argv(i)
        s.start()
        self.dispatchers.append(s)
        return s

    def reconfigure_dispatchers(self, overrides: dict[str, Any], *, fresh_agents: bool = True) -> bool:
        """Restart the dispatchers (SIGTERM) with these settings overrides; False when they already run so.

        ``fresh_agents``: restart the agents too, as a World of its own would have them (an agent keeps the
        longest lease it was ever granted, so a dispatcher restarted with a shorter lease meets agents
        that still hold the old one: the ``lease-shortened`` scenario, which passes False).
        """
        if overrides == self.o.dispatcher:
            return False
        self.o.dispatcher = dict(overrides)
        for i, s in enumerate(self.dispatchers):
            s.terminate()
            s.argv = self._dispatcher_argv(i)
            s.start()
        if fresh_agents:
            for a in self.agents.values():
                a.terminate()
                a.start()
        return True

    def add_agent(self, cluster: str) -> Service:
        from worker_agent.settings import AgentSettings

        values: dict[str, Any] = {
            "cluster_name": cluster,
            "kubeconfig": str(self.kubeconfigs[cluster]),
            "mqtt": {"url": self.agent_mqtt_url(cluster), "topic_root": self.topic_root,
                     "client_id": f"{self.tag}-agent-{cluster}",
                     "backoff_max": 2.0, "keepalive": 10},
            "origin": ORIGIN,
            "heartbeat_interval_seconds": 2.0,
            "capacity_debounce_seconds": 0.5,
            "signing": {"private_key": self.keys[cluster][0]},
            "dispatcher_public_keys": json.dumps([self.keys["dispatcher"][1]]),
            "kinds_file": str(KINDS_FILE),
        }
        for k, v in self.o.agent.items():
            if isinstance(v, dict) and isinstance(values.get(k), dict):
                values[k] = {**values[k], **v}
            else:
                values[k] = v
        s = python_service(f"agent-{cluster}", ["-m", "mkctl.main", "agent",
                                                *self._flags(AgentSettings, values, "agent")], self.logs)
        s.start()
        self.agents[cluster] = s
        return s

    def add_fencer(self, cluster: str) -> Service | None:
        """The fencer of ``cluster``: reads the lease its agent records there, stops its Jobs when it runs out."""
        try:
            from worker_agent.settings import FencerSettings
        except ImportError:
            note = "fencer: this checkout has no `mkctl fencer`; a frozen agent's Jobs are not stopped"
            if note not in self.notes:
                self.notes.append(note)
            return None
        values: dict[str, Any] = {"cluster_name": cluster, "kubeconfig": str(self.kubeconfigs[cluster]),
                                  "origin": ORIGIN, "poll_seconds": 1.0, "sweep_seconds": 3.0, "concurrency": 16,
                                  "kinds_file": str(KINDS_FILE)}
        s = python_service(f"fencer-{cluster}", ["-m", "mkctl.main", "fencer",
                                                 *self._flags(FencerSettings, values, "fencer")], self.logs)
        s.start()
        self.fencers[cluster] = s
        return s

    @property
    def services(self) -> list[Service]:
        return [*self.dispatchers, *self.agents.values(), *self.fencers.values(), *self.kubesims, *(p for p, _ in self.proxies.values())]

    def check(self) -> None:
        """Fail with the log of any service that died without being told to (a crash is a finding)."""
        for s in self.services:
            if not s.frozen and (why := s.exited()):
                raise RuntimeError(why)

    async def wait_online(self, within: float = 90.0) -> None:
        """Until the database lists every worker online (the agents' heartbeats reached a dispatcher)."""
        from sqlalchemy import text

        from dispatcher.db import make_engine

        engine = make_engine(self.database_url)
        try:
            deadline = time.monotonic() + within
            online: set[str] = set()
            while time.monotonic() < deadline:
                self.check()
                with contextlib.suppress(Exception):
                    async with engine.connect() as conn:
                        rows = (await conn.execute(text("SELECT name, online FROM clusters"))).all()
                    online = {r[0] for r in rows if r[1]}
                    if set(WORKERS) <= online:
                        return
                await asyncio.sleep(0.3)
            raise RuntimeError(f"workers online within {within:.0f}s: only {sorted(online)}")
        finally:
            await engine.dispose()
