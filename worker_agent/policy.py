"""The agent's policy: the shared check (``federation.policy``) under the agent's settings name.

The agent enforces it in the inbox before creating anything (Rejected, reason ``PolicyViolation``,
naming each field), labels the namespaces it creates with the Pod Security level, and announces
the policy in its heartbeat so the dispatcher can skip a cluster that would refuse a Job.
``CheckedPolicy`` remembers the answers for the last few (namespace, spec) pairs: Jobs placed in a
burst mostly share one spec, and the check walks every pod template of it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import orjson

from federation.policy import LEVELS, Level, Policy, PolicySettings, Violation, describe, pod_specs

REMEMBERED = 256
"""(namespace, spec) pairs whose answers ``CheckedPolicy`` keeps."""


class CheckedPolicy(Policy):
    """``Policy`` whose ``check`` answers a (namespace, spec) seen lately from memory.

    The answer depends on nothing else: the namespace rules, and per pod template its spec and the
    metadata next to it, all under ``spec``. The key is the spec as canonical JSON (sorted keys)."""

    def __init__(self, settings: PolicySettings) -> None:
        super().__init__(settings)
        self._answers: OrderedDict[tuple[str, bytes], tuple[Violation, ...]] = OrderedDict()

    def check(self, manifest: Mapping[str, Any], namespace: str) -> list[Violation]:
        try:
            key = (namespace, orjson.dumps(manifest.get("spec"), option=orjson.OPT_SORT_KEYS))
        except TypeError:  # not JSON data: no key to remember it by
            return super().check(manifest, namespace)
        answer = self._answers.get(key)
        if answer is None:
            answer = self._answers[key] = tuple(super().check(manifest, namespace))
            if len(self._answers) > REMEMBERED:
                self._answers.popitem(last=False)
        else:
            self._answers.move_to_end(key)
        return list(answer)


__all__ = ["LEVELS", "CheckedPolicy", "Level", "Policy", "PolicySettings", "Violation", "describe", "pod_specs"]
