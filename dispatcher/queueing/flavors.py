"""Flavor assignment: which ResourceFlavor each PodSet's resources are reserved in, pure.

Per PodSet and resource group, the ClusterQueue's flavors are tried in their listed order. A
flavor is a candidate when the PodSet's pods may run on its nodes (the pods' nodeSelector does
not contradict the flavor's node labels, and the pods tolerate its node taints) and the PodSet's
total requests fit the quota the ClusterQueue may still use (its own, plus what it may borrow).
``whenCanBorrow: MayStopSearch`` (the default; v1beta2 spells it ``Borrow``) takes the first
candidate even if it borrows; ``TryNextFlavor`` looks further for one that needs no borrowing and
falls back to the first borrowing candidate. The reason for a failure is Kueue's sentence with
the numbers: ``insufficient unused quota for cpu in flavor on-demand, 4 more needed``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

from dispatcher.placement import Need, PodSetDemand
from dispatcher.queueing import api
from dispatcher.queueing.catalog import Catalog
from dispatcher.queueing.quota import FR, ZERO, QuotaTree
from federation.podset import format_quantity

IGNORED = frozenset({"pods"})  # counted by the scheduler in every pod, quota only when covered


@dataclass
class Assignment:
    flavors: dict[str, dict[str, str]] = field(default_factory=dict)   # podset -> resource -> flavor
    usage: dict[FR, Decimal] = field(default_factory=dict)
    borrows: bool = False


def compatible(ps: PodSetDemand, flavor: api.ResourceFlavor) -> str:
    """'' when the PodSet's pods may run on the flavor's nodes, else why not."""
    for key, value in ps.node_selector:
        if key in flavor.node_labels and flavor.node_labels[key] != value:
            return f"flavor {flavor.name} doesn't match node affinity (nodeSelector {key}={value})"
    tolerations = [api.Toleration(*t) for t in ps.tolerations] + list(flavor.tolerations)
    for taint in flavor.node_taints:
        if taint.effect in ("NoSchedule", "NoExecute") and not any(t.tolerates(taint) for t in tolerations):
            return f"untolerated taint {taint.key}={taint.value}:{taint.effect} in flavor {flavor.name}"
    return ""


def assign(cq: api.ClusterQueue, need: Need, tree: QuotaTree, catalog: Catalog) -> Assignment | str:
    """Flavors for every PodSet of ``need`` within what ``cq`` may use now, or the reason none fit."""
    out = Assignment()
    for ps in need.podsets:
        wanted: dict[int, dict[str, Decimal]] = {}
        for res, per_pod in ps.requests.items():
            if per_pod <= 0:
                continue
            group = cq.group_of(res)
            if group is None:
                if res in IGNORED:
                    continue
                return (f"couldn't assign flavors to pod set {ps.name}: resource {res} unavailable in "
                        f"ClusterQueue {cq.name}")
            wanted.setdefault(cq.resource_groups.index(group), {})[res] = per_pod * ps.count
        chosen: dict[str, str] = {}
        for gi, amounts in sorted(wanted.items()):
            group = cq.resource_groups[gi]
            reasons: list[str] = []
            pick: tuple[api.FlavorQuotas, bool] | None = None
            fallback: tuple[api.FlavorQuotas, bool] | None = None
            for fq in group.flavors:
                flavor = catalog.flavors.get(fq.name)
                if flavor is None:
                    reasons.append(f"flavor {fq.name} not found")
                    continue
                why = compatible(ps, flavor)
                if why:
                    reasons.append(why)
                    continue
                ok, borrow = True, False
                for res, amount in sorted(amounts.items()):
                    fr = (fq.name, res)
                    total = out.usage.get(fr, ZERO) + amount
                    left = tree.available(cq.name, fr) if res in fq.resources else ZERO
                    if left < total:
                        ok = False
                        reasons.append(f"insufficient unused quota for {res} in flavor {fq.name}, "
                                       f"{format_quantity(total - max(left, ZERO), res)} more needed")
                        break
                    borrow = borrow or tree.borrows(cq.name, fr, total)
                if not ok:
                    continue
                if not borrow or cq.when_can_borrow in ("MayStopSearch", "Borrow"):
                    pick = (fq, borrow)
                    break
                fallback = fallback or (fq, borrow)
            pick = pick or fallback
            if pick is None:
                return f"couldn't assign flavors to pod set {ps.name}: " + "; ".join(reasons)
            fq, borrow = pick
            out.borrows = out.borrows or borrow
            for res, amount in amounts.items():
                fr = (fq.name, res)
                out.usage[fr] = out.usage.get(fr, ZERO) + amount
                chosen[res] = fq.name
        out.flavors[ps.name] = chosen
    return out


def with_flavors(need: Need, flavors: dict[str, dict[str, str]], catalog: Catalog) -> Need:
    """The Need placement checks: each PodSet's node selector and tolerations plus its flavors'."""
    podsets = []
    for ps in need.podsets:
        selector = dict(ps.node_selector)
        tolerations = list(ps.tolerations)
        for name in sorted(set(flavors.get(ps.name, {}).values())):
            flavor = catalog.flavors.get(name)
            if flavor is None:
                continue
            selector.update(flavor.node_labels)
            tolerations.extend((t.key, t.operator, t.value, t.effect) for t in flavor.tolerations)
        podsets.append(PodSetDemand(ps.name, ps.count, ps.requests, tuple(sorted(selector.items())),
                                    tuple(tolerations), ps.affinity))
    return Need(need.kind, need.total, need.pods, tuple(podsets))
