"""Label keys, annotation keys and managedBy values: the one module holding these constants.

Every object the agent creates in a worker cluster carries ``ORIGIN``, ``WORKLOAD_UID``,
``PLACEMENT_ATTEMPT`` and ``JOB_KIND``; garbage collection lists by them and checks the
origin before deleting anything.
"""

from __future__ import annotations

# --- managedBy values -------------------------------------------------------------------
MULTIKUEUE = "kueue.x-k8s.io/multikueue"
"""The value that hands a Job to a multi-cluster dispatcher (mkd claims exactly these)."""

TRAINING_OPERATOR = "kubeflow.org/training-operator"
"""Kubeflow v1 jobs (PyTorchJob, TFJob, XGBoostJob, PaddleJob, JAXJob)."""
MPI_OPERATOR = "kubeflow.org/mpi-operator"
"""MPIJob v2beta1."""
TRAINJOB_CONTROLLER = "trainer.kubeflow.org/trainjob-controller"
"""TrainJob (trainer v2); the CRD defaults spec.managedBy to this value."""
BATCH_JOB_CONTROLLER = "kubernetes.io/job-controller"
"""batch/v1 Job's built-in controller."""
JOBSET_CONTROLLER = "jobset.sigs.k8s.io/jobset-controller"
"""JobSet's own controller."""

# --- Kueue's well-known keys ---------------------------------------------------------------
QUEUE_NAME = "kueue.x-k8s.io/queue-name"
"""Label naming the Queue a Job joins; the default queue otherwise."""
DEFAULT_QUEUE = "default"
KUEUE_ORIGIN = "kueue.x-k8s.io/multikueue-origin"
"""Kueue stamps remote copies with this; mkd stamps it too so Kueue-aware tooling recognises them."""
KUEUE_PREBUILT_WORKLOAD = "kueue.x-k8s.io/prebuilt-workload-name"

# --- mkd's own keys --------------------------------------------------------------------------
PREFIX = "mkd.dev"
ORIGIN = f"{PREFIX}/origin"
"""Name of the dispatcher (federation) that placed the object; GC only touches its own origin."""
WORKLOAD_UID = f"{PREFIX}/workload-uid"
"""uid of the Job in the manager cluster (the Workload key)."""
PLACEMENT_ATTEMPT = f"{PREFIX}/placement-attempt"
"""Placement attempt number (decimal)."""
EPOCH = f"{PREFIX}/epoch"
"""Dispatcher epoch that issued the placement (decimal)."""
JOB_KIND = f"{PREFIX}/kind"
"""JobKind name (``PyTorchJob``, ``MPIJob``, ...)."""
OWNER_UID = f"{PREFIX}/owner-uid"
"""uid of the worker Job that owns a child (Service, ConfigMap, Secret, launcher Job, JobSet); how
the agent's reconcilers list a job's children without scanning the namespace."""
SPEC_VERSION_ANNOTATION = f"{PREFIX}/spec-version"
"""Annotation: the spec version last applied from a place Command (decimal)."""
CREATED_BY = f"{PREFIX}/created-by"
"""Annotation on the worker Job and on every child the agent creates: the origin whose agent made it.
A child controlled by a stamped Job without it was made by another controller (``worker_agent.foreign``)."""
MANAGER_NAMESPACE_ANNOTATION = f"{PREFIX}/manager-namespace"
MANAGER_NAME_ANNOTATION = f"{PREFIX}/manager-name"
FENCED_ANNOTATION = f"{PREFIX}/fenced"
"""On a worker Job the agent suspended because its lease ran out (worker_agent.lease); resumed when a
Resync lists the Job again."""

# --- condition types mkd writes on manager Jobs -----------------------------------------------
CONDITION_DISPATCHED = "MultiClusterDispatched"
"""Set on the manager Job: True with the cluster name once placed, False with the reason while pending."""
CONDITION_REJECTED = "MultiClusterRejected"
"""Set on the manager Job when mkd cannot run it (invalid spec, unknown runtime, managedBy changed)."""
CONDITION_PENDING = "MultiClusterPending"
"""Set on the manager Job while its Workload waits (for quota, a cluster, or after an eviction or requeue):
True with the reason, removed once it is admitted. The CRDs' STATE column prints the last condition's type,
so a waiting Job reads ``MultiClusterPending`` there rather than the type of a condition that is False."""
CONDITION_QUOTA_RESERVED = "QuotaReserved"
"""Kueue's condition: quota reserved in the Job's ClusterQueue (True), or why not (False, reason Pending)."""
CONDITION_ADMITTED = "Admitted"
"""Kueue's condition: admitted; in mkd, quota reserved and placed on a worker cluster."""
CONDITION_EVICTED = "Evicted"
CONDITION_PREEMPTED = "Preempted"
CONDITION_REQUEUED = "Requeued"
CONDITION_FINISHED = "Finished"
"""Kueue's condition: the Job ended (reason Succeeded / Failed, the Job's own message); its quota is released
while QuotaReserved and Admitted stay True, as on Kueue's Workload."""
KUEUE_CONDITIONS = (CONDITION_REQUEUED, CONDITION_EVICTED, CONDITION_PREEMPTED, CONDITION_QUOTA_RESERVED,
                    CONDITION_ADMITTED, CONDITION_FINISHED)
"""The Kueue Workload conditions mkd writes on the manager Job (it has no Workload object of its own)."""


def origin_selector(origin: str) -> str:
    """Label selector matching every object a given dispatcher origin created."""
    return f"{ORIGIN}={origin}"
