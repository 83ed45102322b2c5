"""Which conditions the manager Job gets at each step of its Workload's life: one function per step.

mkd has no Workload object, so the Job carries Kueue's Workload conditions itself (QuotaReserved,
Admitted, Evicted, Preempted, Requeued, Finished), written as Kueue writes them (``pkg/workload``:
``SetQuotaReservation``, ``UnsetQuotaReservationWithCondition``, ``SyncAdmittedCondition``,
``SetRequeuedCondition``; the scheduler and the job reconciler's eviction and finish steps), beside
mkd's own ``MultiCluster*`` conditions. ``MultiClusterPending`` is True exactly while the Workload
waits, so that a Job with no condition of its own reads as pending in ``kubectl get`` (the STATE
column prints the last condition's type; ``workload.merge_status`` puts mkd's True conditions last).
Each step's conditions go to the kube writer together and share one write of the Job.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from dispatcher.workload import condition, removal, reset
from federation.labels import (
    CONDITION_ADMITTED,
    CONDITION_DISPATCHED,
    CONDITION_EVICTED,
    CONDITION_FINISHED,
    CONDITION_PENDING,
    CONDITION_PREEMPTED,
    CONDITION_QUOTA_RESERVED,
    CONDITION_REJECTED,
    CONDITION_REQUEUED,
)

Conditions = list[dict[str, Any]]
NO_RESERVATION = "The workload has no reservation"
"""Kueue's Admitted=False message (reason NoReservation) once a Workload's quota is gone."""


def waiting(word: str, message: str, now: datetime, *, step: Literal["queue", "placement"]) -> Conditions:
    """The Workload waits in its queue: why (QuotaReserved=False for the queue and quota steps, as Kueue's
    scheduler writes it, a True Admitted set False with it as ``UnsetQuotaReservationWithCondition`` does; or
    MultiClusterDispatched=False when no cluster takes it), and MultiClusterPending."""
    if step == "placement":
        return [condition(CONDITION_DISPATCHED, False, word, message, now),
                condition(CONDITION_PENDING, True, word, message, now)]
    return [condition(CONDITION_QUOTA_RESERVED, False, "Pending", message, now),
            reset(CONDITION_ADMITTED, "NoReservation", NO_RESERVATION, now),
            condition(CONDITION_PENDING, True, word, message, now)]


def requeued(word: str, message: str, now: datetime) -> Conditions:
    """The Workload is back in its queue (its placement refused or lost, or taken off by an admin): its quota
    is released (QuotaReserved=False reason Pending with the cause, Admitted=False NoReservation, where they
    were True: Kueue's job reconciler on an eviction) and it waits again."""
    return [condition(CONDITION_DISPATCHED, False, word, message, now),
            reset(CONDITION_QUOTA_RESERVED, "Pending", message, now),
            reset(CONDITION_ADMITTED, "NoReservation", NO_RESERVATION, now),
            condition(CONDITION_PENDING, True, word, message, now)]


def preempted(reason: str, message: str, now: datetime) -> Conditions:
    """Evicted by a preemption: the scheduler's Evicted (reason Preempted) and Preempted (InClusterQueue, ...),
    then the job reconciler's Requeued=True with the eviction's reason and message, and the quota released."""
    return [condition(CONDITION_EVICTED, True, "Preempted", message, now),
            condition(CONDITION_PREEMPTED, True, reason, message, now),
            condition(CONDITION_REQUEUED, True, "Preempted", message, now),
            *requeued("Preempted", message, now)]


def admitted(reserved: str, placed: str, now: datetime) -> Conditions:
    """Quota reserved and a cluster chosen (one step in mkd): QuotaReserved and Admitted True; an earlier
    eviction's Evicted and Preempted flip to False ("Previously: ...", SetQuotaReservation); Requeued stays."""
    return [condition(CONDITION_QUOTA_RESERVED, True, "QuotaReserved", reserved, now),
            condition(CONDITION_ADMITTED, True, "Admitted", placed, now),
            reset(CONDITION_EVICTED, "QuotaReserved", "", now, previously=True),
            reset(CONDITION_PREEMPTED, "QuotaReserved", "", now, previously=True),
            removal(CONDITION_PENDING)]


def quota_text(cluster_queue: str, flavors: dict[str, dict[str, str]] | None, *, borrows: bool = False) -> str:
    """QuotaReserved's message: the ClusterQueue, the flavor of each PodSet's resources, any borrowing."""
    named = ", ".join(f"{ps}: " + ", ".join(f"{r}={f}" for r, f in sorted(rs.items()))
                      for ps, rs in sorted((flavors or {}).items()) if rs)
    text = f"Quota reserved in ClusterQueue {cluster_queue}" + (f" ({named})" if named else "")
    return text + (", borrowing from its cohort" if borrows else "")


def admitted_text(cluster: str) -> str:
    """Admitted's message."""
    return f"The workload is admitted: placed on cluster {cluster}"


def accepted_text(cluster: str, attempt: int) -> str:
    """MultiClusterDispatched=True's message."""
    return f"placed on cluster {cluster} (attempt {attempt})"


def accepted(message: str, now: datetime) -> Conditions:
    """The cluster's agent took the Job (in open mode the first sign it waits no more)."""
    return [condition(CONDITION_DISPATCHED, True, "Placed", message, now), removal(CONDITION_PENDING)]


def finished(outcome: Literal["Succeeded", "Failed"], message: str, now: datetime) -> Conditions:
    """The Job ended: Kueue's Finished=True (reason Succeeded / Failed, the Job's own message). The quota is
    released; QuotaReserved and Admitted stay True, as on a finished Workload."""
    return [condition(CONDITION_FINISHED, True, outcome, message, now)]


def refused(reason: str, message: str, now: datetime) -> Conditions:
    """mkd will not run the Job (invalid, managedBy changed, placement attempts exhausted): it waits no
    more, and any quota it held is released."""
    return [condition(CONDITION_REJECTED, True, reason, message, now),
            reset(CONDITION_QUOTA_RESERVED, "Pending", message, now),
            reset(CONDITION_ADMITTED, "NoReservation", NO_RESERVATION, now),
            removal(CONDITION_PENDING)]
