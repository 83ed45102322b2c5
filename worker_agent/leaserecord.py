"""The agent's lease, written into its own worker cluster for the fencer to read.

The dispatcher's lease lives in the agent's memory (``worker_agent.lease``); a frozen or hung agent
process can neither act on it nor say it ran out. So on every renewal the agent also writes a
``coordination.k8s.io/v1`` Lease, ``mkd-agent-<cluster>`` in its namespace: ``renewTime`` is the
agent's wall clock at the moment it measured its lease, and ``leaseDurationSeconds`` the whole
seconds from then until half of the agent's ``stop_before`` is left of the dispatcher's lease (rounded
down): a live agent suspends its Jobs itself first, and only an agent that did not gets the fencer
(``worker_agent.fencer``), a separate process, which stops every Job of the agent's origin once
``renewTime + leaseDurationSeconds`` has passed, still ``stop_before / 2`` before the lease ends. The
record never ends after the lease the dispatcher granted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from federation import labels
from federation.errors import NotFound
from federation.kube import LEASES, Kube


def record_name(cluster: str) -> str:
    return f"mkd-agent-{cluster}"


def micro_time(at: datetime) -> str:
    """A ``metav1.MicroTime`` as the API server writes it: RFC 3339, six fraction digits, UTC."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return None


@dataclass(frozen=True)
class Held:
    """What a record says: who holds it, renewed when, for how long."""

    holder: str
    renewed: datetime
    seconds: int

    @property
    def ends(self) -> datetime:
        """When the agent's Jobs must stop (the fencer stops them from then on)."""
        return self.renewed + timedelta(seconds=self.seconds)


def read(lease: dict[str, Any]) -> Held | None:
    """The record in a Lease object; None when it holds no renewal yet."""
    spec = lease.get("spec") or {}
    renewed = parse_time(spec.get("renewTime"))
    seconds = spec.get("leaseDurationSeconds")
    if renewed is None or not isinstance(seconds, int):
        return None
    return Held(str(spec.get("holderIdentity") or ""), renewed, seconds)


async def fetch(kube: Kube, namespace: str, cluster: str) -> Held | None:
    try:
        return read(await kube.get(LEASES, record_name(cluster), namespace))
    except NotFound:
        return None


def hold_seconds(remaining: float) -> int:
    """Whole seconds left before the fencer must act (rounded down: the record never outlasts the lease)."""
    return max(0, math.floor(remaining))


async def write(kube: Kube, namespace: str, cluster: str, *, origin: str, renewed: datetime, seconds: int) -> Held:
    """Record a renewal (merge patch; the Lease is created on first use). ``seconds`` must be above 0:
    the API server refuses ``leaseDurationSeconds`` 0, and a lease with no time left is not renewed."""
    if seconds <= 0:
        raise ValueError(f"leaseDurationSeconds must be above 0, got {seconds}")
    name = record_name(cluster)
    spec = {"holderIdentity": f"mkd-agent/{cluster}", "leaseDurationSeconds": seconds,
            "renewTime": micro_time(renewed)}
    try:
        obj = await kube.patch(LEASES, name, {"spec": spec}, namespace)
    except NotFound:
        obj = await kube.create(LEASES, {
            "apiVersion": LEASES.api_version, "kind": LEASES.kind,
            "metadata": {"name": name, "namespace": namespace, "labels": {labels.ORIGIN: origin}},
            "spec": {**spec, "acquireTime": micro_time(renewed)}}, namespace)
    held = read(obj)
    assert held is not None, f"the API server dropped the renewal of Lease {namespace}/{name}"
    return held
