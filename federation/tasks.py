"""Named long-lived tasks with an owner and a staged shutdown; the only place that creates them.

``Supervisor`` starts each task under a name; a task that fails is logged the moment it fails and either
restarted with capped backoff (``restart=True``, the one :class:`~federation.retry.Backoff`, reset once a run
lasted longer than the cap) or treated as fatal: ``run_until_stopped`` returns early and re-raises it. A
:class:`~federation.errors.Permanent` error (a bad setting, refused credentials) is always fatal, logged in
one line: retrying it forever with a traceback per attempt helps nobody. Shutdown is staged: every task is
cancelled, stragglers (tasks that swallow the cancellation or clean up slowly) get ``grace`` seconds, are then
cancelled again and named in the log, and the first task error is re-raised, not swallowed.
``install_signal_handlers`` turns SIGTERM / SIGINT into setting the stop event.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Collection, Coroutine
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar

from federation.clock import Clock, SystemClock
from federation.errors import Forbidden, Invalid, Permanent, Temporary
from federation.retry import Backoff

log = logging.getLogger(__name__)

Factory = Callable[[], Awaitable[None]]
T = TypeVar("T")


@dataclass
class TaskInfo:
    """What the supervisor knows about one named task (for health endpoints and tests)."""

    name: str
    restart: bool
    task: asyncio.Task[None]
    restarts: int = 0
    last_error: BaseException | None = field(default=None, repr=False)
    child_failures: int = 0
    """Failed short-lived tasks of this task's :class:`TaskSet` (``Supervisor.task_set``)."""


OnError = Callable[[str, BaseException], None]


@dataclass
class Fault:
    """What is wrong with one piece of side work now."""

    work: str
    cause: str
    """Short and stable: the same cause failing again is counted, not logged again."""
    message: str
    fix: str
    since: float
    failures: int = 1

    def describe(self) -> str:
        return f"{self.work}: {self.message}" + (f"; fix: {self.fix}" if self.fix else "")


def cause_of(exc: BaseException) -> tuple[str, str]:
    """(cause, fix) of a side-work failure: a 403 names the rule it needs, an invalid value its field."""
    if isinstance(exc, Forbidden):
        return f"forbidden: {exc.verb} {exc.resource} in API group {exc.group or 'core'}", exc.fix
    if isinstance(exc, Invalid):
        return f"invalid: {exc.field}", exc.fix
    if isinstance(exc, Permanent):
        return exc.reason, ""
    if isinstance(exc, Temporary):
        return type(exc).__name__, "transient: retried with backoff"
    return type(exc).__name__, "see the log for the traceback"


class SideWork:
    """The faults of a service's side work; the probes and metrics read it.

    Side work (queue status, Events, handover records, metrics: what the service does besides its core loops)
    degrades and never stops the process: a task started with ``side=True`` is restarted with backoff after
    any error, a :class:`~federation.errors.Permanent` one (a 403) included, and the one :class:`SideWork` of
    the service logs each fault once per cause, counts it, and holds what is wrong and how to fix it (for a
    403 the missing RBAC rule) for ``/readyz`` and the metrics until the work reports itself healthy again, or
    its restarted task has run for ``restart_max`` without failing.
    """

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or SystemClock()
        self.faults: dict[tuple[str, str], Fault] = {}
        """(work, cause) -> what is wrong now; a work may fail for several causes at once (two 403s)."""
        self.failures: collections.Counter[tuple[str, str]] = collections.Counter()
        """(work, cause) -> failures since the start (``mkd_side_work_failures_total``)."""

    def failed(self, work: str, exc: BaseException) -> Fault:
        """Count a failure of ``work``; logged when its cause is new while the work is failing."""
        cause, fix = cause_of(exc)
        self.failures[(work, cause)] += 1
        fault = self.faults.get((work, cause))
        if fault is not None:
            fault.failures += 1
            fault.message = str(exc)
            return fault
        fault = self.faults[(work, cause)] = Fault(work, cause, str(exc), fix, self.clock.monotonic())
        log.error("%s is degraded (the service keeps running and retries with backoff): %s%s", work, exc,
                  f"; fix: {fix}" if fix else "", exc_info=exc if fix.startswith("see the log") else None)
        return fault

    def ok(self, work: str, causes: Collection[str] | None = None) -> None:
        """``work`` succeeded throughout: its faults (those of ``causes`` only, when given) are over."""
        for key in [k for k in self.faults if k[0] == work and (causes is None or k[1] in causes)]:
            fault = self.faults.pop(key)
            log.warning("%s recovered after %d failure(s) (%s)", work, fault.failures, fault.cause)

    def of(self, work: str) -> list[Fault]:
        """The faults of ``work`` now, oldest first."""
        return sorted((f for (w, _), f in self.faults.items() if w == work), key=lambda f: f.since)

    def problems(self) -> list[str]:
        """One line per fault: what is wrong and the fix."""
        return [fault.describe() for _, fault in sorted(self.faults.items())]

    def collect(self) -> list[Any]:
        """Prometheus families (a collector's ``collect``): ``mkd_side_work_failures_total{work,cause}`` and
        ``mkd_side_work_degraded{work,cause}`` (1 while failing), the same in every service."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        failures = CounterMetricFamily("mkd_side_work_failures", "Failures of side work (queue status, Events, "
                                       "handover records, metrics) by work and cause; the service keeps running",
                                       labels=["work", "cause"])
        for (work, cause), n in sorted(self.failures.items()):
            failures.add_metric([work, cause], float(n))
        degraded = GaugeMetricFamily("mkd_side_work_degraded", "1 while a side work fails for this cause (/readyz "
                                     "says what is wrong and the fix)", labels=["work", "cause"])
        for work, cause in sorted(self.faults):
            degraded.add_metric([work, cause], 1.0)
        return [failures, degraded]


class TaskSet:
    """Short-lived tasks of one owner, tracked, and never failing silently.

    Every long-lived coroutine runs as a Supervisor task. A pool of workers inside one task (the kube
    writer's, the agent's apply loop) is an ``asyncio.TaskGroup``, so one failing worker stops the pool
    and the Supervisor restarts it whole, never leaving orphans. Short-lived per-item tasks (one Command
    being applied, one QoS 1 publish in flight, one requeue timer, the HTTP server inside its task) are
    made by a :class:`TaskSet` of the object that owns them, never by a bare ``create_task``: a TaskSet
    tracks its tasks and cancels them with ``cancel_all``, and a task that fails is logged the moment
    it fails (with its traceback), counted (``failures``, and in its Supervisor's ``child_failures`` when
    it was made by ``Supervisor.task_set``) and handed to the owner's ``on_error``, which decides what it
    means (the outbox reconnects, the agent reports the Command as not applied). Without ``on_error``
    the failure is kept in ``errors`` and raised by ``check()`` in the owner's loop.
    """

    def __init__(self, owner: str, *, on_error: OnError | None = None,
                 counted: Callable[[], None] | None = None) -> None:
        self.owner = owner
        self.on_error = on_error
        self.tasks: set[asyncio.Task[object]] = set()
        self.failures = 0
        """Tasks that ended with an error (cancelled ones are not failures)."""
        self.errors: list[tuple[str, BaseException]] = []
        """Failures not handed to an ``on_error``, for ``check()`` (the newest 100)."""
        self._counted = counted

    def __len__(self) -> int:
        return len(self.tasks)

    def spawn(self, coro: Coroutine[object, object, T], *, name: str = "") -> asyncio.Task[T]:
        """Run ``coro`` as a task of this set; ``name`` says which item it serves (in the log)."""
        task: asyncio.Task[T] = asyncio.get_running_loop().create_task(coro, name=f"{self.owner}/{name or 'item'}")
        self.tasks.add(task)  # type: ignore[arg-type]
        task.add_done_callback(self._done)  # type: ignore[arg-type]
        return task

    def _done(self, task: asyncio.Task[object]) -> None:
        self.tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()  # retrieved here: asyncio never reports it as "never retrieved"
        if exc is None:
            return
        self.failures += 1
        if self._counted is not None:
            self._counted()
        name = task.get_name()
        log.error("task %s failed (%s: %s)", name, type(exc).__name__, exc, exc_info=exc)
        if self.on_error is not None:
            try:
                self.on_error(name, exc)
            except Exception:
                log.exception("the owner of task %s could not handle its failure", name)
            return
        self.errors.append((name, exc))
        del self.errors[:-100]

    def check(self) -> None:
        """Raise the oldest failure not handed to an ``on_error`` (the owner's loop calls it)."""
        if self.errors:
            _, exc = self.errors.pop(0)
            raise exc

    async def cancel_all(self, grace: float = 5.0) -> None:
        """Cancel every task still running and wait up to ``grace`` seconds for them to end."""
        running = list(self.tasks)
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running, timeout=grace)

    async def wait(self) -> None:
        """Wait until no task of this set runs (tasks started meanwhile included)."""
        while self.tasks:
            await asyncio.wait(list(self.tasks))


class Supervisor:
    """Async context manager owning named tasks; leaving it stops them all (see module docstring)."""

    def __init__(self, *, grace: float = 5.0, clock: Clock | None = None,
                 restart_initial: float = 0.5, restart_max: float = 30.0, side: SideWork | None = None) -> None:
        self.grace = grace
        self.clock = clock or SystemClock()
        self.side = side or SideWork(self.clock)
        """Where ``side=True`` tasks' failures go (:class:`SideWork`)."""
        self.restart_initial = restart_initial
        self.restart_max = restart_max
        self.tasks: dict[str, TaskInfo] = {}
        self._fatal: asyncio.Event | None = None
        self._errors: list[tuple[str, BaseException]] = []
        self._stopping = False
        self._stopped = False
        self.orphan_failures = 0
        """Failed tasks of a task set whose owner is not (or no longer) one of these tasks."""

    async def __aenter__(self) -> Supervisor:
        self._fatal = asyncio.Event()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        # When the body already failed, its error wins; task errors are logged by shutdown.
        await self.shutdown(reraise=exc is None)

    def task_set(self, owner: str, *, on_error: OnError | None = None) -> TaskSet:
        """A :class:`TaskSet` for the short-lived tasks of the task ``owner``; its failures are counted
        in that task's ``child_failures`` as well."""
        def counted() -> None:
            info = self.tasks.get(owner)
            if info is not None:
                info.child_failures += 1
            else:
                self.orphan_failures += 1
        return TaskSet(owner, on_error=on_error, counted=counted)

    def start(self, name: str, factory: Factory, *, restart: bool = False, side: bool = False) -> None:
        """Run ``factory()`` as the task ``name``; ``restart`` re-runs it after a failure, with backoff;
        ``side``: side work, re-run after any failure (``Permanent`` too) and reported to ``self.side``."""
        if self._fatal is None:
            raise RuntimeError("Supervisor.start before `async with Supervisor()`")
        if self._stopping:
            raise RuntimeError(f"Supervisor is shutting down; cannot start {name}")
        if name in self.tasks and not self.tasks[name].task.done():
            raise RuntimeError(f"a task named {name!r} is already running")
        task = asyncio.get_running_loop().create_task(self._run(name, factory, restart or side, side), name=name)
        self.tasks[name] = TaskInfo(name, restart or side, task)

    async def _run(self, name: str, factory: Factory, restart: bool, side: bool = False) -> None:
        backoff = Backoff(self.restart_initial, self.restart_max)
        crashed: set[str] = set()  # causes of the side work's failures not yet outlived by a clean run
        while True:
            started = self.clock.monotonic()
            try:
                await self._attempt(name, factory, crashed)
                log.debug("task %s finished", name)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                info = self.tasks.get(name)
                if info is not None:
                    info.last_error = exc
                if side:  # degrade, say why once, retry: side work never stops the service
                    if self.clock.monotonic() - started > self.restart_max:
                        backoff.succeeded()
                    crashed.add(self.side.failed(name, exc).cause)
                    if info is not None:
                        info.restarts += 1
                    await self.clock.sleep(backoff.failed())
                    continue
                if isinstance(exc, Permanent):  # a bad setting, refused credentials: retrying cannot help
                    log.error("task %s: %s", name, exc)  # one line; the service stops and says it
                    self._errors.append((name, exc))
                    assert self._fatal is not None
                    self._fatal.set()
                    return
                if not restart:
                    log.error("task %s failed", name, exc_info=exc)
                    self._errors.append((name, exc))
                    assert self._fatal is not None
                    self._fatal.set()
                    return
                if self.clock.monotonic() - started > self.restart_max:
                    backoff.succeeded()  # a task that ran for a while before failing starts afresh
                delay = backoff.failed()
                log.warning("task %s failed (%s: %s); restarting in %.1fs", name, type(exc).__name__, exc, delay,
                            exc_info=exc)
                if info is not None:
                    info.restarts += 1
                await self.clock.sleep(delay)

    async def _attempt(self, name: str, factory: Factory, crashed: set[str]) -> None:
        """One run of ``factory``. Side work restarted after ``crashed`` is healthy again once a run has lasted
        ``restart_max`` (the window after which backoff starts afresh): those faults are over then, even if the
        work never says so itself (faults it reports under its own name are its own to clear)."""
        def outlived() -> None:
            self.side.ok(name, set(crashed))
            crashed.clear()
        timer = self.clock.call_later(self.restart_max, outlived) if crashed else None
        try:
            await factory()
        finally:
            if timer is not None:
                timer.cancel()

    @property
    def failed(self) -> bool:
        """True once a task without ``restart`` has failed."""
        return bool(self._errors)

    async def run_until_stopped(self, stop: asyncio.Event,
                                before_shutdown: Callable[[], Awaitable[object]] | None = None) -> None:
        """Wait for ``stop`` or a fatal task failure, then shut down; re-raises the task's failure.
        ``before_shutdown`` runs first when ``stop`` was set and every task still runs (a stop, not a failure):
        work the tasks hold in memory is finished there (it bounds its own time)."""
        if self._fatal is None:
            raise RuntimeError("Supervisor.run_until_stopped before `async with Supervisor()`")
        waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._fatal.wait())]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
        if before_shutdown is not None and not self._fatal.is_set():
            await before_shutdown()
        await self.shutdown()

    async def shutdown(self, *, reraise: bool = True) -> None:
        """Cancel every task, give stragglers ``grace`` seconds, then re-raise the first task error."""
        if self._stopped:
            return
        self._stopping = True
        running = [i.task for i in self.tasks.values() if not i.task.done()]
        for task in running:
            task.cancel()
        if running:
            _, pending = await asyncio.wait(running, timeout=self.grace)
            if pending:
                log.error("tasks still running %.1fs after cancel, abandoning: %s", self.grace,
                          ", ".join(sorted(t.get_name() for t in pending)))
                for task in pending:
                    task.cancel()
        for info in self.tasks.values():
            task = info.task
            if task.done() and not task.cancelled() and task.exception() is not None:
                # _run returns instead of raising, so only a failure inside the supervisor lands here.
                self._errors.append((info.name, task.exception()))  # type: ignore[arg-type]
        self._stopped = True
        if self._errors and reraise:
            _, error = self._errors[0]
            for other, exc in self._errors[1:]:
                log.error("task %s also failed: %r", other, exc)
            raise error


async def park(waiters: collections.deque[asyncio.Future[None]], pass_on: Callable[[], None]) -> None:
    """Wait in ``waiters`` until ``wake_first`` wakes this one. Cancelled while waiting, it leaves the queue;
    cancelled after it was woken but before it ran, ``pass_on`` hands the wake-up on (no one else got it)."""
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    waiters.append(waiter)
    try:
        await waiter
    except asyncio.CancelledError:
        if waiter.done() and not waiter.cancelled():
            pass_on()
        else:
            with contextlib.suppress(ValueError):
                waiters.remove(waiter)
        raise


def wake_first(waiters: collections.deque[asyncio.Future[None]]) -> bool:
    """Set the first of ``waiters`` not done yet (taking it and the done ones before it off the queue); False
    when none was waiting. For a queue of parked coroutines woken one at a time, in the order they came."""
    while waiters:
        waiter = waiters.popleft()
        if not waiter.done():
            waiter.set_result(None)
            return True
    return False


def install_signal_handlers(stop: asyncio.Event, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT),
                            ) -> Callable[[], None]:
    """SIGTERM / SIGINT set ``stop`` (graceful shutdown); returns a function removing the handlers."""
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        stop.set()

    for signum in signals:
        loop.add_signal_handler(signum, on_signal, signum)

    def remove() -> None:
        for signum in signals:
            loop.remove_signal_handler(signum)

    return remove
