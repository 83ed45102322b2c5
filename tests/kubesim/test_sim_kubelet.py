"""The simulated kubelet seen through the official client: phases, timing annotations, exit codes, restarts."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client, config

import kubesim
from kubesim import ClusterSpec, KubeletSpec, NodeSpec
from kubesim.testing import eventually as wait_for

pytestmark = pytest.mark.kubesim_only("drives kubesim's simulated kubelet through kubesim.mkd.dev/* pod annotations")

T = TypeVar("T")
NS = "default"


@contextmanager
def cluster(tmp_path: Path, kubelet: KubeletSpec | None = None) -> Iterator[client.CoreV1Api]:
    spec = ClusterSpec("k", [NodeSpec("node-1"), NodeSpec("node-2")],
                       kubelet=kubelet or KubeletSpec(start_seconds=0.02, run_seconds=0.1))
    with kubesim.serve([spec], tmp_path) as sim:
        api = config.new_client_from_config(config_file=str(sim.kubeconfig("k")))
        try:
            yield client.CoreV1Api(api)
        finally:
            api.close()


def pod(name: str, restart: str = "Never", annotations: dict[str, str] | None = None,
        **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"restartPolicy": restart, "containers": [{"name": "main", "image": "busybox"}], **spec}}


def phase(core: client.CoreV1Api, name: str) -> str:
    return core.read_namespaced_pod(name, NS).status.phase  # type: ignore[no-any-return]


def conditions(p: Any) -> dict[str, str]:
    return {c.type: c.status for c in p.status.conditions or ()}


def test_pod_runs_then_succeeds_with_running_status_fields(tmp_path: Path) -> None:
    with cluster(tmp_path) as core:
        core.create_namespaced_pod(NS, pod("ok", annotations={"kubesim.mkd.dev/run-seconds": "0.5"},
                                           initContainers=[{"name": "init", "image": "busybox"}]))
        running = wait_for(lambda: (p := core.read_namespaced_pod("ok", NS)).status.phase == "Running" and p,
                           what="Running")
        assert conditions(running).items() >= {"PodScheduled": "True", "Initialized": "True", "ContainersReady": "True",
                                       "Ready": "True"}.items()
        assert running.status.pod_ip.startswith("10.244.")
        assert running.status.host_ip
        assert running.status.start_time is not None
        main = running.status.container_statuses[0]
        assert main.ready and main.state.running is not None and main.restart_count == 0
        init = running.status.init_container_statuses[0]
        assert init.state.terminated.exit_code == 0 and init.state.terminated.reason == "Completed"
        done = wait_for(lambda: (p := core.read_namespaced_pod("ok", NS)).status.phase == "Succeeded" and p,
                        what="Succeeded")
        term = done.status.container_statuses[0].state.terminated
        assert term.exit_code == 0 and term.reason == "Completed"
        assert conditions(done)["Ready"] == "False"


def test_never_restart_pod_fails_with_the_annotated_exit_code(tmp_path: Path) -> None:
    with cluster(tmp_path) as core:
        core.create_namespaced_pod(NS, pod("bad", annotations={"kubesim.mkd.dev/exit-code": "42"}))
        wait_for(lambda: phase(core, "bad") == "Failed", what="Failed")
        status = core.read_namespaced_pod("bad", NS).status.container_statuses[0]
        assert status.state.terminated.exit_code == 42
        assert status.state.terminated.reason == "Error"
        assert status.restart_count == 0


def test_cluster_default_exit_code_applies_without_annotations(tmp_path: Path) -> None:
    with cluster(tmp_path, KubeletSpec(start_seconds=0.01, run_seconds=0.05, exit_code=3)) as core:
        core.create_namespaced_pod(NS, pod("dflt"))
        wait_for(lambda: phase(core, "dflt") == "Failed", what="Failed")
        assert core.read_namespaced_pod("dflt", NS).status.container_statuses[0].state.terminated.exit_code == 3


def test_on_failure_restarts_in_place_until_fail_attempts_are_used(tmp_path: Path) -> None:
    with cluster(tmp_path) as core:
        core.create_namespaced_pod(NS, pod("flaky", restart="OnFailure", annotations={
            "kubesim.mkd.dev/fail-attempts": "2", "kubesim.mkd.dev/exit-code": "7",
            "kubesim.mkd.dev/run-seconds": "0.05"}))
        done = wait_for(lambda: (p := core.read_namespaced_pod("flaky", NS)).status.phase == "Succeeded" and p,
                        what="Succeeded after restarts")
        status = done.status.container_statuses[0]
        assert status.restart_count == 2
        assert status.last_state.terminated.exit_code == 7
        assert status.state.terminated.exit_code == 0


def test_always_restarts_even_on_success_and_stays_running(tmp_path: Path) -> None:
    with cluster(tmp_path) as core:
        core.create_namespaced_pod(NS, pod("svc", restart="Always",
                                           annotations={"kubesim.mkd.dev/run-seconds": "0.05"}))
        restarted = wait_for(lambda: (p := core.read_namespaced_pod("svc", NS)).status.container_statuses
                             and p.status.container_statuses[0].restart_count >= 2 and p,
                             what="two restarts")
        assert restarted.status.phase == "Running"
        assert restarted.status.container_statuses[0].last_state.terminated.exit_code == 0


def test_start_seconds_and_run_forever(tmp_path: Path) -> None:
    with cluster(tmp_path) as core:
        core.create_namespaced_pod(NS, pod("slow", annotations={"kubesim.mkd.dev/start-seconds": "1.5",
                                                                "kubesim.mkd.dev/run-forever": "true"}))
        wait_for(lambda: core.read_namespaced_pod("slow", NS).spec.node_name, what="bound")
        assert phase(core, "slow") == "Pending"  # bound, but the start time has not passed yet
        wait_for(lambda: phase(core, "slow") == "Running", what="Running")
        time.sleep(0.3)  # well past the cluster's run time: run-forever keeps it running
        assert phase(core, "slow") == "Running"


def test_deleted_running_pod_goes_away(tmp_path: Path) -> None:
    with cluster(tmp_path) as core:
        core.create_namespaced_pod(NS, pod("gone", annotations={"kubesim.mkd.dev/run-forever": "true"}))
        wait_for(lambda: phase(core, "gone") == "Running", what="Running")
        core.delete_namespaced_pod("gone", NS)
        wait_for(lambda: not [p for p in core.list_namespaced_pod(NS).items if p.metadata.name == "gone"],
                 what="pod removed")


def test_readiness_probe_delays_ready_until_after_start(tmp_path: Path) -> None:
    with cluster(tmp_path) as core:
        body = pod("probed", annotations={"kubesim.mkd.dev/run-forever": "true"})
        body["spec"]["containers"][0]["readinessProbe"] = {"exec": {"command": ["true"]}}
        core.create_namespaced_pod(NS, body)
        seen: list[tuple[str, bool]] = []

        def ready() -> bool:
            p = core.read_namespaced_pod("probed", NS)
            if p.status.phase == "Running":
                seen.append((conditions(p).get("Ready", ""), p.status.container_statuses[0].ready))
            return conditions(p).get("Ready") == "True"

        wait_for(ready, what="Ready after the probe")
        assert seen[-1] == ("True", True)
        assert all(c == "False" and not r for c, r in seen[:-1])


def test_pods_of_a_deleted_node_fail_and_are_removed(tmp_path: Path) -> None:
    with cluster(tmp_path) as core:
        core.create_namespaced_pod(NS, pod("lost", annotations={"kubesim.mkd.dev/run-forever": "true"},
                                           nodeSelector={"kubernetes.io/hostname": "node-2"}))
        wait_for(lambda: phase(core, "lost") == "Running", what="Running on node-2")
        core.delete_node("node-2")
        wait_for(lambda: not [p for p in core.list_namespaced_pod(NS).items if p.metadata.name == "lost"],
                 what="pod removed by pod GC")
