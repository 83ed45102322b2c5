"""Two controllers on one job: noticed, and refused with a message that names the fix.

The agent clears managedBy on the copies it runs itself (the Kubeflow family, MPIJob, JobSet,
TrainJob), and an upstream operator installed in the same cluster reconciles every job whose
managedBy is nil as well: without ``--delegate`` the job would get two controllers and run twice.
The agent tells the two apart by what it stamps: the worker Job and every child the agent creates
carry the annotation ``mkd.dev/created-by`` (``federation.labels.CREATED_BY``). A child controlled by
such a copy (controller ownerReference) without that annotation was made by another controller.
:func:`foreign_owner` says so from a child event; the inbox then refuses the job (stops reconciling
it, deletes the copy, a permanent Rejected and a Warning Event naming ``--delegate``) and refuses
later Places of that kind at once. Copies made by an agent that did not stamp yet (no annotation on
the worker Job) are never judged; delegated kinds and the batch Job (run by the cluster's own Job
controller) are not the agent's to run, so foreign children are expected there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from federation import labels
from federation.messages import REJECTED_TWO_CONTROLLERS
from worker_agent.apply import JobKey

REASON = REJECTED_TWO_CONTROLLERS


def created_by(obj: Mapping[str, Any]) -> str | None:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(labels.CREATED_BY)
    return value if isinstance(value, str) else None


def controller_uid(obj: Mapping[str, Any]) -> str | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


def foreign_owner(child: Mapping[str, Any], by_uid: Mapping[str, JobKey], *, run_here: set[str]) -> JobKey | None:
    """The key of the copy ``child`` is controlled by, when another controller made ``child``.

    ``run_here``: the kinds the agent reconciles itself (not delegated, not pass-through).
    Whether the copy itself is stamped is the caller's check (it holds the job cache)."""
    uid = controller_uid(child)
    key = by_uid.get(uid) if uid else None
    if key is None or key[0] not in run_here or created_by(child) is not None:
        return None
    return key


def message(kind: str, controller: str, namespace: str, name: str, child_kind: str, child_name: str,
            cluster: str) -> str:
    return (f"{child_kind} {namespace}/{child_name} is controlled by {kind} {namespace}/{name} but was not "
            f"created by mkd: another controller (an upstream operator) reconciles {kind} in cluster {cluster}. "
            f"Two controllers on one job would run it twice, so mkd refused the job here and deleted its copy; "
            f"run the agent with --delegate {kind}={controller} to let that operator run {kind}, or uninstall "
            "the operator")
