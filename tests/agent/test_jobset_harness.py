"""In-memory driver for the MPIJob / JobSet / TrainJob renders (no tests here; shared by their tests).

Applies a Plan the way the apply loop does: deletes, creates (controller ownerRef to the job, a
uid per object), full-object updates, the status write; pass by pass on an injected clock.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from worker_agent.reconcilers.base import Observed, Plan, Reconciler

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def ts(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Sim:
    reconciler: Reconciler
    job: dict[str, Any] | None
    now: datetime = T0
    objects: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    extra: dict[str, Any] | None = None
    plans: list[Plan] = field(default_factory=list)

    def __post_init__(self) -> None:
        for res in self.reconciler.children:
            self.objects.setdefault(res.plural, {})
        if self.job is not None:
            self.job["metadata"].setdefault("uid", "uid-" + self.job["metadata"]["name"])
            self.job["metadata"].setdefault("namespace", "default")
            self.job["metadata"].setdefault("creationTimestamp", ts(self.now))

    def step(self) -> Plan:
        assert self.job is not None
        observed = Observed(job=copy.deepcopy(self.job),
                            children={k: [copy.deepcopy(o) for o in v.values()] for k, v in self.objects.items()},
                            now=self.now)
        if self.extra is not None:
            observed.extra = copy.deepcopy(self.extra)  # type: ignore[attr-defined]
        plan = self.reconciler.render(observed)
        for res, name in plan.deletes:
            self.objects[res.plural].pop(name, None)
        for res, body in plan.creates:
            body = copy.deepcopy(body)
            name = body["metadata"]["name"]
            assert name not in self.objects[res.plural], f"create of existing {res.plural}/{name}"
            body["metadata"]["ownerReferences"] = [{"uid": self.job["metadata"]["uid"], "controller": True}]
            body["metadata"]["uid"] = f"uid-{res.plural}-{name}"
            body["metadata"]["creationTimestamp"] = ts(self.now)
            if res.plural == "pods":
                body["status"] = {"phase": "Pending"}
            self.objects[res.plural][name] = body
        for res, body in plan.updates:
            self.objects[res.plural][body["metadata"]["name"]] = copy.deepcopy(body)
        if plan.status is not None:
            self.job["status"] = copy.deepcopy(plan.status)
        self.events += plan.events
        if plan.delete_job:
            self.job = None
        self.plans.append(plan)
        return plan

    def settle(self, limit: int = 6) -> Plan:
        plan = self.step()
        for _ in range(limit):
            if not (plan.creates or plan.deletes or plan.updates or plan.status) or self.job is None:
                return plan
            plan = self.step()
        return plan

    def obj(self, plural: str, name: str) -> dict[str, Any]:
        return self.objects[plural][name]

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def conditions(self) -> list[tuple[str, str, str]]:
        assert self.job is not None
        return [(c["type"], c["status"], c["reason"]) for c in (self.job.get("status") or {}).get("conditions", [])]
