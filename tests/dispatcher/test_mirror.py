"""The manager Job shows the worker's truth, read back through the kubernetes client from kubesim.

Every Kubeflow CRD's printer column STATE reads ``.status.conditions[-1:].type``: the Job's own latest
condition must stay last, never mkd's ``MultiCluster*``. And the worker's status replaces the
manager's: nested keys the worker no longer has (an MPIJob's ``replicaStatuses.Launcher.active``)
disappear on the manager too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from federation import labels
from federation.kube import Kube
from tests.dispatcher.harness import PYTORCHJOBS, FakeAgent, eventually, pytorchjob, running, settings


def _cond(type_: str, at: str) -> dict[str, Any]:
    return {"type": type_, "status": "True", "reason": f"PyTorchJob{type_}", "message": type_.lower(),
            "lastTransitionTime": at}


async def test_the_jobs_own_latest_condition_stays_last_and_removed_nested_keys_disappear(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s) as dispatcher:
        await kube.create(PYTORCHJOBS, pytorchjob("truth", workers=3), "default")
        await eventually(lambda: agent.places(), what="a Place command")
        place = agent.places()[0]

        async def dispatched() -> Any:
            st = (await kube.get(PYTORCHJOBS, "truth", "default")).get("status") or {}
            return any(c["type"] == labels.CONDITION_DISPATCHED for c in st.get("conditions") or [])
        await eventually(dispatched, what="MultiClusterDispatched on the manager Job")

        running_status = {
            "startTime": "2026-01-01T00:00:00Z",
            "conditions": [_cond("Created", "2026-01-01T00:00:00Z"), _cond("Running", "2026-01-01T00:00:05Z")],
            "replicaStatuses": {"Master": {"active": 1}, "Worker": {"active": 3}}}
        await agent.status(place, running_status)

        async def shown(predicate: Any) -> Any:
            st = (await kube.get(PYTORCHJOBS, "truth", "default")).get("status") or {}
            return st if predicate(st) else None
        st = await eventually(lambda: shown(lambda st: st.get("replicaStatuses")), what="running status mirrored")
        # the printer column STATE (conditions[-1:].type) says what the Job does, not what mkd did
        assert st["conditions"][-1]["type"] == "Running"
        assert labels.CONDITION_DISPATCHED in {c["type"] for c in st["conditions"]}

        done = {
            "startTime": "2026-01-01T00:00:00Z", "completionTime": "2026-01-01T00:10:00Z",
            "conditions": [*running_status["conditions"], _cond("Succeeded", "2026-01-01T00:10:00Z")],
            "replicaStatuses": {"Master": {"succeeded": 1}, "Worker": {"succeeded": 3}}}
        await agent.status(place, done, finished="Succeeded")
        st = await eventually(lambda: shown(lambda st: st.get("completionTime")), what="finished status mirrored")
        assert st["conditions"][-1]["type"] == "Succeeded"
        # replaced, not merged: no pod is active any more
        assert st["replicaStatuses"] == {"Master": {"succeeded": 1}, "Worker": {"succeeded": 3}}
        # the watch's echoes of these status writes were told without decoding them (KubeWriter.echo_line)
        await eventually(lambda: dispatcher.engine.writer.echoes_not_decoded >= 1, what="an echo told undecoded")
