"""Preemption: which admitted Workloads to evict so a pending one gets its quota, pure, as Kueue decides.

Candidates are those Kueue's policies of the preemptor's ClusterQueue allow, using a (flavor, resource)
the preemptor needs: ``withinClusterQueue`` (``LowerPriority``, ``LowerOrNewerEqualPriority``) in its own
ClusterQueue, and ``reclaimWithinCohort`` (``LowerPriority``, ``Any``) only in ClusterQueues of its cohort
tree that are above their nominal quota. A candidate whose ClusterQueue the preemptor is entitled to
reclaim from (the preemptor fits its own nominal quota, or a cohort on its path to the root does) may go
whatever the preemptor then borrows; another goes only if the preemptor will not borrow, or under
``borrowWithinCohort: LowerPriority`` (up to ``maxPriorityThreshold``) while it borrows. The order is
Kueue's: other ClusterQueues' Workloads before the preemptor's own, then lowest priority, then most
recently admitted; candidates are removed in that order, skipping one whose ClusterQueue
is no longer above its nominal quota, until the preemptor fits, and then each one not needed is given
back, last first (Kueue's ``classicalPreemptions``). With fair sharing the candidates are taken by
:mod:`~dispatcher.queueing.fairshare`. mkd places on clusters, so one step follows Kueue's: Kueue's
order leaves equal candidates (same priority and admission time) in an arbitrary order (their uids);
mkd takes the most recently queued first, and among the sets those ties allow mkd prefers Kueue's own set when its room is on one cluster where the preemptor fits,
else the smallest such set; it never takes a Workload outside these sets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from dispatcher.queueing import api
from dispatcher.queueing.quota import FR, ZERO, Node, QuotaTree

WITHIN, RECLAIM, WITHOUT_BORROWING, WHILE_BORROWING = "within", "reclaim", "without-borrowing", "while-borrowing"
REASON = {WITHIN: "InClusterQueue", RECLAIM: "InCohortReclamation", WITHOUT_BORROWING: "InCohortReclamation",
          WHILE_BORROWING: "InCohortReclaimWhileBorrowing"}
"""Kueue's preemption reason (the Preempted condition's reason) of each kind of candidate."""


@dataclass(frozen=True)
class Candidate:
    """An admitted Workload holding quota."""

    uid: str
    cq: str
    priority: int
    queued_at: float
    admitted_at: float
    cluster: str | None
    usage: Mapping[FR, Decimal]


@dataclass(frozen=True)
class Preemptor:
    """The pending Workload: its ClusterQueue, priority, queue time and what it asks of each (flavor,
    resource) that needs preemption."""

    cq: api.ClusterQueue
    priority: int
    queued_at: float
    request: Mapping[FR, Decimal]


@dataclass(frozen=True)
class _Cand:
    c: Candidate
    kind: str
    lca: Node | None   # the cohort it was found under (its validity is checked up to there)


def allows(policy: str, p: Preemptor, c: Candidate) -> bool:
    """Kueue's ``SatisfiesPreemptionPolicy``."""
    if policy == "Any":
        return True
    if policy == "LowerPriority":
        return c.priority < p.priority
    if policy == "LowerOrNewerEqualPriority":
        return c.priority < p.priority or (c.priority == p.priority and p.queued_at < c.queued_at)
    return False


def _uses(c: Candidate, frs: Iterable[FR]) -> bool:
    return any(c.usage.get(fr, ZERO) > 0 for fr in frs)


def _within_nominal(node: Node, frs: Iterable[FR]) -> bool:
    """Kueue's ``IsWithinNominalInResources``: usage within the node's subtree quota for every fr."""
    return all(node.usage.get(fr, ZERO) <= node.subtree.get(fr, ZERO) for fr in frs)


def _fits_in_quota(node: Node, request: Mapping[FR, Decimal]) -> tuple[bool, dict[FR, Decimal]]:
    fits = all(node.subtree.get(fr, ZERO) >= node.usage.get(fr, ZERO) + v for fr, v in request.items())
    rest = {fr: max(ZERO, v - max(ZERO, node.local(fr) - node.usage.get(fr, ZERO))) for fr, v in request.items()}
    return fits, rest


def order_key(c: Candidate, preemptor_cq: str, prefer: str | None = None
              ) -> tuple[bool, int, float, bool, float, str]:
    """Kueue's ``CandidatesOrdering``. Kueue leaves candidates admitted at the same time in uid order (an
    arbitrary one): mkd takes ``prefer``'s first (a cluster), then the most recently queued."""
    return (c.cq == preemptor_cq, c.priority, -c.admitted_at, prefer is not None and c.cluster != prefer,
            -c.queued_at, c.uid)


def _classify(p: Preemptor, c: Candidate, advantage: bool) -> str | None:
    pol = p.cq.preemption
    if c.cq == p.cq.name:
        return WITHIN if allows(pol.within_cluster_queue, p, c) else None
    if not allows(pol.reclaim_within_cohort, p, c):
        return None
    if advantage:
        return RECLAIM
    if pol.borrow_within_cohort != "LowerPriority" or c.priority >= p.priority or (
            pol.max_priority_threshold is not None and c.priority > pol.max_priority_threshold):
        return WITHOUT_BORROWING
    return WHILE_BORROWING


def _collect(p: Preemptor, by_cq: Mapping[str, list[Candidate]], tree: QuotaTree
             ) -> tuple[list[_Cand], list[_Cand], list[_Cand]]:
    """(hierarchy, priority, same-queue) candidates as Kueue's candidate generator finds them."""
    frs = list(p.request)
    same = []
    if p.cq.preemption.within_cluster_queue != "Never":
        same = [_Cand(c, WITHIN, None) for c in by_cq.get(p.cq.name, ()) if _uses(c, frs)
                and _classify(p, c, False) == WITHIN]
    hier: list[_Cand] = []
    prio: list[_Cand] = []
    me = tree.queues.get(p.cq.name)
    if me is None or me.parent is None or p.cq.preemption.reclaim_within_cohort == "Never":
        return hier, prio, same
    advantage, rest = _fits_in_quota(me, p.request)
    previous: Node | None = None
    current: Node | None = me.parent
    while current is not None:
        into = hier if advantage else prio
        _subtree(p, current, current, previous, advantage, by_cq, frs, me, into)
        fits, rest = _fits_in_quota(current, rest)
        advantage = advantage or fits
        previous, current = current, current.parent
    return hier, prio, same


def _subtree(p: Preemptor, node: Node, lca: Node, skip: Node | None, advantage: bool,
             by_cq: Mapping[str, list[Candidate]], frs: list[FR], me: Node, into: list[_Cand]) -> None:
    for child in node.children:
        if child is skip or child is me or _within_nominal(child, frs):
            continue  # a subtree or ClusterQueue within its quota is never reclaimed from
        if child.is_cohort:
            _subtree(p, child, lca, skip, advantage, by_cq, frs, me, into)
            continue
        for c in by_cq.get(child.name, ()):
            kind = _classify(p, c, advantage) if _uses(c, frs) else None
            if kind is not None:
                into.append(_Cand(c, kind, lca))


def _valid(x: _Cand, borrowing: bool, tree: QuotaTree, frs: list[FR]) -> bool:
    """Kueue's ``candidateIsValid``, against the tree as earlier removals left it."""
    if x.kind == WITHIN:
        return True
    if borrowing and x.kind == WITHOUT_BORROWING:
        return False
    node: Node | None = tree.queues.get(x.c.cq)
    while node is not None and node is not x.lca:
        if _within_nominal(node, frs):
            return False
        node = node.parent
    return True


def classical(p: Preemptor, admitted: Iterable[Candidate], tree: QuotaTree, fits: Callable[[bool], bool],
              prefer: str | None = None) -> list[tuple[Candidate, str]] | None:
    """Kueue's classical preemption: ``(victim, reason)`` so that ``fits(allow_borrowing)`` holds, or
    None. ``prefer`` breaks ties in Kueue's order towards one cluster. The tree is left as it was."""
    by_cq: dict[str, list[Candidate]] = {}
    for c in admitted:
        by_cq.setdefault(c.cq, []).append(c)
    hier, prio, same = _collect(p, by_cq, tree)
    for group in (hier, prio, same):
        group.sort(key=lambda x: order_key(x.c, p.cq.name, prefer))
    ordered = hier + prio + same
    if not ordered:
        return None
    frs = list(p.request)
    me = tree.queues[p.cq.name]
    forbidden = p.cq.preemption.borrow_within_cohort != "LowerPriority"
    under_nominal = all(me.nominal.get(fr, ZERO) > me.usage.get(fr, ZERO) for fr in frs)
    if (not hier and not prio) or (forbidden and not under_nominal):
        attempts: tuple[bool, ...] = (True,)
    elif forbidden and not hier:
        attempts = (False, True)
    else:
        attempts = (True, False)
    for borrowing in attempts:
        removed: list[_Cand] = []
        try:
            for x in ordered:
                if not _valid(x, borrowing, tree, frs):
                    continue
                tree.remove(x.c.cq, x.c.usage)
                removed.append(x)
                if fits(borrowing):
                    return [(y.c, REASON[y.kind]) for y in _fill_back(removed, tree, fits, borrowing)]
        finally:
            for x in removed:
                tree.add(x.c.cq, x.c.usage)
    return None


def _fill_back(removed: list[_Cand], tree: QuotaTree, fits: Callable[[bool], bool], borrowing: bool) -> list[_Cand]:
    """Give back, last removed first (but the one that made it fit), every victim not needed. The
    victims stay removed from the tree (the caller restores them)."""
    victims = list(removed)
    for x in reversed(removed[:-1]):
        tree.add(x.c.cq, x.c.usage)
        if fits(borrowing):
            victims.remove(x)
            removed.remove(x)   # back in the tree: the caller must not add it again
        else:
            tree.remove(x.c.cq, x.c.usage)
    return victims


def fair_candidates(p: Preemptor, admitted: Iterable[Candidate], tree: QuotaTree) -> list[Candidate]:
    """Fair sharing's candidates (Kueue's ``findCandidates``) in Kueue's order: the preemptor's own
    ClusterQueue by ``withinClusterQueue``; every ClusterQueue of its cohort tree above its nominal
    quota by ``reclaimWithinCohort``."""
    frs = list(p.request)
    pol = p.cq.preemption
    me = tree.queues.get(p.cq.name)
    out = []
    for c in admitted:
        if not _uses(c, frs):
            continue
        if c.cq == p.cq.name:
            if pol.within_cluster_queue != "Never" and allows(pol.within_cluster_queue, p, c):
                out.append(c)
            continue
        node = tree.queues.get(c.cq)
        if me is None or me.parent is None or node is None or node.parent is None or node.root() is not me.root():
            continue
        borrowing = any(node.usage.get(fr, ZERO) > node.nominal.get(fr, ZERO) for fr in frs)
        if borrowing and pol.reclaim_within_cohort != "Never" and allows(pol.reclaim_within_cohort, p, c):
            out.append(c)
    out.sort(key=lambda c: order_key(c, p.cq.name))
    return out


def choose(sets: Sequence[list[tuple[Candidate, str]]], fits_on: Callable[[str, list[Candidate]], bool]
           ) -> tuple[list[tuple[Candidate, str]], str | None]:
    """mkd's step after Kueue's: ``sets[0]`` is Kueue's set, the others those that Kueue's ties allow.
    Kueue's set when its victims are on one cluster where the preemptor then fits; else the smallest
    such set; else Kueue's set (the preemptor then waits for the room to be freed where it fits).
    Returns the set and the cluster its room is on (None: no single cluster)."""
    def cluster_of(victims: list[tuple[Candidate, str]]) -> str | None:
        names = {c.cluster for c, _ in victims}
        if len(names) != 1:
            return None
        name = names.pop()
        return name if name is not None and fits_on(name, [c for c, _ in victims]) else None
    first = cluster_of(sets[0])
    if first is not None:
        return sets[0], first
    good = [(len(s), n, s, where) for n, s in enumerate(sets[1:], 1) if (where := cluster_of(s)) is not None]
    if good:
        _, _, best, where = min(good, key=lambda g: (g[0], g[1]))
        return best, where
    return sets[0], None
