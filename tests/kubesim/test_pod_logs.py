"""``pods/{name}/log`` through the official client: options, their validation, container choice, previous, follow."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

import kubesim
from kubesim import ClusterSpec, KubeletSpec, NodeSpec
from kubesim.testing import eventually as wait_for

NS = "default"
kubesim_only = pytest.mark.kubesim_only("the container's output comes from kubesim.mkd.dev/log annotations")


@contextmanager
def cluster(tmp_path: Path) -> Iterator[client.CoreV1Api]:
    spec = ClusterSpec("k", [NodeSpec("node-1")], kubelet=KubeletSpec(start_seconds=0.02, run_seconds=0.3))
    with kubesim.serve([spec], tmp_path) as sim:
        api = config.new_client_from_config(config_file=str(sim.kubeconfig("k")))
        try:
            yield client.CoreV1Api(api)
        finally:
            api.close()


def pod(name: str, annotations: dict[str, str], *, restart: str = "Never",
        containers: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": annotations},
            "spec": {"restartPolicy": restart,
                     "containers": containers or [{"name": "main", "image": "busybox"}]}}


def phase(core: client.CoreV1Api, name: str) -> str:
    return str(core.read_namespaced_pod(name, NS).status.phase)


def error(call: Any) -> tuple[int, str]:
    with pytest.raises(client.ApiException) as info:
        call()
    return info.value.status, json.loads(info.value.body)["message"]


@kubesim_only
def test_lines_over_the_run_with_timestamps_tail_and_limit(tmp_path: Path) -> None:
    with cluster(tmp_path) as core:
        core.create_namespaced_pod(NS, pod("p", {"kubesim.mkd.dev/log": "epoch 1\nepoch 2\nepoch 3\ndone {pod}",
                                                 "kubesim.mkd.dev/run-seconds": "0.4"}))
        wait_for(lambda: phase(core, "p") == "Succeeded", what="Succeeded")
        assert core.read_namespaced_pod_log("p", NS) == "epoch 1\nepoch 2\nepoch 3\ndone p\n"
        assert core.read_namespaced_pod_log("p", NS, tail_lines=2) == "epoch 3\ndone p\n"
        assert core.read_namespaced_pod_log("p", NS, tail_lines=0) == ""
        assert core.read_namespaced_pod_log("p", NS, limit_bytes=10) == "epoch 1\nep"
        stamped = core.read_namespaced_pod_log("p", NS, timestamps=True).splitlines()
        assert len(stamped) == 4
        times = [line.split(" ", 1)[0] for line in stamped]
        assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z", t) for t in times)
        assert times == sorted(times) and times[0] < times[-1]  # written over the run, not at once
        assert [line.split(" ", 1)[1] for line in stamped] == ["epoch 1", "epoch 2", "epoch 3", "done p"]
        assert core.read_namespaced_pod_log("p", NS, since_seconds=3600).count("\n") == 4
        assert error(lambda: core.read_namespaced_pod_log("p", NS, previous=True)) == (
            400, 'previous terminated container "main" in pod "p" not found')


@kubesim_only
def test_echo_command_prints_its_arguments(tmp_path: Path) -> None:
    with cluster(tmp_path) as core:
        core.create_namespaced_pod(NS, pod("e", {}, containers=[
            {"name": "main", "image": "busybox", "command": ["/bin/echo", "hello"], "args": ["world"]}]))
        wait_for(lambda: phase(core, "e") == "Succeeded", what="Succeeded")
        assert core.read_namespaced_pod_log("e", NS) == "hello world\n"


@kubesim_only
def test_previous_reads_the_start_before_a_restart(tmp_path: Path) -> None:
    with cluster(tmp_path) as core:
        core.create_namespaced_pod(NS, pod("r", {"kubesim.mkd.dev/log": "attempt {attempt}",
                                                 "kubesim.mkd.dev/fail-attempts": "1",
                                                 "kubesim.mkd.dev/run-seconds": "0.2"}, restart="OnFailure"))
        wait_for(lambda: phase(core, "r") == "Succeeded", what="Succeeded after one restart")
        assert core.read_namespaced_pod_log("r", NS) == "attempt 2\n"
        assert core.read_namespaced_pod_log("r", NS, previous=True) == "attempt 1\n"


@kubesim_only
def test_follow_streams_until_the_container_exits(tmp_path: Path) -> None:
    with cluster(tmp_path) as core:
        core.create_namespaced_pod(NS, pod("f", {"kubesim.mkd.dev/log": "tick", "kubesim.mkd.dev/log-interval": "0.1",
                                                 "kubesim.mkd.dev/run-seconds": "1.0"}))
        wait_for(lambda: phase(core, "f") == "Running", what="Running")
        stream = core.read_namespaced_pod_log("f", NS, follow=True, _preload_content=False)
        arrivals: list[float] = []
        began = time.monotonic()
        for chunk in stream.stream(64):
            arrivals.extend(time.monotonic() for _ in range(chunk.count(b"\n")))
        ended = time.monotonic()
        assert 8 <= len(arrivals) <= 12  # one line every 0.1 s over a 1 s run
        assert ended - began >= 0.5       # it stayed open while the container ran
        assert arrivals[-1] - arrivals[1] >= 0.4  # lines came as written, not in one piece at the end
        assert phase(core, "f") in ("Running", "Succeeded")
        wait_for(lambda: phase(core, "f") == "Succeeded", what="Succeeded")


@kubesim_only
def test_follow_ends_when_the_pod_is_deleted(tmp_path: Path) -> None:
    with cluster(tmp_path) as core:
        core.create_namespaced_pod(NS, pod("d", {"kubesim.mkd.dev/log": "tick", "kubesim.mkd.dev/log-interval": "0.05",
                                                 "kubesim.mkd.dev/run-forever": "true"}))
        wait_for(lambda: phase(core, "d") == "Running", what="Running")
        done = threading.Event()

        def read() -> None:
            stream = core.read_namespaced_pod_log("d", NS, follow=True, _preload_content=False)
            for _ in stream.stream(64):
                pass
            done.set()

        threading.Thread(target=read, daemon=True).start()
        time.sleep(0.3)
        assert not done.is_set()
        core.delete_namespaced_pod("d", NS)
        assert done.wait(5), "the follow did not end with its pod"


@pytest.mark.realcluster
def test_options_are_validated_with_the_servers_wording(api: client.ApiClient, ns: str) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(ns, pod("v", {}))
    assert error(lambda: core.read_namespaced_pod_log("v", ns, tail_lines=-1)) == (
        422, 'PodLogOptions "v" is invalid: tailLines: Invalid value: -1: must be greater than or equal to 0')
    assert error(lambda: core.read_namespaced_pod_log("v", ns, limit_bytes=0)) == (
        422, 'PodLogOptions "v" is invalid: limitBytes: Invalid value: 0: must be greater than 0')
    assert error(lambda: core.read_namespaced_pod_log("v", ns, since_seconds=0)) == (
        422, 'PodLogOptions "v" is invalid: sinceSeconds: Invalid value: 0: must be greater than 0')
    assert error(lambda: core.read_namespaced_pod_log("nope", ns)) == (404, 'pods "nope" not found')
    assert error(lambda: core.read_namespaced_pod_log("v", ns, container="other")) == (
        400, "container other is not valid for pod v")


@pytest.mark.realcluster
def test_a_pod_of_several_containers_needs_one_named(api: client.ApiClient, ns: str) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(ns, pod("two", {}, containers=[{"name": "a", "image": "busybox"},
                                                              {"name": "b", "image": "busybox"}]))
    assert error(lambda: core.read_namespaced_pod_log("two", ns)) == (
        400, "a container name must be specified for pod two, choose one of: [a b]")
