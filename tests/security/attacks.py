"""What an attacker sends: Commands and Reports built the way the real sides build them, unsigned
(or signed with a key nobody registered), and the manifests a hostile manager user submits."""

from __future__ import annotations

import copy
from typing import Any

import yaml

from tests.federation.test_examples import EXAMPLES

BIG = 2**63 - 1


def hostile_job(name: str = "evil", namespace: str = "kube-system") -> dict[str, Any]:
    """A batch Job that would own its node: privileged, hostPID, hostNetwork, hostPath /, the agent's SA."""
    job: dict[str, Any] = yaml.safe_load((EXAMPLES / "batch/job.yaml").read_text())
    job["metadata"] = {"name": name, "namespace": namespace}
    job["spec"].pop("managedBy", None)
    pod = job["spec"]["template"]["spec"]
    pod.update(hostPID=True, hostNetwork=True, serviceAccountName="mkd-agent",
               volumes=[{"name": "root", "hostPath": {"path": "/"}}])
    container = pod["containers"][0]
    container["securityContext"] = {"privileged": True}
    container["volumeMounts"] = [{"name": "root", "mountPath": "/host"}]
    return job


def harmless_job(name: str, namespace: str = "team-a") -> dict[str, Any]:
    job: dict[str, Any] = copy.deepcopy(yaml.safe_load((EXAMPLES / "batch/job.yaml").read_text()))
    job["metadata"] = {"name": name, "namespace": namespace}
    job["spec"].pop("managedBy", None)
    job["spec"]["template"]["metadata"] = {"annotations": {"kubesim.mkd.dev/run-forever": "true"}}
    return job
