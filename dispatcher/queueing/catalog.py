"""The queueing objects the dispatcher knows now: Kueue's objects, PriorityClasses, namespace labels.

The :class:`Catalog` is filled by the watcher (``dispatcher.queueing.watcher``) from the manager cluster's
informers and read by the scheduler; it does no I/O. An object that does not parse is kept out and its problem
recorded in ``problems`` (``mkctl queues show`` prints it), so one bad ClusterQueue does not hide the others.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dispatcher.queueing import api
from federation.errors import Invalid


@dataclass(frozen=True)
class Resolved:
    """Where a Workload queues: its ClusterQueue, or why it cannot queue (``problem``)."""

    cluster_queue: api.ClusterQueue | None
    local_queue: api.LocalQueue | None
    problem: str = ""
    reason: str = ""  # a Kueue-style reason word for the condition


@dataclass
class Catalog:
    """**Open mode.** While no ClusterQueue exists, every Job
    is admitted without quota, in priority and queue-time order, whatever its queue label says. As
    soon as one ClusterQueue exists, a Job must name (label ``kueue.x-k8s.io/queue-name``, ``default``
    when absent) a LocalQueue in its namespace that points to an existing ClusterQueue admitting that
    namespace, exactly as with Kueue; otherwise it stays pending with a reason saying which.
    """
    flavors: dict[str, api.ResourceFlavor] = field(default_factory=dict)
    cluster_queues: dict[str, api.ClusterQueue] = field(default_factory=dict)
    local_queues: dict[tuple[str, str], api.LocalQueue] = field(default_factory=dict)
    cohorts: dict[str, api.Cohort] = field(default_factory=dict)
    workload_priorities: dict[str, api.PriorityClass] = field(default_factory=dict)
    pod_priorities: dict[str, api.PriorityClass] = field(default_factory=dict)
    namespaces: dict[str, dict[str, str]] = field(default_factory=dict)
    problems: dict[tuple[str, str], str] = field(default_factory=dict)   # (kind, key) -> why it was refused
    generation: int = 0
    """Bumped on every change: the scheduler re-tries Workloads it set aside."""
    ready: bool = True
    """False until the watcher listed every type: the scheduler admits nothing before (a dispatcher
    starting up must not mistake "not listed yet" for "no ClusterQueue", i.e. open mode)."""

    @property
    def open(self) -> bool:
        """No ClusterQueue exists: admission needs no quota (mkd's behaviour before queueing)."""
        return not self.cluster_queues

    # --- updates from the watcher -------------------------------------------------------------

    def apply(self, kind: str, obj: Mapping[str, Any], deleted: bool = False) -> None:
        md = obj.get("metadata") or {}
        name = str(md.get("name") or "")
        ns = str(md.get("namespace") or "")
        key = f"{ns}/{name}" if kind == "LocalQueue" else name
        self.generation += 1
        if kind == "Namespace":
            if deleted:
                self.namespaces.pop(name, None)
            else:
                self.namespaces[name] = {str(k): str(v) for k, v in (md.get("labels") or {}).items()}
            return
        table = self._table(kind)
        index: Any = (ns, name) if kind == "LocalQueue" else name
        self.problems.pop((kind, key), None)
        if deleted:
            table.pop(index, None)
            return
        try:
            table[index] = api.PARSERS[kind](obj)
        except Invalid as exc:
            table.pop(index, None)
            self.problems[(kind, key)] = str(exc)

    def _table(self, kind: str) -> dict[Any, Any]:
        tables: dict[str, dict[Any, Any]] = {"ResourceFlavor": self.flavors, "ClusterQueue": self.cluster_queues,
                "LocalQueue": self.local_queues, "Cohort": self.cohorts,
                "WorkloadPriorityClass": self.workload_priorities, "PriorityClass": self.pod_priorities}
        return tables[kind]

    # --- reading -------------------------------------------------------------------------------

    def resolve(self, namespace: str, queue: str) -> Resolved:
        """The ClusterQueue a Workload in ``namespace`` naming LocalQueue ``queue`` goes to."""
        lq = self.local_queues.get((namespace, queue))
        if lq is None:
            return Resolved(None, None, f"LocalQueue {namespace}/{queue} does not exist", "LocalQueueDoesNotExist")
        cq = self.cluster_queues.get(lq.cluster_queue)
        if cq is None:
            why = self.problems.get(("ClusterQueue", lq.cluster_queue))
            text = f"ClusterQueue {lq.cluster_queue} (of LocalQueue {namespace}/{queue}) does not exist"
            return Resolved(None, lq, text + (f": it was refused: {why}" if why else ""), "ClusterQueueDoesNotExist")
        sel = cq.namespace_selector
        if sel is None or not sel.matches(self.namespaces.get(namespace, {})):
            return Resolved(cq, lq, f"ClusterQueue {cq.name} does not admit namespace {namespace} "
                                    "(its namespaceSelector does not match the namespace's labels)",
                            "NamespaceNotAdmitted")
        missing = [f for f in cq.flavor_names() if f not in self.flavors]
        if missing:
            return Resolved(cq, lq, f"ClusterQueue {cq.name} is inactive: ResourceFlavor "
                                    f"{', '.join(missing)} does not exist", "FlavorNotFound")
        return Resolved(cq, lq)

    def stopped(self, resolved: Resolved) -> str:
        """Why no new reservation is made in this queue (``stopPolicy``), or ''."""
        if resolved.cluster_queue is not None and resolved.cluster_queue.stop_policy != "None":
            return f"ClusterQueue {resolved.cluster_queue.name} is stopped (stopPolicy {resolved.cluster_queue.stop_policy})"
        if resolved.local_queue is not None and resolved.local_queue.stop_policy != "None":
            lq = resolved.local_queue
            return f"LocalQueue {lq.namespace}/{lq.name} is stopped (stopPolicy {lq.stop_policy})"
        return ""

    def priority(self, job_labels: Mapping[str, Any], pod_priority_classes: Iterable[str]) -> tuple[int, str]:
        """Kueue's rule: the WorkloadPriorityClass the label names, else the pods' PriorityClass, else 0.

        Returns (value, source) where source names the class (for the history), or '' for 0.
        A named class that does not exist counts as 0 and says so in the source.
        """
        wpc = job_labels.get(api.PRIORITY_CLASS_LABEL)
        if wpc:
            found = self.workload_priorities.get(str(wpc))
            if found is not None:
                return found.value, f"WorkloadPriorityClass {found.name}"
            return 0, f"WorkloadPriorityClass {wpc} (not found: 0)"
        best: tuple[int, str] | None = None
        for name in pod_priority_classes:
            pc = self.pod_priorities.get(name)
            if pc is not None and (best is None or pc.value > best[0]):
                best = (pc.value, f"PriorityClass {pc.name}")
            elif pc is None and best is None:
                best = (0, f"PriorityClass {name} (not found: 0)")
        return best if best is not None else (0, "")

    def cohort_chain(self, cq: api.ClusterQueue) -> list[str]:
        """The cohorts above a ClusterQueue, nearest first (a loop in parentName is cut)."""
        chain: list[str] = []
        name = cq.cohort
        while name and name not in chain:
            chain.append(name)
            parent = self.cohorts.get(name)
            name = parent.parent if parent is not None else None
        return chain
