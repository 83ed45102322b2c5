"""The fencer's Prometheus metrics and probes, served on its own port (``MKD_FENCER_METRICS_PORT``).

Families (``mkd_fencer_`` prefix), read from the :class:`~worker_agent.fencer.Fencer` at scrape: sweeps,
placed Jobs suspended, their child Jobs and JobSets suspended, pods deleted, failed calls by reason
(``record``: reading the lease record; ``list``, ``suspend``, ``delete``), the seconds left on the agent's
lease record as last read (negative: out of date by that much; absent while there is no record), and API
calls to the worker cluster by verb and HTTP code. The process's own figures follow on the same page.
``/healthz`` answers while the event loop runs; ``/readyz`` is 200 once the fencer has read the record
(or found none) and listed every kind it fences, 503 naming what failed. The HTTP surface is the
agent's (``worker_agent.metrics``).
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client import REGISTRY, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from federation.tasks import SideWork
from worker_agent.metrics import ProbeServer

FAILURE_REASONS = ("record", "list", "suspend", "delete")


class FencerFigures(Protocol):
    """What is read from the fencer (``worker_agent.fencer.Fencer``) at scrape and for ``/readyz``."""

    sweeps: int
    suspended: int
    children_suspended: int
    pods_deleted: int
    failures: Tally[str]

    def seconds_left(self) -> float | None: ...

    def missing(self) -> str | None: ...


class _Figures(Collector):
    def __init__(self, fencer: FencerFigures) -> None:
        self.fencer = fencer

    def collect(self) -> Iterator[Any]:
        f = self.fencer
        for name, doc, value in (
                ("sweeps", "Sweeps run because the agent's lease record had run out", f.sweeps),
                ("jobs_suspended", "Placed Jobs of the agent suspended (and marked fenced)", f.suspended),
                ("child_jobs_suspended", "Jobs and JobSets the agent made under its placed Jobs, suspended",
                 f.children_suspended),
                ("pods_deleted", "Pods the agent made under its placed Jobs, deleted", f.pods_deleted)):
            family = CounterMetricFamily(f"mkd_fencer_{name}", doc)
            family.add_metric([], float(value))
            yield family
        failures = CounterMetricFamily("mkd_fencer_failures", "Failed calls by reason (record: reading the lease "
                                       "record; list, suspend, delete: while sweeping)", labels=["reason"])
        for reason in sorted(set(FAILURE_REASONS) | set(f.failures)):
            failures.add_metric([reason], float(f.failures[reason]))
        yield failures
        left = GaugeMetricFamily("mkd_fencer_record_seconds_left", "Seconds until the agent's lease record as "
                                 "last read runs out (negative: out of date); absent with no record")
        seconds = f.seconds_left()
        if seconds is not None:
            left.add_metric([], seconds)
        yield left


class FencerMetrics:
    """The fencer's registry."""

    def __init__(self, fencer: FencerFigures) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_Figures(fencer))
        self.api_calls = Counter("mkd_fencer_api_calls", "Requests to the worker cluster's API server by verb and "
                                 "HTTP code (0: no answer)", ["verb", "code"], registry=self.registry)

    def api_call(self, verb: str, code: int) -> None:
        self.api_calls.labels(verb, str(code)).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry) + generate_latest(REGISTRY)


class FencerServer(ProbeServer):
    """The fencer's metrics port as a supervised task (``metrics``)."""

    def __init__(self, fencer: FencerFigures, host: str, port: int, side: SideWork | None = None) -> None:
        self.fencer = fencer
        self.metrics = FencerMetrics(fencer)
        super().__init__(host, port, side)

    def missing(self) -> str | None:
        return self.fencer.missing()
