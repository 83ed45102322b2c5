"""Fair sharing: weighted dominant resource shares in cohort trees, and preemption by them, pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal

from dispatcher.queueing.catalog import Catalog
from dispatcher.queueing.quota import FR, ZERO, Node, QuotaTree

LESS_THAN_OR_EQUAL_TO_FINAL_SHARE = "LessThanOrEqualToFinalShare"
LESS_THAN_INITIAL_SHARE = "LessThanInitialShare"
STRATEGIES = (LESS_THAN_OR_EQUAL_TO_FINAL_SHARE, LESS_THAN_INITIAL_SHARE)
ALLOWED = ((LESS_THAN_OR_EQUAL_TO_FINAL_SHARE,), (LESS_THAN_INITIAL_SHARE,),
           (LESS_THAN_OR_EQUAL_TO_FINAL_SHARE, LESS_THAN_INITIAL_SHARE))
"""The lists Kueue's configuration accepts (the second strategy, when there is one, is LessThanInitialShare)."""
IN_CLUSTER_QUEUE = "InClusterQueue"
IN_COHORT_RECLAMATION = "InCohortReclamation"
IN_COHORT_FAIR_SHARING = "InCohortFairSharing"
INFINITE = Decimal("Infinity")


def allowed(value: Sequence[str]) -> bool:
    return tuple(value) in ALLOWED


def _strategy(name: str) -> Callable[[Decimal, Decimal, Decimal], bool]:
    if name == LESS_THAN_OR_EQUAL_TO_FINAL_SHARE:
        return lambda preemptor_new, target_old, target_new: preemptor_new <= target_new
    return lambda preemptor_new, target_old, target_new: preemptor_new < target_old


class Shares:
    """Shares of the nodes of one quota tree, with the weights of the catalog's objects.

    **Share.** The share of a node (a ClusterQueue or a Cohort under a cohort) is the largest, over flavor
    and resource, of what it uses above its own quota (a ClusterQueue: its nominal quota; a Cohort: its
    subtree quota) divided by what the root of its tree can lend of that resource, divided by the node's
    ``fairSharing.weight``. Weight 0: infinite as soon as it borrows anything (it only gets what nobody
    else wants). Admission prefers the lowest share after the admission (``scheduler.Queues``).
    """

    def __init__(self, tree: QuotaTree, catalog: Catalog) -> None:
        self.tree = tree
        self.catalog = catalog

    def weight(self, node: Node) -> Decimal:
        if node.is_cohort:
            cohort = self.catalog.cohorts.get(node.name)
            return cohort.weight if cohort is not None else Decimal(1)
        spec = self.catalog.cluster_queues.get(node.name)
        return spec.weight if spec is not None else Decimal(1)

    def of(self, node: Node, extra: Mapping[FR, Decimal] | None = None) -> Decimal:
        """The weighted dominant share of ``node`` (with ``extra`` usage added to it, not to its parents)."""
        if node.parent is None:
            return ZERO
        root = node.root()
        worst = ZERO
        own = node.subtree if node.is_cohort else node.nominal
        for fr in set(node.usage) | set(extra or {}):
            above = node.usage.get(fr, ZERO) + (extra or {}).get(fr, ZERO) - own.get(fr, ZERO)
            lendable = root.subtree.get(fr, ZERO)
            if above > 0 and lendable > 0:
                worst = max(worst, above / lendable)
        weight = self.weight(node)
        if weight <= 0:
            return INFINITE if worst > 0 else ZERO
        return worst / weight


def _path(node: Node) -> list[Node]:
    out = [node]
    while out[-1].parent is not None:
        out.append(out[-1].parent)  # type: ignore[arg-type]
    return out


def almost_lcas(x: Node, y: Node) -> tuple[Node, Node]:
    """The children of the lowest common ancestor of ``x`` and ``y`` on the path to each (x, y in one tree)."""
    px, py = _path(x), _path(y)
    on_y = {id(n) for n in py}
    i = next(i for i, n in enumerate(px) if id(n) in on_y)
    j = next(j for j, n in enumerate(py) if n is px[i])
    return px[max(i - 1, 0)], py[max(j - 1, 0)]


class _Ordering:
    """Target ClusterQueues, the highest share first, walking down from the root (see :func:`preemptions`)."""

    def __init__(self, preemptor: Node, by_cq: dict[str, list[str]], shares: Shares) -> None:
        self.preemptor = preemptor
        self.by_cq = by_cq
        self.shares = shares
        self.above = {id(n) for n in _path(preemptor)[1:]}
        self.pruned: set[int] = set()

    def drop(self, node: Node) -> None:
        self.pruned.add(id(node))

    def next(self) -> Node | None:
        root = self.preemptor.root()
        while id(root) not in self.pruned:
            found = self._next(root)
            if found is not None:
                return found
        return None

    def _next(self, cohort: Node) -> Node | None:
        best_cq: tuple[Decimal, Node] | None = None
        best_cohort: tuple[Decimal, Node] | None = None
        for child in cohort.children:
            if id(child) in self.pruned:
                continue
            share = self.shares.of(child)
            if not child.is_cohort:
                if (share == 0 and child is not self.preemptor) or not self.by_cq.get(child.name):
                    self.pruned.add(id(child))
                elif best_cq is None or share >= best_cq[0]:
                    best_cq = (share, child)
            elif share == 0 and id(child) not in self.above:
                self.pruned.add(id(child))
            elif best_cohort is None or share >= best_cohort[0]:
                best_cohort = (share, child)
        if best_cq is None and best_cohort is None:
            self.pruned.add(id(cohort))
            return None
        if best_cohort is not None and (best_cq is None or best_cohort[0] >= best_cq[0]):
            return self._next(best_cohort[1])
        assert best_cq is not None
        return best_cq[1]


def preemptions(preemptor_cq: str, usage: Mapping[FR, Decimal], candidates: Sequence[tuple[str, str]],
                usage_of: Callable[[str], tuple[str, Mapping[FR, Decimal]]], tree: QuotaTree, shares: Shares,
                fits: Callable[[], bool], strategies: Sequence[str]) -> list[tuple[str, str]] | None:
    """Victims ``(uid, reason)`` so the preemptor (``usage`` in ``preemptor_cq``) fits, or None.

    ``candidates`` are ``(uid, cluster queue)`` in the order they are taken within each ClusterQueue
    (lowest priority, most recently admitted first); ``fits()`` checks the preemptor against the tree
    as it stands. The tree is left as it was.

    **Preemption** (Kueue's ``fairSharing.preemptionStrategies``, KEP 1714, rebuilt from its rules): the
    preemptor's usage is counted in its ClusterQueue for every share below. Target ClusterQueues are taken
    from the root down, always the child with the highest share (a Cohort on a tie, so the most unfair
    node inside it is found), skipping nodes that do not borrow (share 0), except the preemptor's own
    ClusterQueue and the Cohorts above it. From the preemptor's own ClusterQueue its candidates (by
    ``withinClusterQueue``) are taken one by one. From another ClusterQueue *y*, with *X* and *Y* the
    children of the lowest common ancestor of the two on their paths, a candidate is taken when the first
    strategy allows it:

    - ``LessThanOrEqualToFinalShare``: share(X) with the preemptor ≤ share(Y) without the candidate;
    - ``LessThanInitialShare``: share(X) with the preemptor < share(Y) as it is.

    then the order is computed again (shares changed). Candidates the first strategy refused go to the
    second one, when configured (it is always ``LessThanInitialShare``): one candidate per ClusterQueue.
    Once the preemptor fits, every victim not needed is given back, last taken kept (a minimal set).
    """
    me = tree.queues[preemptor_cq]
    by_cq: dict[str, list[str]] = {}
    for uid, cq in candidates:
        by_cq.setdefault(cq, []).append(uid)
    taken: list[tuple[str, str]] = []

    def take(uid: str, reason: str) -> None:
        cq, used = usage_of(uid)
        tree.remove(cq, used)
        taken.append((uid, reason))

    def fits_now() -> bool:  # the shares count the preemptor; the fit does not
        tree.remove(preemptor_cq, usage)
        try:
            return fits()
        finally:
            tree.add(preemptor_cq, usage)

    first = _strategy(strategies[0])
    fitted = False
    tree.add(preemptor_cq, usage)
    try:
        retry: dict[str, list[str]] = {}
        # within its nominal quota (counting itself), the preemptor reclaims whatever the shares say
        within = all(me.usage.get(fr, ZERO) <= me.nominal.get(fr, ZERO) for fr in usage)
        order = _Ordering(me, by_cq, shares)
        while not fitted and (target := order.next()) is not None:
            if target is me:
                take(by_cq[me.name].pop(0), IN_CLUSTER_QUEUE)
                fitted = fits_now()
                continue
            if within:
                take(by_cq[target.name].pop(0), IN_COHORT_RECLAMATION)
                fitted = fits_now()
                continue
            mine, theirs = almost_lcas(me, target)
            preemptor_new, target_old = shares.of(mine), shares.of(theirs)
            queue = by_cq[target.name]
            while queue:
                uid = queue.pop(0)
                cq, used = usage_of(uid)
                tree.remove(cq, used)
                target_new = shares.of(theirs)
                tree.add(cq, used)
                if first(preemptor_new, target_old, target_new):
                    take(uid, IN_COHORT_FAIR_SHARING)
                    fitted = fits_now()
                    break  # shares changed: choose the target again
                retry.setdefault(target.name, []).append(uid)
        if not fitted and len(strategies) > 1:
            order = _Ordering(me, retry, shares)
            while not fitted and (target := order.next()) is not None:
                mine, theirs = almost_lcas(me, target)
                if shares.of(mine) < shares.of(theirs):
                    take(retry[target.name].pop(0), IN_COHORT_FAIR_SHARING)
                    fitted = fits_now()
                order.drop(target)
    finally:
        tree.remove(preemptor_cq, usage)
    if not fitted:
        for uid, _ in taken:
            cq, used = usage_of(uid)
            tree.add(cq, used)
        return None
    victims = list(taken)
    for item in reversed(taken[:-1]):  # the last one taken was needed to fit
        cq, used = usage_of(item[0])
        tree.add(cq, used)
        if fits():
            victims.remove(item)
        else:
            tree.remove(cq, used)
    for uid, _ in victims:
        cq, used = usage_of(uid)
        tree.add(cq, used)
    return victims
