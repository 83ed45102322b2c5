"""The policy gate answers for a Job from its spec and worker namespace; Jobs alike share one check."""

from __future__ import annotations

import copy
from typing import Any

from dispatcher.clusters.policycheck import PolicyGate
from dispatcher.intake.jobcache import JobCache
from federation import messages
from federation.policy import PolicySettings
from tests.dispatcher.harness import pytorchjob


def job(name: str, namespace: str, *, privileged: bool = False) -> dict[str, Any]:
    obj = pytorchjob(name, namespace=namespace)
    obj["metadata"]["uid"] = f"uid-{name}"
    if privileged:
        obj["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["hostPID"] = True
    return obj


def test_alike_jobs_share_a_check_but_not_across_namespaces_or_specs() -> None:
    cache = JobCache()
    jobs = [job("a", "team-a"), job("b", "team-a"), job("c", "kube-system"), job("d", "team-a", privileged=True),
            job("e", "team-a")]
    for j in jobs:
        cache[j["metadata"]["uid"]] = copy.deepcopy(j)
    beats = {"w1": messages.Heartbeat(cluster="w1", policy=PolicySettings()),
             "w2": messages.Heartbeat(cluster="w2", policy=PolicySettings(pod_security="privileged"))}
    gate = PolicyGate()
    decoded: list[str] = []

    def refusals(uid: str) -> dict[str, str]:
        head = cache.head(uid)
        assert head is not None

        def load() -> Any:
            decoded.append(uid)
            return cache[uid]
        return gate.refusals(uid, head, load, beats)
    assert refusals("uid-a") == {} and refusals("uid-b") == {}
    kube_system = refusals("uid-c")
    assert set(kube_system) == {"w1", "w2"} and all("metadata.namespace" in w for w in kube_system.values())
    hostpid = refusals("uid-d")
    assert set(hostpid) == {"w1"} and "hostPID" in hostpid["w1"]
    assert refusals("uid-e") == {}
    assert decoded == ["uid-a", "uid-b", "uid-c", "uid-d", "uid-e"]  # each Job decoded once, for both policies
    assert refusals("uid-d") == hostpid and decoded[-1] == "uid-e"  # known: not decoded again
