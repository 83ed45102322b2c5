"""Every kind's example runs through the agent's one apply loop on kubesim (the other reconcilers included)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from federation.kube import Resource
from tests.agent.conftest import AgentHarness, place

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RUNTIMES = Resource("trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", "ClusterTrainingRuntime",
                    namespaced=False)


def load(path: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / path).read_text())
    return doc


@pytest.mark.parametrize("path", ["batch/job.yaml", "jobset/jobset.yaml", "mpi/pi.yaml", "trainjob/multi-node.yaml",
                                  "pytorch/elastic-echo.yaml"])
async def test_example_runs_to_success(harness: AgentHarness, path: str) -> None:
    if path.startswith("trainjob/"):
        await harness.kube.create(RUNTIMES, load("trainjob/torch-distributed-runtime.yaml"))
    manifest = load(path)
    cmd = place(manifest)
    await harness.send(cmd)
    accepted = await harness.wait_report(lambda r: r.type in ("accepted", "rejected"))
    assert accepted.type == "accepted", getattr(accepted, "message", "")
    done = await harness.wait_report(lambda r: r.type == "status" and r.finished is not None, within=40)
    assert done.finished == "Succeeded", done.status
    assert done.placement == cmd.placement
