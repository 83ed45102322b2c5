"""HandoverPolicy: which new Jobs a platform team hands to mkd, read from the manager cluster.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from dispatcher.queueing.api import Selector, parse_selector
from federation.errors import Invalid

GROUP = "handover.mkd.dev"
VERSION = "v1alpha1"
PLURAL = "handoverpolicies"
KIND = "HandoverPolicy"
MODES = ("Shadow", "Route", "Drain")
Mode = Literal["Shadow", "Route", "Drain"]


@dataclass(frozen=True)
class Policy:
    """One HandoverPolicy, parsed.

    A ``HandoverPolicy`` (``handover.mkd.dev/v1alpha1``, cluster-scoped, several allowed) selects Jobs by
    namespace labels, Job labels and kind, and says what happens to the new ones it selects:

    - ``Shadow``: nothing is routed; mkd records what it would have done with the Jobs other controllers
      run (see :mod:`dispatcher.handover.book`).
    - ``Route``: a new Job whose managedBy the user left unset is given ``kueue.x-k8s.io/multikueue`` by
      the admission webhook, for ``percent`` of the selected Jobs. The share is a stable hash of
      ``namespace/name`` (:func:`bucket`), so raising 10 to 50 keeps the first 10% and adds to them.
    - ``Drain``: no new Job is routed to mkd; what mkd holds runs to its end.
    """

    name: str
    mode: Mode
    namespaces: Selector = field(default_factory=Selector)
    jobs: Selector = field(default_factory=Selector)
    kinds: frozenset[str] = frozenset()  # empty: every kind mkd supports
    percent: int = 100

    def selects(self, kind: str, namespace_labels: Mapping[str, str], job_labels: Mapping[str, str]) -> bool:
        return ((not self.kinds or kind in self.kinds) and self.namespaces.matches(namespace_labels)
                and self.jobs.matches(job_labels))


def parse(obj: Mapping[str, Any], known_kinds: Iterable[str]) -> Policy:
    """A Policy from a HandoverPolicy object; :class:`Invalid` names the first bad field and the fix."""
    name = str((obj.get("metadata") or {}).get("name") or "")
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise Invalid("spec", "is required", fix="give the policy a spec with a mode")
    mode = spec.get("mode")
    if mode not in MODES:
        raise Invalid("spec.mode", f"{mode!r} is not a mode", fix="use Shadow, Route or Drain")
    percent = spec.get("percent", 100)
    if not isinstance(percent, int) or isinstance(percent, bool) or not 0 <= percent <= 100:
        raise Invalid("spec.percent", f"{percent!r} is not a whole percentage", fix="use 0 to 100")
    known = set(known_kinds)
    kinds = spec.get("kinds") or []
    for i, kind in enumerate(kinds):
        if kind not in known:
            raise Invalid(f"spec.kinds[{i}]", f"{kind!r} is not a kind mkd supports",
                          fix=f"use one of {', '.join(sorted(known))}")
    return Policy(name, mode, parse_selector(spec.get("namespaceSelector"), "spec.namespaceSelector") or Selector(),
                  parse_selector(spec.get("jobSelector"), "spec.jobSelector") or Selector(), frozenset(kinds), percent)


def bucket(namespace: str, name: str) -> int:
    """A stable 0..99 for ``namespace/name``: the same Job falls in the same share on every replica."""
    digest = hashlib.sha256(f"{namespace}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 100


@dataclass(frozen=True)
class Decision:
    """What the policies say of one new Job: route it to mkd or not, and which policy decided."""

    route: bool
    policy: str | None  # None: no policy selects the Job
    mode: Mode | None
    reason: str


def decide(policies: Iterable[Policy], *, kind: str, namespace: str, name: str,
           namespace_labels: Mapping[str, str], job_labels: Mapping[str, str]) -> Decision:
    """Route a new Job to mkd or leave it to its own controller (precedence: Drain, Route, Shadow).

    Precedence when several policies select a Job: a ``Drain`` wins (a drain is an explicit stop), then a
    ``Route`` whose share takes the Job, then ``Shadow``. Rolling back is editing or deleting a policy:
    a Job never changes hands after it was created. This module is pure: parsing with errors that name
    the field, selection and the decision.
    """
    chosen = sorted((p for p in policies if p.selects(kind, namespace_labels, job_labels)), key=lambda p: p.name)
    if not chosen:
        return Decision(False, None, None, "no HandoverPolicy selects it")
    drain = next((p for p in chosen if p.mode == "Drain"), None)
    if drain is not None:
        return Decision(False, drain.name, "Drain", f"HandoverPolicy {drain.name} drains: no new Job goes to mkd")
    share = bucket(namespace, name)
    for p in chosen:
        if p.mode == "Route" and share < p.percent:
            return Decision(True, p.name, "Route", f"HandoverPolicy {p.name} routes {p.percent}% (this Job: {share})")
    route = next((p for p in chosen if p.mode == "Route"), None)
    if route is not None:
        return Decision(False, route.name, "Route",
                        f"HandoverPolicy {route.name} routes {route.percent}%; this Job's share {share} is outside it")
    return Decision(False, chosen[0].name, "Shadow", f"HandoverPolicy {chosen[0].name} only shadows")
