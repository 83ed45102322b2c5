"""Placement against the clusters' announced policies: a Job is not sent where it would be refused.

:meth:`PolicyGate.apply` runs before each scheduling pass: every queued Workload's cluster exclusions
(``dispatcher.queueing``'s per-Job constraints) get the clusters whose announced policy refuses it, on top of
its own; :meth:`PolicyGate.why` tells the round why, for the Job's condition and Event.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson

from dispatcher.intake.jobcache import Head, JobCache
from federation import messages
from federation.policy import Policy, describe


class PolicyGate:
    """Every agent announces its policy in its heartbeat (``federation.policy``: namespace rules, allowed
    service accounts, Pod Security level) and enforces it before creating anything. The dispatcher
    checks a pending Job against each announced policy before placing it: a cluster whose policy
    refuses the Job is left out, and when that leaves no cluster the Job waits with the reason
    ``PolicyViolation`` naming each cluster and field (condition ``MultiClusterDispatched=False`` and a
    Warning Event), before any placement. Results are cached per (Job generation, policy).
    """
    def __init__(self) -> None:
        self._policies: dict[str, Policy] = {}
        self._cache: dict[tuple[str, int, str], str] = {}
        self._base: dict[str, tuple[Any, Any]] = {}
        """uid -> (the queue entry, its own placement constraints before any policy exclusion), for the
        entries a policy excludes clusters of."""
        self._why: dict[str, dict[str, str]] = {}
        self._by_spec: dict[tuple[str, str, bytes], str] = {}
        """(policy, worker namespace, the Job's spec as JSON) -> the check's answer: a policy reads nothing
        else of a Job, and Jobs submitted from one template would be checked alike again and again."""

    def apply(self, entries: Mapping[str, Any], cache: JobCache, heartbeats: Mapping[str, messages.Heartbeat],
              decoded: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        """Exclude, per queued Workload, the clusters whose policy refuses it (its own constraints kept).
        ``decoded``: Jobs at hand already decoded (the batch's), read instead of decoding them from ``cache``
        (~15 us each; a Job is checked first in the batch that claims it)."""
        fresh = decoded if decoded is not None else {}
        announced = {name: hb for name, hb in heartbeats.items() if hb.policy is not None}
        texts = {name: hb.policy.model_dump_json() for name, hb in announced.items()}  # type: ignore[union-attr]
        if len(self._base) > 2 * len(entries) + 1000:
            self._base = {u: v for u, v in self._base.items() if u in entries}
            self._why = {u: v for u, v in self._why.items() if u in entries}
        for uid, e in entries.items():
            base = self._base.get(uid)
            own = base[1] if base is not None and base[0] is e else e.placement  # a new entry: its own
            head = cache.head(uid) if announced else None
            refused = (self.refusals(uid, head, lambda uid=uid: fresh.get(uid) or cache[uid],  # type: ignore[misc]
                                     announced, texts)
                       if head is not None else {})
            if refused:
                self._base[uid] = (e, own)  # kept only while a policy changes it (100,000 entries)
                e.placement = type(own)(own.pin, own.exclude | frozenset(refused), own.selector)
                self._why[uid] = refused
            else:
                if base is not None:
                    del self._base[uid]
                e.placement = own
                self._why.pop(uid, None)

    def why(self, uid: str) -> dict[str, str]:
        """The clusters whose policy refuses the Workload, and why (empty: none)."""
        return self._why.get(uid, {})

    def _policy(self, text: str, hb: messages.Heartbeat) -> Policy:
        policy = self._policies.get(text)
        if policy is None:
            assert hb.policy is not None
            if len(self._policies) > 1000:
                self._policies.clear()
            policy = self._policies[text] = Policy(hb.policy)
        return policy

    def refusals(self, uid: str, head: Head, job: Callable[[], Mapping[str, Any]],
                 heartbeats: Mapping[str, messages.Heartbeat], texts: Mapping[str, str] | None = None) -> dict[str, str]:
        """Cluster -> why its policy refuses the Job (clusters that accept it, or announce no policy, absent).
        ``job`` decodes the cached Job, called only when a (generation, policy) was not checked yet."""
        generation = head.generation
        out: dict[str, str] = {}
        obj: Mapping[str, Any] | None = None  # decoded once, for the first policy not checked yet
        for name, hb in heartbeats.items():
            if hb.policy is None:
                continue
            text = texts[name] if texts is not None else hb.policy.model_dump_json()
            key = (uid, generation, text)
            why = self._cache.get(key)
            if why is None:
                policy = self._policy(text, hb)
                namespace = policy.target_namespace(head.namespace or "default")
                if obj is None:
                    obj = job()
                try:
                    spec = orjson.dumps(obj.get("spec"), option=orjson.OPT_SORT_KEYS)
                except TypeError:  # not JSON (never from an API server): no sharing
                    spec = b""
                shared = self._by_spec.get((text, namespace, spec)) if spec else None
                if shared is None:
                    shared = describe(policy.check(obj, namespace))
                    if spec:
                        if len(self._by_spec) >= 1024:
                            self._by_spec.clear()
                        self._by_spec[(text, namespace, spec)] = shared
                why = shared
                if len(self._cache) > 100_000:
                    self._cache.clear()
                self._cache[key] = why
            if why:
                out[name] = why
        return out


def reason(refused: Mapping[str, str], other: str) -> str:
    """The pending reason when policies left no cluster: each refusing cluster and its fields."""
    parts = [f"the policy of {name} refuses it: {why}" for name, why in sorted(refused.items())]
    if other:
        parts.append(other)
    return "; ".join(parts)
