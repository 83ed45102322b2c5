"""The agent's Prometheus metrics and probes, served on its own port (``metrics_port``).

Every family of the agent is defined here, in one registry per Agent (``mkd_agent_`` prefix, units in
names, ``_total`` counters): reconcile latency per job kind (every apply-loop pass), API calls to its
worker cluster by verb and HTTP code (0: no answer), the objects it owns per resource (its informer
caches: jobs it placed and their children), the MQTT link's reconnects, Commands taken, the
heartbeat interval. Families kept in the process-wide default registry (``mkd_messages_refused_total``,
the process's own figures) follow on the same page. ``/healthz`` answers while the event loop runs;
``/readyz`` is 200 once discovery has run, the MQTT link is up and the node and pod caches have listed (before,
the agent claims no capacity), 503 naming what is missing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from federation.tasks import SideWork

RECONCILE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class _Parts(Collector):
    def __init__(self, metrics: AgentMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Any]:
        agent = self.metrics.agent
        owned = GaugeMetricFamily("mkd_agent_objects_owned", "Objects this agent's informers hold (its placed "
                                  "jobs and their children; nodes and pods of the whole cluster)", labels=["resource"])
        reconnects = CounterMetricFamily("mkd_agent_mqtt_reconnects", "MQTT reconnections after the first connect")
        up = GaugeMetricFamily("mkd_agent_mqtt_connected", "1 while the MQTT link is up")
        for plural, cache in sorted((getattr(agent, "caches", None) or {}).items()):
            owned.add_metric([plural], float(len(cache)))
        health = getattr(agent, "link_health", None)
        reconnects.add_metric([], float(max(0, health.connects - 1)) if health is not None else 0.0)
        connected = getattr(agent, "connected", None)
        up.add_metric([], 1.0 if connected is not None and connected.is_set() else 0.0)
        echoes = CounterMetricFamily("mkd_agent_watch_echoes", "Watch events recognised, before decoding, as "
                                     "the echo of the agent's own create or write of a child or status write of a job")
        echoes.add_metric([], float(getattr(agent, "echoes_handled", 0)))
        yield from (owned, reconnects, up, echoes)


class AgentMetrics:
    """The agent's registry; ``agent`` is read at scrape (caches, link health)."""

    def __init__(self, agent: Any = None) -> None:
        self.agent = agent
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.reconcile = Histogram("mkd_agent_reconcile_duration_seconds", "One apply-loop pass over a job",
                                   ["kind"], buckets=RECONCILE_BUCKETS, registry=r)
        self.api_calls = Counter("mkd_agent_api_calls", "Requests to the worker cluster's API server by verb and "
                                 "HTTP code (0: no answer)", ["verb", "code"], registry=r)
        r.register(_Parts(self))
        self._reconcile_of: dict[str, Any] = {}
        self._calls_of: dict[tuple[str, int], Any] = {}
        """The labelled children, looked up once: ``labels()`` takes a lock and builds a key on every call, and
        these are counted ~10 times per job."""

    def counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
        """For other parts to add their families to the agent's page."""
        return Counter(name, doc, list(labels), registry=self.registry)

    def reconciled(self, kind: str, seconds: float) -> None:
        child = self._reconcile_of.get(kind)
        if child is None:
            child = self._reconcile_of[kind] = self.reconcile.labels(kind)
        child.observe(seconds)

    def api_call(self, verb: str, code: int) -> None:
        child = self._calls_of.get((verb, code))
        if child is None:
            child = self._calls_of[(verb, code)] = self.api_calls.labels(verb, str(code))
        child.inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry) + generate_latest(REGISTRY)


def create_app(metrics: Any, ready: Any, side: SideWork | None = None) -> Any:
    """``/metrics`` (``metrics.exposition()``), ``/healthz`` and ``/readyz``; ``ready()`` returns None or
    what is missing; ``side``'s faults are listed by ``/readyz`` (one ``degraded:`` line each, the probe's
    status unchanged) and counted in ``/metrics``. The agent's and the fencer's (``worker_agent.fencermetrics``) ports."""
    # starlette only once a port is served: an agent or fencer without one never loads it
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse, Response
    from starlette.routing import Route

    sides = CollectorRegistry(auto_describe=False)
    if side is not None:
        sides.register(side)  # type: ignore[arg-type]

    async def prometheus(request: Request) -> Response:
        return Response(metrics.exposition() + generate_latest(sides), media_type=CONTENT_TYPE_LATEST)

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(request: Request) -> Response:
        missing = ready()
        degraded = "".join(f"\ndegraded: {line}" for line in side.problems()) if side is not None else ""
        if missing:
            return PlainTextResponse(f"not ready: {missing}{degraded}", status_code=503)
        return PlainTextResponse(f"ok{degraded}")

    return Starlette(routes=[Route("/metrics", prometheus), Route("/healthz", healthz), Route("/readyz", readyz)])


class ProbeServer:
    """A metrics-and-probes port as a supervised task: ``metrics`` (with ``exposition()``) and
    ``missing()`` (None: ready) are the subclass's; ``port`` 0 binds any free port, set once ``started``."""

    metrics: Any

    def __init__(self, host: str, port: int, side: SideWork | None = None) -> None:
        self.host = host
        self.port = port
        self.started = asyncio.Event()
        self.app = create_app(self.metrics, self.missing, side)

    def missing(self) -> str | None:
        raise NotImplementedError

    def _bound(self, port: int) -> None:
        self.port = port
        self.started.set()

    async def run(self) -> None:
        from federation.httpserve import serve  # uvicorn: loaded only by a process that serves a port

        await serve(self.app, self.host, self.port, self._bound)


class MetricsServer(ProbeServer):
    """The agent's metrics port as a supervised task (``metrics``)."""

    def __init__(self, agent: Any, host: str, port: int) -> None:
        self.agent = agent
        self.metrics = AgentMetrics(agent)
        super().__init__(host, port, agent.side)

    def missing(self) -> str | None:
        if getattr(self.agent, "apply", None) is None:
            return "job kinds not discovered yet"
        connected = getattr(self.agent, "connected", None)
        if connected is None or not connected.is_set():
            return "MQTT link not up"
        known = getattr(self.agent, "capacity_known", None)
        if known is not None and not known.is_set():
            # until both listed, the agent claims no capacity (``Agent._wait_for_lists``): not ready to run Jobs
            listed: set[str] = getattr(self.agent, "_listed", set())
            return f"{', '.join(p for p in ('nodes', 'pods') if p not in listed)} not listed yet"
        return None
