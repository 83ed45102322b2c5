"""The agent process: wires caches, informers, the apply loop, the inbox and the reports under one Supervisor.

Tasks (all named, all owned by the Supervisor): one informer per watched job kind (label
selector = this agent's origin) and per child resource (pods, services, ... plus nodes for
capacity), the apply loop's worker pool, the MQTT link loop (reconnect with LinkHealth; on each
connect: subscribe to the commands topic, send an Inventory and a heartbeat), the outbox
senders and the heartbeat loop (whose capacity is measured only once the node and pod informers
have listed: ``_wait_for_lists``). The will message is a Heartbeat with ``online=False``; a clean
shutdown publishes the same before leaving.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from federation import __version__, topics
from federation.clock import Clock, SystemClock
from federation.errors import Transport
from federation.kinds import registry
from federation.kinds.base import JobKind
from federation.kinds.registry import KINDS
from federation.kube import CONFIGMAPS, NODES, PODS, SECRETS, Kube, Resource, resource_for
from federation.labels import origin_selector
from federation.messages import Capacity, Heartbeat, encode
from federation.mqtt import LinkHealth, MqttLink, Will
from federation.tasks import SideWork, Supervisor
from worker_agent.apply import ApplyLoop, JobKey, StatusEcho, job_key
from worker_agent.cache import ObjectCache, Stored, key_of
from worker_agent.foreign import created_by, foreign_owner
from worker_agent.identity import AgentIdentity
from worker_agent.inbox import Inbox
from worker_agent.lease import LeaseKeeper
from worker_agent.metrics import MetricsServer
from worker_agent.podanswers import Answerer
from worker_agent.policy import CheckedPolicy
from worker_agent.reconcilers.base import Reconciler
from worker_agent.reconcilers.registry import reconcilers as all_reconcilers
from worker_agent.reports import CapacityMeter, Outbox, Reporter, heartbeat, placement_of, sleep_or
from worker_agent.seq import SHIFT, Sequencer, take_epoch
from worker_agent.settings import AgentSettings

log = logging.getLogger(__name__)

SENDERS = 32
"""Reports publishing at once (each waits for its PUBACK; the link caps them at ``mqtt.max_inflight``).
A PUBACK is read only when the agent's loop gets to it, and a loop busy with a burst of jobs takes
tens of milliseconds per turn: four senders then carried well under 100 Reports/s and an Accepted
reached the dispatcher about 16 s after the Job ran. Numbers are stamped in the order
the senders take Reports, and the link publishes in that order."""
NAMESPACED_READS = frozenset({SECRETS.plural, CONFIGMAPS.plural})
"""Children read only where Jobs may land when the policy lists those namespaces (see ``child_namespaces``)."""
FLUSH_SECONDS = 2.0
"""On shutdown, how long queued reports may take to reach the broker."""
REGAIN_WAIT = 15.0
"""Seconds an Inventory sent after a lease renewal waits for its Resync before another may be sent."""


class Agent:
    """One agent for one worker cluster; ``run`` until ``stop`` is set."""

    def __init__(self, settings: AgentSettings, kube: Kube, *, clock: Clock | None = None) -> None:
        self.settings = settings
        self.kube = kube
        self.clock = clock or SystemClock()
        self.side = SideWork(self.clock)
        """Faults of the side work (Events, the metrics port): /readyz and /metrics show them."""
        kube.side = self.side
        self.declared = settings.declared_kinds()
        """The kinds ``kinds_file`` declares (run by their own operators here): known to every lookup while the
        agent runs."""
        self.kinds: dict[str, JobKind] = {k.name: k for k in (*KINDS, *self.declared)}
        self.delegated = {k: v for k, v in settings.delegate.items() if k in self.kinds}
        recs = all_reconcilers(tuple(self.kinds.values()))
        self.reconcilers: dict[str, Reconciler] = {
            name: r for name, r in recs.items() if name in self.kinds and name not in self.delegated}
        self.job_resources: dict[str, Resource] = {}
        self.child_resources: dict[str, Resource] = {PODS.plural: PODS, NODES.plural: NODES}
        self.caches: dict[str, ObjectCache] = {}
        self.by_uid: dict[str, JobKey] = {}
        self.echoes_handled = 0
        """Watch events recognised as the echo of the agent's own write before decoding: a child's create or write
        (``_child_echo``), a job's status write (``_job_echo``) or the inbox's create of a copy (``_created_echo``)."""
        self.job_echoes_handled = 0
        """Of those, the echoes of the apply loop's status writes of jobs (``_job_echo``)."""
        self.copy_echoes_handled = 0
        """Of those, the echoes of the inbox's creates of copies (``_created_echo``)."""
        self.policy = settings.policy.model_copy(update={"agent_namespace": settings.namespace})
        """The policy enforced and announced: the configured one, with the agent's own namespace always denied."""
        self.identity = AgentIdentity(settings)
        """The agent's key (every Report is sealed) and the dispatcher's (every Command is checked)."""
        self.outbox = Outbox(seal=self.identity.seal, accept_hold=settings.accept_hold_seconds, clock=self.clock)
        root = settings.mqtt.topic_root
        self.reporter = Reporter(settings.cluster_name, topics.reports(settings.cluster_name, root), self.outbox,
                                 settings.origin)
        self.apply: ApplyLoop | None = None
        self.inbox: Inbox | None = None
        self.lease: LeaseKeeper | None = None
        self._regained = asyncio.Event()
        self.capacity_changed = asyncio.Event()
        self._listed: set[str] = set()
        """Which of the node and pod informers have completed a list (``follow_children``)."""
        self.capacity_known = asyncio.Event()
        """Set once both the node and the pod caches were listed: only then is capacity measured from them."""
        self.connected = asyncio.Event()
        self.meter: CapacityMeter | None = None
        self._unserved_logged: set[str] = set()
        self._watching: set[str] = set()
        self._watching_children: set[str] = set()
        self.link_health: LinkHealth | None = None
        self.link: MqttLink | None = None
        """The current link to the broker (None while reconnecting)."""
        self.first_link_ms: int | None = None
        """Unix ms when this process first connected: Commands sealed earlier are refused (link_loop)."""
        self.metrics_server: Any = None
        self.answers = Answerer(settings, kube, self.identity, self.clock)
        """Answers the dispatcher's Asks: a placed Job's pods and logs (worker_agent.podanswers)."""

    def _admission(self, kind: str) -> contextlib.AbstractAsyncContextManager[None]:
        """A new Job of ``kind`` waits for room in the apply loop when the loop reconciles that kind."""
        loop = self.apply
        if loop is not None and kind in loop.reconcilers:
            return loop.admission()
        return contextlib.nullcontext()

    async def discover(self) -> None:
        """Watch the kinds whose CRDs are served now (reconciled or delegated); the others are retried."""
        self.caches.setdefault(PODS.plural, ObjectCache(PODS.plural))
        self.caches.setdefault(NODES.plural, ObjectCache(NODES.plural))
        self.meter = CapacityMeter(self.caches[NODES.plural], self.caches[PODS.plural])
        self.apply = ApplyLoop(self.kube, {}, {}, self.caches, self.clock,
                               concurrency=self.settings.concurrency, on_status=self._own_status,
                               origin=self.settings.origin, backlog_max=self.settings.backlog_max,
                               status_hold=self.settings.status_hold_seconds)
        self.inbox = Inbox(self.kube, self.caches, self.reporter, origin=self.settings.origin, kinds={},
                           delegate=self.delegated, create_namespaces=self.settings.create_namespaces,
                           policy=CheckedPolicy(self.policy), clock=self.clock)
        self.lease = LeaseKeeper(self.kube, self.caches, self.inbox.kinds, origin=self.settings.origin,
                                 clock=self.clock, startup_grace=self.settings.lease_startup_grace_seconds,
                                 stop_before=self.settings.lease_stop_before_seconds,
                                 on_regained=self._lease_regained,
                                 record_in=(self.settings.namespace, self.settings.cluster_name))
        self.inbox.lease = self.lease
        self.inbox.report_again = self._report_again
        self.inbox.admission = self._admission
        self.apply.may_start = self.lease.holds
        await self.adopt_served()

    async def adopt_served(self) -> list[str]:
        """Add every wanted kind whose CRD is served now; returns the names added."""
        assert self.apply is not None and self.inbox is not None
        added: list[str] = []
        for name in sorted(set(self.reconcilers) | set(self.delegated)):
            if name in self.job_resources:
                continue
            res = resource_for(self.kinds[name])
            if not await self.kube.served(res):
                if name not in self._unserved_logged:
                    self._unserved_logged.add(name)
                    log.warning("%s (%s) is not served by this cluster (yet); its placements are rejected "
                                "until its CRD is installed", name, res.plural)
                continue
            self.job_resources[name] = res
            self.caches.setdefault(res.plural, ObjectCache(res.plural))
            reconciler = self.reconcilers.get(name)
            if reconciler is not None:
                for child in reconciler.children:
                    self.child_resources.setdefault(child.plural, child)
                    self.caches.setdefault(child.plural, ObjectCache(child.plural))
                self.apply.reconcilers[name] = reconciler
            self.apply.resources[name] = res
            self.inbox.kinds[name] = self.kinds[name]
            added.append(name)
        return added

    async def rediscover_loop(self, sup: Supervisor) -> None:
        """CRDs installed after the agent started are picked up without a restart."""
        while len(self.job_resources) < len(set(self.reconcilers) | set(self.delegated)):
            await self.clock.sleep(self.settings.discovery_interval_seconds)
            if await self.adopt_served():
                self._start_watchers(sup)
                self.capacity_changed.set()  # the heartbeat lists the kinds

    def _start_watchers(self, sup: Supervisor) -> None:
        for name in self.job_resources:
            if name not in self._watching:
                self._watching.add(name)
                sup.start(f"watch-kind-{name}", self._bind(self.follow_jobs, name), restart=True)
        for plural in self.child_resources:
            if plural not in self._watching_children:
                self._watching_children.add(plural)
                for namespace in self.child_namespaces(plural):
                    where = f"-{namespace}" if namespace else ""
                    sup.start(f"watch-child-{plural}{where}",
                              lambda p=plural, n=namespace: self.follow_children(p, n),  # type: ignore[misc]
                              restart=True)

    def child_namespaces(self, plural: str) -> list[str | None]:
        """Where children of kind ``plural`` are watched: Secrets and ConfigMaps only in the namespaces the
        policy lets Jobs land in, when it lists them (the agent's RBAC grants those reads there and
        nowhere else, see deploy/worker); everything else, and every kind when any namespace is
        allowed, cluster-wide (None)."""
        allowed = self.policy.allowed_namespaces
        if plural in NAMESPACED_READS and allowed:
            return list(dict.fromkeys(allowed))
        return [None]

    def _own_status(self, kind: str, job: dict[str, Any]) -> None:
        self.reporter.job_changed(self.kinds[kind], job)

    def _reports_by_pass(self, kind: str) -> bool:
        reconciler = self.reconcilers.get(kind)
        return reconciler is not None and reconciler.reports_status

    def _report_again(self, kind: JobKind, job: dict[str, Any]) -> None:
        """A Resync's "report it again": the job's status as watched, or a pass for a kind whose reconciler
        reports (its report then goes even if unchanged)."""
        if not self._reports_by_pass(kind.name) or self.apply is None:
            self.reporter.job_changed(kind, job, force=True)
            return
        placement = placement_of(job)
        if placement is not None:
            self.reporter.forget_status(placement.workload_uid)
        ns, name = key_of(job)
        self.apply.enqueue((kind.name, ns, name))

    # --- watchers ---------------------------------------------------------------------------
    async def follow_jobs(self, name: str) -> None:
        res = self.job_resources[name]
        kind = self.kinds[name]
        cache = self.caches[res.plural]
        assert self.apply is not None and self.inbox is not None
        selector = origin_selector(self.settings.origin)
        # what the cache holds already (the task restarted after a failure): the first list reports as DELETED
        # what was deleted while none watched, which would otherwise stay in the cache for good
        async for event in self.kube.informer(res, label_selector=selector, known=cache.held(None, selector),
                                              echoes=functools.partial(self._job_echo, name)):
            obj = event.object
            ns, job_name = key_of(obj)
            uid = str((obj.get("metadata") or {}).get("uid") or "")
            if event.type == "DELETED":
                last = cache.delete_event(obj)
                # a relist reports deletions with the informer's slim copy; the cache has the full one
                full = obj if ("spec" in obj or last is None) else last
                if cache.header((ns, job_name)) is None:
                    self.by_uid.pop(uid, None)
                    self.apply.forget((name, ns, job_name))
                self.inbox.job_seen(name, full, deleted=True)
                self.reporter.job_changed(kind, full, deleted=True)
                continue
            if not cache.accepts(obj):
                continue
            key = (name, ns, job_name)
            echo = self.apply.status_echo(key, obj)
            if echo in (StatusEcho.PASS_OWED, StatusEcho.SETTLED):
                # the echo of the apply loop's own status write, which was reported as it was written and
                # changed no label or annotation: only the pass after the write may still be owed
                cache.upsert(obj, watched=True)
                if echo is StatusEcho.PASS_OWED:
                    self.apply.enqueue(key)
                continue
            self.by_uid[uid] = (name, ns, job_name)
            self.inbox.job_seen(name, obj)
            if self.lease is not None:
                self.lease.job_seen(res.plural, obj)  # a copy marked fenced is resumed once a Resync lists it
            if not self._reports_by_pass(name):
                self.reporter.job_changed(kind, obj)
            cache.upsert(obj, watched=True)  # shrinks obj to its header: read it before
            if echo is not StatusEcho.EARLY_SETTLED:  # that status write's pass needs no other
                self.apply.enqueue((name, ns, job_name))

    async def follow_children(self, plural: str, namespace: str | None = None) -> None:
        res = self.child_resources[plural]
        cache = self.caches[plural]
        assert self.apply is not None
        listed = functools.partial(self._listed_once, plural) if plural in (PODS.plural, NODES.plural) else None
        echoes = functools.partial(self._child_echo, plural) if plural != NODES.plural else None
        # as in follow_jobs: a restarted informer is told what the cache holds, so what vanished meanwhile goes
        async for event in self.kube.informer(res, namespace, listed=listed, known=cache.held(namespace),
                                              echoes=echoes):
            obj = event.object
            stored: Stored | None = None
            if event.type == "DELETED":
                cache.delete_event(obj)
            else:
                self._check_foreign(obj)  # before upsert, which shrinks obj to its header
                stored = cache.upsert(obj, watched=True)
                if not stored:
                    continue
                if stored is Stored.SAME_CONTENT and plural != NODES.plural:
                    # a pod scheduled (its node is for capacity only), a write that changed nothing the
                    # reconcilers read: its job's pass would render what the last one did
                    if plural == PODS.plural:
                        self.capacity_changed.set()
                    continue
            echo = stored is not None and self.apply.own_echo(plural, key_of(obj), stored, added=event.type == "ADDED")
            self._child_changed(plural, obj, echo=echo)

    def _child_changed(self, plural: str, header: Mapping[str, Any], *, echo: bool) -> None:
        """What a child's watch event causes once it is in the cache: capacity measured again (nodes, pods), and
        its owner's pass (none for an ``echo`` of the agent's own write when the owner settles)."""
        assert self.apply is not None
        if plural in (PODS.plural, NODES.plural):
            self.capacity_changed.set()
        if plural != NODES.plural:
            self.apply.enqueue_owner(header, self.by_uid, echo=echo)

    def _child_echo(self, plural: str, rv: int, line: bytes) -> dict[str, Any] | None:
        """The watch echoing a child this agent created or wrote (``federation.kube.EchoCheck``), handled without
        decoding it, as ``follow_children`` handles a ``Stored.HELD`` event: the agent's children carry its stamp
        (nothing foreign to check), and the owner gets the pass an echo is owed (none when it settles). Two to
        four events per job are such echoes, each a few KB of JSON."""
        header = self.caches[plural].echo(rv, line)
        if header is None:
            return None
        self.echoes_handled += 1
        self._child_changed(plural, header, echo=True)
        return header

    def _job_echo(self, name: str, rv: int, line: bytes) -> dict[str, Any] | None:
        """The watch echoing the apply loop's status write of a job of kind ``name`` (``federation.kube.EchoCheck``),
        handled without decoding it, as ``follow_jobs`` handles the decoded echo (``StatusEcho.SETTLED`` or
        ``PASS_OWED``): the version is the one the write's answer brought, which the cache holds and the Reporter
        was given already. An echo that came before the write's answer is decoded as before (``EARLY_SETTLED``)."""
        assert self.apply is not None
        cache = self.caches[self.job_resources[name].plural]
        key = cache.own_key(rv)
        jkey = job_key(name, key) if key is not None else None
        if jkey is None:
            return None
        if not self.apply.status_written_at(jkey, rv):
            return self._created_echo(cache, jkey, rv, line)
        header = cache.echo(rv, line)
        if header is None:
            return None
        if self.apply.status_echo(jkey, header) is StatusEcho.PASS_OWED:
            self.apply.enqueue(jkey)
        self.echoes_handled += 1
        self.job_echoes_handled += 1
        return header

    def _created_echo(self, cache: ObjectCache, key: JobKey, rv: int, line: bytes) -> dict[str, Any] | None:
        """The watch echoing the inbox's create of the copy ``key`` (``Inbox.created``), handled without decoding
        it as ``follow_jobs`` handles the decoded one: the version is the create's answer, which the cache holds;
        it has no status and is not fenced, so the inbox, the lease keeper and the Reporter learn nothing from
        it but that it was seen, and the job gets its first pass (one decoded job a job less)."""
        assert self.apply is not None and self.inbox is not None
        made = self.inbox.created.get(rv)
        # the Reporter first: should the echo still be decoded after all (not the version held), the decoded
        # copy's job_changed counts it as running just as new_copy_seen did
        if made is None or not self.reporter.new_copy_seen(made.placement):
            return None
        header = cache.echo(rv, line)
        if header is None:
            return None
        self.inbox.created_echo(rv)
        self.by_uid[str(header["metadata"]["uid"])] = key
        self.apply.enqueue(key)
        self.echoes_handled += 1
        self.copy_echoes_handled += 1
        return header

    def _listed_once(self, plural: str) -> None:
        """A list of nodes or pods is complete and every event of it is in the cache (called after each relist
        too: a relist changes the cache event by event on the loop, without giving way, and never empties it,
        so a heartbeat never sees one half done)."""
        if self.capacity_known.is_set():
            return
        self._listed.add(plural)
        if self._listed >= {NODES.plural, PODS.plural}:
            self.capacity_known.set()
            self.capacity_changed.set()

    def _check_foreign(self, child: dict[str, Any]) -> None:
        """A child another controller made for a copy the agent runs: refuse that job (worker_agent.foreign)."""
        assert self.apply is not None and self.inbox is not None
        if created_by(child) is not None:
            return  # stamped by an agent: what nearly every child event is (foreign_owner's last test, first)
        run_here = {name for name, r in self.apply.reconcilers.items() if r.children}
        key = foreign_owner(child, self.by_uid, run_here=run_here)
        if key is None or key in self.apply.refused:
            return
        job = self.caches[self.job_resources[key[0]].plural].get(key[1:])
        if job is None or created_by(job) != self.settings.origin:
            return  # a copy made before the agent stamped its objects is not judged
        self.apply.refused.add(key)
        self.apply.forget(key)
        self.inbox.refuse_foreign(self.kinds[key[0]], job, child)

    # --- MQTT ---------------------------------------------------------------------------------
    def _heartbeat(self, capacity: Capacity, online: bool = True) -> Heartbeat:
        running = self.reporter.running()
        return heartbeat(self.settings.cluster_name, capacity, version=__version__,
                                interval=self.settings.heartbeat_interval_seconds,
                                cluster_labels=self.settings.cluster_labels,
                                reconciled=[n for n in self.job_resources if n in self.reconcilers],
                                delegated={n: v for n, v in self.delegated.items() if n in self.job_resources},
                                running=running, online=online, policy=self.policy)

    async def link_loop(self) -> None:
        settings = self.settings
        root = settings.mqtt.topic_root
        presence = topics.presence(settings.cluster_name, root)
        offline = encode(self._heartbeat(Capacity(), online=False))
        health = self.link_health = LinkHealth(settings.mqtt, self.clock)
        assert self.inbox is not None
        while True:
            # the will is sealed on the stream the link's Reports will carry: the dispatcher accepts an
            # offline message only from the stream a cluster speaks on now (an old one replayed is refused)
            stream = self.outbox.new_stream()
            will = Will(presence, self.identity.seal(presence, offline, stream, 0), retain=True)
            # Commands sealed before this agent's first link are refused (Deletes excepted): nothing this
            # process saw can vouch for them, so a recording replayed after a restart does nothing. Those
            # sealed since are judged by the opener's memory of what it saw, which spans every link of this
            # process: a Command queued in the broker while a partition cut the link is new, not a replay.
            if self.first_link_ms is None:
                self.first_link_ms = time.time_ns() // 1_000_000
            try:
                async with MqttLink(settings.mqtt, client_id=settings.client_id(), will=will) as link:
                    self.link = link
                    health.connected_now()
                    await link.subscribe(topics.commands(settings.cluster_name, root))
                    self.outbox.attach(link, stream=stream)
                    self.connected.set()
                    self.capacity_changed.set()  # a heartbeat at once
                    items = await self.inbox.inventory_items(self.job_resources)
                    self.reporter.inventory(items)
                    log.info("connected to the broker; inventory of %d jobs sent", len(items))
                    try:
                        async for message in link.messages():
                            for body in self.identity.open_commands(message.topic, message.payload,
                                                                    self.first_link_ms):
                                self.inbox.receive(body)
                    except asyncio.CancelledError:
                        with contextlib.suppress(Exception):
                            await asyncio.wait_for(link.publish(presence, will.payload, retain=True), 2.0)
                        raise
            except Transport as exc:
                self.outbox.attach(None)
                self.connected.clear()
                health.failed(exc)
                log.warning("MQTT link lost (%s); retrying in %.1fs", exc, health.next_delay())
                await self.clock.sleep(health.next_delay())
            finally:
                self.outbox.attach(None)
                self.link = None

    async def heartbeat_loop(self) -> None:
        assert self.meter is not None
        presence = topics.presence(self.settings.cluster_name, self.settings.mqtt.topic_root)
        last: Capacity | None = None
        last_sent = -1e18
        interval = self.settings.heartbeat_interval_seconds
        while True:
            await self.connected.wait()
            if not self.capacity_known.is_set() and last is None:
                await self._wait_for_lists(interval)
            if self.capacity_known.is_set():
                snapshot = self.meter.snapshot()
                capacity = await asyncio.to_thread(self.meter.measure, snapshot) if len(snapshot[1]) > 2000 \
                    else self.meter.measure(snapshot)
            else:
                capacity = Capacity()  # no room claimed until the caches are true (see _wait_for_lists)
            now = self.clock.monotonic()
            if capacity != last or now - last_sent >= interval:
                hb = self._heartbeat(capacity)
                if self.lease is not None:
                    self.lease.heartbeat_sent(hb)  # a renewal of the lease runs from now
                self.outbox.put_heartbeat(presence, hb)
                last, last_sent = capacity, now
            self.capacity_changed.clear()
            await sleep_or(self.capacity_changed, max(0.0, interval - (self.clock.monotonic() - last_sent)))
            await asyncio.sleep(self.settings.capacity_debounce_seconds)

    async def _wait_for_lists(self, interval: float) -> None:
        """Before the first heartbeat: wait for the node and pod informers' first lists, at most ``interval``.

        Capacity measured from caches that have not listed is false: no nodes reads as a cluster without
        room, nodes without their pods as one with room it does not have, and the dispatcher believes
        either until the next heartbeat. But waiting with no bound would be worse when the API server is
        down or slow at start: without heartbeats the agent gets no lease (it fences its Jobs after
        ``lease_startup_grace_seconds``) and the dispatcher marks the cluster lost after
        ``heartbeat_timeout_seconds``. So after one interval the heartbeat goes anyway, with an empty
        Capacity, as do those after it until the lists are complete: the lease is renewed and the
        cluster stays online, but nothing is placed on room nobody has seen. The heartbeat with the
        measured capacity follows as soon as both lists are in (``_listed_once`` wakes this loop)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.capacity_known.wait(), interval)
        if not self.capacity_known.is_set():
            missing = sorted({NODES.plural, PODS.plural} - self._listed)
            log.warning("%s not listed after %.1fs: heartbeats claim no capacity until they are",
                        " and ".join(missing), interval)

    # --- run ------------------------------------------------------------------------------------
    def _lease_regained(self) -> None:
        """A renewal after the lease ran out: pods wanted meanwhile are created now, and a Resync is asked for."""
        if self.apply is not None:
            self.apply.lease_back()
        self._regained.set()

    async def _inventory_on_regain(self) -> None:
        """A lease renewed after it ran out: an Inventory makes the dispatcher answer with a Resync, which
        deletes what went elsewhere and resumes what it still expects here (worker_agent.lease)."""
        assert self.inbox is not None
        while True:
            await self._regained.wait()
            self._regained.clear()
            self.inbox.resynced.clear()
            self.reporter.inventory(await self.inbox.inventory_items(self.job_resources))
            # One at a time: renewals that come meanwhile wait for the Resync answering this Inventory (or
            # for REGAIN_WAIT, should it be lost). A flapping lease sent them in bursts, each answered by a
            # Resync that re-reports every Job, and the dispatcher fell further behind with its renewals.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.inbox.resynced.wait(), REGAIN_WAIT)

    async def run(self, stop: asyncio.Event) -> None:
        with registry.declared(self.declared):
            await self._run(stop)

    async def _run(self, stop: asyncio.Event) -> None:
        epoch = await take_epoch(self.kube, self.settings.namespace, self.settings.cluster_name, self.clock)
        self.reporter.seq = Sequencer(epoch)
        log.info("report epoch %d: this run numbers its Reports from %d", epoch, epoch << SHIFT | 1)
        await self.discover()
        assert self.apply is not None
        if self.settings.metrics_port is not None:  # /metrics, /healthz, /readyz (worker_agent/metrics.py)
            self.metrics_server = MetricsServer(self, self.settings.metrics_host, self.settings.metrics_port)
            self.kube.on_call = self.metrics_server.metrics.api_call
            self.apply.pass_observer = self.metrics_server.metrics.reconciled
        async with Supervisor(side=self.side) as sup:
            if self.metrics_server is not None:
                sup.start("metrics", self.metrics_server.run, side=True)
            self._start_watchers(sup)
            sup.start("discovery", lambda: self.rediscover_loop(sup), restart=True)
            self.apply.timers = sup.task_set("apply")  # per-item tasks: counted on their owner task
            sup.start("apply", self.apply.run, restart=True)
            if self.inbox is not None:
                self.inbox.tasks = sup.task_set("mqtt")
                self.inbox.asks = self.answers.ask
                self.answers.namespace_of = self.inbox.policy.target_namespace
            self.answers.tasks = sup.task_set("streams")
            sup.start("streams", self.answers.run_link, restart=True)
            for i in range(min(SENDERS, self.settings.mqtt.max_inflight)):
                sup.start(f"outbox-{i}", self.outbox.run_sender, restart=True)
            sup.start("mqtt", self.link_loop, restart=True)
            sup.start("heartbeat", self.heartbeat_loop, restart=True)
            assert self.lease is not None
            sup.start("lease", self.lease.run, restart=True)
            sup.start("lease-record", self.lease.record_loop, restart=True)
            sup.start("lease-resume", self.lease.resume_loop, restart=True)
            sup.start("inventory-on-regain", self._inventory_on_regain, restart=True)
            flushed = asyncio.Event()
            sup.start("flush-on-stop", lambda: self._flush_after(stop, flushed))
            await sup.run_until_stopped(flushed)
        if self.inbox is not None:
            await self.inbox.drain()

    async def _flush_after(self, stop: asyncio.Event, flushed: asyncio.Event) -> None:
        """On stop, give queued reports a moment to reach the broker before the tasks are cancelled."""
        await stop.wait()
        if self.apply is not None:  # a Created status held for the job's next one is written now (bounded)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.apply.write_held(), FLUSH_SECONDS)
        self.outbox.release_held()  # Accepteds held for a Status that will not come now
        for _ in range(int(FLUSH_SECONDS / 0.05)):
            if not self.outbox.pending() or not self.connected.is_set():
                break
            await asyncio.sleep(0.05)
        flushed.set()

    @staticmethod
    def _bind(fn: Callable[[str], Coroutine[Any, Any, None]], arg: str) -> Callable[[], Coroutine[Any, Any, None]]:
        return lambda: fn(arg)


async def run(settings: AgentSettings, *, stop: asyncio.Event, clock: Clock | None = None) -> None:
    """Run the agent for ``settings.cluster_name`` until ``stop`` is set."""
    async with Kube.from_settings(settings.kube_settings(), clock=clock, user_agent="mkd-agent") as kube:
        await Agent(settings, kube, clock=clock).run(stop)
