"""The simulated kubelet: runs the pods bound to the cluster's nodes through their phases.

Owns everything a kubelet writes to a pod: Pending → Running after the start time (conditions
PodReadyToStartContainers, Initialized, ContainersReady, Ready, PodScheduled; podIP from the node's
pod CIDR, hostIP from the node, startTime, containerStatuses running and ready, initContainerStatuses
terminated with 0 and sidecars running) → Succeeded or Failed after the run time, with each
container's exit code. restartPolicy OnFailure (on a non-zero exit) and Always (on any exit) restart the
containers in place: restartCount grows, lastState keeps the terminated state, the pod stays Running and
passes through a short CrashLoopBackOff wait. A pod with a deletionTimestamp is stopped (exit code 143 on
its running containers) and then removed, as the kubelet removes pods once they have terminated. Timing
and outcome come from pod annotations (see ``kubesim.sim``) or the cluster's ``KubeletSpec``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubesim.sim.common import (
    EXIT_CODE,
    FAIL_ATTEMPTS,
    RUN_FOREVER,
    RUN_SECONDS,
    START_SECONDS,
    TERMINATION_SECONDS,
    Key,
    StoreLike,
    annotation,
    key_of,
    log,
    now_ts,
    set_condition,
)
from kubesim.sim.logs import LogBook
from kubesim.sim.scheduler import TERMINAL, Scheduler

RESTART_DELAY = 0.05
"""First CrashLoopBackOff wait in seconds (the real one is 10 s), doubling up to RESTART_DELAY_MAX."""
RESTART_DELAY_MAX = 0.5
READY_DELAY = 0.05
"""Seconds from a container's start to its first passing readinessProbe."""
TERMINATION_SECONDS_MAX = 0.1
DUE_BUDGET = 100
"""Pod transitions (each a status write) the kubelet makes per loop iteration."""
"""terminationGracePeriodSeconds is scaled down to at most this many seconds."""


@dataclass
class Outcome:
    """How one pod behaves, from its annotations or the cluster defaults."""

    start_seconds: float
    run_seconds: float
    exit_code: int
    fail_attempts: int | None
    forever: bool
    termination_seconds: float | None = None

    def code_for(self, attempt: int) -> int:
        """Exit code of the ``attempt``-th container start (1-based)."""
        if self.fail_attempts is None:
            return self.exit_code
        return self.exit_code if attempt <= self.fail_attempts else 0


@dataclass
class PodRun:
    key: Key
    uid: str
    node: str
    outcome: Outcome
    restart_policy: str
    state: str = "starting"          # starting | running | backoff | terminating | done
    attempt: int = 0                 # container starts so far
    restarts: int = 0
    pod_ip: str = ""
    started_at: str = ""
    handle: asyncio.TimerHandle | None = None
    exits: list[int] = field(default_factory=list)


def outcome_of(pod: Mapping[str, Any], defaults: Any) -> Outcome:
    def number(key: str, fallback: float) -> float:
        raw = annotation(pod, key)
        try:
            return max(float(raw), 0.0) if raw is not None else fallback
        except ValueError:
            return fallback

    fail_raw = annotation(pod, FAIL_ATTEMPTS)
    try:
        fail_attempts = int(fail_raw) if fail_raw is not None else None
    except ValueError:
        fail_attempts = None
    default_code = int(getattr(defaults, "exit_code", 0))
    code_raw = annotation(pod, EXIT_CODE)
    try:
        exit_code = int(code_raw) if code_raw is not None else default_code
    except ValueError:
        exit_code = default_code
    if fail_attempts is not None and exit_code == 0:
        exit_code = 1  # "fail the first N starts" needs a failing code even when none was given
    return Outcome(
        start_seconds=number(START_SECONDS, float(getattr(defaults, "start_seconds", 0.05))),
        run_seconds=number(RUN_SECONDS, float(getattr(defaults, "run_seconds", 1.0))),
        exit_code=exit_code,
        fail_attempts=fail_attempts,
        forever=(annotation(pod, RUN_FOREVER) or "").lower() == "true",
        termination_seconds=number(TERMINATION_SECONDS, -1.0) if annotation(pod, TERMINATION_SECONDS) else None,
    )


class Kubelet:
    """One simulated kubelet for all of a cluster's nodes."""

    def __init__(self, store: StoreLike, loop: asyncio.AbstractEventLoop, scheduler: Scheduler,
                 defaults: Any) -> None:
        self.store = store
        self.loop = loop
        self.scheduler = scheduler
        self.defaults = defaults
        self.runs: dict[Key, PodRun] = {}
        self.parked: dict[str, dict[Key, None]] = {}
        self._ip_next: dict[str, int] = {}
        self._due: deque[tuple[Callable[..., None], tuple[Any, ...]]] = deque()
        self._due_handle: asyncio.Handle | None = None
        self.stopped = False
        self.logs = LogBook()
        """What each container start printed (kubesim/sim/logs.py); the pods/log endpoint reads it."""
        scheduler.on_node_change.append(self._node_changed)

    def stop(self) -> None:
        self.stopped = True
        self.logs.close()
        for run in self.runs.values():
            if run.handle is not None:
                run.handle.cancel()
                run.handle = None

    # --- timers -------------------------------------------------------------------------------
    def _later(self, delay: float, fn: Callable[..., None], *args: Any) -> asyncio.TimerHandle:
        """Run ``fn`` after ``delay`` through the due queue, so thousands of pods started together do not
        hold the loop (and the API server on it) for one long burst."""
        return self.loop.call_later(delay, self._enqueue, fn, args)

    def _enqueue(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        self._due.append((fn, args))
        if self._due_handle is None and not self.stopped:
            self._due_handle = self.loop.call_soon(self._run_due)

    def _run_due(self) -> None:
        self._due_handle = None
        for _ in range(min(len(self._due), DUE_BUDGET)):
            fn, args = self._due.popleft()
            if self.stopped:
                return
            try:
                fn(*args)
            except Exception:
                log.exception("kubelet step %s failed", getattr(fn, "__name__", fn))
        if self._due and not self.stopped:
            self._due_handle = self.loop.call_soon(self._run_due)

    # --- events -------------------------------------------------------------------------------
    def on_pod(self, event: str, pod: Mapping[str, Any]) -> None:
        key = key_of(pod)
        meta = pod.get("metadata") or {}
        run = self.runs.get(key)
        if event == "DELETED":
            if run is not None and run.uid == meta.get("uid"):
                self._drop(run)
            return
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:
            if meta.get("deletionTimestamp") and (pod.get("status") or {}).get("phase") not in TERMINAL:
                self.loop.call_soon(self._gc_unscheduled, key, meta.get("uid") or "")
            return
        if run is not None and run.uid != meta.get("uid"):
            self._drop(run)
            run = None
        if run is None:
            if node not in self.scheduler.nodes:
                self.parked.setdefault(node, {})[key] = None
                return
            run = self._adopt(key, pod, node)
        if meta.get("deletionTimestamp") and run.state != "terminating":
            self._begin_termination(run, pod)
        elif run.state in ("starting", "running", "backoff") and (pod.get("status") or {}).get("phase") in TERMINAL:
            # Someone else recorded a terminal phase; a kubelet never moves a pod out of one.
            if run.handle is not None:
                run.handle.cancel()
                run.handle = None
            run.state = "done"

    def _node_changed(self, node: str) -> None:
        if self.stopped:
            return
        if node not in self.scheduler.nodes:
            # PodGC: pods bound to a node that no longer exists fail and are deleted (a rare event,
            # so a scan over the running pods is fine).
            for run in sorted((r for r in self.runs.values() if r.node == node), key=lambda r: r.key):
                self._drop(run)
                self.loop.call_soon(self._gc_orphaned, run.key, run.uid)
        waiting = self.parked.pop(node, None)
        if not waiting or node not in self.scheduler.nodes:
            if waiting:
                self.parked[node] = waiting
            return
        for key in waiting:
            pod = self.store.get("pods", *key)
            if pod is not None and (pod.get("spec") or {}).get("nodeName") == node:
                self.loop.call_soon(self.on_pod, "MODIFIED", pod)

    def _adopt(self, key: Key, pod: Mapping[str, Any], node: str) -> PodRun:
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        run = PodRun(key=key, uid=meta.get("uid") or "", node=node,
                     outcome=outcome_of(pod, self.defaults),
                     restart_policy=(pod.get("spec") or {}).get("restartPolicy") or "Always")
        self.runs[key] = run
        phase = status.get("phase")
        if phase in TERMINAL:
            run.state = "done"
        elif phase == "Running":
            # Resumed after a cluster restart: keep the pod's identity and let it run again.
            run.pod_ip = status.get("podIP") or self._allocate_ip(node)
            run.started_at = status.get("startTime") or now_ts()
            run.restarts = max((c.get("restartCount") or 0 for c in status.get("containerStatuses") or ()),
                               default=0)
            run.attempt = run.restarts + 1
            run.state = "running"
            self._schedule_exit(run)
        else:
            run.handle = self._later(run.outcome.start_seconds, self._start, run)
        return run

    def _drop(self, run: PodRun) -> None:
        if run.handle is not None:
            run.handle.cancel()
            run.handle = None
        if self.runs.get(run.key) is run:
            del self.runs[run.key]
            self.logs.drop_pod(run.uid)

    # --- transitions --------------------------------------------------------------------------
    def _current(self, run: PodRun) -> dict[str, Any] | None:
        if self.stopped:
            return None  # a stopped cluster's kubelet writes nothing more
        pod = self.store.get("pods", *run.key)
        if pod is None or (pod.get("metadata") or {}).get("uid") != run.uid:
            self._drop(run)
            return None
        return pod

    def _write_status(self, run: PodRun, pod: dict[str, Any]) -> None:
        try:
            self.store.update_rec("pods", pod, subresource="status")  # the written object is not needed
        except Exception as exc:
            log.warning("kubelet status for %s/%s not written: %s", run.key[0], run.key[1], exc)

    def _schedule_exit(self, run: PodRun) -> None:
        if not run.outcome.forever:
            run.handle = self._later(run.outcome.run_seconds, self._exit, run)

    def _start(self, run: PodRun) -> None:
        run.handle = None
        if run.state not in ("starting", "backoff"):
            return
        pod = self._current(run)
        if pod is None:
            return
        stamp = now_ts()
        first = run.state == "starting"
        if first:
            run.pod_ip = run.pod_ip or self._allocate_ip(run.node)
            run.started_at = stamp
        run.attempt += 1
        run.state = "running"
        spec = pod.get("spec") or {}
        status = pod.setdefault("status", {})
        status["phase"] = "Running"
        node = self.scheduler.nodes.get(run.node)
        host_ip = _host_ip(node.addresses if node else [], node.index if node else 0)
        status["hostIP"] = host_ip
        status["hostIPs"] = [{"ip": host_ip}]
        status["podIP"] = run.pod_ip
        status["podIPs"] = [{"ip": run.pod_ip}]
        status.setdefault("startTime", run.started_at)
        status.setdefault("qosClass", _qos_class(spec))
        conditions = status.setdefault("conditions", [])
        containers = list(spec.get("containers") or ())
        # A container with a readinessProbe turns ready only once its first probe passes (READY_DELAY later).
        probed = [str(c.get("name")) for c in containers if c.get("readinessProbe")]
        for ctype in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready", "PodScheduled"):
            if probed and ctype in ("ContainersReady", "Ready"):
                set_condition(conditions, ctype, "False", "ContainersNotReady",
                              f"containers with unready status: [{' '.join(probed)}]", now=stamp, probe_times=True)
                continue
            set_condition(conditions, ctype, "True", probe_times=True, now=stamp)
            _clear_reason(conditions, ctype)
        status["containerStatuses"] = [
            _container_status(c, run, {"running": {"startedAt": stamp}}, ready=c.get("name") not in probed,
                              last=_previous_last(status, c.get("name")))
            for c in containers
        ]
        if spec.get("initContainers"):
            status["initContainerStatuses"] = [_init_status(c, run, stamp) for c in spec["initContainers"]]
        for c in containers:
            self.logs.start(pod, c, _container_id(run), run.attempt,
                            None if run.outcome.forever else run.outcome.run_seconds)
        self._write_status(run, pod)
        self._schedule_exit(run)
        if probed:
            self._later(READY_DELAY, self._ready, run, run.attempt)

    def _ready(self, run: PodRun, attempt: int) -> None:
        if run.state != "running" or run.attempt != attempt:
            return
        pod = self._current(run)
        if pod is None:
            return
        status = pod.setdefault("status", {})
        stamp = now_ts()
        for cs in status.get("containerStatuses") or ():
            if "running" in (cs.get("state") or {}):
                cs["ready"] = True
        conditions = status.setdefault("conditions", [])
        for ctype in ("ContainersReady", "Ready"):
            set_condition(conditions, ctype, "True", now=stamp, probe_times=True)
            _clear_reason(conditions, ctype)
        self._write_status(run, pod)

    def _exit(self, run: PodRun) -> None:
        run.handle = None
        if run.state != "running":
            return
        pod = self._current(run)
        if pod is None:
            return
        code = run.outcome.code_for(run.attempt)
        run.exits.append(code)
        self.logs.finish(_container_id(run), _names(pod))
        restart = run.restart_policy == "Always" or (run.restart_policy == "OnFailure" and code != 0)
        if restart:
            self._crash_loop(run, pod, code)
        else:
            self._terminate(run, pod, code)

    def _terminated(self, run: PodRun, code: int, stamp: str) -> dict[str, Any]:
        return {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                               "startedAt": run.started_at or stamp, "finishedAt": stamp,
                               "containerID": _container_id(run)}}

    def _crash_loop(self, run: PodRun, pod: dict[str, Any], code: int) -> None:
        stamp = now_ts()
        run.restarts += 1
        run.state = "backoff"
        delay = min(RESTART_DELAY * 2 ** (run.restarts - 1), RESTART_DELAY_MAX)
        spec = pod.get("spec") or {}
        status = pod.setdefault("status", {})
        names = [c.get("name") for c in spec.get("containers") or ()]
        status["containerStatuses"] = [
            _container_status(c, run, {"waiting": {
                "reason": "CrashLoopBackOff",
                "message": f"back-off {delay:g}s restarting failed container={c.get('name')} "
                           f"pod={run.key[1]}_{run.key[0]}({run.uid})"}},
                ready=False, last=self._terminated(run, code, stamp))
            for c in spec.get("containers") or ()
        ]
        conditions = status.setdefault("conditions", [])
        message = f"containers with unready status: [{' '.join(str(n) for n in names)}]"
        for ctype in ("ContainersReady", "Ready"):
            set_condition(conditions, ctype, "False", "ContainersNotReady", message, now=stamp, probe_times=True)
        self._write_status(run, pod)
        run.handle = self._later(delay, self._start, run)

    def _terminate(self, run: PodRun, pod: dict[str, Any], code: int, *, force_failed: bool = False) -> None:
        stamp = now_ts()
        run.state = "done"
        self.logs.finish(_container_id(run), _names(pod))
        spec = pod.get("spec") or {}
        status = pod.setdefault("status", {})
        status["phase"] = "Succeeded" if code == 0 and not force_failed else "Failed"
        status["containerStatuses"] = [
            _container_status(c, run, self._terminated(run, code, stamp), ready=False,
                              last=_previous_last(status, c.get("name")))
            for c in spec.get("containers") or ()
        ]
        for init in status.get("initContainerStatuses") or ():
            if "running" in (init.get("state") or {}):
                init["state"] = self._terminated(run, 0, stamp)
                init["ready"] = False
                init["started"] = False
        conditions = status.setdefault("conditions", [])
        if status["phase"] == "Succeeded":
            reason, message = "PodCompleted", None
        else:  # the kubelet reports a failed pod's containers as not ready, naming them
            names = " ".join(str(c.get("name")) for c in spec.get("containers") or ())
            reason, message = "ContainersNotReady", f"containers with unready status: [{names}]"
        for ctype in ("ContainersReady", "Ready"):
            set_condition(conditions, ctype, "False", reason, message, now=stamp, probe_times=True)
            if message is None:
                for cond in conditions:
                    if cond.get("type") == ctype:
                        cond.pop("message", None)
        set_condition(conditions, "PodReadyToStartContainers", "False", None, None, now=stamp, probe_times=True)
        self._write_status(run, pod)

    # --- deletion -----------------------------------------------------------------------------
    def _begin_termination(self, run: PodRun, pod: Mapping[str, Any]) -> None:
        if run.handle is not None:
            run.handle.cancel()
            run.handle = None
        was_running = run.state in ("running", "backoff")
        run.state = "terminating"
        grace = (pod.get("metadata") or {}).get("deletionGracePeriodSeconds")
        if grace is None:
            grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
        delay = min(float(grace or 0), TERMINATION_SECONDS_MAX)
        if run.outcome.termination_seconds is not None and run.outcome.termination_seconds >= 0:
            delay = run.outcome.termination_seconds
        run.handle = self._later(delay, self._finish_termination, run, was_running)

    def _finish_termination(self, run: PodRun, was_running: bool) -> None:
        run.handle = None
        pod = self._current(run)
        if pod is None:
            return
        if (pod.get("status") or {}).get("phase") not in TERMINAL:
            # Stopped by SIGTERM: the kubelet records the terminal phase before the pod goes away.
            self._terminate(run, pod, 143, force_failed=True)
        self._remove(run)

    def _gc_orphaned(self, key: Key, uid: str) -> None:
        if self.stopped:
            return
        pod = self.store.get("pods", *key)
        if pod is None or (pod.get("metadata") or {}).get("uid") != uid:
            return
        status = pod.setdefault("status", {})
        try:
            if status.get("phase") not in TERMINAL:
                status["phase"] = "Failed"
                set_condition(status.setdefault("conditions", []), "DisruptionTarget", "True", "DeletionByPodGC",
                              "PodGC: node no longer exists", probe_times=True)
                self.store.update("pods", pod, subresource="status")
            self.store.delete("pods", key[0], key[1])
        except Exception as exc:
            log.debug("pod GC of %s/%s: %s", key[0], key[1], exc)

    def _gc_unscheduled(self, key: Key, uid: str) -> None:
        if self.stopped:
            return
        """PodGC's rule: an unscheduled pod being deleted is marked Failed so its finalizers can finish."""
        pod = self.store.get("pods", *key)
        if pod is None or (pod.get("metadata") or {}).get("uid") != uid:
            return
        if (pod.get("spec") or {}).get("nodeName") or (pod.get("status") or {}).get("phase") in TERMINAL:
            return
        status = pod.setdefault("status", {})
        status["phase"] = "Failed"
        set_condition(status.setdefault("conditions", []), "DisruptionTarget", "True", "DeletionByPodGC",
                      "PodGC: node no longer exists", probe_times=True)
        try:
            self.store.update("pods", pod, subresource="status")
            remove_pod(self.store, *key)
        except Exception as exc:
            log.debug("pod GC of %s/%s: %s", key[0], key[1], exc)

    def _remove(self, run: PodRun) -> None:
        ns, name = run.key
        try:
            remove_pod(self.store, ns, name)
        except Exception as exc:
            log.debug("removing %s/%s: %s", ns, name, exc)
        self._drop(run)

    # --- addresses ----------------------------------------------------------------------------
    def _allocate_ip(self, node: str) -> str:
        info = self.scheduler.nodes.get(node)
        index = info.index if info is not None else 0
        n = self._ip_next.get(node, 0)
        self._ip_next[node] = n + 1
        # Each node owns a /24 of 10.244.0.0/16 (as kubeadm's default pod CIDR hands them out).
        host = n % 253 + 2
        return f"10.244.{index % 256}.{host}"


def remove_pod(store: StoreLike, namespace: str, name: str) -> None:
    """Final removal of a terminated pod (the kubelet's DELETE with grace period 0)."""
    final = getattr(store, "finalize_delete", None)
    if callable(final):
        final("pods", namespace, name)
    else:
        store.delete("pods", namespace, name)


def _names(pod: Mapping[str, Any]) -> list[str]:
    return [str(c.get("name") or "") for c in (pod.get("spec") or {}).get("containers") or ()]


def _host_ip(addresses: list[dict[str, Any]], index: int) -> str:
    for addr in addresses:
        if addr.get("type") == "InternalIP" and addr.get("address"):
            return str(addr["address"])
    return f"172.18.0.{index + 2}"


def _container_id(run: PodRun) -> str:
    return f"containerd://{run.uid.replace('-', '')}{run.attempt:08x}"


def _container_status(container: Mapping[str, Any], run: PodRun, state: dict[str, Any], *, ready: bool,
                      last: dict[str, Any] | None) -> dict[str, Any]:
    image = container.get("image") or ""
    return {
        "name": container.get("name"),
        "image": image,
        "imageID": f"{image}@sha256:{'0' * 64}" if image else "",
        "containerID": _container_id(run),
        "ready": ready,
        "started": "running" in state,
        "restartCount": run.restarts,
        "state": state,
        "lastState": last or {},
    }


def _init_status(container: Mapping[str, Any], run: PodRun, stamp: str) -> dict[str, Any]:
    if container.get("restartPolicy") == "Always":
        state: dict[str, Any] = {"running": {"startedAt": stamp}}
        ready = True
    else:
        state = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": run.started_at,
                                "finishedAt": run.started_at, "containerID": _container_id(run)}}
        ready = True
    status = _container_status(container, run, state, ready=ready, last=None)
    status["restartCount"] = 0
    return status


def _previous_last(status: Mapping[str, Any], name: Any) -> dict[str, Any] | None:
    for cs in status.get("containerStatuses") or ():
        if cs.get("name") == name:
            return cs.get("lastState") or None
    return None


def _clear_reason(conditions: list[dict[str, Any]], ctype: str) -> None:
    for cond in conditions:
        if cond.get("type") == ctype:
            cond.pop("reason", None)
            cond.pop("message", None)


def _qos_class(spec: Mapping[str, Any]) -> str:
    containers = list(spec.get("containers") or ()) + list(spec.get("initContainers") or ())
    requests_any = False
    guaranteed = bool(containers)
    for c in containers:
        res = c.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        if req or lim:
            requests_any = True
        for name in ("cpu", "memory"):
            if name not in lim or (name in req and req[name] != lim[name]):
                guaranteed = False
    if guaranteed:
        return "Guaranteed"
    return "Burstable" if requests_any else "BestEffort"
