"""The explicit list of reconcilers the agent runs, keyed by JobKind name (no import side effects)."""

from __future__ import annotations

from collections.abc import Sequence

from federation.kinds.base import JobKind
from federation.kinds.registry import KINDS
from worker_agent.reconcilers.base import Reconciler
from worker_agent.reconcilers.family import (
    JAXJobReconciler,
    PaddleJobReconciler,
    TFJobReconciler,
    XGBoostJobReconciler,
)
from worker_agent.reconcilers.jobset import JobSetReconciler
from worker_agent.reconcilers.mpi import MPIJobReconciler
from worker_agent.reconcilers.passthrough import PassThrough
from worker_agent.reconcilers.pods import PodGroupReconciler
from worker_agent.reconcilers.pytorch import PyTorchJobReconciler
from worker_agent.reconcilers.trainjob import TrainJobReconciler


def reconcilers(kinds: Sequence[JobKind] = KINDS) -> dict[str, Reconciler]:
    """A fresh reconciler per kind the agent can run itself, and a pass-through per kind of ``kinds`` the worker
    cluster's own controller runs (the kind's ``run_by``: declared kinds always)."""
    found: list[Reconciler] = [
        PyTorchJobReconciler(),
        TFJobReconciler(),
        XGBoostJobReconciler(),
        PaddleJobReconciler(),
        JAXJobReconciler(),
        MPIJobReconciler(),
        TrainJobReconciler(),
        JobSetReconciler(),
        PodGroupReconciler(),
    ]
    found += [PassThrough(kind.name) for kind in kinds if kind.run_by == "operator"]
    return {r.kind: r for r in found}
