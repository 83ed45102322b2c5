"""End to end: a placed Job's pods and logs read from the manager (the API, through the agent, sealed on the wire).

The demo's federation (dispatcher and agents over the broker, kubesim clusters whose kubelet prints what the
pod template's ``kubesim.mkd.dev/log`` says). Pods list with role and index; a log reads whole, by tail,
and followed until the container ends, lines arriving as they are printed; wrong pod and wrong container
are refused listing what exists; a Job not placed says it waits; RBAC on the manager decides who reads
(``list pods``, ``get pods/log``); no broker subscriber reads a log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from federation import labels
from federation.errors import AlreadyExists
from federation.kube import EVENTS, JOBS, NAMESPACES, PODS, Resource
from mkctl.main import app
from mkctl.topology import Topology
from tests.e2e.conftest import NotYet, wait_for
from tests.security.conftest import sniffing

pytestmark = [pytest.mark.slow, pytest.mark.kubesim_only("the containers' output comes from kubesim.mkd.dev/log")]
NS = "team-logs"
SECRET_LINE = "loss=0.1234 token=hunter2-secret"
CRASH_REASONS = ("WorkerCrashLoopBackOff", "WorkerError")
"""A restarting container is seen waiting in back-off, or running after its last exit (reason Error)."""


def job(name: str, *, run: str = "30", log: str = f"epoch 1\nepoch 2\n{SECRET_LINE}",
        interval: str | None = None, cpu: str = "100m") -> dict[str, Any]:
    annotations = {"kubesim.mkd.dev/run-seconds": run, "kubesim.mkd.dev/log": log}
    if interval:
        annotations["kubesim.mkd.dev/log-interval"] = interval
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": NS},
            "spec": {"managedBy": labels.MULTIKUEUE, "completions": 1, "backoffLimit": 0, "template": {
                "metadata": {"annotations": annotations},
                "spec": {"restartPolicy": "Never", "containers": [{
                    "name": "main", "image": "busybox", "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}]}}}}


async def setup(top: Topology) -> httpx.AsyncClient:
    for cluster in top.cluster_names:
        with contextlib.suppress(AlreadyExists):
            await top.kubes[cluster].create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                                         "metadata": {"name": NS}})
    assert top.api_port is not None
    return httpx.AsyncClient(base_url=f"http://127.0.0.1:{top.api_port}",
                             headers={"Authorization": f"Bearer {top.api_token}"}, timeout=30)


async def running(top: Topology, api: httpx.AsyncClient, name: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | NotYet:
        got = await api.get(f"/api/v1/workloads/{NS}/{name}/pods")
        if got.status_code != 200:
            return NotYet(f"{got.status_code} {got.text}")
        body: dict[str, Any] = got.json()
        pods = body["pods"]
        return body if pods and pods[0]["phase"] == "Running" else NotYet(str(pods))
    return await wait_for(probe, f"{name}'s pod Running, seen from the manager", top=top)  # type: ignore[no-any-return]


async def test_pods_and_logs_of_a_placed_job_from_the_manager(federation: Topology, mqtt_url: str,
                                                              topic_root: str) -> None:
    api = await setup(federation)
    async with api, sniffing(mqtt_url, f"{topic_root}/+/streams") as seen:
        await federation.manager.create(JOBS, job("train"), NS)
        listed = await running(federation, api, "train")
        assert listed["cluster"] in federation.worker_names and listed["attempt"] == 1
        pod = listed["pods"][0]
        assert pod["role"] == "main" and pod["index"] == 0 and pod["ready"] == "1/1" and pod["containers"] == ["main"]
        assert pod["node"] and pod["restarts"] == 0

        async def logged() -> str | NotYet:
            text = (await api.get(f"/api/v1/workloads/{NS}/train/logs")).text
            return text if SECRET_LINE in text else NotYet(text)
        await wait_for(logged, "the whole log", top=federation, within=45)
        whole = await api.get(f"/api/v1/workloads/{NS}/train/logs")
        assert whole.status_code == 200 and whole.text == f"epoch 1\nepoch 2\n{SECRET_LINE}\n"
        assert whole.headers["x-mkd-pod"] == pod["name"] and whole.headers["x-mkd-container"] == "main"
        tail = await api.get(f"/api/v1/workloads/{NS}/train/logs", params={"tail": 1, "timestamps": "true"})
        assert tail.text.endswith(f"Z {SECRET_LINE}\n") and tail.text.count("\n") == 1

        wrong = await api.get(f"/api/v1/workloads/{NS}/train/logs", params={"container": "sidecar"})
        assert wrong.status_code == 400
        assert "has no container sidecar; its containers: main" in wrong.json()["detail"]["message"]
        missing = await api.get(f"/api/v1/workloads/{NS}/train/logs", params={"pod": "nope"})
        assert missing.status_code == 404 and pod["name"] in missing.json()["detail"]["message"]
        no_role = await api.get(f"/api/v1/workloads/{NS}/train/logs", params={"role": "master"})
        assert no_role.status_code == 404 and "(main 0)" in no_role.json()["detail"]["message"]
        bad_since = await api.get(f"/api/v1/workloads/{NS}/train/logs", params={"since": "soon"})
        assert bad_since.status_code == 400 and "since" in bad_since.json()["detail"]

        server = ["--server", f"http://127.0.0.1:{federation.api_port}", "--token", federation.api_token]
        printed = await asyncio.to_thread(CliRunner().invoke, app, ["logs", f"{NS}/train", "--tail", "2", *server])
        assert printed.exit_code == 0 and printed.stdout == f"epoch 2\n{SECRET_LINE}\n", printed.output
        table = await asyncio.to_thread(CliRunner().invoke, app, ["pods", f"{NS}/train", *server])
        assert table.exit_code == 0 and pod["name"] in table.stdout and "Running" in table.stdout, table.output
        refused = await asyncio.to_thread(CliRunner().invoke, app, ["logs", f"{NS}/train", "-c", "x", *server])
        assert refused.exit_code == 2 and "its containers: main" in refused.output
        # kubectl's plugin: `kubectl mkd logs` (kubectl-mkd next to mkctl, found on PATH)
        bin_dir = str(Path(sys.executable).parent)
        kubectl = shutil.which("kubectl")
        argv = [kubectl, "mkd"] if kubectl else [str(Path(bin_dir) / "kubectl-mkd")]
        proc = await asyncio.create_subprocess_exec(
            *argv, "logs", f"{NS}/train", "--tail", "1", *server, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env={**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"})
        out, err = await proc.communicate()
        assert proc.returncode == 0 and out.decode() == f"{SECRET_LINE}\n", err.decode()
    assert seen, "no answer frame crossed the broker"
    assert not [p for p in seen if b"hunter2" in p or b"epoch 1" in p], "a log line crossed the broker readable"


async def test_follow_streams_lines_as_they_are_printed_until_the_container_ends(federation: Topology) -> None:
    api = await setup(federation)
    async with api:
        await federation.manager.create(JOBS, job("ticker", run="4", log="tick", interval="0.25"), NS)
        await running(federation, api, "ticker")
        arrivals: list[float] = []
        began = time.monotonic()
        async with api.stream("GET", f"/api/v1/workloads/{NS}/ticker/logs", params={"follow": "true"}) as got:
            assert got.status_code == 200
            async for chunk in got.aiter_bytes():
                arrivals.extend(time.monotonic() for _ in range(chunk.count(b"\n")))
        ended = time.monotonic()
        assert len(arrivals) >= 5, arrivals
        assert arrivals[-1] - arrivals[-5] >= 0.75  # line by line, not in one piece at the end
        assert ended - began < 30  # the follow ended with the container


async def test_a_job_not_placed_says_where_it_waits(federation: Topology) -> None:
    api = await setup(federation)
    async with api:
        await federation.manager.create(JOBS, job("huge", cpu="5000"), NS)

        async def refused() -> httpx.Response | NotYet:
            got = await api.get(f"/api/v1/workloads/{NS}/huge/logs")
            return got if got.status_code == 409 else NotYet(f"{got.status_code} {got.text}")
        got = await wait_for(refused, "a 409 for the unplaced Job", top=federation)
        assert "is not placed on a cluster yet" in got.json()["detail"]
        assert "mkctl why team-logs/huge" in got.json()["detail"]


async def test_rbac_on_the_manager_decides_who_reads_pods_and_logs(federation: Topology) -> None:
    api = await setup(federation)
    reviews = federation.sim.cluster("manager").server.reviews
    reviews.add_token("tok-reader", "reader")
    reviews.add_token("tok-lister", "lister")
    rbac = "rbac.authorization.k8s.io"
    roles = Resource(rbac, "v1", "roles", "Role")
    bindings = Resource(rbac, "v1", "rolebindings", "RoleBinding")
    with contextlib.suppress(AlreadyExists):
        await federation.manager.create(NAMESPACES, {"metadata": {"name": NS}})
    for user, rules in (("reader", [{"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list"]}]),
                        ("lister", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}])):
        await federation.manager.create(roles, {"metadata": {"name": user, "namespace": NS}, "rules": rules}, NS)
        await federation.manager.create(bindings, {
            "metadata": {"name": user, "namespace": NS},
            "roleRef": {"apiGroup": rbac, "kind": "Role", "name": user},
            "subjects": [{"kind": "User", "name": user, "apiGroup": rbac}]}, NS)
    async with api:
        await federation.manager.create(JOBS, job("guarded"), NS)
        await running(federation, api, "guarded")

        def as_user(token: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {token}"}
        assert (await api.get(f"/api/v1/workloads/{NS}/guarded/pods", headers=as_user("tok-lister"))
                ).status_code == 200
        denied = await api.get(f"/api/v1/workloads/{NS}/guarded/logs", headers=as_user("tok-lister"))
        assert denied.status_code == 403 and f"may not get pods/log in namespace {NS}" in denied.json()["detail"]
        reader = await api.get(f"/api/v1/workloads/{NS}/guarded/logs", headers=as_user("tok-reader"))
        assert reader.status_code == 200
        assert (await api.get(f"/api/v1/workloads/{NS}/guarded/pods", headers=as_user("tok-nobody"))
                ).status_code == 401


@pytest.fixture
async def limited(tmp_path: Any, mqtt_url: str, database_url: str, topic_root: str) -> Any:
    """The demo's federation with tight log limits (one stream per user, a follow idles out after 2 s) and
    worker causes asked about every second."""
    from mkctl.topology import TopologyOptions

    options = TopologyOptions(state_dir=tmp_path / "state", mqtt_url=mqtt_url, database_url=database_url,
                              topic_root=topic_root, heartbeat_seconds=1.0, heartbeat_timeout_seconds=3.0,
                              origin="mkd-e2e", dispatcher_overrides={"log_streams_per_user": 1,
                                                                      "log_follow_idle_seconds": 2.0,
                                                                      "worker_causes_seconds": 1.0})
    async with Topology(options) as top:
        yield top
        top.check_running()


async def test_limits_a_reader_leaving_idling_and_a_stopped_agent(limited: Topology) -> None:
    api = await setup(limited)
    async with api:
        await limited.manager.create(JOBS, job("long", run="120", log="tick", interval="0.2"), NS)
        await limited.manager.create(JOBS, job("quiet", run="120", log="only line"), NS)
        cluster = (await running(limited, api, "long"))["cluster"]
        await running(limited, api, "quiet")
        async with api.stream("GET", f"/api/v1/workloads/{NS}/long/logs", params={"follow": "true"}) as held:
            assert held.status_code == 200
            chunks = held.aiter_bytes()
            await anext(chunks)
            busy = await api.get(f"/api/v1/workloads/{NS}/quiet/logs")
            assert busy.status_code == 429 and "has 1 streams open" in busy.json()["detail"]["message"], busy.text
            await anext(chunks)  # still streaming
        # the reader left: its stream is closed on the dispatcher and the agent told to stop

        async def free() -> httpx.Response | NotYet:
            got = await api.get(f"/api/v1/workloads/{NS}/quiet/logs")
            return got if got.status_code == 200 else NotYet(f"{got.status_code} {got.text}")
        assert (await wait_for(free, "a stream free again", top=limited, within=15)).text == "only line\n"

        began = time.monotonic()
        idled = await api.get(f"/api/v1/workloads/{NS}/quiet/logs", params={"follow": "true"})
        assert idled.status_code == 200 and time.monotonic() - began < 15
        assert idled.text.startswith("only line\n") and "no new line for 2s: the follow ended" in idled.text

        text, stopped = b"", False
        async with api.stream("GET", f"/api/v1/workloads/{NS}/long/logs", params={"follow": "true"}) as followed:
            async for chunk in followed.aiter_bytes():
                text += chunk
                if not stopped and text.count(b"tick") >= 3:
                    stopped = True
                    await limited.stop_agent(cluster)
        assert f"mkd: the agent of cluster {cluster} ended the stream".encode() in text \
            or f"mkd: cluster {cluster} went offline".encode() in text, text[-300:]
        offline = await api.get(f"/api/v1/workloads/{NS}/long/logs")
        assert offline.status_code in (503, 504), offline.text


async def test_why_and_a_warning_event_name_the_worker_side_cause(limited: Topology) -> None:
    federation = limited
    api = await setup(federation)
    crashing = job("crashing", run="0.3", log="starting")
    spec = crashing["spec"]
    spec["backoffLimit"] = 100
    spec["template"]["spec"]["restartPolicy"] = "OnFailure"
    spec["template"]["metadata"]["annotations"].update({"kubesim.mkd.dev/exit-code": "1",
                                                        "kubesim.mkd.dev/fail-attempts": "1000"})
    async with api:
        await federation.manager.create(JOBS, crashing, NS)

        async def cause() -> list[str] | NotYet:
            got = await api.get(f"/api/v1/why/{NS}/crashing")
            details = [d for d in got.json().get("details") or [] if "CrashLoopBackOff" in d]
            return details or NotYet(got.text)
        found = await wait_for(cause, "why naming the pod's CrashLoopBackOff", top=federation)
        assert found[0].startswith("pod crashing-") and "back-off" in found[0]

        async def warned() -> list[dict[str, Any]] | NotYet:
            events = (await federation.manager.list(EVENTS, NS)).items
            mine = [e for e in events if e["involvedObject"].get("name") == "crashing"
                    and e.get("reason") in CRASH_REASONS]
            return mine or NotYet(str([(e["involvedObject"].get("name"), e.get("reason")) for e in events]))
        told = await wait_for(warned, "a Warning Event on the manager Job naming the cause", top=federation)
        assert told[0]["type"] == "Warning" and told[0]["message"].startswith("pod crashing-")
        await asyncio.sleep(4)  # four more rounds: the same cause is not told again
        again = [e for e in (await federation.manager.list(EVENTS, NS)).items
                 if e["involvedObject"].get("name") == "crashing" and e.get("reason") in CRASH_REASONS]
        assert len(again) == 1  # one cause told; the next waits a minute (the rate limit)



async def test_a_follow_says_when_its_pod_was_deleted(federation: Topology) -> None:
    api = await setup(federation)
    async with api:
        await federation.manager.create(JOBS, job("doomed", run="120", log="tick", interval="0.2"), NS)
        listed = await running(federation, api, "doomed")
        cluster, name = listed["cluster"], listed["pods"][0]["name"]
        text, deleted = b"", False
        async with api.stream("GET", f"/api/v1/workloads/{NS}/doomed/logs", params={"follow": "true"}) as got:
            async for chunk in got.aiter_bytes():
                text += chunk
                if not deleted and b"tick" in text:
                    deleted = True
                    await federation.kubes[cluster].delete(PODS, name, NS)
        assert f"mkd: pod {name} was deleted on cluster {cluster}: its log ends here".encode() in text, text[-200:]


async def test_the_pods_of_a_rayjob_and_an_lws_carry_their_podsets_roles(federation: Topology) -> None:
    """A RayJob's pods are its RayCluster's (owned by the cluster, which the RayJob owns) and its submitter's:
    they are listed with the roles of the RayJob's PodSets (head, the worker group, submitter), the submitter
    first, whose log is the Ray job's; an LWS's are its groups' leaders and workers."""
    api = await setup(federation)
    ray = {"spec": {"containers": [{"name": "ray", "image": "rayproject/ray:2.46.0",
                                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}}
    rayjob = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "rj", "namespace": NS},
              "spec": {"managedBy": labels.MULTIKUEUE, "entrypoint": "python -c 'print(1)'",
                       "shutdownAfterJobFinishes": True,
                       "submitterPodTemplate": {"metadata": {"annotations": {"kubesim.mkd.dev/run-seconds": "60"}},
                                                "spec": {"restartPolicy": "Never", "containers": [{
                                                    "name": "ray-job-submitter", "image": "rayproject/ray:2.46.0",
                                                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}},
                       "rayClusterSpec": {"headGroupSpec": {"rayStartParams": {}, "template": ray},
                                          "workerGroupSpecs": [{"groupName": "Workers", "replicas": 2,
                                                                "template": ray}]}}}
    lws = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
           "metadata": {"name": "lw", "namespace": NS, "labels": {labels.QUEUE_NAME: "default"}},
           "spec": {"replicas": 2, "leaderWorkerTemplate": {"size": 2, "leaderTemplate": ray, "workerTemplate": ray}}}
    async with api:
        await federation.manager.create(Resource("ray.io", "v1", "rayjobs", "RayJob"), rayjob, NS)
        await federation.manager.create(Resource("leaderworkerset.x-k8s.io", "v1", "leaderworkersets",
                                                 "LeaderWorkerSet"), lws, NS)

        async def roles(name: str, want: int) -> list[tuple[str, int]] | NotYet:
            got = await api.get(f"/api/v1/workloads/{NS}/{name}/pods")
            if got.status_code != 200:
                return NotYet(f"{got.status_code} {got.text}")
            pods = got.json()["pods"]
            return [(p["role"], p["index"]) for p in pods] if len(pods) == want else NotYet(str(pods))

        ray_roles = await wait_for(lambda: roles("rj", 4), "the RayJob's four pods seen from the manager",
                                   top=federation)
        assert ray_roles == [("submitter", 0), ("head", 0), ("workers", 0), ("workers", 0)]
        lws_roles = await wait_for(lambda: roles("lw", 4), "the LWS's four pods seen from the manager", top=federation)
        assert lws_roles == [("leader", 0), ("leader", 1), ("worker", 0), ("worker", 1)]


async def test_a_placed_pod_is_its_own_pod(federation: Topology) -> None:
    """A single Pod's worker copy is the pod itself (a group's lead pod likewise, beside the pods it owns): the
    manager lists it and reads its log."""
    from federation.kinds import pod as pods

    api = await setup(federation)
    single = {"apiVersion": "v1", "kind": "Pod",
              "metadata": {"name": "solo", "namespace": NS, "labels": {labels.QUEUE_NAME: "default"},
                           "annotations": {"kubesim.mkd.dev/run-seconds": "60", "kubesim.mkd.dev/log": "solo says hi"}},
              "spec": {"schedulingGates": [{"name": pods.ADMISSION_GATE}], "restartPolicy": "Never",
                       "containers": [{"name": "main", "image": "busybox",
                                       "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}}
    async with api:
        await federation.manager.create(PODS, single, NS)

        async def listed() -> list[str] | NotYet:
            got = await api.get(f"/api/v1/workloads/{NS}/solo/pods")
            if got.status_code != 200:
                return NotYet(f"{got.status_code} {got.text}")
            names = [p["name"] for p in got.json()["pods"]]
            return names if names else NotYet("no pods listed")

        assert await wait_for(listed, "the placed Pod listed from the manager", top=federation) == ["solo"]

        async def log() -> str | NotYet:
            text = (await api.get(f"/api/v1/workloads/{NS}/solo/logs")).text
            return text if "solo says hi" in text else NotYet(text)

        await wait_for(log, "the placed Pod's log read from the manager", top=federation)
