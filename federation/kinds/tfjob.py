"""TFJob (kubeflow.org/v1): Chief/PS/Worker/Evaluator/Master, container ``tensorflow``.

At most one of Chief and Master, with one replica.
"""

from __future__ import annotations

from federation.kinds.kubeflow import v1_kind

TFJOB = v1_kind(
    "TFJob",
    "tfjobs",
    "tfReplicaSpecs",
    ("Chief", "Master", "PS", "Worker", "Evaluator"),
    "tensorflow",
    single_types=("Chief", "Master"),
    at_most_one_of=("Chief", "Master"),
    port_name="tfjob-port",
    default_port=2222,
)
