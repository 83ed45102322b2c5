"""End to end: a Job whose pods carry a secret env value travels sealed (``federation.sealing``).

The demo's federation (a real dispatcher and agents over the broker, kubesim clusters); an anonymous
subscriber on every cluster's commands topic plays a broker reader. The Job runs to its end, the
worker's copy carries the env value as the user wrote it, and no payload the subscriber saw holds it.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import pytest

from federation import labels, messages, sealing
from federation.errors import AlreadyExists
from federation.kube import JOBS, NAMESPACES
from mkctl.topology import Topology
from tests.e2e.conftest import NotYet, wait_for
from tests.security.conftest import sniffing

pytestmark = [pytest.mark.slow, pytest.mark.realcluster]  # a batch Job: its pod completes on kwok-style nodes
SECRET = f"s3cr3t-{uuid.uuid4().hex}"


def job() -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "sealed-env", "namespace": "team-a"},
            "spec": {"managedBy": labels.MULTIKUEUE, "completions": 1, "backoffLimit": 0, "template": {
                "metadata": {"annotations": {"kubesim.mkd.dev/run-seconds": "1"}},
                "spec": {"restartPolicy": "Never", "containers": [{
                    "name": "main", "image": "busybox", "env": [{"name": "API_TOKEN", "value": SECRET}],
                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}}}}


async def test_a_place_with_a_secret_env_value_runs_and_no_broker_subscriber_reads_it(
        federation: Topology, mqtt_url: str, topic_root: str) -> None:
    async with sniffing(mqtt_url, f"{topic_root}/+/commands") as seen:
        for cluster in federation.cluster_names:
            with contextlib.suppress(AlreadyExists):
                await federation.kubes[cluster].create(
                    NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}})
        await federation.manager.create(JOBS, job(), "team-a")

        async def succeeded() -> bool | NotYet:
            got = await federation.manager.get(JOBS, "sealed-env", "team-a")
            status = got.get("status") or {}
            return True if status.get("succeeded") == 1 else NotYet(str(status))
        await wait_for(succeeded, "the sealed Job succeeded on the manager", top=federation)
        copies = [c for w in federation.worker_names
                  for c in (await federation.kubes[w].list(JOBS, "team-a", label_selector=labels.ORIGIN)).items
                  if c["metadata"]["name"] == "sealed-env"]
    assert len(copies) == 1
    env = copies[0]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env == [{"name": "API_TOKEN", "value": SECRET}]
    # a message is one Command or a batch of them (a Place may share one with a Lease or Resync); signed either way
    items = [item for p in seen for item in messages.split_commands(p[:p.rfind(b',"seal":')] + b"}")]
    places = [item for item in items if sealing.is_sealed(item)]
    assert places, f"no sealed Place seen among {len(items)} commands: {[item[:40] for item in items]}"
    assert not [p for p in seen if SECRET.encode() in p or b"API_TOKEN" in p]
