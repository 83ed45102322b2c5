"""Why a Job of the manager cluster has no Workload: who manages it instead.

mkd claims only Jobs whose managedBy is ``kueue.x-k8s.io/multikueue`` and never writes to the others,
so the database knows nothing about them. ``mkctl placements show NAME`` (with ``--kubeconfig``) and the
API's Workload endpoint ask the manager cluster instead: every kind mkd knows is looked up by name and
the answer names the controller the Job is left to, and the field that says so.
"""

from __future__ import annotations

from typing import Any

from federation import labels
from federation.errors import FederationError, NotFound
from federation.kinds.base import dotted
from federation.kinds.registry import KINDS


async def explain(kube: Any, namespace: str, name: str) -> str | None:
    """One sentence about the Job ``namespace/name`` mkd did not claim, or None when no kind has it."""
    from federation.kube import resource_for

    for kind in KINDS:
        try:
            job = await kube.get(resource_for(kind), name, namespace)  # type: ignore[arg-type]
        except NotFound:
            continue  # no such Job of this kind (or the kind is not served)
        except FederationError:
            continue
        managed_by = kind.managed_by(job)
        where = dotted(kind.managed_by_path)
        if managed_by == labels.MULTIKUEUE:
            return (f"{namespace}/{name} ({kind.name}) has {where}: {labels.MULTIKUEUE} but no Workload yet: "
                    "the dispatcher has not claimed it (is it running and watching this namespace?)")
        owner = managed_by or kind.controller
        value = repr(managed_by) if managed_by else "unset"
        return (f"{namespace}/{name} ({kind.name}) is left to {owner}: its {where} is {value}, "
                f"and mkd only claims Jobs whose {where} is {labels.MULTIKUEUE}")
    return None
