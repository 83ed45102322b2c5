"""Quota in cohort trees: what a ClusterQueue may still reserve per (flavor, resource), pure.

Each ClusterQueue and each Cohort is a node. A node's *subtree quota* is its own nominal quota
plus what its children lend it (a child lends at most its ``lendingLimit``, all of its subtree
quota when that is null). What a node keeps for itself (*local quota*) is its subtree quota
minus its lending limit (nothing when the limit is null: it lends everything). Usage climbs the tree only for the part above a node's local quota, so a
ClusterQueue using less than its local quota never touches its cohort's pool. What a node may
still use is its unused local quota plus what its parent has available, capped by its
``borrowingLimit`` (null: no cap). This is Kueue's hierarchical-cohort arithmetic
(``pkg/cache/resource_node.go``), rebuilt from the rules, not the code.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from dispatcher.queueing import api
from dispatcher.queueing.catalog import Catalog

ZERO = Decimal(0)
FR = tuple[str, str]  # (flavor, resource)


@dataclass
class Node:
    name: str
    is_cohort: bool
    parent: Node | None = None
    children: list[Node] = field(default_factory=list)
    nominal: dict[FR, Decimal] = field(default_factory=dict)
    borrowing_limit: dict[FR, Decimal] = field(default_factory=dict)
    lending_limit: dict[FR, Decimal] = field(default_factory=dict)
    subtree: dict[FR, Decimal] = field(default_factory=dict)
    usage: dict[FR, Decimal] = field(default_factory=dict)

    def local(self, fr: FR) -> Decimal:
        """Kept for itself (guaranteed): subtree quota minus its lending limit; 0 with no limit (lends all)."""
        lend = self.lending_limit.get(fr)
        if self.parent is None:
            return self.subtree.get(fr, ZERO)
        return ZERO if lend is None else max(ZERO, self.subtree.get(fr, ZERO) - lend)

    def available(self, fr: FR) -> Decimal:
        """What this node may still use of ``fr`` (can be negative after a quota shrank)."""
        used = self.usage.get(fr, ZERO)
        if self.parent is None:
            return self.subtree.get(fr, ZERO) - used
        local = self.local(fr)
        local_left = max(ZERO, local - used)
        from_parent = self.parent.available(fr)
        limit = self.borrowing_limit.get(fr)
        if limit is not None:
            stored = self.subtree.get(fr, ZERO) - local
            used_in_parent = max(ZERO, used - local)
            from_parent = min(from_parent, stored - used_in_parent + limit)
        return local_left + max(ZERO, from_parent)

    def add(self, fr: FR, amount: Decimal) -> None:
        local_left = max(ZERO, self.local(fr) - self.usage.get(fr, ZERO))
        self.usage[fr] = self.usage.get(fr, ZERO) + amount
        if self.parent is not None and amount > local_left:
            self.parent.add(fr, amount - local_left)

    def remove(self, fr: FR, amount: Decimal) -> None:
        stored_above = self.usage.get(fr, ZERO) - self.local(fr)
        self.usage[fr] = self.usage.get(fr, ZERO) - amount
        if self.parent is not None and stored_above > 0:
            self.parent.remove(fr, min(amount, stored_above))

    def root(self) -> Node:
        node = self
        while node.parent is not None:
            node = node.parent
        return node


def _quotas(node: Node, groups: Iterable[api.ResourceGroup]) -> None:
    for g in groups:
        for f in g.flavors:
            for res, quota in f.resources.items():
                fr = (f.name, res)
                node.nominal[fr] = quota.nominal
                if quota.borrowing_limit is not None:
                    node.borrowing_limit[fr] = quota.borrowing_limit
                if quota.lending_limit is not None:
                    node.lending_limit[fr] = quota.lending_limit


class QuotaTree:
    """Nodes for every ClusterQueue and Cohort of a catalog; usage is added by the caller."""

    def __init__(self, catalog: Catalog) -> None:
        self.queues: dict[str, Node] = {}
        self.cohorts: dict[str, Node] = {}
        for name, cohort in catalog.cohorts.items():
            node = self.cohorts[name] = Node(name, True)
            _quotas(node, cohort.resource_groups)
        for name, cq in catalog.cluster_queues.items():
            node = self.queues[name] = Node(name, False)
            _quotas(node, cq.resource_groups)
            if cq.cohort:
                parent = self.cohorts.get(cq.cohort)
                if parent is None:  # a cohort named only by ClusterQueues needs no object
                    parent = self.cohorts[cq.cohort] = Node(cq.cohort, True)
                node.parent = parent
                parent.children.append(node)
        for name, cohort in catalog.cohorts.items():
            if cohort.parent:
                node = self.cohorts[name]
                parent = self.cohorts.get(cohort.parent)
                if parent is None:
                    parent = self.cohorts[cohort.parent] = Node(cohort.parent, True)
                if not _ancestor(node, parent):  # refuse a loop: the cohort stays a root
                    node.parent = parent
                    parent.children.append(node)
        for node in self.cohorts.values():
            if node.parent is None:
                _subtree(node)
        for node in self.queues.values():
            if node.parent is None:
                _subtree(node)

    def node(self, cq: str) -> Node:
        return self.queues[cq]

    def available(self, cq: str, fr: FR) -> Decimal:
        return self.queues[cq].available(fr)

    def borrows(self, cq: str, fr: FR, amount: Decimal) -> bool:
        """Would using ``amount`` more of ``fr`` take the ClusterQueue above its nominal quota?"""
        node = self.queues[cq]
        return node.usage.get(fr, ZERO) + amount > node.nominal.get(fr, ZERO)

    def add(self, cq: str, usage: Mapping[FR, Decimal]) -> None:
        node = self.queues.get(cq)
        if node is not None:
            for fr, amount in usage.items():
                node.add(fr, amount)

    def remove(self, cq: str, usage: Mapping[FR, Decimal]) -> None:
        node = self.queues.get(cq)
        if node is not None:
            for fr, amount in usage.items():
                node.remove(fr, amount)

    def root_of(self, cq: str) -> str:
        return self.queues[cq].root().name


def _ancestor(node: Node, candidate: Node) -> bool:
    probe: Node | None = candidate
    while probe is not None:
        if probe is node:
            return True
        probe = probe.parent
    return False


def _subtree(node: Node) -> None:
    """Subtree quota bottom-up: own nominal plus what each child lends."""
    total = dict(node.nominal)
    for child in node.children:
        _subtree(child)
        for fr, amount in child.subtree.items():
            lend = child.lending_limit.get(fr)
            total[fr] = total.get(fr, ZERO) + (amount if lend is None else min(lend, amount))
    node.subtree = total
