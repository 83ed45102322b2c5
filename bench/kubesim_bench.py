"""kubesim benchmark: one simulated cluster in a separate ``python -m kubesim`` process, driven by clients here.

Prints pod creates/s from one official-client thread and from eight, PyTorchJob creates and updates/s
with mkd's CRDs (CEL rules) and deploy/admission's ValidatingAdmissionPolicies installed, the latency of listing 10,000 pods
(raw bytes and typed), watch delivery latency p50/p99, the server's RSS at 100,000 pods (``--quick``
uses smaller counts and says so), and the server's CPU-µs per request for each verb of the traffic mkd
causes per job (``--verbs`` prints only those: creates of PyTorchJobs, Services and Pods, status writes by
merge patch and by PUT, gets, lists, and watch events fanned out to several watchers), and the CPU-µs of
authorizing a request (``--authz`` prints only those). Pods name a scheduler that does not exist so that they stay Pending:
the figures are the API server's, not the simulated kubelet's.

    .venv/bin/python bench/kubesim_bench.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psutil
import yaml
from kubernetes import client, config

ROOT = Path(__file__).resolve().parents[1]
NS = "bench"


def pod_body(name: str) -> dict[str, Any]:
    """A pod shaped like the ones mkd's worker agent creates (labels, annotations, resources, env)."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "mkd", "mkd.dev/placement": "p-123",
                                              "job-name": "train"},
                     "annotations": {"mkd.dev/origin": "manager", "kubesim.mkd.dev/run-seconds": "60"}},
        "spec": {"schedulerName": "kubesim-bench-unscheduled", "restartPolicy": "Never",
                 "containers": [{"name": "trainer", "image": "ghcr.io/example/trainer:1.0",
                                 "command": ["python", "-m", "train"], "env": [
                                     {"name": "WORLD_SIZE", "value": "8"}, {"name": "RANK", "value": "0"},
                                     {"name": "MASTER_ADDR", "value": "train-0.train"}],
                                 "ports": [{"containerPort": 23456, "name": "dist"}],
                                 "resources": {"requests": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"},
                                               "limits": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"}}}]},
    }


class Server:
    """``python -m kubesim`` in a child process with one cluster named ``bench``."""

    def __init__(self, state: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen([sys.executable, "-m", "kubesim", "--clusters", "bench", "--nodes", "2",
                                      "--state-dir", str(state)], stdout=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if "ready" in line:
                break
        self.kubeconfig = state / "bench.kubeconfig"
        self.ps = psutil.Process(self.proc.pid)

    def rss_mb(self) -> float:
        return float(self.ps.memory_info().rss) / 2**20

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)


def new_client(kc: Path) -> client.ApiClient:
    return config.new_client_from_config(str(kc))


def creates_per_second(kc: Path, threads: int, per_thread: int, prefix: str,
                       srv: Server | None = None) -> tuple[float, float]:
    """Pod creates/s from ``threads`` client threads, and the server's CPU-ms per create (0 without ``srv``)."""
    clients = [client.CoreV1Api(new_client(kc)) for _ in range(threads)]
    barrier = threading.Barrier(threads + 1)

    def work(i: int) -> None:
        v1 = clients[i]
        barrier.wait()
        for j in range(per_thread):
            v1.create_namespaced_pod(NS, pod_body(f"{prefix}-{i}-{j}"))

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    barrier.wait()
    cpu0 = sum(srv.ps.cpu_times()[:2]) if srv else 0.0
    start = time.perf_counter()
    for t in ts:
        t.join()
    rate = threads * per_thread / (time.perf_counter() - start)
    cpu_ms = (sum(srv.ps.cpu_times()[:2]) - cpu0) * 1000 / (threads * per_thread) if srv else 0.0
    return rate, cpu_ms


SCHEMA_GROUP = "bench.kubesim.mkd.dev"
REPLICA_SCHEMA = {"type": "object", "properties": {
    "replicas": {"type": "integer", "format": "int32", "minimum": 0},
    "restartPolicy": {"type": "string", "enum": ["Always", "OnFailure", "Never", "ExitCode"], "default": "OnFailure"},
    "template": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}
TYPED_SCHEMA = {"type": "object", "properties": {
    "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
    "spec": {"type": "object", "required": ["pytorchReplicaSpecs"], "properties": {
        "runPolicy": {"type": "object", "properties": {
            "managedBy": {"type": "string", "enum": ["kubeflow.org/training-operator", "kueue.x-k8s.io/multikueue"]},
            "suspend": {"type": "boolean", "default": False},
            "backoffLimit": {"type": "integer", "minimum": 0}}},
        "pytorchReplicaSpecs": {"type": "object", "additionalProperties": REPLICA_SCHEMA}}},
    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}


def admit_cpu_us(n: int = 5000) -> float:
    """CPU-µs of kubesim.schema.admit (prune + default + validate) on one PyTorchJob-shaped body with the
    typed schema, in this process (free of the server's request handling and of the machine's noise)."""
    from kubesim import schema
    from kubesim.resources import Catalogue

    rt = Catalogue().add_crd({"spec": {"group": SCHEMA_GROUP, "scope": "Namespaced",
                                       "names": {"plural": "typedjobs", "kind": "Typedjob"},
                                       "versions": [{"name": "v1", "served": True, "storage": True,
                                                     "schema": {"openAPIV3Schema": TYPED_SCHEMA}}]}})
    body = pytorchjob("x")
    body["apiVersion"] = f"{SCHEMA_GROUP}/v1"
    raw = orjson.dumps(body)
    t = time.process_time()
    for _ in range(n):
        orjson.loads(raw)
    parse = time.process_time() - t
    t = time.process_time()
    for _ in range(n):
        schema.admit(rt, orjson.loads(raw), None)
    return (time.process_time() - t - parse) * 1e6 / n


RBAC_KINDS = {"Namespace": "namespaces", "ServiceAccount": "serviceaccounts",
              **{k: f"{k.lower()}s.rbac.authorization.k8s.io" for k in ("Role", "ClusterRole", "RoleBinding",
                                                                           "ClusterRoleBinding")}}


def authz_check_us(n: int = 2000) -> tuple[float, float]:
    """CPU-µs per ``kubesim.authz.Access.check`` in this process on a worker cluster holding deploy/worker's RBAC
    (the agent's and the fencer's roles and bindings): (the agent's ServiceAccount token through its bindings,
    the admin in system:masters), over the requests an agent makes for one job."""
    from kubesim.authz import ADMIN_USER, Access
    from kubesim.spec import ClusterSpec, NodeSpec
    from kubesim.store import Store

    store = Store(ClusterSpec("authz", [NodeSpec("node-a")], authorize=True))
    for path in ("deploy/worker/agent.yaml", "deploy/worker/fencer.yaml"):
        for obj in yaml.safe_load_all((ROOT / path).read_text()):
            if obj and obj.get("kind") in RBAC_KINDS and store.get(
                    RBAC_KINDS[obj["kind"]], obj["metadata"].get("namespace"), obj["metadata"]["name"]) is None:
                store.create(RBAC_KINDS[obj["kind"]], obj)
    access = Access(store, enforce=True)
    token = access.token_request("mkd-system", "mkd-agent", {"spec": {}})["status"]["token"]
    admin = next(t for t, u in access.tokens.items() if u.username == ADMIN_USER)
    jobs = "/apis/kubeflow.org/v1/namespaces/mkd-jobs/pytorchjobs"
    calls = [("GET", "/api/v1/namespaces/mkd-jobs/pods", {"watch": "true"}), ("POST", "/api/v1/namespaces/mkd-jobs/pods", {}),
             ("POST", "/api/v1/namespaces/mkd-jobs/services", {}), ("PUT", f"{jobs}/j/status", {}),
             ("GET", f"{jobs}/j", {}), ("PATCH", "/apis/coordination.k8s.io/v1/namespaces/mkd-system/leases/l", {}),
             ("POST", "/api/v1/namespaces/mkd-jobs/events", {}), ("DELETE", "/api/v1/namespaces/mkd-jobs/pods/p", {})]
    figures = []
    for bearer in (token, admin):
        for method, path, query in calls:
            access.check(method, path, query, f"Bearer {bearer}")  # allowed, or the bench measures refusals
        t = time.process_time()
        for i in range(n):
            method, path, query = calls[i % len(calls)]
            access.check(method, path, query, f"Bearer {bearer}")
        figures.append((time.process_time() - t) * 1e6 / n)
    return figures[0], figures[1]


def schema_rates(srv: Server, n: int) -> dict[str, tuple[float, float]]:
    """The cost of structural-schema work (prune, default, validate) alone: the same PyTorchJob-shaped body
    created as a custom resource of a CRD that preserves unknown fields (no schema work) and of one with a
    typed schema (enums, minimum, defaults in a map of replica specs), from one thread; rate and server
    CPU-ms per create for each."""
    api = new_client(srv.kubeconfig)
    ext = client.ApiextensionsV1Api(api)
    co = client.CustomObjectsApi(api)
    out = {}
    crds: list[tuple[str, dict[str, Any]]] = [
        ("plainjobs", {"type": "object", "x-kubernetes-preserve-unknown-fields": True}), ("typedjobs", TYPED_SCHEMA)]
    for plural, schema in crds:
        kind = plural[:-1].capitalize()
        ext.create_custom_resource_definition({"metadata": {"name": f"{plural}.{SCHEMA_GROUP}"}, "spec": {
            "group": SCHEMA_GROUP, "scope": "Namespaced", "names": {"plural": plural, "kind": kind},
            "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}]}})
        while True:  # a freshly installed CRD takes a moment to be served
            try:
                co.list_namespaced_custom_object(SCHEMA_GROUP, "v1", NS, plural)
                break
            except client.ApiException:
                time.sleep(0.1)
        cpu0 = sum(srv.ps.cpu_times()[:2])
        start = time.perf_counter()
        for i in range(n):
            body = pytorchjob(f"{plural}-{i}")
            body["apiVersion"], body["kind"] = f"{SCHEMA_GROUP}/v1", kind
            co.create_namespaced_custom_object(SCHEMA_GROUP, "v1", NS, plural, body)
        rate = n / (time.perf_counter() - start)
        out[plural] = (rate, (sum(srv.ps.cpu_times()[:2]) - cpu0) * 1000 / n)
    return out


def pytorchjob(name: str) -> dict[str, Any]:
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name, "labels": {"a": "b"}},
            "spec": {"runPolicy": {"managedBy": "kueue.x-k8s.io/multikueue", "suspend": True},
                     "pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": pod_body("t")},
                                             "Worker": {"replicas": 3, "template": pod_body("t")}}}}


def admission_rates(srv: Server, n: int) -> tuple[float, float, float, float]:
    """PyTorchJob creates/s and label-patch updates/s from one thread with mkd's CRDs (CEL rules) and the
    deploy/admission policies installed, plus the server's CPU-ms per create and per update. Every update
    runs the CRD's transition rule and the runPolicy policy (two variables, one validation); the other
    policy is only matched against."""
    install_mkd(srv)
    co = client.CustomObjectsApi(new_client(srv.kubeconfig))
    cpu0 = sum(srv.ps.cpu_times()[:2])
    start = time.perf_counter()
    for i in range(n):
        co.create_namespaced_custom_object("kubeflow.org", "v1", NS, "pytorchjobs", pytorchjob(f"pj-{i}"))
    creates = n / (time.perf_counter() - start)
    cpu1 = sum(srv.ps.cpu_times()[:2])
    start = time.perf_counter()
    for i in range(n):
        co.patch_namespaced_custom_object("kubeflow.org", "v1", NS, "pytorchjobs", f"pj-{i}",
                                          {"metadata": {"labels": {"a": "c"}}})
    updates = n / (time.perf_counter() - start)
    cpu2 = sum(srv.ps.cpu_times()[:2])
    return creates, updates, (cpu1 - cpu0) * 1000 / n, (cpu2 - cpu1) * 1000 / n


async def bulk_create(url: str, token: str, start: int, count: int, concurrency: int = 16) -> None:
    """Fill the server quickly over raw HTTP (only the server's memory is measured with these)."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    it = iter(range(start, start + count))
    async with aiohttp.ClientSession(headers=headers) as session:
        async def worker() -> None:
            for i in it:
                async with session.post(f"{url}/api/v1/namespaces/{NS}/pods",
                                        data=orjson.dumps(pod_body(f"fill-{i}"))) as r:
                    if r.status != 201:
                        raise RuntimeError(await r.text())
        await asyncio.gather(*(worker() for _ in range(concurrency)))


def list_latency(kc: Path, repeats: int = 3) -> tuple[float, float, int]:
    v1 = client.CoreV1Api(new_client(kc))
    raw_times, typed_times = [], []
    n = 0
    for _ in range(repeats):
        t = time.perf_counter()
        resp = v1.list_namespaced_pod(NS, _preload_content=False)
        data = resp.data  # the whole body received; parsing is the client's cost, not the server's
        raw_times.append(time.perf_counter() - t)
        n = len(orjson.loads(data)["items"])
    t = time.perf_counter()
    v1.list_namespaced_pod(NS)
    typed_times.append(time.perf_counter() - t)
    return min(raw_times), min(typed_times), n


def watch_latency(kc: Path, count: int, rate: float) -> tuple[float, float]:
    api = new_client(kc)
    v1 = client.CoreV1Api(api)
    rv = v1.list_namespaced_pod(NS, limit=1).metadata.resource_version
    sent: dict[str, float] = {}
    lat: list[float] = []
    done = threading.Event()

    def reader() -> None:
        resp = v1.list_namespaced_pod(NS, watch=True, resource_version=rv, timeout_seconds=300,
                                      label_selector="mkd.dev/placement=watch", _preload_content=False)
        buf = b""
        for chunk in resp.stream(amt=None):
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                got = time.perf_counter()
                ev = orjson.loads(line)
                name = ev["object"]["metadata"]["name"]
                if ev["type"] == "ADDED" and name in sent:
                    lat.append(got - sent[name])
                    if len(lat) >= count:
                        done.set()
                        resp.release_conn()
                        return

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    time.sleep(0.3)  # let the watch connect before the first create
    writer = client.CoreV1Api(new_client(kc))
    for i in range(count):
        body = pod_body(f"watch-{i}")
        body["metadata"]["labels"]["mkd.dev/placement"] = "watch"
        name = body["metadata"]["name"]
        sent[name] = time.perf_counter()
        writer.create_namespaced_pod(NS, body)
        time.sleep(1.0 / rate)
    done.wait(30)
    lat.sort()
    return statistics.median(lat) * 1000, lat[int(len(lat) * 0.99) - 1] * 1000


VERB_PATHS = {"pytorchjobs": "/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs",
              "services": "/api/v1/namespaces/{ns}/services", "pods": "/api/v1/namespaces/{ns}/pods"}


def install_mkd(srv: Server) -> None:
    """mkd's CRDs (CEL rules) and deploy/admission's ValidatingAdmissionPolicies, as the clusters of a run have."""
    from federation.kinds.crds import load_crds

    api = new_client(srv.kubeconfig)
    ext = client.ApiextensionsV1Api(api)
    for crd in load_crds():
        with _suppress_conflict():
            ext.create_custom_resource_definition(crd)
    ar = client.AdmissionregistrationV1Api(api)
    for f in sorted((ROOT / "deploy" / "admission").glob("*.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            with _suppress_conflict():
                if doc and doc["kind"] == "ValidatingAdmissionPolicy":
                    ar.create_validating_admission_policy(doc)
                elif doc and doc["kind"] == "ValidatingAdmissionPolicyBinding":
                    ar.create_validating_admission_policy_binding(doc)
    co = client.CustomObjectsApi(api)
    while True:  # a freshly installed CRD takes a moment to be served
        try:
            co.list_namespaced_custom_object("kubeflow.org", "v1", NS, "pytorchjobs")
            return
        except client.ApiException:
            time.sleep(0.1)


class _suppress_conflict:
    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: Any, exc: Any, tb: Any) -> bool:
        return isinstance(exc, client.ApiException) and exc.status == 409


def e2e_job(name: str) -> dict[str, Any]:
    """The PyTorchJob e2e_bench creates (1 Master + 1 Worker, pods that run for an hour)."""
    def replica() -> dict[str, Any]:
        return {"replicas": 1, "restartPolicy": "OnFailure", "template": {
            "metadata": {"annotations": {"kubesim.mkd.dev/run-seconds": "3600"}},
            "spec": {"containers": [{"name": "pytorch", "image": "docker.io/kubeflowkatib/pytorch-mnist:v1beta1",
                                     "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                                   "limits": {"cpu": "1", "memory": "1Gi"}}}]}}}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "user-queue"}},
            "spec": {"runPolicy": {"managedBy": "kueue.x-k8s.io/multikueue", "suspend": False},
                     "pytorchReplicaSpecs": {"Master": replica(), "Worker": replica()}}}


def running_status(i: int) -> dict[str, Any]:
    return {"conditions": [
        {"type": "Created", "status": "True", "reason": "PyTorchJobCreated", "message": f"job-{i} created",
         "lastUpdateTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"},
        {"type": "Running", "status": "True", "reason": "PyTorchJobRunning", "message": f"job-{i} running",
         "lastUpdateTime": "2026-01-01T00:00:01Z", "lastTransitionTime": "2026-01-01T00:00:01Z"}],
        "replicaStatuses": {"Master": {"active": 1}, "Worker": {"active": 1}}, "startTime": "2026-01-01T00:00:01Z"}


def service_body(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "labels": {"training.kubeflow.org/job-name": name}},
            "spec": {"clusterIP": "None", "selector": {"training.kubeflow.org/job-name": name},
                     "ports": [{"name": "pytorchjob-port", "port": 23456, "targetPort": 23456}]}}


def running_pod_body(name: str) -> dict[str, Any]:
    """A pod the default scheduler binds and the simulated kubelet starts (so its writes are counted too)."""
    body = pod_body(name)
    del body["spec"]["schedulerName"]
    body["metadata"]["annotations"]["kubesim.mkd.dev/run-seconds"] = "3600"
    for c in body["spec"]["containers"]:
        c["resources"] = {"requests": {"cpu": "10m", "memory": "10Mi"}, "limits": {"cpu": "10m", "memory": "10Mi"}}
    return body


async def verb_costs(srv: Server, n: int, watchers: int = 3, concurrency: int = 16) -> list[tuple[str, float]]:
    """The server's CPU-µs per request for each verb of mkd's per-job traffic, over raw HTTP (``concurrency``
    requests in flight, as the federation's clients keep several): measured as the server process's CPU time
    across ``n`` requests of one verb, waiting for the simulated scheduler and kubelet to settle where pods
    are involved (their binds and status writes are part of a pod create's cost)."""
    kcfg = yaml.safe_load(srv.kubeconfig.read_text())
    host = kcfg["clusters"][0]["cluster"]["server"]
    token = kcfg["users"][0]["user"]["token"]
    ns = "verbs"
    base = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    out: list[tuple[str, float]] = []

    async with aiohttp.ClientSession(headers=base) as session:
        async def call(method: str, path: str, body: Any = None, ctype: str = "application/json",
                       ok: tuple[int, ...] = (200, 201)) -> bytes:
            data = None if body is None else orjson.dumps(body)
            async with session.request(method, host + path, data=data,
                                       headers={"Content-Type": ctype} if data is not None else None) as r:
                got = await r.read()
                if r.status not in ok:
                    raise RuntimeError(f"{method} {path}: {r.status} {got[:300]!r}")
                return got

        async def measure(label: str, reqs: list[tuple[str, str, Any, str]], settle: float = 0.0) -> None:
            """The first request is a warm-up (first-use costs are not per-request costs): not counted."""
            await call(*reqs[0])
            reqs = reqs[1:]
            it = iter(reqs)

            async def worker() -> None:
                for method, path, body, ctype in it:
                    await call(method, path, body, ctype)
            await asyncio.sleep(0.2)  # let the previous phase's deferred work finish
            cpu0 = sum(srv.ps.cpu_times()[:2])
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            if settle:
                await asyncio.sleep(settle)
            used = sum(srv.ps.cpu_times()[:2]) - cpu0
            out.append((label, used * 1e6 / len(reqs)))

        await call("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
        jobs = VERB_PATHS["pytorchjobs"].format(ns=ns)
        merge = "application/merge-patch+json"
        await measure("create PyTorchJob (CEL rules, policies; no watch open)",
                      [("POST", jobs, e2e_job(f"a-{i}"), "application/json") for i in range(n)])
        streams = []
        for _ in range(watchers):  # informers: the dispatcher's or agent's, and the benchmark's
            resp = await session.get(host + f"/apis/kubeflow.org/v1/pytorchjobs?watch=true&resourceVersion="
                                     f"{orjson.loads(await call('GET', jobs + '?limit=1'))['metadata']['resourceVersion']}"
                                     "&allowWatchBookmarks=true", timeout=aiohttp.ClientTimeout(total=None))
            streams.append((resp, asyncio.create_task(_drain(resp))))
        await measure(f"create PyTorchJob, {watchers} watches open",
                      [("POST", jobs, e2e_job(f"b-{i}"), "application/json") for i in range(n)], settle=0.3)
        await measure(f"merge-patch status (the mirror), {watchers} watches",
                      [("PATCH", f"{jobs}/b-{i}/status", {"status": running_status(i)}, merge) for i in range(n)],
                      settle=0.3)
        listed = orjson.loads(await call("GET", jobs + "?labelSelector=kueue.x-k8s.io/queue-name"))["items"]
        puts = []
        for obj in listed:
            if obj["metadata"]["name"].startswith("a-"):
                obj["status"] = running_status(0)
                puts.append(("PUT", f"{jobs}/{obj['metadata']['name']}/status", obj, "application/json"))
        await measure(f"PUT status (the agent's), {watchers} watches", puts, settle=0.3)
        await measure(f"merge-patch labels, {watchers} watches",
                      [("PATCH", f"{jobs}/b-{i}", {"metadata": {"labels": {"mkd.dev/x": "y"}}}, merge)
                       for i in range(n)], settle=0.3)
        await measure("get PyTorchJob", [("GET", f"{jobs}/a-{i}", None, "") for i in range(n)])
        await measure(f"list {2 * n} PyTorchJobs", [("GET", jobs, None, "") for _ in range(10)])
        for resp, task in streams:
            task.cancel()
            resp.close()
        await measure("create Service (headless)",
                      [("POST", VERB_PATHS["services"].format(ns=ns), service_body(f"s-{i}"), "application/json")
                       for i in range(n)])
        pods = min(n, 200)  # the two nodes take 220 pods: every one is bound and started
        await measure("create Pod (+ the sim's bind and kubelet writes)",
                      [("POST", VERB_PATHS["pods"].format(ns=ns), running_pod_body(f"p-{i}"), "application/json")
                       for i in range(pods)], settle=1.5)
    return out


async def _drain(resp: aiohttp.ClientResponse) -> None:
    with contextlib.suppress(Exception):
        async for _ in resp.content.iter_any():
            pass


def print_verbs(srv: Server, n: int) -> None:
    install_mkd(srv)
    print(f"server CPU-µs per request, by verb ({n} requests each, 16 in flight, raw HTTP):")
    for label, us in asyncio.run(verb_costs(srv, n)):
        print(f"  {label:<55} {us:8.0f}")


def print_authz() -> None:
    runs = [authz_check_us() for _ in range(3)]
    sa, admin = min(r[0] for r in runs), min(r[1] for r in runs)
    print(f"authorization (ClusterSpec.authorize) per request, in-process, best of 3: the agent's ServiceAccount "
          f"through deploy/worker's RBAC {sa:.1f} CPU-µs, the admin (system:masters) {admin:.1f} CPU-µs")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small counts, a few seconds")
    ap.add_argument("--verbs", action="store_true", help="only the CPU-µs per request of each verb")
    ap.add_argument("--verbs-n", type=int, default=500, help="requests per verb for the per-verb figures")
    ap.add_argument("--authz", action="store_true", help="only the CPU-µs of kubesim's authorization per request")
    args = ap.parse_args()
    if args.authz:
        print_authz()
        return
    if args.verbs:
        with tempfile.TemporaryDirectory() as d:
            srv = Server(Path(d))
            try:
                client.CoreV1Api(new_client(srv.kubeconfig)).create_namespace({"metadata": {"name": NS}})
                print_verbs(srv, args.verbs_n)
            finally:
                srv.close()
        return
    one = 300 if args.quick else 2000
    eight = 60 if args.quick else 400
    list_n = 2000 if args.quick else 10_000
    rss_n = 10_000 if args.quick else 100_000
    with tempfile.TemporaryDirectory() as d:
        srv = Server(Path(d))
        try:
            kc = srv.kubeconfig
            client.CoreV1Api(new_client(kc)).create_namespace({"metadata": {"name": NS}})
            print(f"server pid {srv.proc.pid}, idle RSS {srv.rss_mb():.0f} MB")
            r1, ms1 = creates_per_second(kc, 1, one, "one", srv)
            print(f"pod creates/s, 1 thread : {r1:7.0f}  ({one} pods), server {ms1:.2f} CPU-ms each: "
                  f"{1000 / ms1:.0f}/s of server capacity ({'above' if 1000 / ms1 > 350 else 'BELOW'} a real "
                  "apiserver's ~350 creates/s with one client thread)")
            r8, ms8 = creates_per_second(kc, 8, eight, "eight", srv)
            print(f"pod creates/s, 8 threads: {r8:7.0f}  ({8 * eight} pods), server {ms8:.2f} CPU-ms each")
            sch = schema_rates(srv, 300 if args.quick else 1000)
            (pr, pms), (tr, tms) = sch["plainjobs"], sch["typedjobs"]
            print(f"custom resource creates/s, 1 thread: no schema work {pr:7.0f} ({pms:.2f} CPU-ms each), "
                  f"typed structural schema {tr:7.0f} ({tms:.2f} CPU-ms each): prune + default + validate costs "
                  f"{tms - pms:+.2f} CPU-ms per create (noisy); in-process: {admit_cpu_us():.0f} CPU-µs per create")
            cr_n = 300 if args.quick else 2000
            c, u, c_ms, u_ms = admission_rates(srv, cr_n)
            verdict = "above" if c > 350 else "BELOW"
            print(f"PyTorchJob creates/s, 1 thread, CRD rules + policies: {c:7.0f} ({verdict} a real apiserver's "
                  f"~350 pod creates/s), server {c_ms:.2f} CPU-ms each  ({cr_n} jobs)")
            print(f"PyTorchJob updates/s, 1 thread, transition rule + the matching policy: {u:7.0f}, server "
                  f"{u_ms:.2f} CPU-ms each")
            kcfg = yaml.safe_load(kc.read_text())
            host = kcfg["clusters"][0]["cluster"]["server"]
            token = kcfg["users"][0]["user"]["token"]
            have = one + 8 * eight  # pods (the custom resources above are not pods)
            if list_n > have:
                asyncio.run(bulk_create(host, token, 0, list_n - have))
                have = list_n
            raw, typed, n = list_latency(kc)
            print(f"list {n} pods: {raw * 1000:7.0f} ms until the body is read, {typed * 1000:7.0f} ms typed "
                  "(official client deserialising V1PodList)")
            p50, p99 = watch_latency(kc, 200 if args.quick else 1000, 200.0)
            print(f"watch delivery latency: p50 {p50:5.1f} ms, p99 {p99:5.1f} ms")
            if rss_n > have:
                asyncio.run(bulk_create(host, token, have, rss_n - have))
            total = len(json.loads(client.CoreV1Api(new_client(kc)).list_namespaced_pod(
                NS, _preload_content=False).data)["items"])
            print(f"server RSS at {total} pods: {srv.rss_mb():.0f} MB")
            print_verbs(srv, 300 if args.quick else 500)
            print_authz()
        finally:
            srv.close()


if __name__ == "__main__":
    main()
