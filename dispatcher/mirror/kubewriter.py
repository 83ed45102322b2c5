"""Writes to manager Jobs — mkd's conditions, the mirrored worker status, Events — serial per Job.

The engine decides, this module carries it out after the decision is committed. Work is kept per Job uid and
coalesced (ten Status Reports that arrive while a write is in flight become one write of the newest), one
coroutine works on a given Job at a time, and ``workers`` Jobs are written in parallel. The status is written
the MultiKueue way: the worker's ``.status`` replaces the manager Job's (a merge patch computed against the
last status written, which nulls every key the worker no longer has, nested ones included), keeping only mkd's
own ``MultiCluster*`` conditions, placed before the Job's own so that its latest condition stays last (the
printer columns read ``conditions[-1:]``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from dispatcher.intake.jobcache import JobCache, pack, unpack
from dispatcher.mirror import podstatus
from dispatcher.workload import (
    IF_TRUE,
    MKD_CONDITIONS,
    REMOVE,
    latest_condition,
    merge_patch,
    merge_status,
    passing,
)
from federation.clock import Clock
from federation.errors import FederationError, Invalid, NotFound, Temporary
from federation.kinds.base import JobKind
from federation.kinds.pod import POD
from federation.kinds.registry import by_name
from federation.retry import capped
from federation.tasks import SideWork

log = logging.getLogger(__name__)
COMPONENT = "mkd-dispatcher"
WORK = "manager-job-status"
"""The side work name of the writes to manager Jobs (``SideWork``)."""
HELD_RETRY_MAX = 60.0
"""Seconds between tries of a write refused with a 403, at most (it waits for the role to be fixed)."""


@dataclass(frozen=True, slots=True)
class JobKey:
    """Which manager Job: uid plus what is needed to address it."""

    uid: str
    kind: str
    namespace: str
    name: str


@dataclass(slots=True)
class _Todo:
    key: JobKey
    conditions: dict[str, dict[str, Any]] = field(default_factory=dict)
    status: dict[str, Any] | None = None
    events: list[tuple[Literal["Normal", "Warning"], str, str]] = field(default_factory=list)
    tries: int = 0
    lingering: float | None = None
    """Not queued yet, until this time (the writer's clock, monotonic): conditions or a passing status waiting
    for more to share the write."""
    held_since: float = 0.0
    """When the current wait began (the same clock): later work extends it, never past the longest wait from here."""
    for_status: bool = False
    """The current wait is for the worker's next status (``status_linger``), not a condition's alone: an Event
    queued meanwhile goes alone (``_work``), and the rest keeps waiting."""


class KubeWriter:
    """Per-Job serial, cross-Job parallel writer of manager Job status, conditions and Events.

    A condition alone (a Workload accepted by its cluster, requeued, corrected) waits up to
    ``condition_linger`` seconds for more work on its Job: the worker's first status usually follows the
    Accepted closely, and the two then cost one status write instead of two. A worker status the Job
    leaves on its own within moments (no condition of the Job's own yet, or only Kubeflow's ``Created``),
    or one whose latest condition the manager Job shows already (only counts changed), waits up to
    ``status_linger`` seconds the same way, and so does the Accepted's condition, also when a write of the Job
    (its Placed Event) is in flight as it comes: Accepted, Created and Running usually reach the manager Job in
    one write, not three (the manager's status writes are most of what a Job costs its API server).
    While the writer is behind (more writes queued than it has workers) such a wait that ends is extended, up to
    ``start_linger_max`` from its start: the worker's next status is on its way, and writes are what is short
    (5,000-Job bursts on a loaded machine: Created or Running came more than 2 s after the Accepted for a third
    to over half of the Jobs, each then written two or three times). A status that changes the Job's latest condition
    (Running) or a finished Job's status goes at once and takes whatever waits along; an Event goes at once
    too, and takes along what waits for nothing else, while what waits for the worker's next status keeps
    waiting (else the Placed Event, queued behind a burst, took the Accepted's condition and Created along,
    and Running needed a write of its own); a later status replaces an earlier one, so the last written is
    always the newest. A graceful stop writes what
    waits at once (``flush``, within ``stop_flush_seconds``): nothing else would write it again before the
    Job's next change.

    Per Job only the status the manager Job has after the last write is remembered (packed): mkd's own
    conditions and the worker's part are read back from it, as after a restart they are read from the
    listed Job, so a write packs one status, not three.
    """

    def __init__(self, kube: Any, cache: JobCache, clock: Clock, *,
                 workers: int = 16, resource_for: Callable[[Any], Any] | None = None,
                 condition_linger: float = 0.5, status_linger: float = 2.0, start_linger_max: float = 10.0,
                 side: SideWork | None = None) -> None:
        self.kube = kube
        self.side = side
        """Where a refusal other than a 422 (a 403: the role lacks a rule) is reported while its writes wait."""
        self._refusing: set[str] = set()
        """Jobs whose last write was refused so (``_held``): the side work is healthy again once none is left."""
        self.condition_linger = condition_linger
        self.status_linger = status_linger
        self.start_linger_max = start_linger_max
        """How long a wait for the worker's next status may grow while the writer is behind (``_release``)."""
        self.cache = cache
        self.clock = clock
        self.workers = workers
        if resource_for is None:
            from federation.kube import resource_for as default_resource_for
            resource_for = default_resource_for
        self._resource_for = resource_for
        self._resources: dict[str, Any] = {}
        self._todo: dict[str, _Todo] = {}
        self._busy: set[str] = set()
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        # per Job, packed (dispatcher/intake/jobcache.py: compressed JSON) and kept with the Job
        # in the cache (``JobCache.set_written``): the status the manager Job has after the last write (mkd's
        # conditions and the worker's part are read from it)
        self._echoes: dict[str, str] = {}
        """uid -> resourceVersion of the Job after this writer's last status write, until intake sees its echo."""
        self._echo_keys: dict[int, JobKey] = {}
        """The same versions (those that are numbers, as the API server's are) -> their Job: ``echo_line``."""
        self.echoes_not_decoded = 0
        self._patching: set[str] = set()
        """Jobs whose status write is in flight: a watch event of one waits in ``_deferred`` for its answer."""
        self._deferred: dict[str, dict[str, Any]] = {}
        """uid -> the Job as a watch event showed it while its status write was in flight (perhaps its echo)."""
        self._idle = asyncio.Event()
        self._idle.set()
        self.writes = 0
        self.unchanged = 0
        """Writes skipped because the manager Job already had exactly that status."""
        self.failures = 0
        self.refused = 0
        """Writes the API server refused (422), each logged with what it refused (``_refused``)."""

    # --- what the engine calls (after its transaction committed) ------------------------------

    def _entry(self, key: JobKey, linger: float = 0.0, *, for_status: bool = False) -> _Todo:
        """The Job's pending work; ``linger`` > 0: it may wait that long for more (see :class:`KubeWriter`),
        ``for_status``: for the worker's next status; 0: it goes now, with whatever waits."""
        todo = self._todo.get(key.uid)
        if todo is None:
            todo = self._todo[key.uid] = _Todo(key)
            self._idle.clear()
            if linger > 0:  # also while a write of the Job is in flight: this waits all the same
                self._linger(todo, linger, for_status)
            elif key.uid not in self._busy:  # (else queued again when the write in flight ends)
                self._queue.put_nowait(key.uid)
        elif todo.lingering is not None:
            if linger > 0:
                self._linger(todo, linger, for_status)
            else:
                self._release(key.uid)
        elif (for_status and linger > 0 and key.uid not in self._busy and not todo.conditions
              and todo.status is None):
            self._linger(todo, linger, for_status)  # queued for Events alone: they go alone, this waits
        return todo

    def _linger(self, todo: _Todo, seconds: float, for_status: bool = False) -> None:
        """Hold ``todo`` until ``seconds`` from now, but no longer than the longest wait since its wait began
        (statuses that keep coming never hold the write for good); a timer on the writer's clock."""
        now = self.clock.monotonic()
        if todo.lingering is None:
            todo.held_since = now
            todo.for_status = False
        todo.for_status = todo.for_status or for_status
        due = min(now + seconds, todo.held_since + max(self.condition_linger, self.status_linger))
        if todo.lingering is None or due > todo.lingering:
            todo.lingering = due
            self.clock.call_later(due - now, self._release, todo.key.uid, due)

    def _release(self, uid: str, due: float | None = None) -> None:
        """A lingering todo's wait is over (its time passed — ``due``, unless extended since — or a write
        that does not wait came): queue it."""
        todo = self._todo.get(uid)
        if todo is not None and todo.lingering is not None and (due is None or due >= todo.lingering):
            if due is not None and todo.for_status and self._queue.qsize() > self.workers and self.status_linger:
                now = self.clock.monotonic()
                later = min(now + self.status_linger, todo.held_since + self.start_linger_max)
                if later > due:  # behind: the worker's next status is on its way, writes are short
                    todo.lingering = later
                    self.clock.call_later(later - now, self._release, uid, later)
                    return
            todo.lingering = None
            if uid not in self._busy:
                self._queue.put_nowait(uid)

    def condition(self, key: JobKey, cond: dict[str, Any], *, status_follows: bool = False) -> None:
        """Set one of mkd's conditions (also ``workload.reset`` / ``workload.removal``); it waits
        ``condition_linger`` for more work on the Job, or ``status_linger`` when the worker's status surely
        follows (the Workload was just accepted)."""
        linger = self.status_linger if status_follows else self.condition_linger
        conds = self._entry(key, linger, for_status=status_follows).conditions
        conds[cond["type"]] = _fold(conds.get(cond["type"]), cond)

    def mirror(self, key: JobKey, status: Mapping[str, Any], *, finished: bool = True) -> None:
        """Write the worker's ``status``. One of a Job not ``finished`` waits up to ``status_linger`` for the
        next to share its write when the Job soon leaves it on its own (:func:`passing`), or when its latest
        condition is the one the manager Job shows already (only counts changed); any other goes at once."""
        linger = 0.0
        if not finished and (passing(status) or self._same_state(key.uid, status)):
            linger = self.status_linger
        self._entry(key, linger, for_status=linger > 0).status = dict(status)

    def _same_state(self, uid: str, status: Mapping[str, Any]) -> bool:
        written = self.cache.written(uid)
        if written is None:
            return False
        new = latest_condition(status)
        return new is not None and new == latest_condition(unpack(written))

    def event(self, key: JobKey, type_: Literal["Normal", "Warning"], reason: str, message: str) -> None:
        """An Event goes at once, taking along what waits for nothing else; what waits for the worker's next
        status keeps waiting (``_work`` writes the Events of a waiting todo alone)."""
        todo = self._todo.get(key.uid)
        if todo is not None and todo.lingering is not None and todo.for_status:
            todo.events.append((type_, reason, message))
            if key.uid not in self._busy:
                self._queue.put_nowait(key.uid)
            return
        self._entry(key).events.append((type_, reason, message))

    def forget(self, uid: str) -> None:
        """The Job is gone: drop what is remembered about it (queued work still runs and meets NotFound)."""
        self.cache.set_written(uid, None)
        self._drop_echo(uid)
        self._deferred.pop(uid, None)

    def wrote(self, uid: str, resource_version: str | None, key: JobKey | None = None) -> None:
        """The Job's status was written and it now has ``resource_version`` (None: the write failed, or its
        answer had none). A watch event held meanwhile (``defer``) goes into the Job cache unless it is the
        write's echo; else the echo is told when it comes (``echo_line`` before decoding, or ``defer``); ``key``
        (the Job's) lets ``echo_line`` tell it undecoded."""
        held = self._deferred.pop(uid, None)
        if held is not None:
            if resource_version is None or _version(held) != resource_version:
                self.cache[uid] = held
        elif resource_version is not None:
            self._drop_echo(uid)
            self._echoes[uid] = resource_version
            if key is not None and resource_version.isdigit():
                self._echo_keys[int(resource_version)] = key

    def _drop_echo(self, uid: str) -> None:
        version = self._echoes.pop(uid, None)
        if version is not None and version.isdigit():
            self._echo_keys.pop(int(version), None)

    def echo_line(self, version: int, line: bytes) -> dict[str, Any] | None:
        """``federation.kube.EchoCheck`` for intake's informers: the watch event ``line`` (not decoded) is the echo
        of this writer's last status write of a Job (its version, and that Job's uid in the line) -- what
        ``defer`` would answer True for once decoded, with nothing for intake to do -- so it is not decoded
        (one manager Job of a few KB per Job mirrored). Returns the header the informer keeps."""
        key = self._echo_keys.get(version)
        if key is None or self._echoes.get(key.uid) != str(version) \
                or b'"uid":"' + key.uid.encode() + b'"' not in line:
            return None
        self._drop_echo(key.uid)
        self.echoes_not_decoded += 1
        return {"metadata": {"namespace": key.namespace, "name": key.name, "uid": key.uid,
                             "resourceVersion": str(version)}}

    def superseded(self, uid: str) -> None:
        """Intake put a newer copy of the Job into the cache: a change held for the write in flight is dropped."""
        self._deferred.pop(uid, None)

    def defer(self, uid: str, obj: dict[str, Any]) -> bool:
        """Intake saw a change of the claimed Job ``uid`` that the engine need not hear of (no new generation,
        managedBy or deletion). True: the writer takes care of it — it is the echo of this writer's last status
        write (nothing else changed: watch events come in resourceVersion order, so any other change came as an
        event of its own, and the writer remembers the status it wrote), or it waits for the answer of the write
        in flight to tell (``wrote``). False: intake puts it into the Job cache as ever."""
        version = _version(obj)
        if version is not None and self._echoes.get(uid) == version:
            self._drop_echo(uid)
            return True
        if uid in self._patching and uid not in self._deferred:
            self._deferred[uid] = obj
            return True
        self._deferred.pop(uid, None)  # a newer change: the cache takes it, not the one held
        return False

    async def wait_idle(self) -> None:
        await self._idle.wait()

    @property
    def settled(self) -> bool:
        """Nothing queued and nothing being written: what is left waits for its time (or for more work)."""
        return self._queue.empty() and not self._busy

    async def flush(self, within: float) -> bool:
        """Stopping: what waits to share a write goes now, and nothing waits from here on; True once every
        write is done, False when ``within`` seconds were not enough (logged). Nothing would write a
        waiting condition again until its Job's next change."""
        self.condition_linger = self.status_linger = 0.0
        for uid, todo in list(self._todo.items()):
            if todo.lingering is not None:
                self._release(uid)
        try:
            await asyncio.wait_for(self._idle.wait(), within)
        except TimeoutError:
            log.warning("stopping with %d manager Job writes not done after %.1fs", self.backlog, within)
            return False
        return True

    @property
    def backlog(self) -> int:
        return len(self._todo) + len(self._busy)

    # --- the workers --------------------------------------------------------------------------

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:  # one worker failing stops the others (restarted together)
            for _ in range(self.workers):
                group.create_task(self._work())

    async def _work(self) -> None:
        while True:
            uid = await self._queue.get()
            todo = self._todo.get(uid)
            if todo is None:
                continue
            if todo.lingering is None:
                del self._todo[uid]
            elif todo.events:  # queued for its Events while the rest waits for the worker's status: they go alone
                waiting, todo = todo, _Todo(todo.key, events=todo.events)
                waiting.events = []
            else:
                continue  # waiting, and its Events are written already: its wait's end queues it
            self._busy.add(uid)
            try:
                await self._apply(todo)
            except Temporary as exc:
                todo.tries += 1
                self.failures += 1
                log.warning("writing manager Job %s/%s failed (%s); retrying", todo.key.namespace,
                            todo.key.name, exc)
                # capped low: after a manager API outage the writes catch up within seconds
                await self.clock.sleep(capped(todo.tries, 0.2, 5.0, exc.delay))
                self._requeue(todo)
            except NotFound:
                self.forget(uid)
            except Invalid as exc:
                self.failures += 1
                self.refused += 1
                self._refused(todo, exc)
            except FederationError as exc:
                self._held(todo, exc)
            else:
                if uid in self._refusing:
                    self._refusing.discard(uid)
                    if not self._refusing and self.side is not None:
                        self.side.ok(WORK)
            finally:
                self._busy.discard(uid)
                after = self._todo.get(uid)
                if after is not None and (after.lingering is None or after.events):
                    self._queue.put_nowait(uid)  # (a waiting one goes when its wait ends: _release)
                elif not self._todo and not self._busy:
                    self._idle.set()

    def _held(self, todo: _Todo, exc: FederationError) -> None:
        """A refusal a fix outside mkd ends (a 403 until the role has the rule): the write is kept and tried again
        with backoff, and the refusal reported as degraded side work (``/readyz``, metrics; logged once per cause),
        never dropped."""
        todo.tries += 1
        self.failures += 1
        self._refusing.add(todo.key.uid)
        if self.side is not None:
            self.side.failed(WORK, exc)
        else:
            log.error("writing manager Job %s/%s failed (%s); retrying", todo.key.namespace, todo.key.name, exc)
        self._requeue(todo)
        # a timer, not a sleep: a worker waiting here would not write the Jobs that are allowed meanwhile
        delay = capped(todo.tries, 1.0, HELD_RETRY_MAX)
        held = self._todo[todo.key.uid]
        held.lingering = due = self.clock.monotonic() + delay
        self.clock.call_later(delay, self._release, todo.key.uid, due)

    def _refused(self, todo: _Todo, exc: Invalid) -> None:
        """The API server refused the status write (422): it is logged with what was refused and, when it carried
        a worker status, mkd's conditions are written again without it (the Job keeps the worker status it had),
        so a refusal never silently drops them."""
        what = sorted({*todo.conditions, *(f"status.{k}" for k in todo.status or {})})
        log.error("the API server refused the status of manager Job %s/%s (%s): %s; refused: %s",
                  todo.key.namespace, todo.key.name, "conditions written again without the worker's status"
                  if todo.status is not None and todo.conditions else "not written", exc, ", ".join(what))
        if todo.status is None or not todo.conditions:
            return
        again = _Todo(todo.key, conditions=dict(todo.conditions))
        newer = self._todo.get(todo.key.uid)
        if newer is None:
            self._todo[todo.key.uid] = again
        else:  # later work on the Job: its conditions win, these fill in what it lacks
            newer.conditions = {**again.conditions, **newer.conditions}

    def _suspended(self, uid: str) -> bool:
        try:
            spec = self.cache[uid].get("spec")
        except KeyError:
            return False
        return isinstance(spec, Mapping) and spec.get("suspend") is True

    def _requeue(self, old: _Todo) -> None:
        newer = self._todo.get(old.key.uid)
        if newer is None:
            self._todo[old.key.uid] = old
            return
        # newer work wins over the failed one, events are kept in order
        conds = dict(old.conditions)
        for type_, cond in newer.conditions.items():
            conds[type_] = _fold(conds.get(type_), cond)
        newer.conditions = conds
        newer.status = newer.status if newer.status is not None else old.status
        newer.events = old.events + newer.events
        newer.tries = old.tries

    def _baseline(self, uid: str) -> dict[str, Any] | None:
        written = self.cache.written(uid)
        if written is not None:
            return unpack(written)  # type: ignore[no-any-return]
        return self.cache.status(uid)

    async def _apply(self, todo: _Todo) -> None:
        key = todo.key
        kind = by_name(key.kind)
        res = self._resources.get(key.kind)
        if res is None:
            res = self._resources[key.kind] = self._resource_for(kind)  # type: ignore[arg-type]
        if todo.conditions or todo.status is not None:
            current = self._baseline(key.uid)
            # mkd's own conditions as the manager Job has them (written last time, or before a restart)
            mkd = {c["type"]: c for c in (current or {}).get("conditions") or []
                   if isinstance(c, dict) and c.get("type") in MKD_CONDITIONS}
            for type_, cond in todo.conditions.items():
                old = mkd.get(type_)
                if REMOVE in cond:
                    mkd.pop(type_, None)
                    continue
                if IF_TRUE in cond:
                    if old is None or old.get("status") != "True":
                        continue  # only a condition that holds is reset
                    cond = _resolved(cond, old)
                if old is not None and old.get("status") == cond["status"]:
                    cond = {**cond, "lastTransitionTime": old.get("lastTransitionTime", cond["lastTransitionTime"])}
                mkd[type_] = cond
            if kind.name == POD.name:  # a single Pod or pod group: each of its Pods written (mirror/podstatus.py)
                await self._pods(key, res, todo, mkd, current)
            else:
                await self._job(key, res, kind, todo, mkd, current)
        involved_uid = key.uid
        if kind.name == POD.name:
            involved_uid = podstatus.lead_uid(self.cache.get(key.uid)) or key.uid
        for type_, reason, message in todo.events:
            involved = {"apiVersion": kind.api_version, "kind": kind.name,
                        "metadata": {"namespace": key.namespace, "name": key.name, "uid": involved_uid}}
            await self.kube.event(involved, type=type_, reason=reason, message=message, component=COMPONENT)
        todo.events.clear()

    async def _pods(self, key: JobKey, res: Any, todo: _Todo, mkd: dict[str, dict[str, Any]],
                    current: dict[str, Any] | None) -> None:
        changes = podstatus.targets(todo.status, mkd, current, podstatus.names_of(self.cache.get(key.uid), current))
        self._patching.add(key.uid)
        try:
            written = await podstatus.write(self.kube, res, key.namespace, changes)
        finally:
            self._patching.discard(key.uid)
            self.wrote(key.uid, None)  # each Pod's echo comes back to intake as a change it passes over
        self.writes += 1
        self.cache.set_written(key.uid, pack(written))

    async def _job(self, key: JobKey, res: Any, kind: JobKind, todo: _Todo, mkd: dict[str, dict[str, Any]],
                   current: dict[str, Any] | None) -> None:
        # no new worker status: the worker's part of what the manager Job has stays (merge_status)
        target = merge_status(todo.status, mkd, current, kind.max_conditions)
        started = (current or {}).get("startTime")
        if started and not target.get("startTime") and kind.api_version == "batch/v1" \
                and not self._suspended(key.uid):
            # the API server refuses to remove a batch Job's startTime while it is not suspended (the copy
            # evicted, or a new one placed that has not started yet): the Job keeps the time it started
            target["startTime"] = started
        patch = merge_patch(current, target)
        if current is not None and not patch:
            self.unchanged += 1  # e.g. a status re-reported after a Resync: nothing to write
        else:
            self._patching.add(key.uid)
            version: Any = None
            try:
                result = await self.kube.patch(res, key.name, {"status": patch}, key.namespace,
                                               subresource="status")
                version = _version(result) if isinstance(result, dict) else None
            finally:
                self._patching.discard(key.uid)
                self.wrote(key.uid, version if isinstance(version, str) else None, key)
            self.writes += 1
            written = result.get("status") if isinstance(result, dict) else None
            self.cache.set_written(key.uid, pack(written if isinstance(written, dict) else target))


def _version(obj: Mapping[str, Any]) -> str | None:
    meta = obj.get("metadata")
    version = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    return version if isinstance(version, str) else None


def _resolved(reset: dict[str, Any], old: Mapping[str, Any]) -> dict[str, Any]:
    """A ``workload.reset`` applied to the True condition ``old``: the False condition it writes."""
    out = {k: v for k, v in reset.items() if k != IF_TRUE}
    if reset[IF_TRUE] == "previously":
        out["message"] = f"Previously: {old.get('message', '')}"[:32768]
    return out


def _fold(prior: dict[str, Any] | None, cond: dict[str, Any]) -> dict[str, Any]:
    """What a Job's queued work says of one condition type after ``cond``, given ``prior`` queued before it
    (not written yet): a reset of a condition queued True resolves against it now, one queued False or
    removed stays as it was; anything else replaces what was queued."""
    if prior is None or IF_TRUE not in cond or IF_TRUE in prior:
        return cond
    if REMOVE in prior or prior.get("status") != "True":
        return prior
    return _resolved(cond, prior)
