"""The dispatcher service: wires intake, engine, report subscriber, outbox publisher and writer.

``run(settings, stop=...)`` serves its probes at once, checks the schema (refusing to start on one
that is behind, naming ``mkctl db upgrade``; a database that is not reachable yet is waited for, see
:mod:`dispatcher.replica.startup`), is elected, takes a fencing epoch, and runs these named tasks under one Supervisor
until ``stop`` is set: ``intake/<Kind>[/<namespace>]`` per JobKind, ``engine``, ``reports``,
``outbox``, ``kube-writer``, ``ticker``, ``cluster-keys`` and ``memory``. ``Dispatcher`` is the same thing as an object, for
tests and the benchmark that want to look inside (engine counters, the writer's backlog).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
from pathlib import Path
from typing import Any

from dispatcher import db
from dispatcher.clusters.identity import OutboxSealing
from dispatcher.clusters.leases import LeaseDesk
from dispatcher.db.history import HistoryPruner
from dispatcher.db.queries.listing import list_clusters, list_placements, show_workload
from dispatcher.engine.loop import Engine, Tick
from dispatcher.intake.jobcache import JobCache
from dispatcher.intake.watch import Intake
from dispatcher.mirror.kubewriter import KubeWriter
from dispatcher.queueing.watcher import QueueWatcher
from dispatcher.replica.leader import Leadership
from dispatcher.replica.startup import Startup, Stopped, trim_memory
from dispatcher.settings import DispatcherSettings
from dispatcher.wire.outbox import Publisher
from dispatcher.wire.podstreams import PodStreams
from dispatcher.wire.reports import ReportSubscriber
from dispatcher.wire.workercauses import WorkerCauses
from federation.clock import Clock, SystemClock
from federation.kinds import registry
from federation.kinds.base import JobKind
from federation.kinds.registry import KINDS
from federation.kube import Kube
from federation.tasks import SideWork, Supervisor

__all__ = ["Dispatcher", "list_clusters", "list_placements", "run", "show_workload"]
log = logging.getLogger(__name__)


def _ensure_sqlite_dir(url: str) -> None:
    prefix = "sqlite+aiosqlite:///"
    if url.startswith(prefix) and ":memory:" not in url:
        Path(url[len(prefix):]).parent.mkdir(parents=True, exist_ok=True)


class Dispatcher:
    """One dispatcher instance; ``async with Dispatcher(settings) as d: await d.run(stop)``."""

    def __init__(self, settings: DispatcherSettings, *, clock: Clock | None = None,
                 kinds: tuple[JobKind, ...] | None = None, check_schema: bool = True) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        self.declared = settings.declared_kinds()
        """The kinds ``kinds_file`` declares: known to every lookup while the dispatcher runs."""
        self.kinds = kinds if kinds is not None else (*KINDS, *self.declared)
        self._declared_scope = contextlib.ExitStack()
        self.check_schema = check_schema
        self.kube: Kube | None = None
        self.engine: Engine | None = None
        self.intake: Intake | None = None
        self.queue_watcher: QueueWatcher | None = None
        self.checks: Any = None
        """Kueue mode's :class:`~dispatcher.admissioncheck.controller.KueueChecks` (``admission_check.enabled``)."""
        self.writer: KubeWriter | None = None
        self.publisher: Publisher | None = None
        self.reports: ReportSubscriber | None = None
        self.leases: LeaseDesk | None = None
        self.supervisor: Supervisor | None = None
        self.http: Any = None
        self.handover: Any = None
        self._engine_sql: Any = None
        self.leadership: Leadership | None = None
        self.startup = Startup(self.clock, settings.outage_retry_max_seconds)
        """The start-up steps, each waiting for the database; readiness reads it (dispatcher/replica/startup.py)."""
        self._switch_interval = sys.getswitchinterval()
        self.side = SideWork(self.clock)
        """Faults of the side work (queue status, Events, handover records): /readyz and the metrics show them."""

    async def __aenter__(self) -> Dispatcher:
        try:
            return await self._enter()
        except BaseException:
            self._declared_scope.close()  # the declared kinds are known only while a dispatcher runs
            raise

    async def _enter(self) -> Dispatcher:
        s = self.settings
        self._switch_interval = sys.getswitchinterval()
        if s.gil_switch_interval_seconds is not None:
            sys.setswitchinterval(s.gil_switch_interval_seconds)
        self._declared_scope.enter_context(registry.declared(self.declared))
        _ensure_sqlite_dir(s.database_url)
        self._engine_sql = db.make_engine(s.database_url)
        sessions = db.sessionmaker(self._engine_sql)
        self.kube = await Kube.from_settings(s.kube, clock=self.clock, user_agent="mkd-dispatcher").__aenter__()
        self.kube.side = self.side
        cache = JobCache()
        self.writer = KubeWriter(self.kube, cache, self.clock, workers=s.kube_writers, side=self.side)
        self.engine = Engine(s, sessions, self.kube, self.writer, self.clock, cache=cache)
        self.leadership = Leadership(s, self._engine_sql, self.clock)
        self._sessions = sessions
        self.intake = Intake(self.kube, self.engine, self.clock, kinds=self.kinds, namespaces=s.namespaces,
                             recheck_seconds=s.kind_recheck_seconds)
        # one id per replica: two replicas sharing one would knock each other off the broker
        base = f"{s.mqtt.client_id or f'mkd-dispatcher-{s.origin}'}-{s.replica_id or socket.gethostname()}"[:200]
        engine = self.engine
        sealing = OutboxSealing(engine.identity, epoch=lambda: engine.epoch, fresh=lambda: engine.outbox_ids.next(),
                                root=s.mqtt.topic_root)
        self.publisher = Publisher(s, sessions, self.clock, self.engine.outbox_wake, client_id=f"{base}-out",
                                   seal=sealing, fresh=self.engine.fresh, unanswered=self.engine.unanswered)
        self.reports = ReportSubscriber(s, self.engine, self.clock, client_id=f"{base}-in")
        leadership, publisher = self.leadership, self.publisher
        self.podstreams = PodStreams(s, engine.identity, publisher.publish_now, self.clock, client_id=f"{base}-streams",
                                     epoch=lambda: engine.epoch, lost=lambda cluster: engine.lost.get(cluster))
        self.leases = self.reports.leases = LeaseDesk(self.engine, publisher.publish_now, lambda: leadership.active)
        if s.handover.enabled:  # policies, counts, shadow records, the admission webhook (dispatcher/handover)
            from dispatcher.handover.service import HandoverService

            self.handover = HandoverService(self, sessions)
            self.intake.observe = self.handover.book.observe
        if s.api_port is not None:  # the admin API, dashboard, /metrics and probes (dispatcher/api/)
            from dispatcher.api.service import HttpService

            self.http = HttpService(self, sessions)
            self.engine.metrics = self.http.metrics
            self.http.ctx.ready_checks["start"] = self._started
            self.http.ctx.streams = self.podstreams
        engine = self.engine
        if s.admission_check.enabled:  # Kueue mode: Kueue's queueing decides, mkd serves its check
            from dispatcher.admissioncheck.controller import KueueChecks

            handover = self.handover
            self.checks = KueueChecks(self.kube, engine, sessions, self.clock, kinds={k.name: k for k in self.kinds},
                                      sync_seconds=s.admission_check.sync_seconds,
                                      no_fit_retry_seconds=s.admission_check.no_fit_retry_seconds,
                                      changed=handover.book.recount if handover is not None else None)
            self.intake.lens = self.checks.view
            if handover is not None:
                handover.book.classify = self.checks.classify
            return self
        self.queue_watcher = QueueWatcher(self.kube, self.engine.queueing.catalog, self.clock,
                                          lambda: engine.inbox.put_nowait(Tick()), recheck_seconds=s.kind_recheck_seconds,
                                          side=self.side)
        return self

    async def __aexit__(self, *exc: object) -> None:
        sys.setswitchinterval(self._switch_interval)
        self._declared_scope.close()
        if self.kube is not None:
            await self.kube.__aexit__(None, None, None)
        if self._engine_sql is not None:
            await self._engine_sql.dispose()

    async def _ticker(self) -> None:
        assert self.engine is not None
        period = min(self.settings.placement_retry_seconds, self.settings.heartbeat_timeout_seconds / 3,
                     self.settings.place_resend_seconds / 2)
        while True:
            await self.clock.sleep(period)
            self.engine.inbox.put_nowait(Tick())

    async def _cluster_keys(self) -> None:
        """Clusters registered while running are heard within a refresh; refused senders are recorded."""
        assert self.engine is not None
        while True:
            await self.clock.sleep(self.settings.cluster_keys_refresh_seconds)
            await self.engine.identity.refresh(self._sessions, self.clock.now())

    async def _reports_after_intake(self) -> None:
        # Inventory answers re-send Place commands from the Job cache: fill it first (bounded wait).
        assert self.intake is not None and self.reports is not None
        try:
            await asyncio.wait_for(self.intake.ready.wait(), timeout=30)
        except TimeoutError:
            log.warning("intake has not listed every kind after 30s; taking Reports anyway")
        await self.reports.run()

    async def _outbox_after_subscribe(self) -> None:
        assert self.reports is not None and self.publisher is not None
        try:
            await asyncio.wait_for(self.reports.subscribed.wait(), timeout=60)
        except TimeoutError:
            log.warning("not subscribed to Reports after 60s; sending Commands anyway")
        await self.publisher.run()

    def start_tasks(self, sup: Supervisor) -> None:
        assert self.engine and self.intake and self.writer and self.publisher and self.reports
        for kind in self.kinds:
            for ns in self.intake.namespaces:
                name = f"intake/{kind.name}" + (f"/{ns}" if ns else "")
                sup.start(name, lambda kind=kind, ns=ns: self.intake.watch(kind, ns),  # type: ignore[union-attr,misc]
                          restart=True)
        sup.start("engine", self.engine.run, restart=True)
        sup.start("kube-writer", self.writer.run, restart=True)
        self.publisher.publishes = sup.task_set("outbox", on_error=self.publisher.publish_failed)
        sup.start("outbox", self._outbox_after_subscribe, restart=True)
        sup.start("reports", self._reports_after_intake, restart=True)
        assert self.leases is not None
        sup.start("leases", self.leases.run, restart=True)  # heartbeat -> persisted -> Lease, beside the engine
        sup.start("ticker", self._ticker, restart=True)
        sup.start("streams", self.podstreams.run, restart=True)  # answers to Asks: pods and logs (podstreams)
        if self.settings.worker_causes_seconds > 0:  # why placed Jobs' pods do not run, as Events on the manager
            causes = WorkerCauses(self.settings.worker_causes_seconds, self._sessions, self.kube, self.podstreams,
                                  self.clock)
            sup.start("worker-causes", causes.run, side=True)
        sup.start("cluster-keys", self._cluster_keys, restart=True)
        pruner = HistoryPruner(self._sessions, self.clock, self.settings.history_retention_seconds)
        sup.start("history", pruner.run, side=True)  # deleted Jobs' Workloads past the retention (dispatcher/db/history.py)
        engine, writer = self.engine, self.writer

        def waiting() -> int:  # the work a burst leaves in memory (see trim_memory)
            return engine.inbox.qsize() + writer.backlog + len(engine.fresh)
        sup.start("memory", lambda: trim_memory(self.clock, waiting=waiting), restart=True)  # RSS down after bursts
        if self.checks is not None:
            from dispatcher.admissioncheck import kueueview as kv

            checks = self.checks
            for res in (kv.ADMISSION_CHECKS, kv.CLUSTER_QUEUES, kv.LOCAL_QUEUES, kv.RESOURCE_FLAVORS, kv.WORKLOADS):
                sup.start(f"kueue/{res.plural}", lambda r=res: checks.watch(r), restart=True)  # type: ignore[misc]
            sup.start("kueue/checks", checks.sync_checks, restart=True)
            sup.start("kueue/active", checks.mark_active, side=True)
        if self.queue_watcher is not None:
            watcher = self.queue_watcher
            for object_kind in watcher.kinds():
                sup.start(f"queues/{object_kind}", lambda k=object_kind: watcher.watch(k), side=True)  # type: ignore[misc]
            sup.start("queues/status", lambda: watcher.write_status(self.engine.queueing.queues, 2.0),  # type: ignore[union-attr]
                      side=True)
        if self.handover is not None:
            self.handover.start_tasks(sup)

    def _started(self) -> str | None:
        """Readiness: None once this replica is the active one and has started its tasks."""
        if self.leadership is not None and self.leadership.standing_by:
            return "standing by: another dispatcher of this origin is active"
        return self.startup.problem()

    async def _start(self, stop: asyncio.Event) -> bool:
        """The start-up steps that read the database, each waiting out an outage of any length
        (dispatcher/replica/startup.py); False when ``stop`` was set first."""
        assert self.engine is not None and self.leadership is not None and self.intake is not None
        s, sessions, step = self.settings, self._sessions, self.startup.step
        engine, leadership = self.engine, self.leadership
        try:
            if self.check_schema:
                await step("checking the schema", lambda: db.check_current(s.database_url), stop)
            await step("reading the cluster keys", lambda: engine.identity.refresh(sessions, self.clock.now()), stop)
            if self.http is not None:
                await step("reading the metrics' starting point", self.http.start, stop)
            if not await step("electing the active dispatcher", lambda: leadership.acquire(stop), stop):
                return False
            await step("taking a fencing epoch and rebuilding from the database", engine.start, stop)
        except Stopped:
            return False
        self.intake.follow_claimed()  # what is claimed is known only now
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Serve the probes at once; wait for the database and stand by until this replica is the
        active one (dispatcher/replica/leader.py), then take a fencing epoch, rebuild from the database and run
        every task until ``stop``; a lost leadership is fatal (the process exits and comes back as a
        standby)."""
        assert self.engine is not None and self.leadership is not None
        try:
            async with Supervisor(clock=self.clock, side=self.side) as sup:
                self.supervisor = sup
                if self.http is not None:  # alive from the start, ready only once started (``_started``)
                    sup.start("api", self.http.run, restart=True)
                if not await self._start(stop):
                    return
                self.start_tasks(sup)
                sup.start("leadership", self.leadership.hold)  # not restarted: losing it is fatal
                self.startup.done = True
                await sup.run_until_stopped(stop, before_shutdown=self._before_shutdown)
        finally:
            await self.leadership.release()


    async def _before_shutdown(self) -> None:
        """Stopping: the manager Job writes that wait to share a write go now (``KubeWriter.flush``), and the
        Commands the broker acknowledged are marked sent (``Publisher.settle``)."""
        if self.writer is not None:
            await self.writer.flush(self.settings.stop_flush_seconds)
        if self.publisher is not None:
            await self.publisher.settle(self.settings.stop_flush_seconds)


async def run(settings: DispatcherSettings, *, stop: asyncio.Event) -> None:
    """Run the dispatcher until ``stop`` is set; raises Permanent when the schema is behind."""
    async with Dispatcher(settings) as dispatcher:
        await dispatcher.run(stop)
