"""XGBoostJob (kubeflow.org/v1): Master (required, exactly 1) and Worker, container ``xgboost``."""

from __future__ import annotations

from federation.kinds.kubeflow import v1_kind

XGBOOSTJOB = v1_kind(
    "XGBoostJob",
    "xgboostjobs",
    "xgbReplicaSpecs",
    ("Master", "Worker"),
    "xgboost",
    required_types=("Master",),
    single_replicas_explicit=True,
    port_name="xgboostjob-port",
    default_port=9999,
)
