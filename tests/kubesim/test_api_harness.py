"""Starting kubesim: serve_async, several clusters, kubeconfigs for kubectl, ``python -m kubesim``."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config

import kubesim

pytestmark = pytest.mark.kubesim_only("starts kubesim itself (serve_async, python -m kubesim)")


async def test_serve_async_runs_independent_clusters(tmp_path: Path) -> None:
    specs = [kubesim.ClusterSpec("m", []), kubesim.ClusterSpec("w1", [kubesim.NodeSpec("n1", cpu="2")])]
    async with kubesim.serve_async(specs, tmp_path) as sim:
        assert sim.url("m") != sim.url("w1")
        api = config.new_client_from_config(str(sim.kubeconfig("w1")))
        nodes = client.CoreV1Api(api).list_node().items
        assert [(n.metadata.name, n.status.allocatable["cpu"]) for n in nodes] == [("n1", "2")]
        assert nodes[0].metadata.labels["kubernetes.io/hostname"] == "n1"
        assert any(c.type == "Ready" and c.status == "True" for c in nodes[0].status.conditions)
        m = config.new_client_from_config(str(sim.kubeconfig("m")))
        assert client.CoreV1Api(m).list_node().items == []
        api.close()
        m.close()


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_kubectl_works_with_the_kubeconfig(sim_only: kubesim.Sim, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    kc = str(sim_only.kubeconfig("sim"))
    monkeypatch.setenv("KUBECACHEDIR", str(tmp_path / "kube-cache"))  # keep ~/.kube/cache untouched
    out = subprocess.run(["kubectl", "--kubeconfig", kc, "get", "nodes", "-o", "name"], capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    assert out == ["node/node-a", "node/node-b"]
    created = subprocess.run(["kubectl", "--kubeconfig", kc, "create", "configmap", "from-kubectl",
                              "--from-literal=a=b"], capture_output=True, text=True, timeout=60)
    assert created.returncode == 0, created.stderr
    got = subprocess.run(["kubectl", "--kubeconfig", kc, "get", "configmap", "from-kubectl", "-o", "yaml"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert yaml.safe_load(got)["data"] == {"a": "b"}
    manifest = yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"},
                               "data": {"k": "v"}})
    for _ in range(2):  # create, then patch computed by kubectl from the last-applied annotation
        applied = subprocess.run(["kubectl", "--kubeconfig", kc, "apply", "-f", "-"], input=manifest,
                                 capture_output=True, text=True, timeout=60)
        assert applied.returncode == 0, applied.stderr
        manifest = manifest.replace("k: v", "k: w")
    got = subprocess.run(["kubectl", "--kubeconfig", kc, "get", "configmap", "applied", "-o", "yaml"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert yaml.safe_load(got)["data"] == {"k": "w"}


def test_python_m_kubesim_serves_until_sigterm(tmp_path: Path) -> None:
    topo = tmp_path / "topo.yaml"
    topo.write_text(yaml.safe_dump({"clusters": [{"name": "solo", "nodes": [
        {"name": "gpu-1", "cpu": "16", "extended": {"nvidia.com/gpu": 8}}]}]}))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-m", "kubesim", "--topology", str(topo), "--state-dir",
                             str(tmp_path / "state")], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "ready" in line:
                break
        kc = tmp_path / "state" / "solo.kubeconfig"
        assert any(str(kc) in ln for ln in lines)
        api = config.new_client_from_config(str(kc))
        node = client.CoreV1Api(api).read_node("gpu-1")
        assert node.status.allocatable["nvidia.com/gpu"] == "8"
        api.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
