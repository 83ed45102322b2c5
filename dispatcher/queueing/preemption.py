"""Preemption: which admitted Workloads to evict so a pending one gets its quota, pure.

Kueue's three policies of a ClusterQueue decide who may be a candidate:

- ``withinClusterQueue`` — ``LowerPriority``: admitted Workloads of the same ClusterQueue with a lower
  priority; ``LowerOrNewerEqualPriority``: also those of equal priority queued after the preemptor.
- ``reclaimWithinCohort`` — when the preemptor fits within its ClusterQueue's nominal quota, Workloads
  of other ClusterQueues of its cohort that are borrowing (``LowerPriority``: lower priority only,
  ``Any``: any priority).
- ``borrowWithinCohort.policy: LowerPriority`` — when the preemptor must borrow, lower-priority
  Workloads of other borrowing ClusterQueues, at most ``maxPriorityThreshold`` when set.

Candidates are taken from borrowing ClusterQueues first, then lowest priority, then most recently
admitted, removed from the quota until the preemptor's flavors can be assigned; then every victim
not needed is given back (a minimal set). With fair sharing on, the candidates are those of
``withinClusterQueue`` and ``reclaimWithinCohort`` (whether or not the preemptor borrows), and
:mod:`~dispatcher.queueing.fairshare` chooses among them by share. mkd's quota is federation-wide but the preemptor must run
on one cluster: the candidates of each cluster are tried alone first, and the smallest set that
frees the room on one cluster wins; only when no single cluster can, a set across clusters is taken.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal

from dispatcher.queueing import api
from dispatcher.queueing.quota import ZERO, QuotaTree

FR = tuple[str, str]


def _borrowing(tree: QuotaTree, cq: str) -> bool:
    node = tree.queues.get(cq)
    return node is not None and any(used > node.nominal.get(fr, ZERO) for fr, used in node.usage.items())


def candidates(preemptor_cq: api.ClusterQueue, priority: int, queued_at: float, within_nominal: bool,
               admitted: list[tuple[str, str, int, float, float, str | None]], tree: QuotaTree, *,
               fair: bool = False) -> list[tuple[str, str, int, float, float, str | None]]:
    """Admitted Workloads (uid, cq, priority, queued_at, admitted_at, cluster) the policies allow, in the
    order they are taken: borrowing ClusterQueues first, lowest priority, most recently admitted.
    ``fair``: fair sharing's candidates (``reclaimWithinCohort`` from every borrowing ClusterQueue of
    the tree, ``borrowWithinCohort`` unused), as Kueue finds them."""
    pol = preemptor_cq.preemption
    root = tree.root_of(preemptor_cq.name) if preemptor_cq.cohort else None
    out = []
    for item in admitted:
        _, cq, prio, queued, _, _ = item
        if cq == preemptor_cq.name:
            if pol.within_cluster_queue == "LowerPriority" and prio < priority:
                out.append(item)
            elif pol.within_cluster_queue == "LowerOrNewerEqualPriority" and (
                    prio < priority or (prio == priority and queued > queued_at)):
                out.append(item)
            continue
        if root is None or cq not in tree.queues or tree.root_of(cq) != root or not _borrowing(tree, cq):
            continue
        if within_nominal or fair:
            if pol.reclaim_within_cohort == "Any" or (pol.reclaim_within_cohort == "LowerPriority" and prio < priority):
                out.append(item)
        elif pol.borrow_within_cohort == "LowerPriority" and prio < priority and (
                pol.max_priority_threshold is None or prio <= pol.max_priority_threshold):
            out.append(item)
    out.sort(key=lambda c: (not _borrowing(tree, c[1]), c[2], -c[4], -c[3]))
    return out


def minimal_set(ordered: list[str], usage_of: Callable[[str], tuple[str, dict[FR, Decimal]]], tree: QuotaTree,
                fits: Callable[[], bool]) -> list[str] | None:
    """Remove candidates in order until ``fits()``; then give back each one not needed. The tree is
    left as it was. None when even all of them are not enough."""
    removed: list[str] = []
    found = False
    for uid in ordered:
        cq, usage = usage_of(uid)
        tree.remove(cq, usage)
        removed.append(uid)
        if fits():
            found = True
            break
    if not found:
        for uid in removed:
            cq, usage = usage_of(uid)
            tree.add(cq, usage)
        return None
    victims = list(removed)
    for uid in reversed(removed[:-1]):  # the last one was needed to fit
        cq, usage = usage_of(uid)
        tree.add(cq, usage)
        if fits():
            victims.remove(uid)
        else:
            tree.remove(cq, usage)
    for uid in victims:
        cq, usage = usage_of(uid)
        tree.add(cq, usage)
    return victims
