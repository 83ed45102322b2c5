"""A tiny in-memory cluster for driving a reconciler's pure render pass by pass (no API server)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from worker_agent.reconcilers.base import Observed, Plan, Reconciler

EXAMPLES = Path(__file__).parent / "examples"
T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def example(name: str, namespace: str = "default") -> dict[str, Any]:
    job: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    job["metadata"].setdefault("namespace", namespace)
    job["metadata"]["uid"] = "uid-" + job["metadata"]["name"]
    return job


@dataclass
class MemCluster:
    reconciler: Reconciler
    job: dict[str, Any] | None
    now: datetime = T0
    objects: dict[str, dict[str, dict[str, Any]]] = field(default_factory=lambda: {"pods": {}, "services": {}})
    events: list[tuple[str, str, str]] = field(default_factory=list)
    last: Plan | None = None

    def step(self) -> Plan:
        assert self.job is not None
        observed = Observed(job=copy.deepcopy(self.job),
                            children={k: [copy.deepcopy(o) for o in v.values()] for k, v in self.objects.items()},
                            now=self.now)
        plan = self.reconciler.render(observed)
        for res, name in plan.deletes:
            self.objects[res.plural].pop(name, None)
        for res, body in plan.creates:
            body = copy.deepcopy(body)
            body["metadata"]["ownerReferences"] = [{"uid": self.job["metadata"]["uid"], "controller": True}]
            if res.plural == "pods":
                body["status"] = {"phase": "Pending"}
            self.objects[res.plural][body["metadata"]["name"]] = body
        if plan.status is not None:
            self.job["status"] = plan.status
        self.events += plan.events
        if plan.delete_job:
            self.job = None
        self.last = plan
        return plan

    def settle(self, limit: int = 5) -> None:
        """Render until a pass changes nothing."""
        for _ in range(limit):
            plan = self.step()
            if not (plan.creates or plan.deletes or plan.status) or self.job is None:
                return

    def pod(self, name: str) -> dict[str, Any]:
        return self.objects["pods"][name]

    def set_phase(self, name: str, phase: str, exit_code: int | None = None, container: str = "pytorch") -> None:
        pod = self.pod(name)
        pod["status"] = {"phase": phase}
        if exit_code is not None:
            pod["status"]["containerStatuses"] = [
                {"name": container, "restartCount": 0, "state": {"terminated": {"exitCode": exit_code}}}]

    def all_phase(self, phase: str) -> None:
        for name in list(self.objects["pods"]):
            self.set_phase(name, phase, 0 if phase == "Succeeded" else None)

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def conditions(self) -> list[tuple[str, str, str]]:
        assert self.job is not None
        return [(c["type"], c["status"], c["reason"]) for c in self.job.get("status", {}).get("conditions", [])]
