"""The API's shapes (pydantic): what the OpenAPI document at ``/openapi.json`` describes."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field


class WorkloadItem(BaseModel):
    uid: str
    namespace: str
    name: str
    kind: str
    queue: str
    priority: int = 0
    state: str = Field(description="pending, placed, running, suspended, finished, failed, rejected or deleted "
                                   "(dispatcher.states.WorkloadState)")
    reason: str | None = None
    cluster: str | None = None
    attempt: int = 0
    placement_state: str | None = None
    epoch: int | None = None
    suspended: bool = False
    pinned: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    requests: dict[str, str] = Field(default_factory=dict)
    created_at: datetime | None = None
    updated_at: datetime | None = None
    accepted_at: datetime | None = None
    finished_at: datetime | None = None


class WorkloadPage(BaseModel):
    items: list[WorkloadItem]
    total: int = Field(description="Workloads matching the filters, all pages together (see total_estimated)")
    total_estimated: bool = Field(False, description=(
        "true: total is PostgreSQL's estimate of the Workload rows (kept by autovacuum and ANALYZE), not a "
        "count; an unfiltered list of more than 100,000 Workloads is estimated, a filtered one always counted"))
    limit: int
    offset: int


class PlacementItem(BaseModel):
    attempt: int
    cluster: str
    epoch: int
    state: str
    reason: str = ""
    spec_version: int = 1
    created_at: datetime | None = None
    accepted_at: datetime | None = None
    finished_at: datetime | None = None


class EventItem(BaseModel):
    id: int
    at: datetime
    type: str
    cluster: str | None = None
    reason: str = ""
    message: str = ""
    workload_uid: str | None = None
    namespace: str | None = None
    name: str | None = None
    kind: str | None = None


class EventPage(BaseModel):
    items: list[EventItem]


class Why(BaseModel):
    """Why the Workload is where it is: pending (what holds it, its positions), admitted (where it runs
    and why that cluster won), else its end (``dispatcher.readmodel``)."""

    workload: str
    uid: str | None = None
    state: str
    step: str | None = Field(default=None, description="what holds a pending one: queue, quota, placement, "
                                                       "suspended; admitted; or the end state")
    answer: str
    reason: str | None = None
    details: list[str] = Field(default_factory=list, description="per cluster: its figures from its last heartbeat "
                                                                 "and the heartbeat's age")
    cluster_queue: str | None = None
    queue: str | None = None
    priority: int = 0
    priority_source: str = ""
    position_in_cluster_queue: int | None = None
    position_in_local_queue: int | None = None


class WorkloadDetail(WorkloadItem):
    api_version: str = ""
    generation: int = 0
    spec_version: int = 1
    cluster_queue: str | None = None
    excluded: list[str] = Field(default_factory=list)
    podsets: list[dict[str, Any]] = Field(default_factory=list)
    conditions: list[dict[str, Any]] | None = Field(
        default=None, description="the manager Job's status.conditions, read from the manager cluster (mkd's "
                                  "MultiCluster* and the mirrored worker's); null when the manager could not be read")
    placements: list[PlacementItem]
    events: list[EventItem]
    why: Why


class ClusterItem(BaseModel):
    name: str
    health: str = Field(description="online, stale (no heartbeat for 3 intervals), offline, or refused (a sender "
                                    "with no registered key: never a cluster)")
    cordoned: bool = False
    online: bool
    last_heartbeat: datetime | None = None
    heartbeat_age_seconds: float | None = None
    lost_since: datetime | None = None
    agent_version: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    kinds: list[str] = Field(default_factory=list)
    allocatable: dict[str, str] = Field(default_factory=dict)
    free: dict[str, str] = Field(default_factory=dict)
    used: dict[str, str] = Field(default_factory=dict, description="allocatable minus free, per resource")
    running: int = Field(default=0, description="placements holding the cluster now (accepted or running)")
    refused: str | None = Field(default=None, description="why messages from this sender are refused")


class ClusterPage(BaseModel):
    items: list[ClusterItem]


class LocalQueueItem(BaseModel):
    namespace: str
    name: str
    cluster_queue: str | None = None
    workloads: dict[str, int] = Field(description="Workloads in this LocalQueue per state")
    pending: int = 0
    admitted: int = 0
    requests_admitted: dict[str, str] = Field(default_factory=dict,
                                              description="summed requests of placed and running Workloads")
    defined: bool | None = Field(default=None, description="exists on the manager (null: the manager was not read)")


class ClusterQueueItem(BaseModel):
    name: str
    cohort: str | None = None
    quota: dict[str, str] = Field(default_factory=dict, description="nominal quota per flavor/resource")
    usage: dict[str, str] = Field(default_factory=dict, description="quota held by admitted Workloads per "
                                                                    "flavor/resource")
    pending: int = Field(default=0, description="Workloads waiting in this ClusterQueue")
    admitted: int = Field(default=0, description="Workloads holding quota in this ClusterQueue")
    defined: bool | None = Field(default=None, description="exists on the manager (null: the manager was not read)")
    problem: str | None = Field(default=None, description="why Kueue's rules refuse its spec")


class QueuePage(BaseModel):
    source: str = Field(description="manager: every queue defined on the manager cluster; records: only the queues "
                                    "Workloads were recorded in (the manager was not read)")
    configured: bool = Field(description="False: no ClusterQueue exists, Workloads are admitted in arrival order "
                                         "without quota (open mode)")
    cluster_queues: list[ClusterQueueItem] = Field(default_factory=list)
    local_queues: list[LocalQueueItem] = Field(default_factory=list)


class PendingItem(BaseModel):
    uid: str
    namespace: str
    name: str
    kind: str
    queue: str
    cluster_queue: str | None = None
    priority: int = 0
    queued_at: datetime | None = None
    queue_seq: int | None = None
    reason: str | None = None
    position_in_cluster_queue: int
    position_in_local_queue: int


class PendingPage(BaseModel):
    items: list[PendingItem]


class RefusedSender(BaseModel):
    name: str
    reason: str
    message: str = ""
    count: int = 0
    first_at: datetime | None = None
    last_at: datetime | None = None


class RefusedPage(BaseModel):
    items: list[RefusedSender]


class HandoverPage(BaseModel):
    items: list[dict[str, Any]] = Field(description="status: Jobs per namespace, kind and controller; report: per "
                                                    "namespace and kind, what mkd would do with other controllers' "
                                                    "Jobs a HandoverPolicy selects")
    warnings: list[dict[str, Any]] = Field(default_factory=list, description="status: Route policies that route "
                                                                             "nothing (policy, since, message)")


class ActionResult(BaseModel):
    message: str


class PinBody(BaseModel):
    cluster: str | None = Field(default=None, description="the cluster to pin to; null removes the pin")


class Owner(BaseModel):
    message: str
