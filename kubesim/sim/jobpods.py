"""What the simulated Job controller knows about its pods, and the Job policies evaluated on them.

Owns ``PodSummary`` (the few fields of a pod the controller's counting needs, kept per Job instead of
whole pods), the completedIndexes interval format, and the pure rules of podFailurePolicy (first matching
rule on exit codes or pod conditions) and successPolicy (succeededIndexes / succeededCount) with the
messages the real controller writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
INDEX_KEY = "batch.kubernetes.io/job-completion-index"


@dataclass
class PodSummary:
    """What the controller needs to know about one of its pods."""

    name: str
    uid: str
    phase: str
    ready: bool
    deleting: bool
    index: int | None
    tracked: bool
    restarts: int
    seq: int
    exit_codes: tuple[tuple[str, int], ...] = ()
    conditions: frozenset[tuple[str, str]] = frozenset()

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def active(self) -> bool:
        return not self.terminal and not self.deleting


def summarize(pod: Mapping[str, Any], seq: int) -> PodSummary:
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    ready = False
    for cond in status.get("conditions") or ():
        if cond.get("type") == "Ready":
            ready = cond.get("status") == "True"
    raw_index = (meta.get("annotations") or {}).get(INDEX_KEY)
    try:
        index = int(raw_index) if raw_index is not None else None
    except ValueError:
        index = None
    restarts = sum(int(cs.get("restartCount") or 0)
                   for cs in list(status.get("containerStatuses") or ()) + list(status.get("initContainerStatuses") or ()))
    phase = status.get("phase") or "Pending"
    exit_codes: tuple[tuple[str, int], ...] = ()
    conditions: frozenset[tuple[str, str]] = frozenset()
    if phase == "Failed":  # what podFailurePolicy rules look at
        exit_codes = tuple((str(cs.get("name")), int(((cs.get("state") or {}).get("terminated") or {}).get("exitCode", 0)))
                           for cs in status.get("containerStatuses") or ()
                           if ((cs.get("state") or {}).get("terminated")))
        conditions = frozenset((str(c.get("type")), str(c.get("status"))) for c in status.get("conditions") or ())
    return PodSummary(name=meta.get("name") or "", uid=meta.get("uid") or "", phase=phase,
                      ready=ready, deleting=bool(meta.get("deletionTimestamp")), index=index,
                      tracked=TRACKING_FINALIZER in (meta.get("finalizers") or ()), restarts=restarts, seq=seq,
                      exit_codes=exit_codes, conditions=conditions)


def owner_uid(pod: Mapping[str, Any]) -> str | None:
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("controller") and ref.get("kind") == "Job" and str(ref.get("apiVersion", "")).startswith("batch/"):
            return str(ref.get("uid"))
    return None


def format_indexes(indexes: Iterable[int]) -> str:
    """completedIndexes form: sorted, consecutive runs as "a-b" ("1,3-5,7")."""
    out: list[str] = []
    run: list[int] = []
    for i in sorted(set(indexes)):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [i]
    if run:
        out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(out)


def parse_indexes(text: str | None) -> set[int]:
    result: set[int] = set()
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                lo, hi = part.split("-", 1)
                result.update(range(int(lo), int(hi) + 1))
            else:
                result.add(int(part))
        except ValueError:
            continue
    return result


def pod_failure_policy(policy: Mapping[str, Any] | None, namespace: str,
                        pod: PodSummary) -> tuple[str, str] | None:
    """(action, message) of the first podFailurePolicy rule matching a failed pod, else None."""
    for i, rule in enumerate((policy or {}).get("rules") or ()):
        action = str(rule.get("action"))
        on_codes = rule.get("onExitCodes")
        if on_codes:
            values = {int(v) for v in on_codes.get("values") or ()}
            wanted = on_codes.get("containerName")
            for name, code in pod.exit_codes:
                if code == 0 or (wanted and wanted != name):
                    continue  # exit code 0 never matches a rule
                if (code in values) == (on_codes.get("operator") == "In"):
                    return action, (f"Container {name} for pod {namespace}/{pod.name} failed with exit code "
                                    f"{code} matching {action} rule at index {i}")
        for pattern in rule.get("onPodConditions") or ():
            if (str(pattern.get("type")), str(pattern.get("status") or "True")) in pod.conditions:
                return action, (f"Pod {namespace}/{pod.name} has condition {pattern.get('type')} matching "
                                f"{action} rule at index {i}")
    return None


def success_policy(policy: Mapping[str, Any] | None, succeeded: set[int]) -> str | None:
    """The SuccessCriteriaMet message when an Indexed Job's successPolicy is met, else None."""
    for i, rule in enumerate((policy or {}).get("rules") or ()):
        count = rule.get("succeededCount")
        if rule.get("succeededIndexes") is not None:
            wanted = parse_indexes(rule.get("succeededIndexes"))
            done = len(wanted & succeeded)
            met = done >= int(count) if count is not None else bool(wanted) and done == len(wanted)
        else:
            met = count is not None and len(succeeded) >= int(count)
        if met:
            return f"Matched rules at index {i}"
    return None


def removal_order(pods: list[PodSummary]) -> list[PodSummary]:
    """Which active pods go first when there are too many: unscheduled/pending, not ready, newest."""
    return sorted(pods, key=lambda p: (p.phase == "Running", p.ready, -p.seq))
