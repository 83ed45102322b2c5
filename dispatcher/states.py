"""The states a Workload and a Placement can be in, and the one table of legal transitions.

One vocabulary everywhere: the ``state`` columns of ``workloads`` and ``placements``, ``mkctl``'s ``--state``
filters and columns, the HTTP API and the demo all use these values (they are ``StrEnum``, so a member equals
its string and goes into SQL as is). Every state change the engine makes passes :func:`transition`, so a state
can only change along an edge of :data:`TRANSITIONS`; anything else is a bug, raised as
:class:`IllegalTransition`.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import TypeVar


class WorkloadState(StrEnum):
    """A Workload (``workloads.state``):

    | state | meaning |
    |---|---|
    | pending | waits for a Cluster (or for a fitting one) |
    | placed | a Place was sent, no agent has answered yet |
    | running | an agent accepted it; its worker copy exists and may run |
    | suspended | the Job is suspended on the manager (``spec.suspend`` / ``runPolicy.suspend``): never placed, or its worker copy is suspended too |
    | finished / failed | the worker Job succeeded / failed (or placement gave up) |
    | rejected | mkd cannot run it as it is (invalid, managedBy changed); a corrected spec makes it pending |
    | deleted | the manager Job is gone (terminal) |
    """
    PENDING = "pending"
    PLACED = "placed"
    RUNNING = "running"
    SUSPENDED = "suspended"
    FINISHED = "finished"
    FAILED = "failed"
    REJECTED = "rejected"
    DELETED = "deleted"


class PlacementState(StrEnum):
    """A Placement (``placements.state``, one row per attempt): ``sent`` → ``accepted`` → ``running``
    (the worker Job started), ``suspended`` while the worker copy is suspended, and the ends
    ``finished``, ``failed``, ``rejected`` (by the agent), ``deleted`` (mkd deleted the copy) and
    ``lost`` (the copy or its cluster vanished).
    """
    SENT = "sent"
    ACCEPTED = "accepted"
    RUNNING = "running"
    SUSPENDED = "suspended"
    FINISHED = "finished"
    FAILED = "failed"
    REJECTED = "rejected"
    DELETED = "deleted"
    LOST = "lost"


W = WorkloadState
P = PlacementState

_WORKLOAD: dict[WorkloadState, frozenset[WorkloadState]] = {
    W.PENDING: frozenset({W.PLACED, W.SUSPENDED, W.REJECTED, W.DELETED}),
    W.PLACED: frozenset({W.RUNNING, W.SUSPENDED, W.PENDING, W.FINISHED, W.FAILED, W.REJECTED, W.DELETED}),
    W.RUNNING: frozenset({W.SUSPENDED, W.PENDING, W.FINISHED, W.FAILED, W.REJECTED, W.DELETED}),
    W.SUSPENDED: frozenset({W.PENDING, W.PLACED, W.RUNNING, W.FINISHED, W.FAILED, W.REJECTED, W.DELETED}),
    W.FINISHED: frozenset({W.REJECTED, W.DELETED}),
    W.FAILED: frozenset({W.REJECTED, W.DELETED}),
    W.REJECTED: frozenset({W.PENDING, W.SUSPENDED, W.DELETED}),
    W.DELETED: frozenset(),
}
_PLACEMENT: dict[PlacementState, frozenset[PlacementState]] = {
    P.SENT: frozenset({P.ACCEPTED, P.RUNNING, P.SUSPENDED, P.FINISHED, P.FAILED, P.REJECTED, P.DELETED, P.LOST}),
    P.ACCEPTED: frozenset({P.RUNNING, P.SUSPENDED, P.FINISHED, P.FAILED, P.REJECTED, P.DELETED, P.LOST}),
    P.RUNNING: frozenset({P.SUSPENDED, P.FINISHED, P.FAILED, P.REJECTED, P.DELETED, P.LOST}),
    P.SUSPENDED: frozenset({P.ACCEPTED, P.FINISHED, P.FAILED, P.REJECTED, P.DELETED, P.LOST}),
    P.FINISHED: frozenset({P.DELETED}),
    P.FAILED: frozenset({P.DELETED}),
    P.REJECTED: frozenset(),
    P.DELETED: frozenset(),
    P.LOST: frozenset(),
}
TRANSITIONS: Mapping[type, Mapping[StrEnum, frozenset[StrEnum]]] = {
    WorkloadState: _WORKLOAD, PlacementState: _PLACEMENT}  # type: ignore[dict-item]
"""Per state type, from each state the states it may go to (staying in a state is always allowed)."""

S = TypeVar("S", WorkloadState, PlacementState)


class IllegalTransition(ValueError):
    """A state change the table does not allow: a bug in the caller, never the user's doing."""


def transition(old: S | str, new: S) -> S:
    """``new`` if a ``type(new)`` may go from ``old`` to it, else :class:`IllegalTransition`."""
    kind = type(new)
    allowed = TRANSITIONS[kind].get(old)  # type: ignore[call-overload,arg-type]  # a StrEnum member hashes as its string
    if allowed is None:
        raise IllegalTransition(f"{old!r} is not a {kind.__name__}")
    if old != new and new not in allowed:
        raise IllegalTransition(f"a {kind.__name__} cannot go from {kind(old)} to {new}")
    return new


_FIRST: Mapping[type, frozenset[StrEnum]] = {
    WorkloadState: frozenset({W.PENDING, W.SUSPENDED, W.REJECTED}), PlacementState: frozenset({P.SENT})}


def initial(state: S) -> S:
    """``state`` if a new row may start in it, else :class:`IllegalTransition`: a Workload is claimed
    ``pending``, ``suspended`` or ``rejected``, a Placement starts ``sent``. Inserts pass here as state
    changes pass :func:`transition`."""
    if state not in _FIRST[type(state)]:
        raise IllegalTransition(f"a {type(state).__name__} cannot start as {state}")
    return state


def member(kind: type[S], value: str) -> S:
    """``kind(value)`` by a dict lookup (an Enum call costs a few microseconds; the engine makes several a Job)."""
    found = _MEMBERS[kind].get(value)
    if found is None:
        return kind(value)  # raises the ValueError a bad value always raised
    return found  # type: ignore[return-value]


def parse(kind: type[S], value: str) -> S:
    """A state from user input (``--state``, an API query): a clear error naming every valid value."""
    try:
        return kind(value.strip().lower())
    except ValueError:
        valid = ", ".join(s.value for s in kind)
        raise ValueError(f"unknown {kind.__name__} {value!r}; use one of: {valid}") from None


_MEMBERS: dict[type, dict[str, StrEnum]] = {k: {m.value: m for m in k} for k in (WorkloadState, PlacementState)}

WORKLOAD_LIVE = tuple(s for s in WorkloadState if s is not W.DELETED)
"""Workloads whose manager Job should still exist."""
PLACEMENT_ACTIVE = (P.SENT, P.ACCEPTED, P.RUNNING, P.SUSPENDED)
"""The placement is current and not ended: its worker copy exists (or is about to)."""
PLACEMENT_HOLDS_CAPACITY = (P.SENT, P.ACCEPTED, P.RUNNING)
"""The placement's pods hold (or are about to hold) room on its Cluster; a suspended copy has no pods."""
PLACEMENT_KEPT = (*PLACEMENT_ACTIVE, P.FINISHED, P.FAILED)
"""The worker copy still exists (finished copies stay until the manager Job is deleted)."""
