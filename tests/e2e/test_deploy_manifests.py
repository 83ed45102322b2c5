"""deploy/ as an operator applies it: every kustomize overlay renders, a manager and a worker cluster
accept every object with server-side dry-run, and the roles grant what the services call and nothing more.

The overlays are rendered with ``kubectl kustomize`` (skipped, saying so, where kubectl is not
installed) and applied through the official client with ``dryRun=All``. The rules come from the code:
every Kubernetes call mkd makes goes through ``federation.kube``, whose ``Kube.recorder`` hears each one
as (User-Agent, verb, API group, resource[/subresource], namespace). The RBAC check runs the demo's
federation (every sample job, the ClusterQueues and LocalQueues of ``demo/queues``, a fencer per worker,
the services under deploy/'s own roles on clusters that authorize), deletes the jobs, and compares: every
(verb, group, resource) the dispatcher (``mkd-dispatcher/...``), the agents (``mkd-agent/...``) and the
fencers (``mkd-fencer/...``) called must be granted by the roles the production overlay installs; every
rule granted but never called in that run must be listed in ``UNUSED_ON_PURPOSE`` with the code path that
calls it. Scope is checked too: a call not confined to one namespace (a cluster-wide list or watch) must
be granted by a role the overlay binds cluster-wide (a ClusterRoleBinding), so the agents run with a policy
that lists the namespaces the samples land in, as the shipped policy does (their Secrets are read there
only). The fencer's fencing calls are recorded in a run of their own.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config, dynamic
from kubernetes.client.rest import ApiException

import kubesim
from federation import labels
from federation.kinds.registry import KINDS, by_api
from federation.kube import Call, Kube, resource_for
from mkctl import jobs
from mkctl.demo import observe_all, submit
from mkctl.topology import Topology, TopologyOptions
from tests.e2e.conftest import REAL, NotYet, check_not_forbidden, wait_for
from tests.realcluster import parse_kubeconfigs
from tests.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = {"demo-manager": "manager", "production-manager": "manager",
            "demo-worker": "worker-1", "production-worker": "worker-1"}
KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl (with its built-in kustomize) is not installed")

# Granted on purpose although the demo run below never calls it, each with the path that does.
UNUSED_ON_PURPOSE: dict[str, dict[tuple[str, str, str], str]] = {
    "dispatcher": {
        ("get", "<job>", "<job>"): "dispatcher/intake/unclaimed.py reads a Job whose claim is in doubt (created and "
                                   "deleted before its claim was handled); tests/dispatcher cover that path",
        ("create", "", "events"): "Warning Events on invalid Jobs (tests/dispatcher/test_conditions.py); "
                                  "every sample is valid",
        ("create", "authentication.k8s.io", "tokenreviews"): "the admin API checks a caller's bearer token "
                                                             "(dispatcher/api; no admin calls in this run)",
        ("create", "authorization.k8s.io", "subjectaccessreviews"): "the admin API asks RBAC whether the caller "
                                                                    "may read or act (dispatcher/api)",
        ("list", "admissionregistration.k8s.io", "mutatingwebhookconfigurations"):
            "only while a Route HandoverPolicy exists: is mkd's webhook registered, and for which namespaces "
            "(dispatcher/handover/book.py; tests/e2e/test_handover_guide.py)",
        **{(verb, "kueue.x-k8s.io", resource): "Kueue mode only (admission_check.enabled, off in this run): "
                                                 "dispatcher/admissioncheck/controller.py; its calls are checked "
                                                 "against this role by tests/e2e/test_kueue_mode.py"
           for verb, resource in (("list", "workloads"), ("watch", "workloads"), ("list", "admissionchecks"),
                                  ("watch", "admissionchecks"), ("patch", "workloads/status"),
                                  ("patch", "admissionchecks/status"))},
    },
    "agent": {
        # (pods/log: Pods are a job kind, so their calls are counted with the class)
        ("get", "<job>", "<job>/log"): "worker_agent/podanswers.py reads a container's log when the manager asks "
                                       "(mkctl logs; tests/e2e/test_pod_logs.py); nobody asks in this run",
        ("list", "", "events"): "worker_agent/podanswers.py lists a placed Job's pods' Events when the manager "
                                "asks (mkctl pods; tests/e2e/test_pod_logs.py); nobody asks in this run",
        ("get", "<job>", "<job>"): "worker_agent/inbox.py reads the worker Job when a create meets one already "
                                   "there and before replacing it for a newer spec version (tests/agent)",
        ("update", "<job>", "<job>"): "worker_agent/inbox.py replaces the worker Job for a newer spec version: "
                                      "suspend, resume, edits (tests/agent/test_agent_inbox.py)",
        **{(verb, "", kind): "worker_agent/apply.py, the one apply loop for every child kind, reads back after "
                             "a conflict, replaces what drifted and deletes what the render no longer wants"
           for verb in ("get", "update", "delete") for kind in ("pods", "services", "configmaps", "secrets")},
        ("create", "", "events"): "Warning Events on worker Jobs the agent refuses (tests/agent)",
        ("create", "", "namespaces"): "worker_agent/inbox.py creates a placed Job's namespace when it is missing "
                                      "(create_namespaces) and worker_agent/seq.py its own; here deploy/ and the "
                                      "test made them first (tests/agent/test_agent_inbox.py)",
        ("patch", "<job>", "<job>"): "worker_agent/lease.py suspends its Jobs when its lease runs out and "
                                     "resumes them after a Resync (tests/agent/test_lease.py); no lease runs "
                                     "out in this run",
    },
    "fencer": {},
}


def record_calls() -> tuple[dict[str, set[Call]], Any]:
    """Every call by service (the User-Agent's name: mkd-dispatcher, mkd-agent, mkd-fencer) from now on;
    the second value stops recording."""
    seen: dict[str, set[Call]] = defaultdict(set)

    def record(user_agent: str, call: Call) -> None:
        if not call.nonresource:  # discovery is open to every authenticated user
            seen[user_agent.split("/", 1)[0]].add(call)
    Kube.recorder = record

    def stop() -> None:
        Kube.recorder = None
    return seen, stop


def render(overlay: str) -> list[dict[str, Any]]:
    assert KUBECTL is not None
    done = subprocess.run([KUBECTL, "kustomize", str(ROOT / "deploy" / "overlays" / overlay)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"kubectl kustomize deploy/overlays/{overlay}: {done.stderr}"
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def role_of(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == name)


def roles_of(docs: list[dict[str, Any]], prefix: str) -> dict[str, Any]:
    """Every (Cluster)Role whose name starts with ``prefix``, as one role: the agent reads through
    ``mkd-agent`` and writes through ``mkd-agent-workloads`` (bound per allowed namespace) and
    ``mkd-agent-self`` (its own namespace)."""
    return {"rules": [rule for d in docs if d["kind"] in ("ClusterRole", "Role")
                      and d["metadata"]["name"].startswith(prefix) for rule in d["rules"]]}


def _classes() -> dict[tuple[str, str], tuple[str, str]]:
    """The code treats every job kind alike (one JobKind protocol), and both runtime kinds alike; a call
    seen for one stands for all of them, so the comparison is made per class."""
    out = {(k.group, k.plural): ("<job>", "<job>") for k in KINDS}
    out[("trainer.kubeflow.org", "trainingruntimes")] = ("<runtime>", "<runtime>")
    out[("trainer.kubeflow.org", "clustertrainingruntimes")] = ("<runtime>", "<runtime>")
    return out


def normalize(verb: str, group: str, resource: str) -> tuple[str, str, str]:
    plural, _, sub = resource.partition("/")
    cls = _classes().get((group, plural))
    if cls is None:
        return verb, group, resource
    return verb, cls[0], cls[1] + (f"/{sub}" if sub else "")


def grants(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(verb, group, resource) for rule in role["rules"] for verb in rule["verbs"]
            for group in rule.get("apiGroups", []) for resource in rule.get("resources", [])}


def allowed(granted: set[tuple[str, str, str]], verb: str, group: str, resource: str) -> bool:
    return any(v in (verb, "*") and g in (group, "*") and r in (resource, "*") for v, g, r in granted)


class Clusters:
    """The manager and one worker: real ones from MKD_TEST_KUBECONFIGS (its first worker), or kubesim's."""

    def __init__(self, paths: dict[str, Path], sim: kubesim.Sim | None = None) -> None:
        self.paths = paths
        self.sim = sim

    def kubeconfig(self, role: str) -> Path:
        """``manager`` or ``worker-1`` (the worker role, whatever the real worker is called)."""
        return self.paths[role]


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clusters]:
    if REAL:
        given = {k: Path(v) for k, v in parse_kubeconfigs(REAL).items()}
        worker = next(k for k in given if k != "manager")
        yield Clusters({"manager": given["manager"], "worker-1": given[worker]})
        return
    specs = [kubesim.ClusterSpec("manager", [kubesim.NodeSpec("manager-node-1")]),
             kubesim.ClusterSpec("worker-1", [kubesim.NodeSpec("worker-1-node-1")])]
    with kubesim.serve(specs, tmp_path_factory.mktemp("deploy")) as sim:
        yield Clusters({name: Path(sim.kubeconfig(name)) for name in ("manager", "worker-1")}, sim)


@needs_kubectl
@pytest.mark.realcluster  # renders only
def test_crds_install_from_one_place() -> None:
    docs = render("../crds")
    shipped = {p.name.removesuffix(".yaml") for p in (ROOT / "federation" / "kinds" / "crds").glob("*.yaml")
               if p.name != "Kustomization"}
    assert {d["metadata"]["name"] for d in docs if d["kind"] == "CustomResourceDefinition"} >= shipped


@needs_kubectl
@pytest.mark.realcluster  # creates deploy/'s Namespaces (kept: a later run or a deploy reuses them), nothing else
@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_overlay_applies_with_server_side_dry_run(clusters: Clusters, overlay: str) -> None:
    docs = render(overlay)
    api = config.new_client_from_config(str(clusters.kubeconfig(OVERLAYS[overlay])))
    try:
        dyn = dynamic.DynamicClient(api)
        core = client.CoreV1Api(api)
        for ns in [d for d in docs if d["kind"] == "Namespace"]:
            try:  # a dry-run namespace would not exist for the objects in it, as on a real server
                core.create_namespace(ns)
            except ApiException as exc:
                assert exc.status == 409, exc.body
        refused = []
        for doc in docs:
            resource = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
            meta = doc["metadata"]
            try:
                resource.server_side_apply(body=doc, name=meta["name"], namespace=meta.get("namespace"),
                                           field_manager="mkd-deploy-test", dry_run="All")
            except ApiException as exc:
                refused.append(f"{doc['kind']} {meta['name']}: {exc.status} {exc.body}")
        assert not refused, "\n".join(refused)
        deployment = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].startswith("mkd-"))
        with pytest.raises(ApiException) as gone:  # dry-run persisted nothing
            client.AppsV1Api(api).read_namespaced_deployment(deployment["metadata"]["name"], "mkd-system")
        assert gone.value.status == 404
    finally:
        api.close()


@pytest.mark.realcluster  # creates nothing: both objects are refused
def test_the_server_refuses_a_deployment_whose_selector_misses_its_template(clusters: Clusters) -> None:
    api = config.new_client_from_config(str(clusters.kubeconfig("manager")))
    try:
        body = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "bad"},
                "spec": {"selector": {"matchLabels": {"app": "a"}},
                         "template": {"metadata": {"labels": {"app": "b"}},
                                      "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}
        with pytest.raises(ApiException) as refused:
            client.AppsV1Api(api).create_namespaced_deployment("default", body)
        assert refused.value.status == 422
        assert "`selector` does not match template `labels`" in refused.value.body
        role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "r"},
                "rules": [{"apiGroups": [""], "resources": ["pods"]}]}
        roles = dynamic.DynamicClient(api).resources.get(api_version="rbac.authorization.k8s.io/v1",
                                                          kind="ClusterRole")
        with pytest.raises(ApiException) as no_verbs:  # the typed client would refuse it before sending
            roles.create(body=role)
        assert no_verbs.value.status == 422 and "rules[0].verbs" in no_verbs.value.body
    finally:
        api.close()


def cluster_wide(docs: list[dict[str, Any]], prefix: str) -> set[tuple[str, str, str]]:
    """What the (Cluster)Roles named ``prefix``... grant through a ClusterRoleBinding: cluster-wide."""
    bound = {d["roleRef"]["name"] for d in docs if d["kind"] == "ClusterRoleBinding"
             and d["metadata"]["name"].startswith(prefix)}
    return grants({"rules": [rule for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] in bound
                             for rule in d["rules"]]})


@pytest.fixture
async def confined(tmp_path: Path, mqtt_url: str, database_url: str, topic_root: str) -> AsyncIterator[Topology]:
    """The e2e federation, its agents' policy listing the namespaces the samples use (as deploy/ does)."""
    namespaces = sorted({s.namespace for s in jobs.load_examples().samples})
    options = TopologyOptions(
        state_dir=tmp_path / "state", mqtt_url=mqtt_url, database_url=database_url, topic_root=topic_root,
        heartbeat_seconds=1.0, heartbeat_timeout_seconds=3.0, origin="mkd-e2e",
        agent_overrides={"policy": {"allowed_namespaces": namespaces}}, fencers=True)
    async with Topology(options) as top:
        yield top
        top.check_running()
        await check_not_forbidden(top)


@needs_kubectl
@pytest.mark.slow
@pytest.mark.needs_running_pods("every sample job must reach its end (PyTorchJob, MPIJob and TrainJob pods complete), "
                                "so that every call of a job's life is made")
async def test_the_roles_grant_what_the_services_call_and_nothing_more(confined: Topology) -> None:
    federation = confined
    examples = jobs.load_examples()
    queues = jobs.load_examples(jobs.queues_dir())
    examples.queue_objects += queues.queue_objects  # ClusterQueues and LocalQueues: their status is written
    examples.namespaces |= {str(o["metadata"]["namespace"]) for o in queues.queue_objects
                            if o["metadata"].get("namespace")}
    used, stop = record_calls()
    try:
        await submit(federation, examples)

        async def all_reached() -> bool | NotYet:
            seen = await observe_all(federation.manager, examples.samples)
            missing = [s.key for s in examples.samples if not jobs.reached(s, seen[s.key])]
            return NotYet(", ".join(missing)) if missing else True

        await wait_for(all_reached, "every sample at its expected end", top=federation)
        cq = "kueue.x-k8s.io", "clusterqueues/status"

        async def queue_status_written() -> bool | NotYet:
            return True if any((c.group, c.resource) == cq for c in used["mkd-dispatcher"]) else NotYet("no write")
        await wait_for(queue_status_written, "the ClusterQueues' status written", top=federation)
        kinds = {s.key: by_api(s.manifest["apiVersion"], s.kind) for s in examples.samples}
        for sample in examples.samples:  # deletions travel to the workers too
            await federation.manager.delete(resource_for(kinds[sample.key]), sample.name, sample.namespace)

        async def workers_empty() -> bool | NotYet:
            left = []
            for worker in federation.worker_names:
                for kind in {k for k in kinds.values() if k is not None}:
                    if (await federation.kubes[worker].list(resource_for(kind), label_selector=labels.ORIGIN)).items:
                        left.append(f"{worker}: {kind.name}")
            return NotYet(", ".join(sorted(set(left)))) if left else True

        await wait_for(workers_empty, "the workers' copies deleted", top=federation)
    finally:
        stop()

    worker_docs = render("production-worker")
    roles = {"dispatcher": role_of(render("production-manager"), "mkd-dispatcher"),
             "agent": roles_of(worker_docs, "mkd-agent"), "fencer": roles_of(worker_docs, "mkd-fencer")}
    everywhere = cluster_wide(worker_docs, "mkd-agent")
    unconfined = {(c.verb, c.group, c.resource) for c in used["mkd-agent"] if not c.namespace}
    assert ("watch", "", "pods") in unconfined  # capacity: every pod, cluster-wide
    beyond = sorted(c for c in unconfined if not allowed(everywhere, *c))
    assert not beyond, f"the agent calls cluster-wide what is granted only per namespace: {beyond}"
    assert not {c for c in unconfined if c[2] in ("secrets", "configmaps")}, "Secrets read cluster-wide"
    assert not allowed(everywhere, "list", "", "secrets") and not allowed(everywhere, "get", "", "secrets")
    figures = []
    for service, role in roles.items():
        calls = {(c.verb, c.group, c.resource) for c in used[f"mkd-{service}"]}
        assert calls, f"the {service} made no API calls"
        check_role(service, role, calls, ignore_unused=service == "fencer")  # fencing: the test below
        used_rules = sorted({normalize(*c) for c in calls})
        figures.append(f"{service}: {len(used_rules)} rules used: {used_rules}")
    print("RBAC from the calls:", "; ".join(figures))


def check_role(service: str, role: dict[str, Any], calls: set[tuple[str, str, str]], *,
               ignore_unused: bool = False) -> None:
    """Every call granted; every grant called or named in UNUSED_ON_PURPOSE (unless ``ignore_unused``)."""
    granted = grants(role)
    missing = sorted(c for c in calls if not allowed(granted, *c))
    assert not missing, (f"the {service} calls what its roles in deploy/ do not grant; add these rules "
                         f"(verb, API group, resource): {missing}")
    if ignore_unused:
        return
    called = {normalize(*c) for c in calls}
    unused = sorted({normalize(*g) for g in granted} - called - set(UNUSED_ON_PURPOSE[service]))
    assert not unused, (f"the {service}'s roles grant what it never called in the run; remove it "
                        f"or say why in UNUSED_ON_PURPOSE: {unused}")


@needs_kubectl
@pytest.mark.kubesim_only("fences a worker: writes an expired lease record for its agent into mkd-system, which "
                          "would stop the real worker's mkd jobs")
async def test_the_fencers_roles_grant_what_it_calls_when_it_fences_and_nothing_more(clusters: Clusters) -> None:
    """A worker whose agent's lease record ran out, with a placed PyTorchJob and its pod: the fencer
    suspends the one and deletes the other, and its roles must grant exactly the calls it made."""
    from datetime import UTC, datetime, timedelta

    from federation.errors import AlreadyExists
    from federation.kinds.crds import load_crds
    from federation.kube import CRDS, NAMESPACES, PODS, Kube
    from tests.agent.render_harness import example
    from worker_agent import leaserecord
    from worker_agent.fencer import Fencer

    pytorchjobs = resource_for(by_api("kubeflow.org/v1", "PyTorchJob"))  # type: ignore[arg-type]
    async with Kube(clusters.kubeconfig("worker-1")) as kube:
        for crd in load_crds():
            with contextlib.suppress(AlreadyExists):
                await kube.create(CRDS, crd)
        for ns in ("mkd-jobs", "mkd-system"):
            with contextlib.suppress(AlreadyExists):
                await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        await eventually(lambda: kube.served(pytorchjobs), what="the CRD to be served (once established)")
        job = example("pytorch-simple.yaml", namespace="mkd-jobs")
        del job["metadata"]["uid"]
        job["metadata"]["namespace"] = "mkd-jobs"
        job["spec"].get("runPolicy", {}).pop("managedBy", None)
        job["metadata"]["labels"] = {labels.ORIGIN: "mkd", labels.WORKLOAD_UID: "wl-fenced",
                                     labels.PLACEMENT_ATTEMPT: "1", labels.EPOCH: "1"}
        copy = await kube.create(pytorchjobs, job, "mkd-jobs")
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": "fenced-master-0", "namespace": "mkd-jobs", "annotations": {labels.CREATED_BY: "mkd"},
            "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": copy["metadata"]["name"],
                                 "uid": copy["metadata"]["uid"], "controller": True}]},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
        await kube.create(PODS, pod, "mkd-jobs")
        await leaserecord.write(kube, "mkd-system", "worker-1", origin="mkd",
                                renewed=datetime.now(UTC) - timedelta(seconds=60), seconds=5)
    used, stop = record_calls()
    try:
        async with Kube(clusters.kubeconfig("worker-1"), user_agent="mkd-fencer") as kube:
            fencer = Fencer(kube, cluster="worker-1", namespace="mkd-system", origin="mkd")
            await fencer.check()
            swept = await fencer.sweep()  # a second sweep finds nothing left to stop
            assert fencer.sweeps == 1 and not swept.suspended and not swept.pods_deleted
    finally:
        stop()
    calls = {(c.verb, c.group, c.resource) for c in used["mkd-fencer"]}
    check_role("fencer", roles_of(render("production-worker"), "mkd-fencer"), calls)
