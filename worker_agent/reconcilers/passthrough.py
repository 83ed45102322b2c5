"""Kinds the worker cluster's own controller runs (``run_by`` operator: the batch Job): the render plans nothing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from federation import labels as mkd_labels
from federation.kube import Resource
from worker_agent.reconcilers.base import Observed, Plan, Reconciler


class PassThrough(Reconciler):
    """The agent only creates, mirrors and deletes the copy; the cluster's controller (for a batch Job
    ``kubernetes.io/job-controller``) runs it."""

    children: tuple[Resource, ...] = ()

    def __init__(self, kind: str) -> None:
        self._kind = kind

    @property
    def kind(self) -> str:
        return self._kind

    def child_selector(self, job: Mapping[str, Any]) -> str:
        return mkd_labels.origin_selector("none")

    def render(self, observed: Observed) -> Plan:
        return Plan()
