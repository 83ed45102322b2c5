"""Choosing a Cluster for a Workload, and the capacity book that remembers what was placed: pure code.

A Workload is placed whole (gang): one Cluster must have room for the sum of all its PodSets and every pod of
every PodSet must fit onto that Cluster's nodes at once, pod by pod (largest pods first, first fit), on nodes
whose labels match the pod's nodeSelector, required node affinity and its flavor's node labels, and whose
taints the pod (plus its flavor's tolerations) tolerates. An agent that reports no per-node figures is checked
against ``largest_node_free`` per resource. ``Constraints`` narrow the candidates: clusters pinned or excluded
(per ClusterQueue or per Job) and a selector on cluster labels. ``PlacementPolicy`` is the one protocol the
engine calls; the default policy is :func:`choose`. Among the Clusters that fit, the one with the most room
left *after* the placement wins: the score is the smallest remaining fraction of allocatable over the
resources the Workload asks for (so one scarce resource decides), ties broken by name. Clusters that are
offline, whose last heartbeat is older than the timeout, that do not run the Workload's kind, or that rejected
it before, are never chosen. When nothing fits, ``choose`` returns a reason that says what is missing where: a
pod larger than any node first (``can never run here: ...`` when no node's allocatable could hold it), then
the clusters' totals, e.g. ``needs 8 nvidia.com/gpu in one cluster; most free: worker-2 has 4``.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Protocol, overload

from federation import messages
from federation.errors import Invalid
from federation.podset import Resources, format_quantity, parse_quantity, shortfall, sub

ZERO = Decimal(0)
# "pods" is counted in every pod's requests; an agent that does not report it has no pod limit.
OPTIONAL = frozenset({"pods"})


Taint = tuple[str, str, str]                    # key, value, effect
Toleration = tuple[str, str, str, str]          # key, operator, value, effect
Term = tuple[tuple[str, str, tuple[str, ...]], ...]  # node affinity term: (key, operator, values) ANDed


@dataclass(frozen=True)
class PodSetDemand:
    """One PodSet as node fit sees it: ``count`` pods of ``requests`` with their node constraints."""

    name: str
    count: int
    requests: Resources
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    affinity: tuple[Term, ...] = ()             # required terms, ORed; empty: any node


@dataclass(frozen=True)
class Need:
    """What a Workload needs: its kind, the sum over PodSets and each PodSet's per-pod requests;
    ``podsets`` (counts and node constraints) enables the pod-by-pod node fit."""

    kind: str
    total: Resources
    pods: tuple[tuple[str, Resources], ...]  # (PodSet name, per-pod requests)
    podsets: tuple[PodSetDemand, ...] = ()

    @functools.cached_property
    def fit_order(self) -> tuple[tuple[PodSetDemand, Resources, tuple[tuple[str, Decimal, Decimal], ...], bool], ...]:
        """The PodSets in the order ``fit_nodes`` places them (largest pods first), each with its positive
        requests, the per-resource checks (resource, amount, what a node that does not report it has)
        and whether it has no node constraint: computed once per Need, not at every fit."""
        order = sorted(self.podsets, key=lambda p: sorted(((k, -v) for k, v in p.requests.items())))
        order = sorted(order, key=lambda p: -sum((v for k, v in p.requests.items() if k not in OPTIONAL), ZERO))
        out = []
        for ps in order:
            wanted = {k: v for k, v in ps.requests.items() if v > 0}
            checks = tuple((k, v, ZERO if k not in OPTIONAL else v) for k, v in wanted.items())
            out.append((ps, wanted, checks, not ps.node_selector and not ps.affinity))
        return tuple(out)


@dataclass(frozen=True)
class NodeView:
    name: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    free: Resources
    allocatable: Resources = field(default_factory=dict)  # empty: the agent did not report it


@dataclass(frozen=True)
class Constraints:
    """Clusters a Workload may use: ``pin`` (only these, when not empty), ``exclude``, and labels
    the cluster must carry (``selector``)."""

    pin: frozenset[str] = frozenset()
    exclude: frozenset[str] = frozenset()
    selector: Mapping[str, str] = field(default_factory=dict)


@dataclass
class ClusterView:
    """A Cluster as placement sees it: capacity net of recent placements."""

    name: str
    online: bool
    last_heartbeat: datetime | None
    allocatable: Resources
    free: Resources
    largest_node_free: Resources
    kinds: frozenset[str] | None = None  # None: the agent did not say, any kind is fine
    labels: Mapping[str, str] = field(default_factory=dict)
    nodes: list[NodeView] = field(default_factory=list)  # empty: the agent sent no per-node figures
    rooms: dict[int, tuple[object, ...]] = field(default_factory=dict, repr=False, compare=False)
    """``_room`` answers for the current ``free``: one pass asks the same few shapes of every cluster,
    and only the cluster a Workload just went to changes."""
    live: tuple[object, ...] = field(default=(), repr=False, compare=False)
    """``eligible``'s last answer: (now, timeout, answer)."""


@dataclass(frozen=True)
class Decision:
    cluster: str | None
    reason: str


def _relevant(need: Mapping[str, Decimal], cluster: ClusterView) -> Resources:
    return {k: v for k, v in need.items() if v > 0 and not (k in OPTIONAL and k not in cluster.allocatable)}


def _fits_pods(need: Need, cluster: ClusterView) -> tuple[str, str, Decimal, Decimal] | None:
    """The first (podset, resource, needed, largest free) that no node can hold, else None."""
    if not cluster.largest_node_free:
        return None  # the agent did not report per-node figures: trust the totals
    for podset, requests in need.pods:
        for res, amount in _relevant(requests, cluster).items():
            if res in OPTIONAL:
                continue
            have = cluster.largest_node_free.get(res, ZERO)
            if amount > have:
                return podset, res, amount, have
    return None


def _tolerated(taint: Taint, tolerations: Sequence[Toleration]) -> bool:
    key, value, effect = taint
    if effect == "PreferNoSchedule":
        return True
    for t_key, op, t_value, t_effect in tolerations:
        if t_effect and t_effect != effect:
            continue
        if not t_key and op == "Exists":
            return True
        if t_key == key and (op == "Exists" or t_value == value):
            return True
    return False


def _term_matches(term: Term, labels: Mapping[str, str]) -> bool:
    for key, op, values in term:
        have = labels.get(key)
        if op == "In" and have not in values:
            return False
        if op == "NotIn" and have is not None and have in values:
            return False
        if op == "Exists" and have is None:
            return False
        if op == "DoesNotExist" and have is not None:
            return False
        if op in ("Gt", "Lt"):
            try:
                ok = int(have or "") > int(values[0]) if op == "Gt" else int(have or "") < int(values[0])
            except (ValueError, IndexError):
                return False
            if not ok:
                return False
    return True


def node_allows(ps: PodSetDemand, node: NodeView) -> bool:
    """The node's labels match the pod's selector and affinity, and the pod tolerates its taints."""
    if any(node.labels.get(k) != v for k, v in ps.node_selector):
        return False
    if ps.affinity and not any(_term_matches(t, node.labels) for t in ps.affinity):
        return False
    return all(_tolerated(t, ps.tolerations) for t in node.taints if t[2] in ("NoSchedule", "NoExecute"))


_LAST_FIT: list[object] = [None, None, None]
"""(nodes, need, where each pod went) of the last fit that succeeded: the scheduler subtracts the
Workload it just placed from the very nodes it fitted it onto, and need not fit it a second time."""


def fit_nodes(need: Need, nodes: Sequence[NodeView]) -> str | None:
    """Place every pod of every PodSet onto ``nodes`` at once (largest pods first, first fit, on a
    scratch copy of the free figures). None when they all fit, else what the first misfit lacks."""
    misfit, used = _first_fit(need, nodes)
    if misfit is None:
        _LAST_FIT[:] = [nodes, need, used]
    return misfit


def _first_fit(need: Need, nodes: Sequence[NodeView]) -> tuple[str | None, dict[int, dict[str, Decimal]]]:
    """The pods of ``need`` onto ``nodes``: (None, the touched nodes' new free figures) or (why not, ...)."""
    used: dict[int, dict[str, Decimal]] = {}   # copies of the nodes a pod went to (the rest untouched)
    count = len(nodes)
    for ps, wanted, checks, plain in need.fit_order:
        start = 0  # the pods of a PodSet are identical: a node one of them did not fit, no later one fits
        for n in range(ps.count):
            i = start
            while i < count:
                node = nodes[i]
                if (plain and not node.taints) or node_allows(ps, node):
                    f = used.get(i) or node.free
                    for k, v, missing in checks:
                        if f.get(k, missing) < v:
                            break
                    else:
                        g = used.get(i)
                        if g is None:
                            g = used[i] = dict(node.free)
                        for k, v in wanted.items():
                            if k in g:
                                g[k] -= v
                        start = i
                        break
                i += 1
            else:
                allowed = [i for i, node in enumerate(nodes) if node_allows(ps, node)]
                if not allowed:
                    return f"no node matches the {ps.name} pods' node selector, affinity and tolerations", used
                free = {i: used.get(i) or nodes[i].free for i in allowed}
                best = max(allowed, key=lambda i: min((free[i].get(k, ZERO) / v for k, v in wanted.items()
                                                       if k not in OPTIONAL), default=ZERO))
                lack = {k: v - free[best].get(k, ZERO) for k, v in wanted.items()
                        if k not in OPTIONAL and free[best].get(k, ZERO) < v}
                return (f"{ps.name} pod {n + 1} of {ps.count} fits on no node (best node {nodes[best].name} lacks "
                        + ", ".join(q(v, k) for k, v in sorted(lack.items())) + ")"), used
    return None, used


def _node_misfit(need: Need, cluster: ClusterView) -> str | None:
    if cluster.nodes and need.podsets:
        return fit_nodes(need, cluster.nodes)
    m = _fits_pods(need, cluster)
    return None if m is None else f"no node with {q(m[2], m[1])} for a {m[0]} pod"


_SHAPES: dict[tuple[tuple[str, Decimal], ...], int] = {}
_SHAPE_IDS = itertools.count(1)


def shape_id(total: Resources) -> int:
    """A number per distinct request total: Workloads of one shape share ``_room`` answers (a number is
    never given to two shapes, so a view's cached answer can never be another shape's)."""
    key = tuple(total.items())
    sid = _SHAPES.get(key)
    if sid is None:
        if len(_SHAPES) >= 4096:
            _SHAPES.clear()
        sid = _SHAPES[key] = next(_SHAPE_IDS)
    return sid


def _room(total: Resources, cluster: ClusterView, sid: int | None = None
          ) -> tuple[Resources, tuple[Decimal, Decimal]]:
    """``shortfall`` of what the Workload asks for (``_relevant``) on one cluster and, when nothing is
    short, its score: the smallest and the sum of the fractions of allocatable left after it, over the
    resources it asks for (``pods`` aside). One walk over the requests, done for every cluster; remembered
    per shape (``sid``, :func:`shape_id`) for the view's current ``free``."""
    alloc, free = cluster.allocatable, cluster.free
    key = sid if sid is not None else -id(total)
    known = cluster.rooms.get(key)
    if known is not None and (sid is not None or known[0] is total) and known[1] is free and known[2] is alloc:
        return known[3], known[4]  # type: ignore[return-value]
    missing: Resources = {}
    low: Decimal | None = None
    spread = ZERO
    for res, amount in total.items():
        if amount <= 0:
            continue
        optional = res in OPTIONAL
        if optional and res not in alloc:
            continue
        have = free.get(res, ZERO)
        if amount > have:
            missing[res] = amount - have
        elif not missing and not optional:
            a = alloc.get(res, ZERO)
            if a > 0:
                fraction = (have - amount) / a
                spread += fraction
                low = fraction if low is None or fraction < low else low
    score = (ZERO, ZERO) if missing or low is None else (low, spread)
    if len(cluster.rooms) >= 256:
        cluster.rooms.clear()
    cluster.rooms[key] = (total, free, alloc, missing, score)
    return missing, score


def eligible(cluster: ClusterView, *, now: datetime, timeout: float) -> bool:
    """Online and heard from within ``timeout`` seconds (remembered on the view for this ``now``: a pass
    asks it of every cluster for every Workload)."""
    known = cluster.live
    if known and known[0] == now and known[1] == timeout:
        return bool(known[2])
    answer = (cluster.online and cluster.last_heartbeat is not None
              and (now - cluster.last_heartbeat).total_seconds() <= timeout)
    cluster.live = (now, timeout, answer)
    return answer


def q(amount: Decimal, res: str) -> str:
    return f"{format_quantity(amount, res)} {res}"


class PlacementPolicy(Protocol):
    """What the engine calls to place one Workload whose quota is reserved."""

    def __call__(self, need: Need, clusters: Iterable[ClusterView], *, now: datetime, timeout: float,
                 exclude: Iterable[str] = (), constraints: Constraints | None = None) -> Decision: ...


def choose(need: Need, clusters: Iterable[ClusterView], *, now: datetime, timeout: float,
           exclude: Iterable[str] = (), constraints: Constraints | None = None) -> Decision:
    """The default policy: the roomiest Cluster where the whole Workload fits, or why none does."""
    excluded = set(exclude)
    all_clusters = sorted(clusters, key=_NAME)
    if constraints is not None:
        excluded_by = constraints.exclude
        allowed = [c for c in all_clusters if (not constraints.pin or c.name in constraints.pin)
                   and c.name not in excluded_by
                   and all(c.labels.get(k) == v for k, v in constraints.selector.items())]
        if all_clusters and not allowed:
            what = []
            if constraints.pin:
                what.append(f"pinned to {', '.join(sorted(constraints.pin))}")
            if constraints.exclude:
                what.append(f"excluding {', '.join(sorted(constraints.exclude))}")
            if constraints.selector:
                what.append("cluster labels " + ",".join(f"{k}={v}" for k, v in sorted(constraints.selector.items())))
            return Decision(None, f"no known cluster is allowed ({'; '.join(what)}); known: "
                                  f"{', '.join(c.name for c in all_clusters)}")
        all_clusters = allowed
    # eligible() inlined where its answer is remembered: asked of every cluster for every Workload of a pass
    live = [c for c in all_clusters
            if (c.live[2] if c.live and c.live[0] == now and c.live[1] == timeout
                else eligible(c, now=now, timeout=timeout))]
    if not live:
        if not all_clusters:
            return Decision(None, "no worker cluster is known yet (no agent heartbeat received)")
        return Decision(None, f"no worker cluster is online (none sent a heartbeat within {timeout:g}s: "
                              f"{', '.join(c.name for c in all_clusters)})")
    candidates = [c for c in live if c.name not in excluded] if excluded else live
    if not candidates:
        return Decision(None, f"every online cluster rejected it before: {', '.join(sorted(excluded))}")
    kind = need.kind
    by_kind = [c for c in candidates if c.kinds is None or kind in c.kinds]
    if not by_kind:
        return Decision(None, f"no online cluster runs {need.kind} "
                              f"(checked {', '.join(c.name for c in candidates)})")
    total = need.total
    sid = shape_id(total)
    short: list[tuple[ClusterView, Resources]] = []  # in name order: the reason names the first few
    roomy: list[tuple[tuple[Decimal, Decimal], ClusterView]] = []
    top: tuple[tuple[Decimal, Decimal], ClusterView] | None = None  # the roomiest; on a tie the first by name
    for cluster in by_kind:
        known = cluster.rooms.get(sid)  # _room's remembered answer, looked up here: one call less per cluster
        if known is not None and known[1] is cluster.free and known[2] is cluster.allocatable:
            missing, score = known[3], known[4]
        else:
            missing, score = _room(total, cluster, sid)
        if missing:
            short.append((cluster, missing))  # type: ignore[arg-type]
        else:
            roomy.append((score, cluster))  # type: ignore[arg-type]
            if top is None or score > top[0]:  # type: ignore[operator]
                top = (score, cluster)  # type: ignore[assignment]
    # the pod-by-pod fit is the costly check: roomiest first, and only until one cluster passes it (the
    # roomiest found by one walk, not by sorting every cluster: most Workloads fit on the first)
    best: tuple[tuple[Decimal, Decimal], str] | None = None
    misfits: list[tuple[str, str]] = []
    left = roomy
    while top is not None:
        misfit = _node_misfit(need, top[1])
        if misfit is None:
            best = (top[0], top[1].name)
            break
        misfits.append((top[1].name, misfit))
        gone = top[1]
        left = [sc for sc in left if sc[1] is not gone]
        top = min(left, key=_roomiest) if left else None
    if misfits:
        failed = {name for name, _ in misfits}
        fit = [c.name for _, c in roomy if c.name not in failed]  # in name order (by_kind is)
    else:
        fit = [c.name for _, c in roomy]
    no_room = _NoRoom(short, misfits)
    if best is not None:
        skipped = set(c.name for c in live) - {c.name for c in by_kind} if len(by_kind) < len(live) else set()
        return Decision(best[1], _why(best, fit, no_room, skipped))
    return Decision(None, _explain(need, by_kind, excluded))


_NAME = operator.attrgetter("name")


def _roomiest(sc: tuple[tuple[Decimal, Decimal], ClusterView]) -> tuple[Decimal, Decimal, str]:
    return (-sc[0][0], -sc[0][1], sc[1].name)


class _NoRoom(Sequence[str]):
    """The clusters a Workload does not fit, in name order, as "name (why)": only the few a reason names are
    ever formatted (``_some``), not one text per cluster of a thousand."""

    def __init__(self, short: list[tuple[ClusterView, Resources]], misfits: list[tuple[str, str]]) -> None:
        self._items: list[tuple[str, Any]] = sorted([*((c.name, m) for c, m in short), *misfits],
                                                    key=lambda it: it[0])

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self._text(it) for it in self._items[i]]
        return self._text(self._items[i])

    @staticmethod
    def _text(item: tuple[str, Any]) -> str:
        name, why = item
        if isinstance(why, str):
            return f"{name} ({why})"
        return f"{name} (lacks {', '.join(q(v, k) for k, v in sorted(why.items()))})"


def _why(best: tuple[tuple[Decimal, Decimal], str], fit: Sequence[str], no_room: Sequence[str],
         skipped: set[str]) -> str:
    """Why the chosen cluster won, for the Placement row and ``mkctl placements show``."""
    (scarcest, _), name = best
    text = f"roomiest fit: {name} keeps {max(scarcest, ZERO) * 100:.0f}% of its scarcest requested resource free"
    others = [c for c in fit if c != name]
    if others:
        text += f"; also fit: {_some(others)}"
    if no_room:
        text += f"; no room: {_some(no_room)}"
    if skipped:
        text += f"; not considered: {_some(sorted(skipped))}"
    return text


REASON_NAMES = 5
"""Clusters a placement's reason names per list; the rest are counted (the reason is stored per Placement
and in an Event, so it must not grow with the number of clusters)."""


def _some(names: Sequence[str]) -> str:
    if len(names) <= REASON_NAMES:
        return ", ".join(names)
    return f"{', '.join(names[:REASON_NAMES])} and {len(names) - REASON_NAMES} more"


def _never_on_a_node(need: Need, cluster: ClusterView) -> tuple[str, str, Decimal, Decimal] | None:
    """The first (podset, resource, needed, largest node allocatable) no node of the cluster could ever hold,
    from the nodes' allocatable figures (None when it could, or when the agent reports none)."""
    if not cluster.nodes or not all(n.allocatable for n in cluster.nodes):
        return None
    for podset, requests in need.pods:
        for res, amount in sorted(_relevant(requests, cluster).items()):
            if res in OPTIONAL:
                continue
            biggest = max((n.allocatable.get(res, ZERO) for n in cluster.nodes), default=ZERO)
            if amount > biggest:
                return podset, res, amount, biggest
    return None


def _explain(need: Need, clusters: Sequence[ClusterView], excluded: set[str]) -> str:
    suffix = f" (not considered, rejected it before: {', '.join(sorted(excluded))})" if excluded else ""
    # 1. a resource no cluster offers at all
    for res in sorted(need.total):
        amount = need.total[res]
        if amount <= 0 or res in OPTIONAL:
            continue
        if not any(c.allocatable.get(res, ZERO) > 0 for c in clusters):
            return (f"no cluster offers {res} at all (checked {', '.join(c.name for c in clusters)}); "
                    f"it needs {q(amount, res)}{suffix}")
    # 2. a pod larger than any node, per pod on the nodes before the clusters' totals: larger than any node
    # could ever hold (the nodes' allocatable) is "never", else no node has that much free now
    never = [(c, m) for c in clusters if (m := _never_on_a_node(need, c)) is not None]
    if len(never) == len(clusters) and never:
        cluster, (podset, res, amount, biggest) = max(never, key=lambda cm: (cm[1][3], cm[0].name))
        return (f"can never run here: a {podset} pod needs {q(amount, res)} on one node; no node has that much "
                f"(largest: {cluster.name}'s, {format_quantity(biggest, res)}){suffix}")
    misfits = [(c, m) for c in clusters if (m := _fits_pods(need, c)) is not None]
    if len(misfits) == len(clusters) and misfits:
        cluster, (podset, res, amount, _) = max(
            misfits, key=lambda cm: (cm[0].largest_node_free.get(cm[1][1], ZERO), cm[0].name))
        have = cluster.largest_node_free.get(res, ZERO)
        return (f"a {podset} pod needs {q(amount, res)} on one node; largest free node: {cluster.name} "
                f"has {format_quantity(have, res)}{suffix}")
    # 3. a resource no single cluster has enough of
    for res in sorted(need.total):
        amount = need.total[res]
        if amount <= 0 or res in OPTIONAL:
            continue
        most = max(clusters, key=lambda c: (c.free.get(res, ZERO), c.name))
        have = most.free.get(res, ZERO)
        if have < amount:
            return (f"needs {q(amount, res)} in one cluster; most free: {most.name} has "
                    f"{format_quantity(max(have, ZERO), res)}{suffix}")
    # 4. each resource exists somewhere, but never all of it together (or not pod by pod on nodes)
    parts = []
    for cluster in clusters:
        missing = shortfall(_relevant(need.total, cluster), cluster.free)
        if missing:
            parts.append(f"{cluster.name} lacks " + ", ".join(q(v, k) for k, v in sorted(missing.items())))
        elif (why := _node_misfit(need, cluster)) is not None:
            parts.append(f"{cluster.name}: {why}")
    return "no cluster has room for all of it at once: " + "; ".join(parts) + suffix


# --- the capacity book ------------------------------------------------------------------------


QUANTITY_MEMO_SIZE = 4096
_quantities: dict[str, Decimal] = {}
"""Quantity text -> its value: the nodes of every heartbeat are parsed again, and with many clusters the
same few texts ("64", "256Gi", "8") made parsing a sixth of the dispatcher's work while Jobs arrived."""


def _parse(values: Mapping[str, str], where: str) -> Resources:
    out: Resources = {}
    for name, text in values.items():
        amount = _quantities.get(text) if isinstance(text, str) else None
        if amount is None:
            try:
                amount = parse_quantity(text, f"{where}.{name}")
            except Invalid:
                continue  # one bad figure from an agent must not hide the whole cluster
            if isinstance(text, str):
                if len(_quantities) >= QUANTITY_MEMO_SIZE:
                    _quantities.clear()
                _quantities[text] = amount
        out[name] = amount
    return out


@dataclass(slots=True)
class _Reservation:
    cluster: str
    total: Resources
    accepted_at: datetime | None = None


@dataclass
class CapacityBook:
    """Last heartbeat per Cluster, minus what was placed there since.

    The :class:`CapacityBook` holds the last heartbeat of each Cluster and subtracts the requests of
    placements made since, until a heartbeat sent ``settle`` seconds after the agent accepted them
    shows their pods in the agent's own figures.
    """

    settle_seconds: float = 5.0
    heartbeats: dict[str, messages.Heartbeat] = field(default_factory=dict)
    received: dict[str, datetime] = field(default_factory=dict)
    capacities: dict[str, messages.Capacity] = field(default_factory=dict)
    """Cluster -> the first of its heartbeats' capacities equal to the last one's: the same object as long as
    the capacity does not change, so a heartbeat's quantities are parsed (``views``) and its cluster row
    compared (dispatcher/clusters/health.py) once per change, not once per heartbeat."""
    reservations: dict[str, _Reservation] = field(default_factory=dict)  # by workload uid
    version: int = 0
    """Bumped whenever room may have grown (a heartbeat that changed, a reservation released)."""
    _held: dict[str, tuple[int, Resources]] = field(default_factory=dict, repr=False)
    """Cluster -> (how many reservations, their summed totals): kept as reservations come and go, so a
    round's views need not add up every reservation again."""
    _parsed: dict[str, tuple[messages.Capacity, Resources, Resources, Resources, list[NodeView]]] = field(
        default_factory=dict, repr=False)
    """Cluster -> its capacity (``capacities``) with the quantities parsed (allocatable, free, largest node
    free, nodes): parsed once per change, not once per round."""
    _settling: dict[str, list[tuple[datetime, str]]] = field(default_factory=dict, repr=False)
    """Cluster -> heap of (accepted_at, uid) of its accepted reservations: a heartbeat drops the settled
    ones without walking every reservation of every cluster (entries of a reservation replaced or
    released since are stale and skipped)."""

    def heartbeat(self, hb: messages.Heartbeat, received_at: datetime) -> bool:
        """Record a heartbeat; True when it may let something new fit (capacity or a cluster came online)."""
        old = self.heartbeats.get(hb.cluster)
        self.heartbeats[hb.cluster] = hb
        self.received[hb.cluster] = received_at
        settled = hb.sent_at - timedelta(seconds=self.settle_seconds)  # accepted by then: in the agent's figures
        heap = self._settling.get(hb.cluster)
        while heap and heap[0][0] <= settled:
            at, uid = heapq.heappop(heap)
            res = self.reservations.get(uid)
            if res is not None and res.cluster == hb.cluster and res.accepted_at == at:
                del self.reservations[uid]
                self._hold(res, -1)
        same = old is not None and (old.capacity is hb.capacity or old.capacity == hb.capacity)
        if not same or hb.cluster not in self.capacities:
            self.capacities[hb.cluster] = hb.capacity
        changed = not same or old is None or old.online != hb.online
        if changed:
            self.version += 1
        return changed

    def forget_cluster(self, name: str) -> None:
        self.heartbeats.pop(name, None)
        self.capacities.pop(name, None)
        self.received.pop(name, None)
        self._parsed.pop(name, None)

    def reserve(self, uid: str, cluster: str, total: Resources) -> None:
        """``total`` is kept, not copied (a Workload's shared Need's; never changed)."""
        old = self.reservations.get(uid)
        if old is not None:
            self._hold(old, -1)
        res = self.reservations[uid] = _Reservation(cluster, total)
        self._hold(res, 1)

    def _hold(self, res: _Reservation, sign: int) -> None:
        count, acc = self._held.get(res.cluster, (0, {}))
        count += sign
        if count <= 0:  # none left: start from nothing again (no zero entries, nothing to drift)
            self._held.pop(res.cluster, None)
            return
        for k, v in res.total.items():
            acc[k] = acc.get(k, ZERO) + v if sign > 0 else acc.get(k, ZERO) - v
        self._held[res.cluster] = (count, acc)

    def accepted(self, uid: str, at: datetime) -> None:
        if (res := self.reservations.get(uid)) is not None:
            res.accepted_at = at
            heapq.heappush(self._settling.setdefault(res.cluster, []), (at, uid))

    def release(self, uid: str) -> bool:
        """Drop a placement's reservation (rejected, finished, deleted); True if there was one."""
        res = self.reservations.pop(uid, None)
        if res is None:
            return False
        self._hold(res, -1)
        self.version += 1
        return True

    def views(self) -> list[ClusterView]:
        out = []
        for name, hb in self.heartbeats.items():
            parsed = self._parsed.get(name)
            cap = self.capacities.get(name, hb.capacity)
            if parsed is None or parsed[0] is not cap:
                nodes = [NodeView(n.name, n.labels, tuple((t.key, t.value, t.effect) for t in n.taints),
                                  _parse(n.free, "nodes.free"), _parse(n.allocatable, "nodes.allocatable"))
                         for n in cap.nodes]
                parsed = self._parsed[name] = (cap, _parse(cap.allocatable, "allocatable"),
                                               _parse(cap.free, "free"),
                                               _parse(cap.largest_node_free, "largest_node_free"), nodes)
            _, allocatable, free, largest, nodes = parsed
            held = self._held.get(name)
            if held is not None:
                free = sub(free, held[1])
                if nodes:
                    nodes = subtract_from_nodes(nodes, held[1])
            largest = {k: min(v, free.get(k, v)) for k, v in largest.items()}
            kinds = frozenset(hb.kinds_reconciled) | frozenset(hb.kinds_delegated)
            out.append(ClusterView(
                name=name, online=hb.online, last_heartbeat=self.received.get(name),
                allocatable=dict(allocatable), free=dict(free), largest_node_free=largest, kinds=kinds or None,
                labels=dict(hb.labels), nodes=list(nodes),
            ))
        return out

    def take(self, view: ClusterView, need: Need) -> None:
        """Subtract a placement from a view used for several decisions in one round."""
        view.free = sub(view.free, need.total)
        if view.nodes:
            view.nodes = subtract_from_nodes(view.nodes, need.total, need)


def subtract_from_nodes(nodes: list[NodeView], total: Resources, need: Need | None = None) -> list[NodeView]:
    """Nodes minus placements the agent's figures do not show yet. With the Workload's PodSets the
    pods are put where ``fit_nodes`` would put them; without (a reservation rebuilt from SQL) the
    total is taken from the roomiest nodes first: either way the cluster's sum stays right. Only the
    nodes touched are copied."""
    touched: dict[int, dict[str, Decimal]] = {}
    last_nodes, last_need, last_used = _LAST_FIT
    if need is not None and need.podsets and last_nodes is nodes and last_need is need:
        touched = last_used  # type: ignore[assignment]  # fitted just now onto these very nodes
        _LAST_FIT[:] = [None, None, None]
    elif need is not None and need.podsets and (fitted := _first_fit(need, nodes))[0] is None:
        touched = fitted[1]
    elif need is not None and need.podsets:  # it does not fit (any more): every pod that still does
        for ps in need.podsets:
            wanted = {k: v for k, v in ps.requests.items() if v > 0}
            start = 0
            for _ in range(ps.count):
                for i in range(start, len(nodes)):
                    n = nodes[i]
                    f = touched.get(i) or n.free
                    if node_allows(ps, n) and all(f.get(k, v) >= v for k, v in wanted.items()):
                        g = touched.setdefault(i, dict(n.free))
                        for k, v in wanted.items():
                            if k in g:
                                g[k] -= v
                        start = i
                        break
    else:
        for res, amount in total.items():
            left = amount
            for i in sorted(range(len(nodes)), key=lambda i: -(touched.get(i) or nodes[i].free).get(res, ZERO)):
                if left <= 0:
                    break
                f = touched.get(i) or nodes[i].free
                take = min(left, max(f.get(res, ZERO), ZERO))
                if res in f:
                    touched.setdefault(i, dict(nodes[i].free))[res] -= take
                left -= take
    out = list(nodes)
    for i, free in touched.items():
        n = nodes[i]
        out[i] = NodeView(n.name, n.labels, n.taints, free, n.allocatable)
    return out
