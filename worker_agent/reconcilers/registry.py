"""The explicit list of reconcilers the agent runs, keyed by JobKind name (no import side effects)."""

from __future__ import annotations

from worker_agent.reconcilers.base import Reconciler
from worker_agent.reconcilers.batchjob import BatchJobPassThrough
from worker_agent.reconcilers.family import (
    JAXJobReconciler,
    PaddleJobReconciler,
    TFJobReconciler,
    XGBoostJobReconciler,
)
from worker_agent.reconcilers.jobset import JobSetReconciler
from worker_agent.reconcilers.mpi import MPIJobReconciler
from worker_agent.reconcilers.pytorch import PyTorchJobReconciler
from worker_agent.reconcilers.trainjob import TrainJobReconciler


def reconcilers() -> dict[str, Reconciler]:
    """A fresh reconciler per kind the agent can run itself."""
    found: list[Reconciler] = [
        PyTorchJobReconciler(),
        TFJobReconciler(),
        XGBoostJobReconciler(),
        PaddleJobReconciler(),
        JAXJobReconciler(),
        BatchJobPassThrough(),
        MPIJobReconciler(),
        TrainJobReconciler(),
        JobSetReconciler(),
    ]
    return {r.kind: r for r in found}
