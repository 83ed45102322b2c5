"""The simulated kube-scheduler: binds pending pods to nodes where they fit.

Owns node accounting (allocatable minus the requests of the non-terminal pods bound to each node),
the scheduling queue (pods without ``spec.nodeName`` whose schedulerName is the default one) and
binding. Filters follow the default plugin order and stop at a node's first failing plugin, as the
framework does: NodeUnschedulable, TaintToleration (NoSchedule/NoExecute), NodeAffinity (nodeSelector
and required matchExpressions/matchFields), NodeResourcesFit. The score is LeastAllocated on cpu and
memory; ties break on a hash of seed, pod and node so placement is deterministic under the seed. Pods
that fit nowhere get PodScheduled=False/Unschedulable with the real scheduler's message and a
FailedScheduling Event, and are retried only when capacity frees or a node changes. Work is batched:
one pass per loop iteration over the new pods, or over every waiting pod after capacity changed, with
a per-pass memo so identical pods that failed are not filtered again.
"""

from __future__ import annotations

import asyncio
import zlib
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubesim.sim.common import Key, StoreLike, find_condition, key_of, log, now_ts, record_event
from kubesim.sim.resources import Resources, insufficient, pod_requests, quantities

DEFAULT_SCHEDULER = "default-scheduler"
UNRESOLVABLE = "Preemption is not helpful for scheduling"
NO_VICTIMS = "No preemption victims found for incoming pod"
TERMINAL = frozenset({"Succeeded", "Failed"})
BACKOFF_INITIAL = 1.0
BACKOFF_MAX = 10.0
"""A pod's Unschedulable message is rewritten at most this often (the real queue's pod backoff, seconds)."""
PASS_WRITE_BUDGET = 100
"""Writes (binds, unschedulable status + event) one scheduling pass may make before yielding the loop."""


@dataclass
class NodeInfo:
    name: str
    allocatable: Resources
    labels: dict[str, str]
    taints: list[dict[str, Any]]
    unschedulable: bool
    addresses: list[dict[str, Any]]
    index: int = 0


@dataclass
class PendingPod:
    key: Key
    uid: str
    priority: int
    seq: int
    requests: Resources
    spec: dict[str, Any]
    signature: str
    meta: dict[str, Any] = field(default_factory=dict)


def _signature(spec: Mapping[str, Any], requests: Resources) -> str:
    """What scheduling depends on (``requests``: ``pod_requests(spec)``); two pods with the same signature
    fit the same nodes."""
    return repr((
        sorted(requests.items()),
        sorted((spec.get("nodeSelector") or {}).items()),
        (spec.get("affinity") or {}).get("nodeAffinity"),
        spec.get("tolerations"),
        spec.get("nodeName"),
    ))


class Scheduler:
    """One per simulated cluster; fed by the Simulation's store subscription."""

    def __init__(self, store: StoreLike, loop: asyncio.AbstractEventLoop, seed: int) -> None:
        self.store = store
        self.loop = loop
        self.seed = seed
        self.nodes: dict[str, NodeInfo] = {}
        self.used: dict[str, Resources] = {}
        self.assigned: dict[Key, tuple[str, Resources]] = {}
        self.pending: dict[Key, PendingPod] = {}
        self.active: dict[Key, None] = {}
        self.unschedulable: dict[Key, tuple[str, float, int]] = {}   # message, next rewrite, attempts
        self._refresh: asyncio.TimerHandle | None = None
        self.gated: set[Key] = set()
        self.priorities: Counter[int] = Counter()
        self.on_node_change: list[Callable[[str], None]] = []
        self._seq = 0
        self._node_index = 0
        self._move_all = False
        self._handle: asyncio.Handle | None = None
        self._sorted_nodes: list[NodeInfo] | None = None
        self._backlog: list[Key] = []
        self.binds = 0
        self.stopped = False
        self.passes = 0

    def stop(self) -> None:
        self.stopped = True
        if self._refresh is not None:
            self._refresh.cancel()
            self._refresh = None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    # --- events -------------------------------------------------------------------------------
    def on_node(self, event: str, node: Mapping[str, Any]) -> None:
        meta = node.get("metadata") or {}
        name = meta.get("name") or ""
        if event == "DELETED":
            self.nodes.pop(name, None)
        else:
            status = node.get("status") or {}
            spec = node.get("spec") or {}
            info = NodeInfo(
                name=name,
                allocatable=quantities(status.get("allocatable") or status.get("capacity")),
                labels=dict(meta.get("labels") or {}),
                taints=list(spec.get("taints") or ()),
                unschedulable=bool(spec.get("unschedulable")),
                addresses=list(status.get("addresses") or ()),
            )
            old = self.nodes.get(name)
            if old is not None:
                info.index = old.index
                if (old.allocatable, old.labels, old.taints, old.unschedulable) == (
                        info.allocatable, info.labels, info.taints, info.unschedulable):
                    self.nodes[name] = info
                    return
            else:
                info.index = self._node_index
                self._node_index += 1
            self.nodes[name] = info
        self._sorted_nodes = None
        for hook in self.on_node_change:
            hook(name)
        self._request_pass(move_all=True)

    def on_pod(self, event: str, pod: Mapping[str, Any]) -> None:
        key = key_of(pod)
        if event == "DELETED":
            self._forget_pending(key)
            self.gated.discard(key)
            self.unschedulable.pop(key, None)
            self._release(key)
            return
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        node = spec.get("nodeName")
        terminal = status.get("phase") in TERMINAL
        if node:
            self._forget_pending(key)
            self.gated.discard(key)
            self.unschedulable.pop(key, None)
            if terminal:
                self._release(key)
            elif key not in self.assigned:
                req = pod_requests(spec)
                self.assigned[key] = (node, req)
                used = self.used.setdefault(node, {})
                for name, amount in req.items():
                    used[name] = used.get(name, 0) + amount
            return
        meta = pod.get("metadata") or {}
        if terminal or meta.get("deletionTimestamp"):
            self._forget_pending(key)
            return
        if (spec.get("schedulerName") or DEFAULT_SCHEDULER) != DEFAULT_SCHEDULER:
            return
        if spec.get("schedulingGates"):
            self._forget_pending(key)
            if key not in self.gated:
                self.gated.add(key)
                cond = find_condition(status.get("conditions"), "PodScheduled")
                if cond is None or cond.get("reason") != "SchedulingGated":
                    self.loop.call_soon(self._mark_gated, key)
            return
        self.gated.discard(key)
        requests = pod_requests(spec)
        signature = _signature(spec, requests)
        entry = self.pending.get(key)
        if entry is not None and entry.uid == meta.get("uid") and entry.signature == signature:
            return  # a status write (often our own) changes nothing about where it fits
        if entry is not None:
            self._forget_pending(key)
        self._seq += 1
        priority = int(spec.get("priority") or 0)
        self.pending[key] = PendingPod(
            key=key, uid=meta.get("uid") or "", priority=priority, seq=self._seq,
            requests=requests, spec=dict(spec), signature=signature,
            meta={"name": meta.get("name"), "namespace": meta.get("namespace"), "uid": meta.get("uid")},
        )
        self.priorities[priority] += 1
        self.active[key] = None
        self._request_pass(move_all=False)

    # --- accounting ---------------------------------------------------------------------------
    def _release(self, key: Key) -> None:
        held = self.assigned.pop(key, None)
        if held is None:
            return
        node, req = held
        used = self.used.get(node, {})
        for name, amount in req.items():
            used[name] = used.get(name, 0) - amount
        self._request_pass(move_all=True)

    def _forget_pending(self, key: Key) -> None:
        entry = self.pending.pop(key, None)
        if entry is not None:
            self.priorities[entry.priority] -= 1
            if not self.priorities[entry.priority]:
                del self.priorities[entry.priority]
        self.active.pop(key, None)

    def free(self, node: str) -> Resources:
        info = self.nodes.get(node)
        if info is None:
            return {}
        used = self.used.get(node, {})
        return {name: amount - used.get(name, 0) for name, amount in info.allocatable.items()}

    # --- the scheduling pass ------------------------------------------------------------------
    def _request_pass(self, *, move_all: bool) -> None:
        if move_all:
            if not self.pending:
                return
            self._move_all = True
        if self._handle is None and not self.stopped:
            self._handle = self.loop.call_soon(self._pass)

    def _ordered(self, keys: list[Key]) -> list[Key]:
        if len(self.priorities) <= 1:
            return keys  # insertion order is queue order when every pod has the same priority
        return sorted(keys, key=lambda k: (-self.pending[k].priority, self.pending[k].seq))

    def _pass(self) -> None:
        self._handle = None
        if self.stopped:
            return
        self.passes += 1
        if self._move_all:
            self._backlog = self._ordered(list(self.pending))
            self._move_all = False
        else:
            fresh = [k for k in self.active if k in self.pending]
            if len(self.priorities) <= 1:
                fresh.sort(key=lambda k: self.pending[k].seq)
            # Older pods left over from a pass that ran out of budget keep their place in the queue.
            self._backlog = self._backlog + self._ordered(fresh) if self._backlog else self._ordered(fresh)
        self.active.clear()
        failed: dict[str, str] = {}
        budget = PASS_WRITE_BUDGET
        position = 0
        for position, key in enumerate(self._backlog):  # noqa: B007 - position is used after the loop
            if budget <= 0:
                break
            entry = self.pending.get(key)
            if entry is None:
                continue
            message = failed.get(entry.signature)
            if message is None:
                node, message = self._place(entry)
                if node is not None:
                    self._bind(entry, node)
                    budget -= 1
                    continue
                failed[entry.signature] = message
            prev = self.unschedulable.get(key)
            if prev is None or (prev[0] != message and self.loop.time() >= prev[1]):
                attempts = 0 if prev is None else prev[2] + 1
                wait = min(BACKOFF_INITIAL * 2 ** attempts, BACKOFF_MAX)
                self.unschedulable[key] = (message, self.loop.time() + wait, attempts)
                self._mark_unschedulable(entry, message)
                budget -= 2
            elif prev[0] != message:
                self._refresh_at(prev[1])
        else:
            position = len(self._backlog)
        # Out of budget: the rest waits for the next loop iteration so the API server stays responsive.
        self._backlog = self._backlog[position:]
        if self._backlog and self._handle is None and not self.stopped:
            self._handle = self.loop.call_soon(self._pass)

    def _refresh_at(self, when: float) -> None:
        """A later pass rewrites messages that changed while their pod was backing off."""
        if self._refresh is not None or self.stopped:
            return

        def fire() -> None:
            self._refresh = None
            self._request_pass(move_all=True)

        self._refresh = self.loop.call_at(when, fire)

    def _nodes(self) -> list[NodeInfo]:
        if self._sorted_nodes is None:
            self._sorted_nodes = [self.nodes[n] for n in sorted(self.nodes)]
        return self._sorted_nodes

    def _place(self, pod: PendingPod) -> tuple[str | None, str]:
        nodes = self._nodes()
        if not nodes:
            return None, "no nodes available to schedule pods"
        reasons: Counter[str] = Counter()
        unresolvable = 0
        best: tuple[float, int, str] | None = None
        for node in nodes:
            why = self._filter(pod, node)
            if why is not None:
                resolvable, node_reasons = why
                reasons.update(node_reasons)
                unresolvable += 0 if resolvable else 1
                continue
            score = self._score(pod, node)
            tie = zlib.crc32(f"{self.seed}/{pod.key[0]}/{pod.key[1]}/{node.name}".encode())
            candidate = (score, tie, node.name)
            if best is None or candidate > best:
                best = candidate
        if best is not None:
            return best[2], ""
        total = len(nodes)
        detail = ", ".join(sorted(f"{count} {reason}" for reason, count in reasons.items()))
        post = []
        if total - unresolvable:
            post.append(f"{total - unresolvable} {NO_VICTIMS}")
        if unresolvable:
            post.append(f"{unresolvable} {UNRESOLVABLE}")
        return None, (f"0/{total} nodes are available: {detail}. preemption: 0/{total} nodes are "
                      f"available: {', '.join(sorted(post))}.")

    def _filter(self, pod: PendingPod, node: NodeInfo) -> tuple[bool, list[str]] | None:
        """None when the pod fits; else (resolvable by preemption, reasons) from the first failing plugin."""
        spec = pod.spec
        tolerations = spec.get("tolerations") or ()
        if node.unschedulable and not _tolerates(
                tolerations, {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}):
            return False, ["node(s) were unschedulable"]
        if spec.get("nodeName") and spec["nodeName"] != node.name:
            return False, ["node(s) didn't match the requested node name"]
        for taint in node.taints:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(tolerations, taint):
                return False, [f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"]
        if not _affinity_matches(spec, node):
            return False, ["node(s) didn't match Pod's node affinity/selector"]
        free = self.free(node.name)
        short = insufficient(pod.requests, free)
        if short:
            return True, ["Too many pods" if name == "pods" else f"Insufficient {name}" for name in short]
        return None

    def _score(self, pod: PendingPod, node: NodeInfo) -> float:
        free = self.free(node.name)
        total = 0.0
        for name in ("cpu", "memory"):
            alloc = node.allocatable.get(name, 0)
            if alloc <= 0:
                continue
            left = free.get(name, 0) - pod.requests.get(name, 0)
            total += max(left, 0) * 100.0 / alloc
        return total / 2

    # --- writes -------------------------------------------------------------------------------
    def _bind(self, pod: PendingPod, node: str) -> None:
        ns, name = pod.key
        self._forget_pending(pod.key)
        self.unschedulable.pop(pod.key, None)
        try:
            if bind_pod(self.store, ns, name, pod.uid, node):
                self.binds += 1
        except Exception as exc:
            log.warning("binding %s/%s to %s failed: %s", ns, name, node, exc)

    def _mark_unschedulable(self, pod: PendingPod, message: str) -> None:
        ns, name = pod.key
        try:
            current = self.store.get("pods", ns, name)
            if current is None or (current.get("spec") or {}).get("nodeName"):
                return
            status = current.setdefault("status", {})
            status.setdefault("phase", "Pending")
            conditions = status.setdefault("conditions", [])
            _set_pod_condition(conditions, "PodScheduled", "False", "Unschedulable", message)
            self.store.update("pods", current, subresource="status")
        except Exception as exc:
            log.debug("unschedulable status on %s/%s not written: %s", ns, name, exc)
            return
        record_event(self.store, current, kind="Pod", api_version="v1", type_="Warning",
                     reason="FailedScheduling", message=message, component=DEFAULT_SCHEDULER)

    def _mark_gated(self, key: Key) -> None:
        if key not in self.gated or self.stopped:
            return
        try:
            current = self.store.get("pods", *key)
            if current is None or not (current.get("spec") or {}).get("schedulingGates"):
                return
            status = current.setdefault("status", {})
            status.setdefault("phase", "Pending")
            conditions = status.setdefault("conditions", [])
            if _set_pod_condition(conditions, "PodScheduled", "False", "SchedulingGated",
                                  "Scheduling is blocked due to non-empty scheduling gates"):
                self.store.update("pods", current, subresource="status")
        except Exception as exc:
            log.debug("gated status on %s/%s not written: %s", key[0], key[1], exc)


def bind_pod(store: StoreLike, namespace: str, name: str, uid: str, node: str) -> bool:
    """What POST pods/{name}/binding does: set spec.nodeName and PodScheduled=True in one write.

    The pod spec is immutable through update and patch (as upstream), so binding uses the store's
    ``bind`` when it offers one, else commits the bound object the way the binding subresource does.
    """
    rec = store.get_rec("pods", namespace, name)  # type: ignore[attr-defined]
    if rec is None or rec.uid != uid:
        return False  # gone, or a new pod of the same name that gets its own scheduling attempt
    binder = getattr(store, "bind", None)
    if callable(binder):
        binder(namespace, name, node)
        return True
    pod = rec.obj()
    meta = pod.get("metadata") or {}
    if meta.get("uid") != uid or (pod.get("spec") or {}).get("nodeName") or meta.get("deletionTimestamp"):
        return False
    pod["spec"]["nodeName"] = node
    status = pod.setdefault("status", {})
    status.setdefault("phase", "Pending")
    conditions = status.setdefault("conditions", [])
    _set_pod_condition(conditions, "PodScheduled", "True", None, None)
    store._commit(store.rtype("pods"), pod, "MODIFIED", rec)  # type: ignore[attr-defined]
    return True


def _set_pod_condition(conditions: list[dict[str, Any]], ctype: str, status: str, reason: str | None,
                       message: str | None) -> bool:
    cond = find_condition(conditions, ctype)
    stamp = now_ts()
    if cond is None:
        cond = {"type": ctype, "status": status, "lastProbeTime": None, "lastTransitionTime": stamp}
        conditions.append(cond)
    elif (cond.get("status"), cond.get("reason"), cond.get("message")) == (status, reason, message):
        return False
    if cond.get("status") != status:
        cond["lastTransitionTime"] = stamp
    cond["status"] = status
    for field_name, value in (("reason", reason), ("message", message)):
        if value is None:
            cond.pop(field_name, None)
        else:
            cond[field_name] = value
    return True


def _tolerates(tolerations: Any, taint: Mapping[str, Any]) -> bool:
    for tol in tolerations or ():
        if tol.get("effect") and tol.get("effect") != taint.get("effect"):
            continue
        if tol.get("operator") == "Exists":
            if not tol.get("key") or tol.get("key") == taint.get("key"):
                return True
            continue
        if tol.get("key") == taint.get("key") and (tol.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _expression_matches(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    op = expr.get("operator")
    key = expr.get("key") or ""
    values = expr.get("values") or []
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and values:
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def _affinity_matches(spec: Mapping[str, Any], node: NodeInfo) -> bool:
    for label, value in (spec.get("nodeSelector") or {}).items():
        if node.labels.get(label) != value:
            return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return True
    fields = {"metadata.name": node.name}
    for term in required.get("nodeSelectorTerms") or ():
        exprs = term.get("matchExpressions") or []
        field_exprs = term.get("matchFields") or []
        if not exprs and not field_exprs:
            continue  # an empty term matches nothing
        if all(_expression_matches(e, node.labels) for e in exprs) and all(
                _expression_matches(e, fields) for e in field_exprs):
            return True
    return False
