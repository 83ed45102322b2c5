"""The reconciler contract: ``Observed`` in, ``Plan`` out, one pure ``render`` per JobKind.

A reconciler never writes to the API server. One that needs more input than the job and its children
(TrainJob: its runtime) overrides ``prepare``, which the apply loop awaits before each ``render`` and hands
over as ``Observed.extra``. The apply loop (``worker_agent.apply``) reads the job
and lists its children by ``child_selector``, calls ``render`` and carries out the Plan: creates, updates,
deletes, the status write (status subresource, only when changed), Events, and a requeue after
``requeue_after`` seconds for deadlines and TTLs. Children created from a Plan get an owner reference to the
job (controller, blockOwnerDeletion) added by the apply loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from federation.kube import Resource


@dataclass
class Observed:
    """What the apply loop saw just now."""

    job: dict[str, Any]
    """The worker Job as read now."""
    children: dict[str, list[dict[str, Any]]]
    """``Resource.plural`` -> objects matching ``child_selector``."""
    now: datetime
    extra: dict[str, Any] | None = None
    """What the reconciler's ``prepare`` returned (TrainJob: its runtime), read by the apply loop just before
    ``render``; None for reconcilers that need nothing more."""


@dataclass
class Plan:
    """What to do so the cluster matches the job; empty lists mean nothing to do."""

    creates: list[tuple[Resource, dict[str, Any]]] = field(default_factory=list)
    updates: list[tuple[Resource, dict[str, Any]]] = field(default_factory=list)
    deletes: list[tuple[Resource, str]] = field(default_factory=list)
    """(resource, name) in the job's namespace."""
    status: dict[str, Any] | None = None
    """The job's new full ``.status`` when it changed, else None."""
    events: list[tuple[str, str, str]] = field(default_factory=list)
    """(type, reason, message) Events on the job."""
    requeue_after: float | None = None
    """Seconds until a deadline or TTL falls due."""
    delete_job: bool = False
    """TTL expired: delete the job itself (children go by GC)."""
    report: dict[str, Any] | None = None
    """A status to report to the dispatcher without writing it (a pod group's: its pods' statuses, which are their
    kubelets' to write); the reporter sends it only when it changed."""


class Reconciler(Protocol):
    """One per JobKind the agent runs itself; a reconciler class names this protocol as its base, so the
    optional hooks (:meth:`prepare`, :meth:`settles_after`, :meth:`starting`) default to doing nothing.

    Deletes always bring events of their own.
    """

    @property
    def kind(self) -> str:
        """JobKind name (``PyTorchJob``, ``MPIJob``, ...)."""
        ...

    children: tuple[Resource, ...]
    """Resources the reconciler creates; the apply loop lists these by ``child_selector``."""

    reports_status: bool = False
    """The status reported for the job is the reconciler's ``Plan.report`` (a pod group's), not the job's own
    ``.status`` as the watch shows it; a report asked for again (a Resync) is a pass."""

    def child_selector(self, job: Mapping[str, Any]) -> str:
        """Label selector listing the job's children."""
        ...

    def render(self, observed: Observed) -> Plan:
        """Pure: compute the Plan from what was observed."""
        ...

    async def prepare(self, kube: KubeReader, job: Mapping[str, Any]) -> dict[str, Any] | None:
        """More input than the job and its children (TrainJob: its runtime), read just before each ``render``
        and handed over as ``Observed.extra``; None (the default) when the reconciler needs none."""
        return None

    def settles_after(self, status: Mapping[str, Any] | None) -> bool:
        """Whether a render right after the reconciler's own creates and a status write of ``status`` (None: no
        status write; the created children as the API server answered them) plans nothing more. The watch
        echoes of such writes then start no pass (``worker_agent.apply``). By default: never assumed."""
        return False

    def starting(self, job: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
        """Whether ``status`` is Running with replicas still to start, so the apply loop holds it as it holds
        Created (pods started moments apart then cost one status write). By default: never."""
        return False


class KubeReader(Protocol):
    """What :meth:`Reconciler.prepare` may call: reads of one object."""

    async def get(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]: ...
