"""The dispatcher's Prometheus metrics: every family is defined here, in one registry per Dispatcher.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from dispatcher import readmodel
from dispatcher.db.models import WORKLOAD_STATES, outbox, placements, workloads
from federation.errors import Invalid

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)

UNITS = {"cpu": "core", "memory": "byte", "ephemeral-storage": "byte"}


def unit_of(resource: str) -> str:
    """kube-state-metrics' convention: cpu in cores, memory and storage in bytes, the rest counted."""
    return UNITS.get(resource, "byte" if resource.startswith("hugepages-") else "integer")


class _Parts(Collector):
    """Counters and gauges the dispatcher's parts already keep, read at scrape."""

    def __init__(self, metrics: DispatcherMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Any]:
        d = self.metrics.dispatcher
        engine = getattr(d, "engine", None)
        reports = getattr(d, "reports", None)
        publisher = getattr(d, "publisher", None)
        writer = getattr(d, "writer", None)
        lost = CounterMetricFamily("mkd_report_holes_lost", "Holes in an agent's report stream that did not fill "
                                   "within the grace period (Reports lost; the cluster is sent a Resync)")
        healed = CounterMetricFamily("mkd_report_resyncs", "Resyncs sent to heal lost or possibly missed Reports "
                                     "(holes, streams met part-way, Inventory answers)")
        stale = CounterMetricFamily("mkd_reports_stale_dropped", "Status Reports dropped as older than the last one")
        received = CounterMetricFamily("mkd_reports_received", "Reports decoded from the broker")
        report_messages = CounterMetricFamily("mkd_report_messages_received", "Broker messages on the agents' "
                                              "report and presence topics (a batch of Reports is one)")
        refused = CounterMetricFamily("mkd_reports_refused", "Messages on report topics refused as malformed or "
                                      "claiming another cluster")
        reconnects = CounterMetricFamily("mkd_mqtt_reconnects", "MQTT reconnections after the first connect",
                                         labels=["link"])
        writes = CounterMetricFamily("mkd_kube_writes", "Writes to manager Jobs (status, conditions, Events)",
                                     labels=["result"])
        unanswered = GaugeMetricFamily("mkd_places_unanswered", "Place Commands published and not answered yet")
        published = CounterMetricFamily("mkd_outbox_commands_published", "Commands published and acknowledged by "
                                        "the broker (a Place sent again after no answer counts again)")
        command_messages = CounterMetricFamily("mkd_outbox_messages_published", "Broker messages the outbox "
                                               "published (a batch of Commands is one)")
        batches = CounterMetricFamily("mkd_engine_batches", "Batches the engine decided, each in one database "
                                      "transaction (items per batch: how well a burst is gathered)")
        if engine is not None:
            lost.add_metric([], float(engine.streams.lost_holes))
            healed.add_metric([], float(self.metrics.resyncs))
            stale.add_metric([], float(engine.stale_dropped))
            unanswered.add_metric([], float(len(engine.unanswered)))
            batches.add_metric([], float(engine.batches))
        if reports is not None:
            received.add_metric([], float(reports.received))
            report_messages.add_metric([], float(reports.messages))
            refused.add_metric([], float(reports.refused))
        for link, part in (("reports", reports), ("outbox", publisher)):
            health = getattr(part, "health", None)
            if health is not None:
                reconnects.add_metric([link], float(max(0, health.connects - 1)))
        if publisher is not None:
            published.add_metric([], float(publisher.sent))
            command_messages.add_metric([], float(publisher.messages))
        if writer is not None:
            writes.add_metric(["written"], float(writer.writes))
            writes.add_metric(["unchanged"], float(writer.unchanged))
            writes.add_metric(["failed"], float(writer.failures))
        yield from (lost, healed, stale, received, refused, reconnects, writes, unanswered, published,
                   report_messages, command_messages, batches)
        side = getattr(d, "side", None)
        if side is not None:
            yield from side.collect()
        handover = getattr(d, "handover", None)
        if handover is not None:  # dispatcher/handover: who runs what, and what the webhook routed
            jobs = GaugeMetricFamily("mkd_manager_jobs", "Jobs on the manager cluster by controller (their "
                                     "managedBy; '<controller> (default)' when unset), namespace and kind",
                                     labels=["namespace", "kind", "controller"])
            for (ns, kind, controller), n in sorted(handover.book.counts().items()):
                jobs.add_metric([ns, kind, controller], float(n))
            routed = CounterMetricFamily("mkd_handover_routed", "New Jobs the admission webhook gave managedBy "
                                         "kueue.x-k8s.io/multikueue, by kind and HandoverPolicy",
                                         labels=["kind", "policy"])
            for (kind, policy), n in sorted(handover.routed.items()):
                routed.add_metric([kind, policy], float(n))
            policies = GaugeMetricFamily("mkd_handover_policies", "HandoverPolicies in force by mode, and ignored "
                                         "as invalid (mode=Invalid)", labels=["mode"])
            for mode in ("Shadow", "Route", "Drain"):
                policies.add_metric([mode], float(sum(1 for p in handover.book.policies.values() if p.mode == mode)))
            policies.add_metric(["Invalid"], float(len(handover.book.policy_errors)))
            yield from (jobs, routed, policies)


class DispatcherMetrics:
    """One registry with every dispatcher family; ``dispatcher`` is read by the parts collector.

    Named the Prometheus way: ``mkd_`` prefix, the unit in the name, ``_total`` on counters. Three kinds
    of source:

    - **observed as it happens** (histograms, counters): report lag (``ReportIn`` as the engine takes it),
      admission latency (claim → Place sent) and placement latency (Place sent → accepted), read from new
      placement rows at each scrape so every placement is observed exactly once;
    - **read at scrape** from the database (``refresh``; through the admin surfaces' read model,
      ``dispatcher/readmodel.py``, where it has the figure): Workloads by state and LocalQueue (namespace
      and name), the oldest pending Workload's age per LocalQueue, Cluster health / cordon / capacity
      (allocatable, free, used per resource), outbox depth;
    - **counters owned by the parts** (report streams, link health, kube writer), exposed through a
      collector that reads them at scrape, so no part keeps a second copy.

    Other parts add their families here (e.g. ``mkd_messages_refused_total{reason}``) with :meth:`counter`
    / :meth:`gauge` / :meth:`histogram` on the same registry.
    """

    def __init__(self, dispatcher: Any = None) -> None:
        self.dispatcher = dispatcher
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.workloads = Gauge("mkd_workloads", "Workloads per state and LocalQueue (namespace and queue name)",
                               ["state", "namespace", "queue"], registry=r)
        self.pending_age = Gauge("mkd_workload_pending_oldest_age_seconds",
                                 "Age of the oldest pending (not suspended) Workload per LocalQueue (namespace and "
                                 "queue name)", ["namespace", "queue"], registry=r)
        self.admission = Histogram("mkd_admission_latency_seconds",
                                   "From claim to the first Place sent (first attempts only)",
                                   buckets=LATENCY_BUCKETS, registry=r)
        self.placement = Histogram("mkd_placement_latency_seconds",
                                   "From a Place sent to the agent's Accepted (every attempt)",
                                   buckets=LATENCY_BUCKETS, registry=r)
        self.report_lag = Histogram("mkd_report_lag_seconds", "From an agent sending a Report to the engine taking it",
                                    ["type"], buckets=LATENCY_BUCKETS, registry=r)
        self.cluster_up = Gauge("mkd_cluster_up", "1 when the cluster's heartbeat is fresh and it is online",
                                ["cluster"], registry=r)
        self.cluster_cordoned = Gauge("mkd_cluster_cordoned", "1 when an admin cordoned the cluster", ["cluster"],
                                      registry=r)
        self.heartbeat_age = Gauge("mkd_cluster_heartbeat_age_seconds", "Seconds since the cluster's last heartbeat",
                                   ["cluster"], registry=r)
        labels = ["cluster", "resource", "unit"]
        self.allocatable = Gauge("mkd_cluster_allocatable", "Allocatable capacity per cluster and resource (unit "
                                 "label: core, byte, integer)", labels, registry=r)
        self.free = Gauge("mkd_cluster_free", "Free capacity per cluster and resource", labels, registry=r)
        self.used = Gauge("mkd_cluster_used", "Used capacity (allocatable - free) per cluster and resource", labels,
                          registry=r)
        self.outbox_depth = Gauge("mkd_outbox_unsent_commands", "Commands in the outbox not yet acknowledged by the "
                                  "broker", registry=r)
        self.actions = Counter("mkd_admin_actions", "Admin actions by verb and result", ["verb", "result"],
                               registry=r)
        self._lag_of: dict[str, Any] = {}
        self.resyncs = 0
        self._placements_seen = 0
        self._accepted_seen = datetime.now(UTC)
        r.register(_Parts(self))

    # --- for other parts to add their families ---------------------------------------------------

    def counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(name, doc, list(labels), registry=self.registry)

    def gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(name, doc, list(labels), registry=self.registry)

    def histogram(self, name: str, doc: str, labels: Sequence[str] = (),
                  buckets: Sequence[float] = LATENCY_BUCKETS) -> Histogram:
        return Histogram(name, doc, list(labels), buckets=list(buckets), registry=self.registry)

    # --- hooks ---------------------------------------------------------------------------------------

    def report_taken(self, report: Any, received_at: datetime) -> None:
        sent = getattr(report, "sent_at", None)
        if sent is not None:
            lag = self._lag_of.get(report.type)
            if lag is None:  # one child per Report type, looked up once (``labels`` takes a lock: ~5 us a Report)
                lag = self._lag_of[report.type] = self.report_lag.labels(report.type)
            lag.observe(max(0.0, (received_at - sent).total_seconds()))

    def resync_sent(self) -> None:
        self.resyncs += 1

    # --- at scrape ---------------------------------------------------------------------------------

    async def refresh(self, session: Any, now: datetime | None = None) -> None:
        """Read the database's figures into the gauges and observe new placements (never commits)."""
        from federation.podset import parse_quantity

        now = now or datetime.now(UTC)
        self.workloads.clear()
        page = await readmodel.queues(session)  # the admin surfaces' figures (dispatcher/readmodel.py)
        for lq in page["local_queues"]:
            for state in WORKLOAD_STATES:  # every state of a known queue, zeros included (rates need the series)
                self.workloads.labels(state, lq["namespace"], lq["name"]).set(lq["workloads"].get(state, 0))
        self.pending_age.clear()
        for namespace, queue, oldest in await session.execute(
                sa.select(workloads.c.namespace, workloads.c.queue, sa.func.min(workloads.c.created_at))
                .where(workloads.c.state == "pending", workloads.c.suspended.is_(False))
                .group_by(workloads.c.namespace, workloads.c.queue)):
            if oldest is not None:
                oldest = oldest if oldest.tzinfo else oldest.replace(tzinfo=UTC)
                self.pending_age.labels(namespace, queue).set(max(0.0, (now - oldest).total_seconds()))
        for gauge in (self.cluster_up, self.cluster_cordoned, self.heartbeat_age, self.allocatable, self.free,
                      self.used):
            gauge.clear()
        for c in await readmodel.clusters(session, now):
            if c["refused"]:
                continue  # a sender refused for want of a key, never a cluster
            name = c["name"]
            self.cluster_up.labels(name).set(1 if c["health"] == "online" else 0)
            self.cluster_cordoned.labels(name).set(1 if c["cordoned"] else 0)
            if c["heartbeat_age_seconds"] is not None:
                self.heartbeat_age.labels(name).set(c["heartbeat_age_seconds"])
            alloc, free = c["allocatable"], c["free"]
            for resource in sorted(set(alloc) | set(free)):
                try:
                    a = parse_quantity(alloc.get(resource, "0"), resource)
                    f = parse_quantity(free.get(resource, "0"), resource)
                except (ValueError, Invalid, ArithmeticError):
                    continue
                unit = unit_of(resource)
                self.allocatable.labels(name, resource, unit).set(float(a))
                self.free.labels(name, resource, unit).set(float(f))
                self.used.labels(name, resource, unit).set(float(max(a - f, Decimal(0))))
        depth = (await session.execute(sa.select(sa.func.count()).select_from(outbox)
                                       .where(outbox.c.sent_at.is_(None)))).scalar_one()
        self.outbox_depth.set(depth)
        await self._observe_placements(session)

    async def start(self, session: Any) -> None:
        """Placements made before this process started were observed by the one that made them."""
        found = (await session.execute(sa.select(sa.func.max(placements.c.id)))).scalar_one()
        self._placements_seen = int(found or 0)
        self._accepted_seen = datetime.now(UTC)

    async def _observe_placements(self, session: Any) -> None:
        rows = await session.execute(
            sa.select(placements.c.id, placements.c.attempt, placements.c.created_at, workloads.c.created_at.label("w"))
            .join(workloads, workloads.c.uid == placements.c.workload_uid)
            .where(placements.c.id > self._placements_seen).order_by(placements.c.id))
        for pid, attempt, created, claimed in rows:
            self._placements_seen = max(self._placements_seen, int(pid))
            if attempt == 1:
                self.admission.observe(max(0.0, (created - claimed).total_seconds()))
        accepted = await session.execute(
            sa.select(placements.c.created_at, placements.c.accepted_at)
            .where(placements.c.accepted_at > self._accepted_seen).order_by(placements.c.accepted_at))
        for created, at in accepted:
            self._accepted_seen = max(self._accepted_seen, at)
            self.placement.observe(max(0.0, (at - created).total_seconds()))

    def exposition(self) -> bytes:
        """This dispatcher's families, then the process-wide default registry's (process figures, and
        families kept there such as ``mkd_messages_refused_total``)."""
        from prometheus_client import REGISTRY

        return generate_latest(self.registry) + generate_latest(REGISTRY)
