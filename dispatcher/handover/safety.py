"""Never take over a Job another controller has started.

managedBy is immutable where mkd's admission policy is installed, but not everywhere: a Job that the
training-operator already runs can have its managedBy flipped to ``kueue.x-k8s.io/multikueue``. Claiming
it would run it a second time on a worker and overwrite the first controller's status. At claim time mkd
has written nothing to a Job, so any sign of a controller's work in its status is someone else's:
``status.startTime``, a condition (any type: mkd's own come later), or active pods counted in the status
(``active`` of a batch Job, ``replicaStatuses[*].active`` of the Kubeflow kinds,
``replicatedJobsStatus[*].active`` of a JobSet). Such a Job is refused with a condition and an Event
that say so; the other controller keeps it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from federation.errors import Invalid

REASON = "StartedByAnotherController"


def started_elsewhere(job: Mapping[str, Any]) -> Invalid | None:
    """Why ``job`` shows another controller's work, or None when its status is untouched."""
    status = job.get("status")
    if not isinstance(status, Mapping) or not status:
        return None
    signs: list[str] = []
    if status.get("startTime"):
        signs.append(f"status.startTime is {status['startTime']}")
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, Mapping)]
    if conditions:
        shown = ", ".join(f"{c.get('type')}={c.get('status')}" for c in conditions[:3])
        signs.append(f"status.conditions has {shown}")
    active = _active(status)
    if active:
        signs.append(f"{active} active pod(s) in its status")
    if not signs:
        return None
    return Invalid("status", f"another controller already started this Job ({'; '.join(signs)}); mkd does not "
                   "take over a started Job, so it would not run twice",
                   fix="leave it to the controller that runs it, or delete it and create it again with "
                       "managedBy kueue.x-k8s.io/multikueue")


def _active(status: Mapping[str, Any]) -> int:
    total = 0
    if isinstance(status.get("active"), int):
        total += status["active"]
    for group in ("replicaStatuses", "replicatedJobsStatus"):
        entries = status.get(group)
        values = entries.values() if isinstance(entries, Mapping) else entries if isinstance(entries, list) else []
        for entry in values:
            if isinstance(entry, Mapping) and isinstance(entry.get("active"), int):
                total += entry["active"]
    return total
