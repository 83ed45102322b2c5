"""JAXJob (kubeflow.org/v1): Worker only, container ``jax``."""

from __future__ import annotations

from federation.kinds.kubeflow import v1_kind

JAXJOB = v1_kind("JAXJob", "jaxjobs", "jaxReplicaSpecs", ("Worker",), "jax", single_types=(),
                 port_name="jaxjob-port", default_port=6666, default_restart_policy="OnFailure")
