"""The one apply loop: per job key serial, parallel across jobs; render a Plan and carry it out.

Keys are ``(kind, namespace, name)``. ``enqueue`` marks a key dirty; a bounded pool of workers takes keys off
one queue, and a key being reconciled is never handed to a second worker (a change arriving meanwhile
re-queues it once the pass ends), so no locks guard one job's state. A pass reads the job and its children
from the caches (informers plus the agent's own writes), calls the kind's ``render``, then deletes, creates
(one by one; children get a controller owner reference to the job so the cluster's GC removes them), updates,
writes ``.status`` through the status subresource only when it changed, records Events and schedules a requeue
after ``requeue_after`` seconds on the injected clock. A create that finds its name taken aborts the pass
before the status write, as upstream does; Temporary errors retry with a capped backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from federation import labels
from federation.clock import Clock
from federation.errors import AlreadyExists, Conflict, FederationError, NotFound, Permanent, Temporary
from federation.kinds.base import PASSING_CONDITIONS, latest_condition
from federation.kube import Kube, Resource
from federation.retry import capped
from federation.tasks import TaskSet
from worker_agent.cache import Key, ObjectCache, Stored, rv_of
from worker_agent.reconcilers.base import Observed, Plan, Reconciler

log = logging.getLogger(__name__)

JobKey = tuple[str, str, str]
"""(kind name, namespace, name)."""

COMPONENT = "mkd-agent"
BACKOFF_INITIAL = 0.2
BACKOFF_MAX = 30.0
LEASE_POLL = 5.0
"""Seconds between passes of a Job that waits for the lease to create its objects (``ApplyLoop.lease_back``
wakes it sooner)."""
EVENT_REPEAT_SECONDS = 60.0
REPASS_DELAY = 0.05
"""Seconds a job that changed during its own pass waits before the next one (real time): the watch echoes of
the pass's own writes (one per child created, the status) arrive over some milliseconds, and one pass then
sees them all instead of one pass each."""


class StatusEcho(enum.Enum):
    """What a job's watch event is to the apply loop (``ApplyLoop.status_echo``)."""

    NOT_OURS = 0
    """Not the echo of the loop's last status write: a change like any other."""
    PASS_OWED = 1
    """The echo of its own write, after which the job still needs a pass."""
    SETTLED = 2
    """The echo of its own write, with nothing else changed, after which the job settles: no pass owed."""
    EARLY_SETTLED = 3
    """The echo of a status write not answered yet (the watch was quicker), after which the job settles: handled
    as any change (reported, stored) but starts no pass."""


@dataclass
class _StatusWrite:
    """A status write in flight: the job as the pass read it, the status sent, whether the job settles with it."""

    job: Mapping[str, Any]
    status: Mapping[str, Any]
    settled: bool
    echoed: bool = False
    """Its watch echo came before its answer (``ApplyLoop.status_echo``)."""


@dataclass
class _HeldStatus:
    """A passing status not written yet (:class:`ApplyLoop`): the job's status when the hold began (passes render
    on the held one only while the stored status is still that), the status, and when the hold is over."""

    base: Any
    status: dict[str, Any]
    due: float
    """On ``clock.monotonic()``."""
    timer: tuple[float, asyncio.Task[None]] | None = None
    """The requeue timer armed for ``due`` (``ApplyLoop._timers``), cancelled when the status goes sooner."""


def settles(reconciler: Reconciler | None, status: Mapping[str, Any] | None = None) -> bool:
    """Whether a render right after the reconciler's own creates and a status write of ``status`` (None: no
    status write) plans nothing more (its ``settles_after``; no reconciler: never)."""
    return reconciler is not None and reconciler.settles_after(status)


def _same_but_status(read: Mapping[str, Any], written: Mapping[str, Any]) -> bool:
    """Whether the answer to a status write is the job the pass read with only its status (and version) new.

    The spec is read through ``metadata.generation`` when both carry one: the API server moves it on every change
    of a custom resource's (and a batch Job's) spec and never on a status write, so one generation is one spec,
    and comparing the pod templates themselves was 3 % of an agent's samples at full speed."""
    mine, theirs = read.get("metadata") or {}, written.get("metadata") or {}
    if (mine.get("generation") is None or theirs.get("generation") is None) and read.get("spec") != written.get("spec"):
        return False
    for k, v in mine.items():  # compared in place: no filtered copies of either (two per status write)
        if k not in _VERSION_META and (k not in theirs or theirs[k] != v):
            return False
    return all(k in mine or k in _VERSION_META for k in theirs)


_VERSION_META = frozenset({"resourceVersion", "managedFields"})
"""Metadata a status write changes (``_same_but_status``)."""


def owner_reference(job: Mapping[str, Any]) -> dict[str, Any]:
    meta = job.get("metadata") or {}
    return {"apiVersion": job.get("apiVersion"), "kind": job.get("kind"), "name": meta.get("name"),
            "uid": meta.get("uid"), "controller": True, "blockOwnerDeletion": True}


class ApplyLoop:
    """Reconciles the jobs of the kinds in ``reconcilers``; caches are shared with the watchers.

    New jobs come in only as fast as the loop gets through its work (``admission``): the inbox creates a placed job
    once fewer than ``backlog_max`` passes wait, so a burst of Places waits unanswered, in the dispatcher's outbox and
    SQL, instead of as thousands of created jobs whose children and status come tens of seconds later (10,000-job
    bursts: 7,000 jobs accepted and not yet started across three agents, Running 7-30 s after the Accepted).

    The watch echoes of a pass's own writes (a child it created, the status it wrote) carry nothing the pass
    did not already put in the caches. When the reconciler says a render right after them plans nothing more
    (``settles_after``; the Kubeflow v1 family, for a job not finished) they start no pass (``own_echo``,
    ``status_echo``); otherwise they do, since that next render may still plan something.

    A status whose latest condition is one a job leaves within moments (Kubeflow's ``Created``, until its pods run:
    ``federation.kinds.base.PASSING_CONDITIONS``) is not written at once: it stays in the loop's hands up to
    ``status_hold`` seconds (the agent's ``status_hold_seconds``, 1 s), the job's next passes render on it (its
    condition times and ``startTime`` stay the first pass's, as upstream's create predicate sets Created in the
    cached object that its first status write persists), and the first status that is not passing, or the held one
    once the hold is over, is written. A job whose pods run within the hold gets one status write, Created and
    Running together, instead of two (and one watch echo, one Status Report). A Running status while
    replicas are still to start (the reconciler's optional ``starting``: a Master running, its Worker not yet) is
    held the same way, so pods that start moments apart make one write, not one each. 0 writes at once, as
    upstream does.
    """

    def __init__(self, kube: Kube, reconcilers: Mapping[str, Reconciler], resources: Mapping[str, Resource],
                 caches: Mapping[str, ObjectCache], clock: Clock, *, concurrency: int = 16,
                 component: str = COMPONENT, on_status: Callable[[str, dict[str, Any]], None] | None = None,
                 origin: str = "", backlog_max: int = 64, status_hold: float = 0.0) -> None:
        self.kube = kube
        self.status_hold = status_hold
        """Seconds a passing status waits for the job's next one before it is written (:class:`ApplyLoop`)."""
        self._held_status: dict[JobKey, _HeldStatus] = {}
        self.backlog_max = backlog_max
        """Passes waiting (plus jobs being created) at which a new job waits to come in (``admission``)."""
        self._entering = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self.origin = origin
        """Stamped as ``mkd.dev/created-by`` on every child created or updated (see ``worker_agent.foreign``)."""
        self.refused: set[JobKey] = set()
        """Jobs another controller reconciles too: never reconciled here again."""
        self.reconcilers = dict(reconcilers)
        self.resources = dict(resources)
        """JobKind name -> its Resource."""
        self.caches = caches
        """Resource.plural -> cache (jobs of every kind and every child resource)."""
        self.clock = clock
        self.concurrency = concurrency
        self.component = component
        self.on_status = on_status
        self._queue: asyncio.Queue[JobKey] = asyncio.Queue()
        self._queued: set[JobKey] = set()
        self._running: set[JobKey] = set()
        self._dirty: set[JobKey] = set()
        self._holding: set[JobKey] = set()
        """Jobs changed during their pass, waiting ``REPASS_DELAY`` for the next one (``enqueue`` leaves them)."""
        self._timers: dict[JobKey, tuple[float, asyncio.Task[None]]] = {}
        self.timers = TaskSet("apply")
        """The requeue timers, one task each (``enqueue_after``): tracked, a failure logged and counted."""
        self._failures: dict[JobKey, int] = {}
        self._events: dict[JobKey, dict[tuple[str, str], float]] = {}
        self.passes = 0
        self._status_written: dict[JobKey, tuple[int, bool]] = {}
        """Per job whose last status write's watch echo has not come yet: that write's resourceVersion, and
        whether the job settled with it (``status_echo``)."""
        self._writing: dict[JobKey, _StatusWrite] = {}
        """The status writes awaiting their answer, per job (their watch echo may come first: ``status_echo``)."""
        self._creating: set[tuple[str, str, str]] = set()
        """(plural, namespace, name) of the children passes are creating now: their watch echo may come before
        the answer does (``own_echo``)."""
        self._awaiting_lease: set[JobKey] = set()
        """Jobs whose pass found objects to create but no lease (``may_start``): woken by ``lease_back``."""
        self.may_start: Callable[[], bool] | None = None
        """Fencing: False while the agent holds no lease (``LeaseKeeper.holds``). Nothing is created then:
        an agent thawed after a freeze may still see, in its caches, a Job running that the fencer
        suspended, and must not start its pods again before it knows."""

    # --- queueing ---------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def admission(self) -> AsyncIterator[None]:
        """Around creating a new job: wait until fewer than ``backlog_max`` passes wait. Jobs being created count
        too, and waiters come in first come, first served, as many as the room allows once the backlog is down to
        half (``_make_room``; waking every waiter at each free place cost the agents more than their passes did)."""
        if self._waiters or not self._has_room():
            admitted = asyncio.get_running_loop().create_future()
            self._waiters.append(admitted)
            try:
                await admitted
            except asyncio.CancelledError:
                if admitted.done() and not admitted.cancelled():
                    self._entering -= 1  # let in, but gone before it came: its place goes to the next
                    self._make_room()
                else:
                    self._waiters.remove(admitted)
                raise
        else:
            self._entering += 1
        try:
            yield
        finally:
            self._entering -= 1
            self._make_room()

    def _has_room(self) -> bool:
        return self._queue.qsize() + self._entering < self.backlog_max

    def _make_room(self) -> None:
        """Once the backlog is down to half of ``backlog_max``, let waiting new jobs in while there is room (each
        counted as entering from here): they come in groups, and their Accepted Reports share messages (one at a
        time, each Report took a broker message of its own and a signature)."""
        if not self._waiters or self._queue.qsize() + self._entering > self.backlog_max // 2:
            return
        while self._waiters and self._has_room():
            admitted = self._waiters.popleft()
            if not admitted.done():
                self._entering += 1
                admitted.set_result(None)

    def lease_back(self) -> None:
        """The lease was renewed: every Job that waited for it to create something gets a pass now."""
        waiting, self._awaiting_lease = self._awaiting_lease, set()
        for key in waiting:
            self.enqueue(key)

    def enqueue(self, key: JobKey) -> None:
        if key[0] not in self.reconcilers or key in self.refused:
            return
        if key in self._running:
            self._dirty.add(key)
        elif key in self._holding:
            return  # its next pass is due in a moment (``_release``)
        elif key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    def enqueue_after(self, key: JobKey, delay: float) -> None:
        """Re-queue ``key`` after ``delay`` seconds (the sooner of two requests wins)."""
        due = self.clock.monotonic() + delay
        current = self._timers.get(key)
        if current is not None:
            if current[0] <= due and not current[1].done():
                return
            current[1].cancel()
        self._timers[key] = (due, self.timers.spawn(self._later(key, delay), name=f"requeue/{'/'.join(key)}"))

    async def _later(self, key: JobKey, delay: float) -> None:
        await self.clock.sleep(delay)
        self._timers.pop(key, None)
        self.enqueue(key)

    def enqueue_owner(self, child: Mapping[str, Any], by_uid: Mapping[str, JobKey], *, echo: bool = False) -> None:
        """A child changed: requeue its controlling job (or, for label-only children, every job so named).
        ``echo``: the event only echoes the loop's own write of the child (``own_echo``): a job whose
        reconciler settles after its creates is left alone (a status written with them has its own echo)."""
        meta = child.get("metadata") or {}
        for ref in meta.get("ownerReferences") or []:
            if ref.get("controller"):
                key = by_uid.get(str(ref.get("uid")))
                if key is not None:
                    if not (echo and settles(self.reconcilers.get(key[0]))):
                        self.enqueue(key)
                    return
        job_name = (meta.get("labels") or {}).get("training.kubeflow.org/job-name")
        if job_name:
            ns = str(meta.get("namespace") or "")
            for kind, res in self.resources.items():
                if kind in self.reconcilers and self.caches[res.plural].header((ns, job_name)) is not None:
                    if not (echo and settles(self.reconcilers[kind])):
                        self.enqueue((kind, ns, job_name))

    def own_echo(self, plural: str, key: Key, stored: Stored, *, added: bool) -> bool:
        """Whether a child's watch event (``stored`` as the cache took it) only echoes this loop's own write:
        the very version the cache held already, or the ADDED event of a child a pass is creating right now
        (its answer brings the same version). Not a later event of that child: a pod may be scheduled and
        running before the pass's other creates are answered, and that is news."""
        return stored is Stored.HELD or (added and (plural, key[0], key[1]) in self._creating)

    async def run(self) -> None:
        """Run the worker pool until cancelled."""
        try:
            async with asyncio.TaskGroup() as group:  # one worker failing stops the others (restarted together)
                for _ in range(self.concurrency):
                    group.create_task(self._worker())
        finally:
            for _, task in self._timers.values():
                task.cancel()

    async def _worker(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            self._make_room()
            self._running.add(key)
            try:
                await self._pass(key)
            finally:
                self._running.discard(key)
                if key in self._dirty:
                    self._dirty.discard(key)
                    self._holding.add(key)
                    asyncio.get_running_loop().call_later(REPASS_DELAY, self._release, key)

    def _release(self, key: JobKey) -> None:
        self._holding.discard(key)
        self.enqueue(key)

    pass_observer: Callable[[str, float], None] | None = None
    """Called with the job kind and seconds of every reconcile pass (the agent's metrics)."""

    async def _pass(self, key: JobKey) -> None:
        if self.pass_observer is not None:
            started = time.monotonic()
            try:
                await self._pass_once(key)
            finally:
                self.pass_observer(key[0], time.monotonic() - started)
            return
        await self._pass_once(key)

    async def _pass_once(self, key: JobKey) -> None:
        try:
            retry = await self.reconcile(key)
        except Temporary as exc:
            self._retry(key, exc.delay, exc)
            return
        except Permanent as exc:
            log.warning("reconcile %s/%s/%s: %s", *key, exc)
            self._failures.pop(key, None)
            return
        except NotFound:
            return
        except Exception as exc:  # a bug in one job's pass must not stop the loop
            log.exception("reconcile %s/%s/%s failed", *key)
            self._retry(key, 0.0, exc)
            return
        if retry is not None:
            self._retry(key, retry, None)
        else:
            self._failures.pop(key, None)

    def _retry(self, key: JobKey, delay: float, exc: BaseException | None) -> None:
        n = self._failures.get(key, 0) + 1
        self._failures[key] = n
        wait = capped(n, BACKOFF_INITIAL, BACKOFF_MAX, delay)
        if exc is not None:
            log.info("reconcile %s/%s/%s: %s; retrying in %.2fs", *key, exc, wait)
        self.enqueue_after(key, wait)

    # --- one pass -------------------------------------------------------------------------------
    def observe(self, key: JobKey) -> Observed | None:
        kind, ns, name = key
        job = self.caches[self.resources[kind].plural].get((ns, name))
        if job is None:
            return None
        held = self._current_hold(key, job)
        if held is not None:
            job["status"] = held.status  # the pass renders on the status it holds (:class:`ApplyLoop`)
        reconciler = self.reconcilers[kind]
        children: dict[str, list[dict[str, Any]]] = {}
        if reconciler.children:
            selector = reconciler.child_selector(job)
            for res in reconciler.children:
                children[res.plural] = self.caches[res.plural].select(ns, selector)
        return Observed(job=job, children=children, now=self.clock.now())  # decoded copies, ours to keep

    def _current_hold(self, key: JobKey, job: Mapping[str, Any]) -> _HeldStatus | None:
        """The status held for ``key`` while ``job`` (as stored) still has the status the hold began on and is not
        going; a stale one (someone else wrote its status, or it is being deleted) is dropped."""
        held = self._held_status.get(key)
        if held is None:
            return None
        if job.get("status") == held.base and not (job.get("metadata") or {}).get("deletionTimestamp"):
            return held
        del self._held_status[key]
        return None

    async def reconcile(self, key: JobKey) -> float | None:
        """One pass; returns a retry delay when the pass was cut short."""
        observed = self.observe(key) if key not in self.refused else None
        if observed is None:
            return None
        self.passes += 1
        reconciler = self.reconcilers[key[0]]
        observed.extra = await reconciler.prepare(self.kube, observed.job)
        plan = reconciler.render(observed)
        return await self.carry_out(key, observed.job, plan)

    async def carry_out(self, key: JobKey, job: dict[str, Any], plan: Plan) -> float | None:
        kind, ns, name = key
        job_res = self.resources[kind]
        for res, child in plan.deletes:
            await self._delete(res, child, ns)
        aborted = False
        if plan.creates and self.may_start is not None and not self.may_start():
            log.info("reconcile %s/%s/%s: no lease, creating nothing (%d objects wanted)", kind, ns, name,
                     len(plan.creates))
            # not a failure to back off from (up to 30 s): ``lease_back`` wakes it once the lease is renewed,
            # and a slow poll covers a renewal that comes without fencing first
            self._awaiting_lease.add(key)
            self.enqueue_after(key, LEASE_POLL)
            return None
        if plan.creates:
            owner = owner_reference(job)
            creating = [(res.plural, ns, str((body.get("metadata") or {}).get("name") or ""))
                        for res, body in plan.creates]
            self._creating.update(creating)
            results: list[Exception] = []
            try:
                # one after the other, in this task: a task per create and gather's callbacks are CPU spent on
                # every job, for a few milliseconds less latency; upstream creates them one by one too
                for res, body in plan.creates:
                    try:
                        await self._create(res, body, ns, owner)
                    except Exception as exc:  # every create is tried; a failure then aborts the pass (below)
                        results.append(exc)
            finally:
                self._creating.difference_update(creating)
            for result in results:
                if isinstance(result, AlreadyExists):
                    log.info("reconcile %s/%s/%s: %s", kind, ns, name, result)
                    aborted = True
                elif isinstance(result, Permanent):
                    await self.kube.event(job, type="Warning", reason="FailedCreate", message=result.message,
                                          component=self.component)
                    aborted = True
                else:
                    raise result
        for res, body in plan.updates:
            self._stamp(body)
            updated = await self.kube.replace(res, body, ns)
            self.caches[res.plural].upsert(updated)
        retry: float | None = None
        if aborted:
            retry = 1.0
        elif plan.status is not None or key in self._held_status:
            retry = await self._status(key, job_res, job, plan.status)
        if plan.report is not None and self.on_status is not None:
            self.on_status(kind, {**job, "status": plan.report})
        for etype, reason, message in plan.events:
            if not self._fresh_event(key, reason, message):
                continue  # the same warning every pass (too many Services, say) is recorded once a minute
            await self.kube.event(job, type="Warning" if etype == "Warning" else "Normal", reason=reason,
                                  message=message, component=self.component)
        if plan.delete_job:
            await self._delete(job_res, name, ns)
            return retry
        if plan.requeue_after is not None:
            self.enqueue_after(key, plan.requeue_after)
        return retry

    def _fresh_event(self, key: JobKey, reason: str, message: str) -> bool:
        now = self.clock.monotonic()
        seen = self._events.setdefault(key, {})
        last = seen.get((reason, message))
        if last is not None and now - last < EVENT_REPEAT_SECONDS:
            return False
        seen[(reason, message)] = now
        if len(seen) > 50:
            for old in sorted(seen, key=seen.__getitem__)[:25]:
                del seen[old]
        return True

    def status_echo(self, key: JobKey, job: Mapping[str, Any]) -> StatusEcho:
        """Whether ``job`` (from the watch) is the very version this loop's last status write of ``key`` made,
        and if so whether a pass is still owed after it."""
        written = self._status_written.get(key)
        if written is None or written[0] != rv_of(job):
            write = self._writing.get(key)
            if (write is not None and write.settled and not write.echoed and job.get("status") == write.status
                    and _same_but_status(write.job, job)):
                write.echoed = True
                return StatusEcho.EARLY_SETTLED
            return StatusEcho.NOT_OURS
        del self._status_written[key]
        return StatusEcho.SETTLED if written[1] else StatusEcho.PASS_OWED

    def status_written_at(self, key: JobKey, rv: int) -> bool:
        """Whether ``rv`` is the version this loop's last status write of ``key`` made, its echo not seen yet (what
        ``status_echo`` answers SETTLED or PASS_OWED for, without the object)."""
        written = self._status_written.get(key)
        return written is not None and written[0] == rv

    def forget(self, key: JobKey) -> None:
        """The job is gone: drop its per-key bookkeeping."""
        self._status_written.pop(key, None)
        self._held_status.pop(key, None)
        self._writing.pop(key, None)
        self._events.pop(key, None)
        self._failures.pop(key, None)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer[1].cancel()

    async def _delete(self, res: Resource, name: str, ns: str) -> None:
        cache = self.caches.get(res.plural)
        current = cache.header((ns, name)) if cache is not None else None
        try:
            await self.kube.delete(res, name, ns, propagation="Background")
        except NotFound:
            pass
        if cache is not None and res.plural != "pods":
            cache.remove((ns, name), rv=rv_of(current))
        elif cache is not None:
            # a pod lingers while it terminates; mark it so the next pass does not count it active
            cache.mark_deleting((ns, name), self.clock.now().strftime("%Y-%m-%dT%H:%M:%SZ"))

    async def _create(self, res: Resource, body: dict[str, Any], ns: str, owner: dict[str, Any]) -> None:
        meta = body.setdefault("metadata", {})
        meta["namespace"] = ns
        refs = meta.setdefault("ownerReferences", [])
        if not any(r.get("uid") == owner["uid"] for r in refs):
            refs.append(owner)
        self._stamp(body)
        created = await self.kube.create(res, body, ns)
        cache = self.caches.get(res.plural)
        if cache is not None:
            cache.upsert(created)

    def _stamp(self, body: dict[str, Any]) -> None:
        if self.origin:
            meta = body.setdefault("metadata", {})
            meta["annotations"] = {**(meta.get("annotations") or {}), labels.CREATED_BY: self.origin}

    async def _status(self, key: JobKey, res: Resource, job: dict[str, Any],
                      status: dict[str, Any] | None) -> float | None:
        """Write ``status`` (None: nothing new; the held one, once its hold is over) or hold it (:class:`ApplyLoop`)."""
        held = self._held_status.get(key)
        if status is None:
            if held is None:
                return None
            status = held.status
        if self.status_hold > 0 and (latest_condition(status) in PASSING_CONDITIONS
                                     or self._starting(key, job, status)):
            now = self.clock.monotonic()
            if held is None:
                held = self._held_status[key] = _HeldStatus(job.get("status"), status, now + self.status_hold)
            else:
                held.status = status
            if now < held.due:
                self.enqueue_after(key, held.due - now)  # a timer that woke a moment early is armed again
                held.timer = self._timers.get(key)
                return None
        held = self._held_status.pop(key, None)
        if held is not None and held.timer is not None and self._timers.get(key) is held.timer:
            # written before the hold is over: its timer would only bring a pass that renders nothing new (this
            # pass asks again for any requeue its plan needs)
            del self._timers[key]
            held.timer[1].cancel()
        return await self._write_status(key, res, job, status)

    def _starting(self, key: JobKey, job: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
        """Whether ``status`` is Running with replicas still to start (the reconciler's ``starting``)."""
        reconciler = self.reconcilers.get(key[0])
        return reconciler is not None and reconciler.starting(job, status)

    async def write_held(self) -> None:
        """Write every held status now (a graceful stop: the next agent would render its own, with later times)."""
        for key in list(self._held_status):
            res = self.resources.get(key[0])
            job = self.caches[res.plural].get((key[1], key[2])) if res is not None else None
            held = self._current_hold(key, job) if job is not None else None
            self._held_status.pop(key, None)
            if res is not None and job is not None and held is not None:
                with contextlib.suppress(FederationError):
                    await self._write_status(key, res, job, held.status)

    async def _write_status(self, key: JobKey, res: Resource, job: dict[str, Any],
                            status: dict[str, Any]) -> float | None:
        body = {**job, "status": status}
        meta = job.get("metadata") or {}
        cache = self.caches[res.plural]
        write = self._writing[key] = _StatusWrite(job, status, settles(self.reconcilers.get(key[0]), status))
        try:
            updated = await self.kube.replace(res, body, meta.get("namespace"), subresource="status")
        except Conflict:
            fresh = await self.kube.get(res, str(meta.get("name")), meta.get("namespace"))
            cache.upsert(fresh)
            return 0.0
        finally:
            if self._writing.get(key) is write:
                del self._writing[key]
        rv = rv_of(updated)
        if self.on_status is not None and not cache.watched_at((key[1], key[2]), rv):
            # (when the watch brought this very version first, Agent.follow_jobs reported it then)
            self.on_status(str(job.get("kind")), updated)
            if not write.echoed:  # reported: its echo need not be (Agent.follow_jobs), nor start a pass if it settles
                self._status_written[key] = (rv, write.settled and _same_but_status(job, updated))
        cache.upsert(updated)
        return None


def job_key(kind: str, key: Key) -> JobKey:
    return kind, key[0], key[1]


__all__ = ["ApplyLoop", "FederationError", "JobKey", "StatusEcho", "job_key", "owner_reference", "settles"]
