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


async def test_an_authorizing_cluster_serves_https_and_kubectl_sends_its_token(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """kube-apiserver serves TLS only, and client-go (kubectl) sends a kubeconfig's token only over TLS: over
    plain HTTP an authorizing cluster sees kubectl as system:anonymous, refused discovery."""
    import asyncio

    spec = kubesim.ClusterSpec("m", [], authorize=True, tls=True)
    async with kubesim.serve_async([spec], tmp_path) as sim:
        kc = sim.kubeconfig("m")
        assert sim.url("m").startswith("https://")
        cluster = yaml.safe_load(await asyncio.to_thread(Path(kc).read_text))["clusters"][0]["cluster"]
        assert cluster["certificate-authority-data"]  # the server's certificate is verified, not skipped
        api = config.new_client_from_config(str(kc))
        assert [n.metadata.name for n in client.CoreV1Api(api).list_namespace().items] >= ["default"]
        root_ca = client.CoreV1Api(api).read_namespaced_config_map("kube-root-ca.crt", "default").data["ca.crt"]
        api.close()
        import base64

        assert base64.b64decode(cluster["certificate-authority-data"]).decode() == root_ca  # one CA, as kubeadm's
        if shutil.which("kubectl") is None:
            pytest.skip("kubectl not installed: the client's side is checked, kubectl's is not")
        monkeypatch.setenv("KUBECACHEDIR", str(tmp_path / "kube-cache"))
        proc = await asyncio.create_subprocess_exec("kubectl", "--kubeconfig", str(kc), "get", "namespaces",
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        assert proc.returncode == 0 and "default" in out.decode(), err.decode()


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
