"""The scheduling pass: which pending Workloads get quota and a cluster now, pure (no I/O).

:class:`Queues` holds every pending Workload in memory (no cap), in one heap per ClusterQueue ordered by
priority (higher first), then queue time (the Job's creationTimestamp, kept when it is preempted), then the
order mkd claimed it (never the uid). It also holds the quota usage of every admitted Workload in a
:class:`~dispatcher.queueing.quota.QuotaTree`.
"""

from __future__ import annotations

import heapq
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal

from dispatcher.placement import (
    ClusterView,
    Constraints,
    Need,
    PlacementPolicy,
    choose,
    eligible,
    subtract_from_nodes,
)
from dispatcher.queueing import api, fairshare, preemption
from dispatcher.queueing.catalog import Catalog
from dispatcher.queueing.flavors import Assignment, assign, with_flavors
from dispatcher.queueing.holds import Holds
from dispatcher.queueing.quota import FR, ZERO, QuotaTree

OPEN = ""  # the one queue of open mode
REASONS = {"InClusterQueue": "prioritization in the ClusterQueue", "InCohortReclamation": "reclamation within the cohort",
           "InCohortReclaimWhileBorrowing": "reclamation within the cohort while borrowing",
           fairshare.IN_COHORT_FAIR_SHARING: "Fair Sharing within the cohort"}
"""Kueue's preemption reasons (the Preempted condition's reason) and the words of its message."""
ANYWHERE = api.ANYWHERE


@dataclass(slots=True, eq=False)
class Entry:
    """One pending Workload."""

    uid: str
    namespace: str
    name: str
    queue: str               # the LocalQueue it names
    priority: int
    queued_at: float         # POSIX seconds: creationTimestamp
    seq: int                 # claim order: ties within one second of creationTimestamp
    need: Need
    placement: api.Placement = ANYWHERE
    excluded: tuple[str, ...] = ()       # clusters that rejected it permanently
    pinned: str | None = None            # an admin's pin (``mkctl workloads pin``)
    priority_inputs: tuple[str, tuple[str, ...]] | None = None
    """(WorkloadPriorityClass label, pods' PriorityClass names) while the priority awaits the catalog."""
    cq: str | None = None    # resolved ClusterQueue (OPEN in open mode), None: cannot queue
    step: str = "queued"     # what holds it: queued, queue, stopped, quota, placement
    reason: str = ""
    word: str = ""           # the reason as one CamelCase word (LocalQueueDoesNotExist, ...)
    stored_cq: str | None = None  # the ClusterQueue last written to its row
    set_aside: str = ""      # '' in the heap; 'quota' or 'capacity' while set aside
    set_aside_since: float | None = None
    note: str = ""           # why it let go of a hold (kept in its reason until it is admitted)
    preempting_since: float | None = None  # it evicted Workloads for its quota: that room is its own

    def key(self) -> tuple[int, float, int]:
        return (-self.priority, self.queued_at, self.seq)


@dataclass
class Admitted:
    """A Workload holding quota (placed or running)."""

    uid: str
    cq: str
    usage: dict[FR, Decimal]
    priority: int = 0
    flavors: dict[str, dict[str, str]] = field(default_factory=dict)
    namespace: str = ""
    queue: str = ""          # its LocalQueue
    queued_at: float = 0.0
    admitted_at: float = 0.0
    cluster: str | None = None


@dataclass
class Admission:
    entry: Entry
    cluster: str
    why: str
    need: Need
    flavors: dict[str, dict[str, str]]
    usage: dict[FR, Decimal]
    borrows: bool


@dataclass(frozen=True)
class Eviction:
    """An admitted Workload preempted for ``preemptor`` (its quota is already released)."""

    uid: str
    preemptor: Entry
    reason: str     # Kueue's reason word: InClusterQueue, InCohortReclamation, InCohortReclaimWhileBorrowing
    message: str


@dataclass
class PassResult:
    admitted: list[Admission] = field(default_factory=list)
    waiting: list[Entry] = field(default_factory=list)      # entries whose reason changed this pass
    evicted: list[Eviction] = field(default_factory=list)
    attempts: int = 0


class Queues:
    """Pending Workloads per ClusterQueue and the quota held by admitted ones; see the module docstring.

    A pass (:meth:`Queues.schedule`) repeats rounds, as Kueue repeats scheduling cycles, until nothing
    more is admitted: each round takes every ClusterQueue's head (its preemptor, while it has one),
    orders them (no borrowing first, then priority, then queue time; with fair sharing each next one by
    Kueue's tournament), and for each one reserves quota (flavor assignment) and looks for a cluster
    where every pod fits (the placement policy) in one step, so quota is never held by a Workload that
    fits nowhere; several may borrow in a round while the cohort has room. A head short of quota may
    preempt (:mod:`~dispatcher.queueing.preemption`): its victims stay counted and its room is its own
    for the rest of the pass; one without victims keeps its quota for the rest of the round unless its
    ClusterQueue reclaims ``Any``; with ``prioritize_preemptors`` (Kueue's ``PrioritizePreemptorWorkloads``
    gate, mkd's default) a preemptor whose victims are leaving is tried first and always keeps it. A head that cannot be admitted is *set aside* in a ``BestEffortFIFO``
    queue with every Workload equal to it (it returns when quota in its cohort or cluster capacity frees,
    or a queue object changes) and *blocks* a ``StrictFIFO`` queue. **No starvation:** a head set aside
    for longer than ``starvation_seconds`` is tried first in every pass and, when it still fits no
    cluster, holds the cluster that comes closest: nothing queued after it is placed there until it
    fits; short of quota (that it could have), it blocks its ClusterQueue. Holds are bounded
    (:mod:`~dispatcher.queueing.holds`): let go after ``hold_seconds`` without more room. In open mode
    (no ClusterQueue exists) every Workload is in one queue without quota.
    """

    def __init__(self, catalog: Catalog, *, starvation_seconds: float = 300.0,
                 max_attempts_per_pass: int = 2000, policy: PlacementPolicy = choose,
                 fair_sharing: bool = False, preemption_strategies: tuple[str, ...] = fairshare.STRATEGIES,
                 hold_seconds: float = 60.0, prioritize_preemptors: bool = True) -> None:
        if not fairshare.allowed(preemption_strategies):
            raise ValueError(f"preemption strategies {list(preemption_strategies)}: use one of "
                             f"{[list(a) for a in fairshare.ALLOWED]}")
        self.catalog = catalog
        self.fair_sharing = fair_sharing
        self.prioritize_preemptors = prioritize_preemptors
        self.preemption_strategies = preemption_strategies
        self.starvation_seconds = starvation_seconds
        self.max_attempts = max_attempts_per_pass
        self.policy = policy
        self.entries: dict[str, Entry] = {}
        self.admitted: dict[str, Admitted] = {}
        self.heaps: dict[str | None, list[tuple[int, float, int, str]]] = {}
        """Per ClusterQueue: (-priority, queued_at, seq, uid), an entry's key and uid in one tuple (one per
        pending Workload); stale ones are dropped when they reach the top."""
        self.aside: dict[str | None, dict[str, Entry]] = {}
        self.held = Holds(hold_seconds)          # starving heads' holds on a cluster or their queue
        self.tree = QuotaTree(catalog)
        self._unused: QuotaTree | None = None   # the tree with no usage: a preemptor's flavors (fair sharing)
        self._generation = catalog.generation
        self._stamp = 0.0
        self._admitted_now: set[str] = set()
        self._reserved: list[tuple[str, dict[FR, Decimal]]] = []   # quota held for the rest of a pass
        self._victims: dict[str, Admitted] = {}   # evicted this pass: their quota is freed when the pass ends
        self._round_reserved: list[tuple[str, dict[FR, Decimal]]] = []  # kept by heads without victims, this round
        self._preemptors: dict[str | None, str] = {}  # ClusterQueue -> its preempting Workload: its head (sticky)
        self._failed: dict[str | None, dict[tuple[object, ...], str]] = {}
        """Per BestEffortFIFO ClusterQueue: shapes (priority and pods) that found no quota, and why, until quota
        in its cohort frees (Kueue's scheduling equivalence: an equal Workload is not tried again meanwhile)."""
        self._told: list[Entry] = []   # held before any pass (queue missing, stopped): reported by the next pass

    # --- membership ------------------------------------------------------------------------------

    def add(self, e: Entry) -> None:
        old = self.entries.get(e.uid)
        if old is not None:
            e.set_aside_since, e.note, e.preempting_since = old.set_aside_since, old.note, old.preempting_since
            hold = self.held.by_uid.get(old.uid)
            self._drop(old)
            if hold is not None:  # the same Workload (a new priority, a pin): its hold stays
                self.held.by_uid[old.uid] = hold
        self.entries[e.uid] = e
        self._route(e)

    def discard(self, uid: str) -> Entry | None:
        e = self.entries.pop(uid, None)
        if e is not None:
            self._drop(e)
        return e

    def _drop(self, e: Entry) -> None:
        self.aside.get(e.cq, {}).pop(e.uid, None)
        self.held.drop(e.uid)
        # heap entries are removed lazily (their uid is no longer in self.entries, or moved)

    def _route(self, e: Entry) -> None:
        e.set_aside = ""
        if self.catalog.open:
            e.cq, e.step, e.reason = OPEN, "queued", ""
        else:
            r = self.catalog.resolve(e.namespace, e.queue)
            if r.problem:
                e.cq, e.step, e.reason, e.word = None, "queue", r.problem, r.reason
                self.aside.setdefault(None, {})[e.uid] = e
                self._told.append(e)
                return
            assert r.cluster_queue is not None
            e.cq = r.cluster_queue.name
            stopped = self.catalog.stopped(r)
            if stopped:
                e.step, e.reason, e.word = "stopped", stopped, "Stopped"
                self.aside.setdefault(e.cq, {})[e.uid] = e
                e.set_aside = "stopped"
                self._told.append(e)
                return
            e.step = "queued"
        heapq.heappush(self.heaps.setdefault(e.cq, []), (-e.priority, e.queued_at, e.seq, e.uid))

    def hold_quota(self, a: Admitted) -> None:
        """Record quota held by an admitted Workload (at admission, or rebuilt from SQL)."""
        self.release(a.uid)
        self.admitted[a.uid] = a
        self.tree.add(a.cq, a.usage)

    def release(self, uid: str) -> bool:
        """A Workload stopped holding quota (finished, failed, deleted, evicted): its cohort may admit again."""
        a = self.admitted.pop(uid, None)
        if a is None:
            return False
        self.tree.remove(a.cq, a.usage)
        if a.cq in self.tree.queues:
            root = self.tree.root_of(a.cq)
            for cq in self.tree.queues:
                if self.tree.root_of(cq) == root:
                    self._return(cq, "quota")
        self._return(OPEN, "quota")
        return True

    def capacity_changed(self) -> None:
        """A cluster came online or reported more room: Workloads set aside for capacity try again."""
        for cq in list(self.aside):
            self._return(cq, "capacity")

    def _return(self, cq: str | None, why: str) -> None:
        if why == "quota":
            self._failed.pop(cq, None)
        aside = self.aside.get(cq)
        if not aside:
            return
        for uid, e in list(aside.items()):
            if e.set_aside == why:
                del aside[uid]
                e.set_aside = ""
                heapq.heappush(self.heaps.setdefault(cq, []), (-e.priority, e.queued_at, e.seq, uid))

    def refresh(self) -> None:
        """Queue objects changed: rebuild the quota tree and route every pending Workload again."""
        self._generation = self.catalog.generation
        self.tree = QuotaTree(self.catalog)
        self._unused = None
        for a in self.admitted.values():
            self.tree.add(a.cq, a.usage)
        self.heaps.clear()
        self.aside.clear()
        self._failed.clear()
        self.held.clear()
        for e in self.entries.values():
            self._route(e)

    # --- reading ---------------------------------------------------------------------------------

    def ordered(self, cq: str | None) -> list[Entry]:
        """Every pending Workload of a ClusterQueue in admission order (set-aside ones included)."""
        return sorted((e for e in self.entries.values() if e.cq == cq), key=Entry.key)

    def _head(self, cq: str | None) -> Entry | None:
        heap = self.heaps.get(cq)
        while heap:
            priority, queued_at, seq, uid = heap[0]
            e = self.entries.get(uid)
            if (e is None or e.cq != cq or e.set_aside or -e.priority != priority or e.queued_at != queued_at
                    or e.seq != seq):
                heapq.heappop(heap)
                continue
            return e
        return None

    def _pop(self, e: Entry) -> None:
        heap = self.heaps.get(e.cq)
        if heap and heap[0][3] == e.uid:
            heapq.heappop(heap)

    # --- the pass --------------------------------------------------------------------------------

    def schedule(self, clusters: Iterable[ClusterView], *, now: datetime, timeout: float) -> PassResult:
        """One scheduling pass over ``clusters`` (views are updated in place as Workloads are placed)."""
        if not self.catalog.ready:
            return PassResult()
        if self.catalog.generation != self._generation:
            self.refresh()
        views = {c.name: c for c in clusters}
        result = PassResult()
        result.waiting.extend(e for e in self._told if self.entries.get(e.uid) is e and e.step in ("queue", "stopped"))
        self._told.clear()
        stamp = now.timestamp()
        self._stamp = stamp
        self._admitted_now = set()
        reserved: list[tuple[str, dict[FR, Decimal]]] = []
        self._reserved = reserved
        self._victims = {}
        blocked: set[str | None] = set()
        self._check_holds(views, stamp, result)
        done: set[str] = set()
        starving = [e for es in self.aside.values() for e in es.values()
                    if e.set_aside == "capacity" and (self._starving(e, stamp) or self._preempting(e, stamp))]
        while result.attempts < self.max_attempts:
            heads = []
            for queue in list(self.heaps):
                if queue in blocked:
                    continue
                head = self._sticky(queue, stamp, done)
                while head is None:
                    head = self._head(queue)
                    if head is None or not self._equivalent_failed(head, stamp, blocked, result):
                        break
                    head = None
                if head is not None:
                    heads.append(head)
            heads.extend(e for e in starving if e.uid not in done and e.cq not in blocked
                         and e.set_aside == "capacity" and self.entries.get(e.uid) is e)
            if not heads:
                break
            tried = []
            for e in heads:
                spec = self.catalog.cluster_queues.get(e.cq) if e.cq else None
                got: Assignment | str = Assignment() if spec is None else assign(spec, e.need, self.tree, self.catalog)
                tried.append((got.borrows if isinstance(got, Assignment) else self._would_borrow(e, spec), e, spec, got))
            if not self.fair_sharing:
                tried.sort(key=lambda t: (not self._first(t[1], stamp), t[0], t[1].key()))
            progress = False
            round_reserved: list[tuple[str, dict[FR, Decimal]]] = []
            self._round_reserved = round_reserved
            for _, e, cq, got in self._in_order(tried, stamp):
                if e.cq in blocked or e.uid in done:
                    continue
                result.attempts += 1
                if isinstance(got, str):
                    done.add(e.uid)
                    preempted = self._preempt(e, cq, result, views, now, timeout) if cq is not None else False
                    if preempted is None:
                        done.discard(e.uid)   # its victims no longer make room after this round's others: next round
                        continue
                    if preempted:
                        progress = True   # victims evicted: the preemptor holds their room and goes next pass
                        continue
                    e.preempting_since = None
                    if cq is not None and cq.strategy != "StrictFIFO" and not self._starving(e, stamp):
                        self._failed.setdefault(e.cq, {})[_shape(e)] = got
                    progress |= self._wait(e, "quota", got, stamp, cq, blocked, result)
                    if cq is not None:
                        self._reserve_unreclaimable(e, cq, round_reserved)
                    continue
                if cq is not None and not self._quota_still_fits(cq, got):
                    continue  # an earlier candidate of this round took the quota: next round
                done.add(e.uid)
                need = with_flavors(e.need, got.flavors, self.catalog) if got.flavors else e.need
                held_by_others = self.held.held_by_others(e.uid)
                usable = [v for n, v in views.items() if n not in held_by_others]
                decision = self.policy(need, usable, now=now, timeout=timeout, exclude=e.excluded,
                                       constraints=self._constraints(e, cq))
                if decision.cluster is None:
                    text = decision.reason
                    if held_by_others:
                        text += f" (held for a Workload waiting longer: {', '.join(sorted(held_by_others))})"
                    if self._preempting(e, stamp) and cq is not None:
                        # the room its victims free is its own until their pods are gone
                        self.tree.add(cq.name, got.usage)
                        reserved.append((cq.name, got.usage))
                        text += "; it waits for the room its preemptions free"
                    elif self._starving(e, stamp):
                        self._hold(e, need, usable, now, timeout, stamp)
                        mine = self.held.by_uid.get(e.uid)
                        if mine is not None and mine.cluster is not None:
                            text += (f"; holding {mine.cluster} for it (nothing queued after it is placed there; "
                                     f"let go after {self.held.seconds:g}s without more room)")
                        if cq is not None:  # its quota too, for the rest of this pass
                            self.tree.add(cq.name, got.usage)
                            reserved.append((cq.name, got.usage))
                    progress |= self._wait(e, "capacity", text, stamp, cq, blocked, result)
                    continue
                self._admit(e, cq, got, need, decision.cluster, decision.reason, views, result)
                progress = True
            for cq_name, usage in round_reserved:
                self.tree.remove(cq_name, usage)
            if not progress:
                break
        for cq_name, usage in reserved:
            self.tree.remove(cq_name, usage)
        for uid, victim in self._victims.items():   # Kueue frees a victim's quota once it is evicted: the next pass
            self.admitted.setdefault(uid, victim)
            self.release(uid)
        self._victims = {}
        return result

    def _preempt(self, e: Entry, cq: api.ClusterQueue, result: PassResult, views: Mapping[str, ClusterView],
                 now: datetime, timeout: float) -> bool | None:
        """Evict the victims Kueue chooses so ``e`` gets its quota (see ``preemption``). The victims'
        quota stays counted and ``e``'s is reserved for the rest of the pass, as in Kueue's cycle. The
        victims are chosen on the quota as the round found it (Kueue nominates before it processes); None
        when what others kept in this round leaves no room even without them (tried again next round)."""
        pol = cq.preemption
        fair = self.fair_sharing and cq.cohort is not None
        if pol.within_cluster_queue == "Never" and pol.reclaim_within_cohort == "Never" \
                and pol.borrow_within_cohort == "Never":
            return False
        # Kueue looks for victims only when the request fits the nominal quota, or it may preempt while borrowing
        if not (self._within_nominal(e, cq) or pol.borrow_within_cohort == "LowerPriority"
                or (fair and pol.reclaim_within_cohort != "Never")):
            return False
        ideal = assign(cq, e.need, self._unused_tree(), self.catalog)
        if isinstance(ideal, str):
            return False  # it could not fit even with the whole cohort unused
        p = preemption.Preemptor(cq, e.priority, e.queued_at, ideal.usage)
        cands = [preemption.Candidate(a.uid, a.cq, a.priority, a.queued_at, a.admitted_at, a.cluster, a.usage)
                 for a in [*self.admitted.values(), *self._victims.values()]]

        def fits(borrowing: bool = True) -> bool:
            got = assign(cq, e.need, self.tree, self.catalog)
            return isinstance(got, Assignment) and (borrowing or not got.borrows)

        for cq_name, usage in self._round_reserved:
            self.tree.remove(cq_name, usage)
        try:
            sets = self._victim_sets(e, cq, p, cands, fits, fair, ideal.usage)
        finally:
            for cq_name, usage in self._round_reserved:
                self.tree.add(cq_name, usage)
        if not sets:
            return False
        best, where = preemption.choose(sets, lambda name, victims: self._fits_after(e, cq, name, victims, views,
                                                                                     now, timeout))
        for c, _ in best:
            self.tree.remove(c.cq, c.usage)
        room = fits()
        for c, _ in best:
            self.tree.add(c.cq, c.usage)
        if not room:
            return None
        return self._evict_for(e, cq, best, where, ideal.usage, result)

    def _victim_sets(self, e: Entry, cq: api.ClusterQueue, p: preemption.Preemptor,
                     cands: list[preemption.Candidate], fits: Callable[[bool], bool], fair: bool,
                     wanted: dict[FR, Decimal]) -> list[list[tuple[preemption.Candidate, str]]]:
        """Kueue's victim set first, then those Kueue's ties allow (one per cluster preferred)."""
        sets: list[list[tuple[preemption.Candidate, str]]] = []
        if fair:
            ordered = preemption.fair_candidates(p, cands, self.tree)
            by_uid = {c.uid: c for c in ordered}
            found = fairshare.preemptions(cq.name, wanted, [(c.uid, c.cq) for c in ordered],
                                          lambda uid: (by_uid[uid].cq, by_uid[uid].usage), self.tree,
                                          fairshare.Shares(self.tree, self.catalog), lambda: fits(True),
                                          self.preemption_strategies)
            if found is not None:
                sets.append([(by_uid[uid], word) for uid, word in found])
        else:
            kueue = preemption.classical(p, cands, self.tree, fits)
            if kueue is not None:
                sets.append(kueue)
                seen = {frozenset(c.uid for c, _ in kueue)}
                for cluster in sorted({c.cluster for c in cands if c.cluster is not None}):
                    other = preemption.classical(p, cands, self.tree, fits, prefer=cluster)
                    if other is not None and frozenset(c.uid for c, _ in other) not in seen:
                        seen.add(frozenset(c.uid for c, _ in other))
                        sets.append(other)
        return sets

    def _evict_for(self, e: Entry, cq: api.ClusterQueue, best: list[tuple[preemption.Candidate, str]],
                   where: str | None, usage: dict[FR, Decimal], result: PassResult) -> bool:
        if any(c.uid in self._victims for c, _ in best):
            # Kueue skips an entry whose targets overlap an earlier preemptor's in the same cycle
            e.reason, e.step, e.word = ("waiting for Workloads preempted for another Workload to leave",
                                        "quota", "Preempting")
            result.waiting.append(e)
            return True
        if any(c.uid in self._admitted_now for c, _ in best):
            # Kueue's next cycle would take a Workload admitted in this one: the next pass does (its Place
            # is sent first, never a Place and a Delete in one pass)
            e.reason, e.step, e.word = (f"preempting Workloads admitted a moment ago to get quota in ClusterQueue "
                                        f"{cq.name}: next pass", "quota", "Preempting")
            result.waiting.append(e)
            return True
        who = f"{e.namespace}/{e.name}"
        for c, word in best:
            result.evicted.append(Eviction(c.uid, e, word, f"Preempted to accommodate a workload ({who}, UID: {e.uid}) "
                                                           f"due to {REASONS[word]}"))
            self._victims[c.uid] = self.admitted.pop(c.uid)   # still counted in the tree until the pass ends
        self._preemptors[e.cq] = e.uid
        self.tree.add(cq.name, usage)   # the room is the preemptor's for the rest of the pass
        self._reserved.append((cq.name, dict(usage)))
        e.preempting_since = self._stamp
        room = (f"; their room is freed on cluster {where}" if where is not None else
                "; their room is on no single cluster where it fits: it waits for room to be freed where it fits")
        e.reason, e.step, e.word = (f"preempting {len(best)} admitted Workload(s) to get quota in ClusterQueue "
                                    f"{cq.name}{room}", "quota", "Preempting")
        result.waiting.append(e)
        return True

    def _would_borrow(self, e: Entry, cq: api.ClusterQueue | None) -> bool:
        """Whether ``e``, which does not fit now, would borrow if it were admitted: after the preemptions
        Kueue would make for it, when it may preempt (Kueue orders a head that does not fit by that too)."""
        if cq is None or cq.name not in self.tree.queues:
            return False
        ideal = assign(cq, e.need, self._unused_tree(), self.catalog)
        if isinstance(ideal, str):
            return True
        victims = [] if self.fair_sharing else self._kueue_victims(e, cq, ideal.usage)
        for c in victims:
            self.tree.remove(c.cq, c.usage)
        try:
            return any(self.tree.borrows(cq.name, fr, v) for fr, v in ideal.usage.items())
        finally:
            for c in victims:
                self.tree.add(c.cq, c.usage)

    def _kueue_victims(self, e: Entry, cq: api.ClusterQueue, usage: dict[FR, Decimal]) -> list[preemption.Candidate]:
        """The victims Kueue's classical preemption would take for ``e`` now ([] when none or it may not)."""
        pol = cq.preemption
        if pol.within_cluster_queue == "Never" and pol.reclaim_within_cohort == "Never" \
                and pol.borrow_within_cohort == "Never":
            return []
        if not (self._within_nominal(e, cq) or pol.borrow_within_cohort == "LowerPriority"):
            return []
        cands = [preemption.Candidate(a.uid, a.cq, a.priority, a.queued_at, a.admitted_at, a.cluster, a.usage)
                 for a in self.admitted.values()]

        def fits(borrowing: bool = True) -> bool:
            got = assign(cq, e.need, self.tree, self.catalog)
            return isinstance(got, Assignment) and (borrowing or not got.borrows)
        found = preemption.classical(preemption.Preemptor(cq, e.priority, e.queued_at, usage), cands, self.tree, fits)
        return [c for c, _ in found or []]

    def _reserve_unreclaimable(self, e: Entry, cq: api.ClusterQueue, reserved: list[tuple[str, dict[FR, Decimal]]]
                               ) -> None:
        """A head that needs preemption and found no victims keeps what it could use of its quota for the rest
        of the round when its ClusterQueue cannot always reclaim (``reclaimWithinCohort`` other than ``Any``),
        so that Workloads after it in the round do not take it (Kueue's ``reserveCapacityForUnreclaimablePreempt``);
        with ``prioritize_preemptors``, a preemptor whose victims are leaving keeps it in any case."""
        pol = cq.preemption
        if (pol.reclaim_within_cohort == "Any"
                and not (self.prioritize_preemptors and self._preempting(e, self._stamp))) \
                or cq.name not in self.tree.queues:
            return
        fair = self.fair_sharing and cq.cohort is not None
        if not (self._within_nominal(e, cq) or pol.borrow_within_cohort == "LowerPriority"
                or (fair and pol.reclaim_within_cohort != "Never")):
            return  # Kueue would not look for victims: it does not fit (NoFit), nothing is kept
        ideal = assign(cq, e.need, self._unused_tree(), self.catalog)
        if isinstance(ideal, str):
            return
        node = self.tree.queues[cq.name]
        borrowing = any(node.usage.get(fr, ZERO) + v > node.nominal.get(fr, ZERO) for fr, v in ideal.usage.items())
        keep: dict[FR, Decimal] = {}
        for fr, v in ideal.usage.items():
            used, nominal = node.usage.get(fr, ZERO), node.nominal.get(fr, ZERO)
            if borrowing:
                limit = node.borrowing_limit.get(fr)
                amount = v if limit is None else min(v, nominal + limit - used)
            else:
                amount = min(v, nominal - used)
            if amount > 0:
                keep[fr] = amount
        if keep:
            self.tree.add(cq.name, keep)
            reserved.append((cq.name, keep))

    def _fits_after(self, e: Entry, cq: api.ClusterQueue, name: str, victims: list[preemption.Candidate],
                    views: Mapping[str, ClusterView], now: datetime, timeout: float) -> bool:
        """Whether ``e`` fits on cluster ``name`` once the victims' pods there are gone (their room by the
        totals: which nodes they run on is not known here)."""
        view = views.get(name)
        if view is None:
            return False
        freed: dict[str, Decimal] = {}
        for c in victims:
            for (_, res), amount in c.usage.items():
                freed[res] = freed.get(res, ZERO) + amount
        free = {k: view.free.get(k, ZERO) + freed.get(k, ZERO) for k in {*view.free, *freed}}
        after = replace(view, free=free, largest_node_free={}, nodes=[], rooms={})
        decision = self.policy(e.need, [after], now=now, timeout=timeout, exclude=e.excluded,
                               constraints=self._constraints(e, cq))
        return decision.cluster is not None

    def share(self, cq: str, extra: Mapping[FR, Decimal] | None = None) -> Decimal:
        """Fair sharing's weighted dominant resource share of a ClusterQueue (``fairshare.Shares``)."""
        node = self.tree.queues.get(cq)
        if node is None or cq not in self.catalog.cluster_queues:
            return ZERO
        return fairshare.Shares(self.tree, self.catalog).of(node, extra)

    def _unused_tree(self) -> QuotaTree:
        if self._unused is None:
            self._unused = QuotaTree(self.catalog)
        return self._unused

    def _in_order(self, tried: list[tuple[bool, Entry, api.ClusterQueue | None, Assignment | str]], stamp: float
                  ) -> Iterable[tuple[bool, Entry, api.ClusterQueue | None, Assignment | str]]:
        """The round's heads in the order they are tried: as sorted, or with fair sharing, each time the one
        whose ClusterQueue would then not borrow, else has the lowest share after its admission, counting what
        the round did so far (Kueue's fair sharing tournament); then priority and queue time."""
        if not self.fair_sharing:
            yield from tried
            return
        rest = list(tried)
        while rest:
            keys = [(not self._first(t[1], stamp), *self._fair_rank(t[2], t[1], t[3]), t[1].key()) for t in rest]
            yield rest.pop(min(range(len(rest)), key=keys.__getitem__))

    def _fair_rank(self, cq: api.ClusterQueue | None, e: Entry, got: Assignment | str) -> tuple[bool, Decimal]:
        if cq is None or cq.name not in self.tree.queues:
            return False, ZERO
        if isinstance(got, Assignment):
            usage = got.usage
        else:
            ideal = assign(cq, e.need, self._unused_tree(), self.catalog)
            usage = ideal.usage if isinstance(ideal, Assignment) else {}
        borrows = any(self.tree.borrows(cq.name, fr, v) for fr, v in usage.items())
        return borrows, self.share(cq.name, usage)

    def _within_nominal(self, e: Entry, cq: api.ClusterQueue) -> bool:
        """Whether ``e`` alone fits the ClusterQueue's nominal quota in some flavor of each group."""
        for res, amount in e.need.total.items():
            if amount <= 0 or res == "pods":
                continue
            group = cq.group_of(res)
            if group is None or not any(fq.resources.get(res) is not None and fq.resources[res].nominal >= amount
                                        for fq in group.flavors):
                return False
        return True

    def _quota_still_fits(self, cq: api.ClusterQueue, got: Assignment) -> bool:
        return all(self.tree.available(cq.name, fr) >= amount for fr, amount in got.usage.items())

    def _equivalent_failed(self, e: Entry, stamp: float, blocked: set[str | None], result: PassResult) -> bool:
        """``e`` is equal (priority and pods) to a Workload of its ClusterQueue that found no quota since quota
        last freed: set aside with the same reason, untried (Kueue moves its whole equivalence class)."""
        failed = self._failed.get(e.cq)
        if not failed or self._starving(e, stamp) or self._preempting(e, stamp):
            return False
        why = failed.get(_shape(e))
        if why is None:
            return False
        spec = self.catalog.cluster_queues.get(e.cq) if e.cq else None
        return self._wait(e, "quota", why, stamp, spec, blocked, result)

    def _sticky(self, cq: str | None, stamp: float, done: set[str]) -> Entry | None:
        """The preemptor of a ClusterQueue stays its head until it is admitted (Kueue's sticky preemptor of
        a ``BestEffortFIFO`` queue): a head that came before it must not take the room it freed."""
        uid = self._preemptors.get(cq)
        if uid is None:
            return None
        e = self.entries.get(uid)
        if e is None or e.cq != cq or e.set_aside or not self._preempting(e, stamp):
            del self._preemptors[cq]
            return None
        return None if uid in done else e

    def _preempting(self, e: Entry, stamp: float) -> bool:
        """It evicted Workloads for its quota, not longer ago than ``hold_seconds``."""
        return e.preempting_since is not None and stamp - e.preempting_since < self.held.seconds

    def _first(self, e: Entry, stamp: float) -> bool:
        """Tried before the rest of the round: a starving head, and (``prioritize_preemptors``, Kueue's
        ``PrioritizePreemptorWorkloads`` gate) a preemptor whose victims are leaving: its room is its own, so
        no one it evicted, or anyone else, takes that room first and makes it preempt again. Without it, a
        preemptor is ordered as Kueue's default orders it (what needs no borrowing first), which can loop."""
        return self._starving(e, stamp) or (self.prioritize_preemptors and self._preempting(e, stamp))

    def _starving(self, e: Entry, stamp: float) -> bool:
        return e.set_aside_since is not None and stamp - e.set_aside_since >= self.starvation_seconds

    def _constraints(self, e: Entry, cq: api.ClusterQueue | None) -> Constraints | None:
        pin = set(e.placement.pin)
        exclude = set(e.placement.exclude)
        selector = dict(e.placement.selector)
        if cq is not None:
            if cq.placement.pin:
                pin = pin & set(cq.placement.pin) if pin else set(cq.placement.pin)
                if not pin:
                    pin = {"(none: the Job's and the ClusterQueue's pins do not overlap)"}
            exclude |= cq.placement.exclude
            selector = {**cq.placement.selector, **selector}
        if not pin and not exclude and not selector:
            return None
        return Constraints(frozenset(pin), frozenset(exclude), selector)

    def _wait(self, e: Entry, why: str, text: str, stamp: float, cq: api.ClusterQueue | None,
              blocked: set[str | None], result: PassResult) -> bool:
        """Record why ``e`` waits; set it aside (True) or block its queue (False)."""
        step = "quota" if why == "quota" else "placement"
        if e.note:
            text = f"{text}; {e.note}"
        if e.reason != text or e.step != step:
            e.reason, e.step = sys.intern(text), step  # thousands wait for the same reason: one string
            e.word = "QuotaNotReserved" if why == "quota" else "NoFittingCluster"
            result.waiting.append(e)
        if e.set_aside_since is None:
            e.set_aside_since = stamp
        strict = cq is not None and cq.strategy == "StrictFIFO"
        if strict or (why == "quota" and self._starving(e, stamp) and self._hold_queue(e, cq, stamp)):
            blocked.add(e.cq)  # the head blocks its queue: nothing behind it goes first
            return False
        self._pop(e)
        e.set_aside = why
        self.aside.setdefault(e.cq, {})[e.uid] = e
        return True

    def _hold(self, e: Entry, need: Need, views: list[ClusterView], now: datetime, timeout: float,
              stamp: float) -> None:
        """A starving head holds the cluster that comes closest to fitting it (most allocatable of
        what it asks for, among those it may use) so that freed room accumulates for it."""
        mine = self.held.by_uid.get(e.uid)
        if mine is not None and mine.cluster is not None:
            return
        self.held.drop(e.uid)   # it held its queue's quota; it has quota now, and needs a cluster
        taken = self.held.clusters()
        candidates = [v for v in views if eligible(v, now=now, timeout=timeout) and v.name not in e.excluded
                      and v.name not in taken and (v.kinds is None or need.kind in v.kinds)]
        wanted = [k for k, v in need.total.items() if v > 0 and k != "pods"]
        fits_total = [v for v in candidates if all(v.allocatable.get(k, ZERO) >= need.total[k] for k in wanted)]
        if not fits_total:
            return
        best = max(fits_total, key=lambda v: (_room(v, need), v.name))
        self.held.add(e.uid, best.name, _room(best, need), stamp)

    def _hold_queue(self, e: Entry, cq: api.ClusterQueue | None, stamp: float) -> bool:
        """A starving head short of quota blocks its ClusterQueue, if it could have that quota at all
        (alone in its unused cohort) and its hold was not let go."""
        if cq is None:
            return False
        mine = self.held.by_uid.get(e.uid)
        if mine is not None and mine.cluster is not None:
            self.held.drop(e.uid)   # it held a cluster; quota is what it lacks now
        if e.uid not in self.held.by_uid:
            if isinstance(assign(cq, e.need, self._unused_tree(), self.catalog), str):
                return False  # more than the ClusterQueue can ever give it: blocking would block forever
            self.held.add(e.uid, None, self._quota_room(e, cq), stamp)
        return self.held.by_uid[e.uid].cluster is None

    def _quota_room(self, e: Entry, cq: api.ClusterQueue) -> Decimal:
        """The least share of what ``e`` asks for that its ClusterQueue may still use (best flavor)."""
        room: Decimal | None = None
        for res, amount in e.need.total.items():
            group = cq.group_of(res)
            if amount <= 0 or group is None:
                continue
            best = max((self.tree.available(cq.name, (f.name, res)) for f in group.flavors), default=ZERO)
            room = best / amount if room is None else min(room, best / amount)
        return room if room is not None else ZERO

    def _check_holds(self, views: Mapping[str, ClusterView], stamp: float, result: PassResult) -> None:
        """Holds whose room stopped growing for ``hold_seconds`` are let go (see ``holds``)."""
        for uid, hold in list(self.held.by_uid.items()):
            e = self.entries.get(uid)
            spec = self.catalog.cluster_queues.get(e.cq) if e is not None and e.cq else None
            if e is None or (hold.cluster is not None and hold.cluster not in views) or (
                    hold.cluster is None and spec is None):
                self.held.drop(uid)
                continue
            if hold.cluster is not None:
                room = _room(views[hold.cluster], e.need)
            else:
                assert spec is not None
                room = self._quota_room(e, spec)
            gone = self.held.observe(uid, room, stamp)
            if gone is None:
                continue
            what = f"cluster {gone.cluster}" if gone.cluster else f"the quota of ClusterQueue {e.cq}"
            e.note = (f"let go of {what}, held for it {stamp - gone.since:.0f}s: no more room for it there in "
                      f"{self.held.seconds:g}s; it waits like any other and may hold again after "
                      f"{self.starvation_seconds:g}s")
            e.set_aside_since = stamp   # its starvation clock starts over
            e.reason = f"{e.reason.split('; let go of ')[0]}; {e.note}"
            result.waiting.append(e)

    @property
    def holds(self) -> dict[str, str]:
        """Held cluster -> the uid of the starving head holding it."""
        return self.held.clusters()

    def _admit(self, e: Entry, cq: api.ClusterQueue | None, got: Assignment, need: Need, cluster: str, why: str,
               views: Mapping[str, ClusterView], result: PassResult) -> None:
        self._pop(e)
        self.discard(e.uid)
        if cq is not None:
            self.hold_quota(Admitted(e.uid, cq.name, dict(got.usage), e.priority, got.flavors, e.namespace, e.queue,
                                     e.queued_at, self._stamp, cluster))
        view = views[cluster]
        view.free = {k: view.free.get(k, ZERO) - v for k, v in need.total.items()} | {
            k: v for k, v in view.free.items() if k not in need.total}
        if view.nodes:
            view.nodes = subtract_from_nodes(view.nodes, need.total, need)
        self._admitted_now.add(e.uid)
        result.admitted.append(Admission(e, cluster, why, need, got.flavors, dict(got.usage), got.borrows))


def _shape(e: Entry) -> tuple[object, ...]:
    """What makes two pending Workloads equal to the scheduler: priority, pods, constraints."""
    pods = tuple((ps.name, ps.count, tuple(sorted(ps.requests.items())), ps.node_selector, ps.tolerations,
                  ps.affinity) for ps in e.need.podsets)
    return (e.priority, e.need.kind, pods, repr(e.placement), e.excluded, e.pinned)


def _room(view: ClusterView, need: Need) -> Decimal:
    """The least free share, on one cluster, of what a Workload asks for (1: all of it is free)."""
    wanted = [k for k, v in need.total.items() if v > 0 and k != "pods"]
    return min((view.free.get(k, ZERO) / need.total[k] for k in wanted), default=ZERO)
