"""PaddleJob (kubeflow.org/v1): Master and Worker, container ``paddle``.

The webhook does not fix the Master's count (parameter-server mode may run several).
"""

from __future__ import annotations

from federation.kinds.kubeflow import v1_kind

PADDLEJOB = v1_kind(
    "PaddleJob", "paddlejobs", "paddleReplicaSpecs", ("Master", "Worker"), "paddle", single_types=(),
    port_name="master", default_port=36543,
)
