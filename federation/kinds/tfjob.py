"""TFJob (kubeflow.org/v1): Chief/PS/Worker/Evaluator/Master, container ``tensorflow``, at most one Chief or Master."""

from __future__ import annotations

from federation.kinds.kubeflow import v1_kind

TFJOB = v1_kind(
    "TFJob", "tfjobs", "tfReplicaSpecs", ("Chief", "Master", "PS", "Worker", "Evaluator"), "tensorflow",
    single_types=("Chief", "Master"), at_most_one_of=("Chief", "Master"),
)
