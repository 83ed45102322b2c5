"""batch/v1 Job: created as is; the cluster's own Job controller runs it, so the render plans nothing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from federation import labels as mkd_labels
from federation.kube import Resource
from worker_agent.reconcilers.base import Observed, Plan


class BatchJobPassThrough:
    """The agent only creates, mirrors and deletes a batch Job; ``kubernetes.io/job-controller`` runs it."""

    kind = "Job"
    children: tuple[Resource, ...] = ()

    def child_selector(self, job: Mapping[str, Any]) -> str:
        return mkd_labels.origin_selector("none")

    def render(self, observed: Observed) -> Plan:
        return Plan()
