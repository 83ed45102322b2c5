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
    total: int = Field(description="Workloads matching the filters, all pages together")
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
    """Why the Workload is where it is: pending (what it waits for) or placed (why that cluster won)."""

    state: str
    answer: str
    step: str | None = Field(default=None, description="what holds a pending one: queue, quota, placement, suspended "
                                               "(dispatcher.queueing.views)")
    cluster_queue: str | None = None
    position_in_cluster_queue: int | None = None
    position_in_local_queue: int | None = None


class WorkloadDetail(WorkloadItem):
    api_version: str = ""
    generation: int = 0
    spec_version: int = 1
    excluded: list[str] = Field(default_factory=list)
    podsets: list[dict[str, Any]] = Field(default_factory=list)
    conditions: list[dict[str, Any]] = Field(default_factory=list, description="the manager Job's conditions (mkd's MultiCluster* and the mirrored worker's), "
                                                    "as the dispatcher last saw them")
    placements: list[PlacementItem]
    events: list[EventItem]
    why: Why


class ClusterItem(BaseModel):
    name: str
    health: str = Field(description="online, stale (no heartbeat for 3 intervals) or offline")
    cordoned: bool = False
    online: bool
    last_heartbeat: datetime | None = None
    lost_since: datetime | None = None
    agent_version: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    kinds: Any = None
    allocatable: dict[str, str] = Field(default_factory=dict)
    free: dict[str, str] = Field(default_factory=dict)
    used: dict[str, str] = Field(default_factory=dict, description="allocatable minus free, per resource")
    running: int = Field(default=0, description="placements holding the cluster now (accepted or running)")


class ClusterPage(BaseModel):
    items: list[ClusterItem]


class QueueItem(BaseModel):
    name: str
    workloads: dict[str, int] = Field(description="Workloads in this queue per state")
    requests_admitted: dict[str, str] = Field(description="summed requests of placed and running Workloads")
    quota: dict[str, str] | None = Field(default=None, description="the queue's quota; None: queues not configured")


class ClusterQueueItem(BaseModel):
    name: str
    cohort: str | None = None
    quota: dict[str, str] = Field(description="nominal quota per flavor/resource")
    usage: dict[str, str] = Field(description="quota held by admitted Workloads per flavor/resource")
    pending: int = Field(default=0, description="Workloads waiting in this ClusterQueue's LocalQueues")


class QueuePage(BaseModel):
    configured: bool = Field(description="False: no ClusterQueues / quotas configured, queue names only")
    items: list[QueueItem]
    cluster_queues: list[ClusterQueueItem] = Field(default_factory=list)


class ActionResult(BaseModel):
    message: str


class PinBody(BaseModel):
    cluster: str | None = Field(default=None, description="the cluster to pin to; null removes the pin")


class Owner(BaseModel):
    message: str
