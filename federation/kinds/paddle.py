"""PaddleJob (kubeflow.org/v1): Master and Worker, container ``paddle`` (the webhook does not fix Master's count)."""

from __future__ import annotations

from federation.kinds.kubeflow import v1_kind

PADDLEJOB = v1_kind(
    "PaddleJob", "paddlejobs", "paddleReplicaSpecs", ("Master", "Worker"), "paddle", single_types=()
)
