"""The demo's federation in one process: kubesim clusters, a broker, a database, a dispatcher, agents
(and, with ``TopologyOptions.fencers``, a fencer per worker).

Shared by ``mkctl demo``, the end-to-end tests and the end-to-end benchmark, so the topology is
written once. :class:`Topology` is an async context manager: entering it starts kubesim (a manager
and three worker clusters of different sizes, one with GPUs), the embedded MQTT broker unless a
broker URL is given, a SQLite file under the state directory unless a database URL is given, runs
the migrations, installs mkd's CRDs into every cluster, then starts the dispatcher and one agent per
worker as supervised tasks, and with ``fencers`` (``mkctl demo``: the topology of deploy/) one fencer
per worker next to its agent (``worker_agent.fencer``, its probes and metrics on a free local port,
``describe()["fencers"]``); a fencer keeps running while its agent is stopped. Leaving it stops them in reverse order. Agents can be stopped and started
again (``stop_agent`` / ``start_agent``) to show that a lost worker is noticed and nothing is lost.
Given ``TopologyOptions.kubeconfigs``, real clusters stand in for kubesim (the e2e suite on real clusters).
With ``TopologyOptions.rbac`` (the default) the services run as ``deploy/`` runs them: the RBAC objects of
their manifests are applied from ``deploy/`` (``mkctl.deployrbac``) and each service gets a kubeconfig with
its ServiceAccount's token, never the admin's; kubesim clusters then authorize every request (and serve
HTTPS, so that kubectl, which sends a token over TLS only, works with their kubeconfigs), so a rule
missing from ``deploy/`` fails the demo and the tests. On real clusters what this applied is removed again
when the topology is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace, TracebackType
from typing import Any

from pydantic import BaseModel

from mkctl.errors import CommandFailed

log = logging.getLogger(__name__)

MANAGER = "manager"


SIM_MISSING = ("the simulator is not installed (kubesim and the embedded broker come with mkd[sim]); "
               "install it: pip install -e ./sim -e '.[sim]' from a source tree, or use real clusters")


def _kubesim() -> Any:
    """kubesim, which only the demo, the tests and the benchmarks need (the mkd-sim distribution)."""
    try:
        import kubesim
    except ModuleNotFoundError as exc:
        if exc.name not in ("kubesim", "aiohttp"):
            raise
        raise CommandFailed(SIM_MISSING) from exc
    return kubesim


def default_workers() -> list[Any]:
    """worker-1: small CPU; worker-2: larger CPU; worker-3: GPU nodes (nvidia.com/gpu)."""
    ks = _kubesim()
    return [
        ks.ClusterSpec("worker-1", nodes=[ks.NodeSpec(f"worker-1-node-{i}", cpu="4", memory="16Gi")
                                          for i in (1, 2)], seed=1),
        ks.ClusterSpec("worker-2", nodes=[ks.NodeSpec(f"worker-2-node-{i}", cpu="16", memory="64Gi")
                                          for i in (1, 2, 3, 4)], seed=2),
        ks.ClusterSpec("worker-3", nodes=[
            ks.NodeSpec(f"worker-3-gpu-{i}", cpu="32", memory="128Gi", extended={"nvidia.com/gpu": "4"},
                        labels={"nvidia.com/gpu.present": "true", "node.kubernetes.io/instance-type": "gpu-4x"})
            for i in (1, 2)], seed=3),
    ]


def manager_spec() -> Any:
    ks = _kubesim()
    # the manager runs no LWS controller: an LWS has no managedBy, so one there would run it too
    return ks.ClusterSpec(MANAGER, nodes=[ks.NodeSpec("manager-node-1", cpu="4", memory="16Gi")], seed=0,
                          without=("leaderworkerset",))


DISPATCHER_KEY = "mkd-dispatcher"
"""The dispatcher's entry in ``Topology.keys`` (cluster names are the agents')."""


@dataclass
class TopologyOptions:
    """How to build the federation; every default is the embedded, nothing-to-install one."""

    state_dir: Path = Path("state")
    mqtt_url: str | None = None
    """None: start the embedded broker (amqtt) on a free port."""
    database_url: str | None = None
    """None: SQLite file ``<state_dir>/mkd.db``."""
    topic_root: str = "mkd/v1"
    workers: list[Any] | None = None
    """kubesim ClusterSpecs of the workers; None: :func:`default_workers`."""
    heartbeat_seconds: float = 2.0
    """Agents' heartbeat interval; short in the demo so a stopped agent shows up within seconds."""
    heartbeat_timeout_seconds: float = 6.0
    """Dispatcher: a cluster silent for this long is lost (nothing new is placed on it)."""
    dispatcher_overrides: dict[str, Any] = field(default_factory=dict)
    agent_overrides: dict[str, Any] = field(default_factory=dict)
    origin: str = "mkd-demo"
    start_services: bool = True
    """False: clusters, broker and database only (the benchmark runs the services elsewhere)."""
    kubeconfigs: dict[str, Path] | None = None
    """Real clusters instead of kubesim: cluster name -> kubeconfig, ``manager`` plus the workers
    (the e2e suite's ``MKD_TEST_KUBECONFIGS``); ``workers`` is then ignored."""
    api: bool = True
    """Serve the dispatcher's admin API, dashboard and metrics on a free local port with a fresh token."""
    rbac: bool = True
    """Run the services with ServiceAccount tokens bound to deploy/'s roles (module docstring); False, or
    without a deploy/ directory (an installed wheel), they use the clusters' admin kubeconfigs."""
    handover_webhook: bool = False
    """Serve the dispatcher's handover admission webhook over HTTPS on a free local port (a certificate
    made for 127.0.0.1) and register it in the manager as ``deploy/components/handover-webhook`` does:
    called on CREATE in namespaces labelled ``handover.mkd.dev/enabled=true``. kubesim only (a real API
    server cannot reach this machine's loopback); ``mkctl demo`` turns it on."""
    kinds_file: Path | None = None
    """A declarations file (``externalFrameworks``) every service reads (their ``kinds_file``); with ``rbac`` the
    roles ``mkctl kinds --manifests`` writes for its kinds are applied too, and on kubesim workers the generic
    stand-in operator is configured to run them (its ConfigMap, ``kubesim/sim/generic.py``)."""
    crds: list[dict[str, Any]] = field(default_factory=list)
    """More CRDs installed into every cluster with mkd's (those of the declared kinds)."""
    fencers: bool = False
    """Start a fencer per worker (``mkctl fencer``; deploy/worker/fencer.yaml), each serving /healthz,
    /readyz and /metrics on a free local port. Off for the tests that stop agents on purpose to see what
    the dispatcher alone does; ``mkctl demo`` turns it on."""


def _free_port() -> int:
    """A port free now on 127.0.0.1 (the dispatcher binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def build_settings(cls: type[BaseModel], values: Mapping[str, Any]) -> Any:
    """Settings from explicit values, keeping only fields ``cls`` has (logged), env vars ignored.

    The demo must not pick up a developer's ``MKD_*`` environment, so explicit values are given for
    what matters and the class's defaults cover the rest.
    """
    known = cls.model_fields
    kept = {k: v for k, v in values.items() if k in known}
    dropped = sorted(set(values) - set(kept))
    if dropped:
        log.debug("%s has no field(s) %s; not set", cls.__name__, ", ".join(dropped))
    return cls(**kept)


class Topology:
    """The running federation; see the module docstring. Attributes are valid while entered."""

    def __init__(self, options: TopologyOptions | None = None) -> None:
        self.options = options or TopologyOptions()
        given = self.options.kubeconfigs
        if given is not None and MANAGER not in given:
            raise CommandFailed(f"kubeconfigs must name a {MANAGER!r} cluster besides the workers: {sorted(given)}")
        self.workers: list[Any] = ([SimpleNamespace(name=n) for n in given if n != MANAGER] if given is not None
                                   else self.options.workers or default_workers())
        self.database_url = self.options.database_url or \
            f"sqlite+aiosqlite:///{(self.options.state_dir / 'mkd.db').resolve()}"
        self.mqtt_url: str = self.options.mqtt_url or ""
        self.sim: Any = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._supervisor: Any = None
        self._stops: dict[str, asyncio.Event] = {}
        self.kubes: dict[str, Any] = {}
        # MQTT client ids must differ between federations sharing one broker (persistent sessions
        # are per client id), and stay stable across an agent's restart within one federation.
        self._tag = hashlib.sha1(self.options.topic_root.encode()).hexdigest()[:6]
        self.api_port: int | None = _free_port() if self.options.api else None
        self.api_token = secrets.token_urlsafe(18)
        self.service_kubeconfigs: dict[tuple[str, str], Path] = {}
        """(service, cluster) -> the kubeconfig with that service's token (``rbac``)."""
        self._applied: dict[str, list[Any]] = {}
        """Cluster -> the RBAC objects this topology created there (removed again on real clusters)."""
        self.agent_ports: dict[str, int] = {}
        """Worker -> the port of its agent's /metrics, /healthz and /readyz."""
        self.fencer_ports: dict[str, int] = {}
        """Worker -> the port of its fencer's /metrics, /healthz and /readyz (with ``fencers``)."""
        self.webhook_port: int | None = None
        """The handover webhook's HTTPS port (with ``handover_webhook`` on kubesim)."""
        self._webhook_ca: str | None = None
        from federation import signing

        # Every message is signed: one key pair for the dispatcher and one per agent, made per run;
        # the workers' public keys are registered in the database before the dispatcher starts.
        self.keys: dict[str, tuple[str, str]] = {name: signing.generate()
                                                 for name in (DISPATCHER_KEY, *self.worker_names)}

    # --- names ---------------------------------------------------------------------------------
    @property
    def worker_names(self) -> list[str]:
        return [w.name for w in self.workers]

    @property
    def cluster_names(self) -> list[str]:
        return [MANAGER, *self.worker_names]

    def kubeconfig(self, cluster: str) -> Path:
        if self.options.kubeconfigs is not None:
            return Path(self.options.kubeconfigs[cluster])
        return Path(self.sim.kubeconfig(cluster))

    @property
    def manager(self) -> Any:
        """The manager cluster's federation.kube.Kube (the only API the e2e tests drive)."""
        return self.kubes[MANAGER]

    # --- lifecycle -------------------------------------------------------------------------------
    async def __aenter__(self) -> Topology:
        from federation.kube import Kube
        from federation.tasks import Supervisor

        started = time.monotonic()
        self.options.state_dir.mkdir(parents=True, exist_ok=True)
        stack = contextlib.AsyncExitStack()
        await stack.__aenter__()
        self._stack = stack
        try:
            if self.options.kubeconfigs is None:
                ks = _kubesim()
                sim_dir = self.options.state_dir / "sim"
                specs = [manager_spec(), *self.workers]
                if self.rbac:
                    import dataclasses

                    # HTTPS as well: kubectl sends the kubeconfig's token only over TLS (client-go)
                    specs = [dataclasses.replace(spec, authorize=True, tls=True) for spec in specs]
                self.sim = await stack.enter_async_context(ks.serve_async(specs, sim_dir))
            if not self.mqtt_url:
                try:
                    from federation.embedded_broker import EmbeddedBroker
                except ModuleNotFoundError as exc:
                    raise CommandFailed(SIM_MISSING) from exc

                broker = await stack.enter_async_context(EmbeddedBroker())
                self.mqtt_url = broker.url
            await self._upgrade_database()
            for name in self.cluster_names:
                self.kubes[name] = await stack.enter_async_context(Kube(self.kubeconfig(name)))
            await asyncio.gather(*(self.install_crds(name) for name in self.cluster_names))
            if self.rbac:
                stack.push_async_callback(self._remove_rbac)
                await asyncio.gather(*(self._apply_rbac(name) for name in self.cluster_names))
            if self.options.handover_webhook:
                self._webhook_pki()
            self._supervisor = await stack.enter_async_context(Supervisor(grace=5.0))
            if self.options.start_services:
                self.start_dispatcher()
                if self.webhook_port is not None:
                    await self.register_webhook()
                for name in self.worker_names:
                    self.start_agent(name)
                    if self.options.fencers:
                        self.start_fencer(name)
        except BaseException:
            await stack.__aexit__(None, None, None)
            self._stack = None
            raise
        log.info("federation up in %.1fs: %s", time.monotonic() - started, ", ".join(self.cluster_names))
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        for stop in self._stops.values():
            stop.set()
        # Let the services finish their staged shutdown before the supervisor cancels what is left.
        tasks = [info.task for info in (self._supervisor.tasks.values() if self._supervisor else ())]
        if tasks:
            await asyncio.wait(tasks, timeout=10.0)
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.__aexit__(exc_type, exc, tb)

    @property
    def rbac(self) -> bool:
        from mkctl import deployrbac

        if self.options.rbac and not deployrbac.available():
            log.warning("deploy/ is not here (an installed wheel): the services run with the admin kubeconfigs")
        return self.options.rbac and deployrbac.available()

    async def _apply_rbac(self, cluster: str) -> None:
        """deploy/'s RBAC for the services of ``cluster`` and a kubeconfig with each one's token."""
        from mkctl import deployrbac

        kube = self.kubes[cluster]
        services = ["dispatcher"] if cluster == MANAGER else ["agent", "fencer"]
        allowed = list((self.options.agent_overrides.get("policy") or {}).get("allowed_namespaces") or [])
        applied = self._applied.setdefault(cluster, [])
        declared = self.declared_kinds()
        for service in services:
            docs = deployrbac.documents(service, allowed if service != "dispatcher" else None)
            if declared:  # what `mkctl kinds --manifests` writes for them, as an admin applies it
                docs += deployrbac.declared_documents(service, declared, allowed if service != "dispatcher" else None)
            applied += await deployrbac.apply(kube, docs)
        for service in services:
            out = self.options.state_dir / "kubeconfigs" / f"{service}-{cluster}.kubeconfig"
            self.service_kubeconfigs[(service, cluster)] = await deployrbac.service_kubeconfig(
                kube, self.kubeconfig(cluster), service, out)

    async def _remove_rbac(self) -> None:
        """On real clusters, delete what ``_apply_rbac`` created (newest first); kubesim goes away anyway."""
        from federation.errors import FederationError

        if self.options.kubeconfigs is None:
            return
        for cluster, created in self._applied.items():
            for res, ns, name in reversed(created):
                try:
                    await self.kubes[cluster].delete(res, name, ns)
                except FederationError as exc:
                    log.warning("could not remove %s %s from %s: %s", res.kind, name, cluster, exc)

    def declared_kinds(self) -> tuple[Any, ...]:
        from federation.settings import declared_kinds

        return declared_kinds(self.options.kinds_file)

    def credentials(self, service: str, cluster: str) -> Path:
        """The kubeconfig ``service`` runs with on ``cluster``: its token's, or the admin's without ``rbac``."""
        return self.service_kubeconfigs.get((service, cluster)) or self.kubeconfig(cluster)

    async def _upgrade_database(self) -> None:
        from datetime import UTC, datetime

        from dispatcher import db
        from dispatcher.db.queries import clusters as cluster_q

        await db.upgrade_async(self.database_url)
        engine = db.make_engine(self.database_url)
        try:
            async with db.sessionmaker(engine).begin() as s:
                for name in self.worker_names:
                    await cluster_q.register_cluster(s, name, self.keys[name][1], datetime.now(UTC))
        finally:
            await engine.dispose()

    async def install_crds(self, cluster: str) -> None:
        """mkd's CRD manifests into one cluster; waits until each kind is served."""
        from federation.errors import AlreadyExists
        from federation.kinds.crds import load_crds
        from federation.kube import CRDS

        kube = self.kubes[cluster]
        crds = [*load_crds(), *self.options.crds]
        if cluster == MANAGER:  # the HandoverPolicy CRD is the manager's only
            from dispatcher.handover.crds import load_crd

            crds.append(load_crd())
        for crd in crds:
            with contextlib.suppress(AlreadyExists):
                await kube.create(CRDS, crd)
        if cluster != MANAGER and self.options.kinds_file is not None and self.options.kubeconfigs is None:
            await self._configure_generic_operator(kube)

    async def _configure_generic_operator(self, kube: Any) -> None:
        """kubesim's generic stand-in runs the declared kinds on this worker (as their operators would)."""
        from federation.errors import AlreadyExists
        from federation.kube import CONFIGMAPS
        from kubesim.sim import generic

        assert self.options.kinds_file is not None
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": generic.CONFIG_NAME, "namespace": generic.CONFIG_NAMESPACE},
                "data": {generic.CONFIG_KEY: self.options.kinds_file.read_text(encoding="utf-8")}}
        with contextlib.suppress(AlreadyExists):
            await kube.create(CONFIGMAPS, body, generic.CONFIG_NAMESPACE)

    # --- the handover webhook ------------------------------------------------------------------------
    def _webhook_pki(self) -> None:
        """A certificate for the webhook on 127.0.0.1 and its CA (kubesim checks it as a real server does)."""
        if self.options.kubeconfigs is not None:
            log.warning("handover webhook not served: real clusters cannot call this machine's loopback")
            return
        _kubesim()
        from kubesim.testing import webhook_pki

        pki = webhook_pki([], ips=("127.0.0.1",))
        where = self.options.state_dir / "webhook"
        where.mkdir(parents=True, exist_ok=True)
        (where / "tls.crt").write_bytes(pki.cert_pem)
        (where / "tls.key").write_bytes(pki.key_pem)
        self.webhook_port = _free_port()
        self._webhook_ca = pki.ca_bundle

    def webhook_configuration(self) -> dict[str, Any] | None:
        """deploy/components/handover-webhook's MutatingWebhookConfiguration, its clientConfig pointed at
        this dispatcher's webhook; None (said) where the source tree's deploy/ is not there."""
        import yaml

        path = Path(__file__).resolve().parents[1] / "deploy" / "components" / "handover-webhook" / "webhook.yaml"
        if not path.exists():
            log.warning("handover webhook not registered: %s is not there (run from a source tree)", path)
            return None
        config = next(d for d in yaml.safe_load_all(path.read_text(encoding="utf-8"))
                      if d and d.get("kind") == "MutatingWebhookConfiguration")
        config["metadata"].pop("annotations", None)  # cert-manager's injection: the CA is given here
        for hook in config["webhooks"]:
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{self.webhook_port}/mutate",
                                    "caBundle": self._webhook_ca}
        return dict(config)

    async def register_webhook(self) -> None:
        from federation.errors import AlreadyExists
        from federation.kube import Resource

        config = self.webhook_configuration()
        if config is None:
            return
        res = Resource("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations",
                       "MutatingWebhookConfiguration", namespaced=False)
        with contextlib.suppress(AlreadyExists):
            await self.manager.create(res, config)

    # --- services ------------------------------------------------------------------------------
    def dispatcher_settings(self) -> Any:
        from dispatcher.settings import DispatcherSettings

        values: dict[str, Any] = {
            "kube": {"kubeconfig": self.credentials("dispatcher", MANAGER)},
            "database_url": self.database_url,
            "mqtt": {"url": self.mqtt_url, "topic_root": self.options.topic_root,
                     "client_id": f"{self.options.origin}-{self._tag}-dispatcher"},
            "origin": self.options.origin,
            "signing": {"private_key": self.keys[DISPATCHER_KEY][0]},
            "heartbeat_timeout_seconds": self.options.heartbeat_timeout_seconds,
            "placement_retry_seconds": 2.0,
            "capacity_settle_seconds": 1.0,
        }
        if self.options.kinds_file is not None:
            values["kinds_file"] = self.options.kinds_file
        if self.api_port is not None:
            values.update(api_port=self.api_port, api_host="127.0.0.1", api_token=self.api_token)
        if self.webhook_port is not None:
            where = self.options.state_dir / "webhook"
            values["handover"] = {"webhook_port": self.webhook_port, "webhook_host": "127.0.0.1",
                                  "webhook_cert_file": where / "tls.crt", "webhook_key_file": where / "tls.key"}
        values.update(self.options.dispatcher_overrides)
        return build_settings(DispatcherSettings, values)

    def agent_settings(self, cluster: str) -> Any:
        from worker_agent.settings import AgentSettings

        values: dict[str, Any] = {
            "cluster_name": cluster,
            "kubeconfig": self.credentials("agent", cluster),
            "mqtt": {"url": self.mqtt_url, "topic_root": self.options.topic_root,
                     "client_id": f"{self.options.origin}-{self._tag}-agent-{cluster}"},
            "origin": self.options.origin,
            "signing": {"private_key": self.keys[cluster][0]} if cluster in self.keys else {},
            "dispatcher_public_keys": [self.keys[DISPATCHER_KEY][1]],
            "heartbeat_interval_seconds": self.options.heartbeat_seconds,
            "capacity_debounce_seconds": 0.2,
            "metrics_port": self.agent_ports.setdefault(cluster, _free_port()),  # /readyz says what degraded
            "metrics_host": "127.0.0.1",
            **({"kinds_file": self.options.kinds_file} if self.options.kinds_file is not None else {}),
        }
        values.update(self.options.agent_overrides)
        return build_settings(AgentSettings, values)

    def _start(self, name: str, run: Callable[..., Awaitable[None]], settings: Any) -> None:
        stop = asyncio.Event()
        self._stops[name] = stop
        self._supervisor.start(name, lambda: run(settings, stop=stop))

    def start_dispatcher(self) -> None:
        from dispatcher import app as dispatcher_app

        self._start("dispatcher", dispatcher_app.run, self.dispatcher_settings())

    def start_agent(self, cluster: str) -> None:
        """Start (or start again) the agent of ``cluster``."""
        from worker_agent import app as agent_app

        self._start(f"agent-{cluster}", agent_app.run, self.agent_settings(cluster))

    def fencer_settings(self, cluster: str) -> Any:
        from worker_agent.settings import FencerSettings

        port = self.fencer_ports.setdefault(cluster, _free_port())
        return build_settings(FencerSettings, {
            "cluster_name": cluster, "kubeconfig": self.credentials("fencer", cluster), "origin": self.options.origin,
            "metrics_port": port, "metrics_host": "127.0.0.1",
            **({"kinds_file": self.options.kinds_file} if self.options.kinds_file is not None else {})})

    def start_fencer(self, cluster: str) -> None:
        """Start the fencer of ``cluster`` (``mkctl fencer``), a task apart from its agent."""
        from worker_agent import fencer

        self._start(f"fencer-{cluster}", fencer.run, self.fencer_settings(cluster))

    async def stop_agent(self, cluster: str, *, within: float = 15.0) -> None:
        """Stop one agent the way SIGTERM would, and wait until it has shut down."""
        await self._stop(f"agent-{cluster}", within)

    async def stop_dispatcher(self, *, within: float = 15.0) -> None:
        await self._stop("dispatcher", within)

    async def _stop(self, name: str, within: float) -> None:
        self._stops[name].set()
        info = self._supervisor.tasks.get(name)
        if info is not None and not info.task.done():
            done, _ = await asyncio.wait([info.task], timeout=within)
            if not done:
                info.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await info.task

    async def wait_for_clusters(self, within: float = 30.0) -> list[str]:
        """Wait until the dispatcher has heard every agent's heartbeat; return the clusters it knows.

        Jobs submitted earlier are fine (they wait, pending, for a cluster); the demo waits so its
        table does not open with "no worker cluster is known yet".
        """
        from sqlalchemy.ext.asyncio import AsyncSession

        from dispatcher.db import make_engine
        from dispatcher.db.queries import listing

        engine = make_engine(self.database_url)
        known: list[str] = []
        try:
            deadline = time.monotonic() + within
            while time.monotonic() < deadline:
                self.check_running()
                async with AsyncSession(engine) as session:
                    known = [r.name for r in await listing.list_clusters(session) if r.online]
                if set(self.worker_names) <= set(known):
                    break
                await asyncio.sleep(0.2)
        finally:
            await engine.dispose()
        return known

    def failures(self) -> list[tuple[str, BaseException]]:
        """Services that ended with an error (the demo and tests stop on the first one)."""
        out = []
        for info in (self._supervisor.tasks.values() if self._supervisor else ()):
            # The supervisor keeps a failed task's error in last_error (its task itself returns).
            if info.task.done() and info.last_error is not None:
                out.append((info.name, info.last_error))
        return out

    async def degraded(self) -> dict[str, list[str]]:
        """Service -> the side work its ``/readyz`` says is degraded (what is wrong and the fix), for every
        service serving one (the dispatcher with ``api``, the agents, the fencers); empty when all is well."""
        import httpx

        probes = {f"agent-{c}": p for c, p in self.agent_ports.items()}
        probes |= {f"fencer-{c}": p for c, p in self.fencer_ports.items()}
        if self.api_port is not None:
            probes["dispatcher"] = self.api_port
        out: dict[str, list[str]] = {}
        async with httpx.AsyncClient(timeout=5.0) as client:
            for service, port in sorted(probes.items()):
                try:
                    text = (await client.get(f"http://127.0.0.1:{port}/readyz")).text
                except httpx.HTTPError:
                    continue  # not serving (stopped on purpose, or not up yet): nothing it could say
                lines = [line.removeprefix("degraded: ") for line in text.splitlines() if line.startswith("degraded: ")]
                if lines:
                    out[service] = lines
        return out

    def check_running(self) -> None:
        """Raise the first service failure, so a crashed dispatcher stops the demo with its cause."""
        for name, exc in self.failures():
            raise RuntimeError(f"{name} stopped with an error: {type(exc).__name__}: {exc}") from exc

    def describe(self) -> dict[str, Any]:
        """What is running and where: printed by ``--keep-running`` and used by the e2e tests."""
        return {
            "database_url": self.database_url,
            "mqtt_url": self.mqtt_url,
            "topic_root": self.options.topic_root,
            "kubeconfigs": {name: str(self.kubeconfig(name)) for name in self.cluster_names},
            "api_url": self.api_url,
            "api_token": self.api_token if self.api_url else None,
            "dashboard_url": f"{self.api_url}/?token={self.api_token}" if self.api_url else None,
            "fencers": {name: f"http://127.0.0.1:{port}" for name, port in self.fencer_ports.items()},
            "handover_webhook": (f"https://127.0.0.1:{self.webhook_port}/mutate"
                                 if self.webhook_port is not None else None),
        }

    @property
    def api_url(self) -> str | None:
        return f"http://127.0.0.1:{self.api_port}" if self.api_port is not None else None
