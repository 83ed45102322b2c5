"""Admission webhooks over HTTPS: Mutating/ValidatingWebhookConfiguration, AdmissionReview v1, JSONPatch.

A small HTTPS webhook server runs in a thread of the test process with a certificate from a throw-away CA;
kubesim calls it as a real kube-apiserver would. kubesim-only: a real control plane cannot reach a webhook on
this machine's loopback, so these tests are not marked ``realcluster``.
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.dynamic import DynamicClient

from kubesim.testing import status_of, webhook_pki

pytestmark = pytest.mark.kubesim_only("the webhook server listens on this machine's loopback, out of a real API server's reach")

HOOK_NS = "hooks"  # the Service that fronts the webhook lives here: hooks.hooks.svc
GROUP = "kubesim.mkd.dev"


# ---------------------------------------------------------------------------------------- the webhook server


def _patch(ops: list[dict[str, Any]]) -> str:
    return base64.b64encode(json.dumps(ops).encode()).decode()


class Hook:
    """What the webhook server answers, per path, and what it was sent."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()

    def answer(self, path: str, review: dict[str, Any]) -> dict[str, Any] | None:
        req = review["request"]
        with self.lock:
            self.seen.append((path, review))
        resp: dict[str, Any] = {"uid": req["uid"], "allowed": True}
        obj = req.get("object") or {}
        if path == "/mutate":
            labels = (obj.get("metadata") or {}).get("labels")
            ops = [] if labels else [{"op": "add", "path": "/metadata/labels", "value": {}}]
            ops.append({"op": "add", "path": "/metadata/labels/mutated-by", "value": "hook"})
            resp.update(patchType="JSONPatch", patch=_patch(ops), warnings=["mutated by the test hook"])
        elif path == "/reinvoke":
            meta = obj.get("metadata") or {}
            seen = str(len(meta.get("labels") or {}))
            notes = meta.get("annotations")
            if notes is None:
                ops = [{"op": "add", "path": "/metadata/annotations", "value": {"kubesim.mkd.dev/labels-seen": seen}}]
            else:
                op = "replace" if "kubesim.mkd.dev/labels-seen" in notes else "add"
                ops = [{"op": op, "path": "/metadata/annotations/kubesim.mkd.dev~1labels-seen", "value": seen}]
            resp.update(patchType="JSONPatch", patch=_patch(ops))
        elif path == "/managedby":
            ops = [{"op": "add", "path": "/spec/runPolicy/managedBy", "value": "kueue.x-k8s.io/multikueue"}]
            resp.update(patchType="JSONPatch", patch=_patch(ops))
        elif path == "/deny-big":
            if len(obj.get("data") or {}) > 1:
                resp.update(allowed=False, status={"code": 403, "reason": "Forbidden",
                                                   "message": "at most one key, please"})
        elif path == "/deny-plain":
            resp.update(allowed=False)
        elif path == "/slow":
            time.sleep(2.5)
        elif path == "/bad-uid":
            resp["uid"] = "not-the-uid"
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": resp}

    def paths(self) -> list[str]:
        with self.lock:
            return [p for p, _ in self.seen]

    def last(self, path: str) -> dict[str, Any]:
        with self.lock:
            return [r for p, r in self.seen if p == path][-1]["request"]


@pytest.fixture(scope="module")
def hook_server() -> Iterator[tuple[Hook, int, str]]:
    """(hook, port, caBundle) for an HTTPS server on 127.0.0.1 with a certificate for hooks.hooks.svc."""
    pki = webhook_pki([f"hooks.{HOOK_NS}.svc", "localhost"])
    hook = Hook()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            out = hook.answer(self.path.split("?")[0], json.loads(body))
            data = json.dumps(out).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "tls.crt").write_bytes(pki.cert_pem)
        (Path(d) / "tls.key").write_bytes(pki.key_pem)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(Path(d) / "tls.crt", Path(d) / "tls.key")
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield hook, server.server_address[1], pki.ca_bundle
    server.shutdown()
    server.server_close()


# ---------------------------------------------------------------------------------------- configurations


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def webhook(name: str, client_config: dict[str, Any], resources: list[str], operations: list[str] | None = None,
            group: str = "", version: str = "v1", **extra: Any) -> dict[str, Any]:
    return {"name": name, "clientConfig": client_config, "sideEffects": "None", "admissionReviewVersions": ["v1"],
            "rules": [{"apiGroups": [group], "apiVersions": [version], "resources": resources,
                       "operations": operations or ["CREATE", "UPDATE"]}], **extra}


@pytest.fixture
def hooks(api: client.ApiClient, ns: str) -> Iterator[tuple[client.AdmissionregistrationV1Api, str]]:
    """Configurations made through this fixture are removed after the test; the namespace is labelled."""
    ar = client.AdmissionregistrationV1Api(api)
    client.CoreV1Api(api).patch_namespace(ns, {"metadata": {"labels": {"webhooks": "on"}}})
    tag = uuid.uuid4().hex[:6]
    yield ar, tag
    for c in ar.list_mutating_webhook_configuration().items:
        if c.metadata.name.endswith(tag):
            ar.delete_mutating_webhook_configuration(c.metadata.name)
    for c in ar.list_validating_webhook_configuration().items:
        if c.metadata.name.endswith(tag):
            ar.delete_validating_webhook_configuration(c.metadata.name)


ON = {"matchLabels": {"webhooks": "on"}}


def url_config(port: int, path: str, ca: str) -> dict[str, Any]:
    return {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca}


def install_crd(api: client.ApiClient, name: str) -> None:
    """One of mkd's CRDs (federation/kinds/crds), installed once per cluster and Established."""
    from federation.kinds.crds import load_crds
    from kubesim.testing import eventually

    ext = client.ApiextensionsV1Api(api)
    crd = next(c for c in load_crds() if c["metadata"]["name"] == name)
    try:
        ext.create_custom_resource_definition(crd)
    except client.ApiException as e:
        if e.status != 409:
            raise
    eventually(lambda: any(c.type == "Established" for c in
                           (ext.read_custom_resource_definition(name).status.conditions or [])))


def refused(fn: Any, *args: Any, **kw: Any) -> dict[str, Any]:
    with pytest.raises(client.ApiException) as ei:
        fn(*args, **kw)
    return status_of(ei.value)


# ---------------------------------------------------------------------------------------- tests


def test_mutating_and_validating_webhooks(api: client.ApiClient, ns: str, hooks: Any,
                                          hook_server: tuple[Hook, int, str]) -> None:
    ar, tag = hooks
    hook, port, ca = hook_server
    ar.create_mutating_webhook_configuration({"metadata": {"name": f"m-{tag}"}, "webhooks": [
        webhook("mutate.kubesim.mkd.dev", url_config(port, "/mutate", ca), ["configmaps"], namespaceSelector=ON)]})
    ar.create_validating_webhook_configuration({"metadata": {"name": f"v-{tag}"}, "webhooks": [
        webhook("deny-big.kubesim.mkd.dev", url_config(port, "/deny-big", ca), ["configmaps"], namespaceSelector=ON)]})
    got = ar.read_mutating_webhook_configuration(f"m-{tag}").webhooks[0]
    assert (got.failure_policy, got.match_policy, got.timeout_seconds, got.reinvocation_policy) == \
        ("Fail", "Equivalent", 10, "Never")

    v1 = client.CoreV1Api(api)
    cm, _, headers = v1.create_namespaced_config_map_with_http_info(ns, {"metadata": {"name": "one"},
                                                                         "data": {"a": "1"}})
    assert cm.metadata.labels == {"mutated-by": "hook"}
    assert headers.get("Warning") == '299 - "mutated by the test hook"'
    req = hook.last("/mutate")
    assert req["operation"] == "CREATE" and req["namespace"] == ns and req["name"] == "one"
    assert req["kind"] == {"group": "", "version": "v1", "kind": "ConfigMap"}
    assert req["resource"] == {"group": "", "version": "v1", "resource": "configmaps"}
    assert req["dryRun"] is False and req["oldObject"] is None and req["object"]["data"] == {"a": "1"}
    # The validating webhook sees the mutated object.
    assert hook.last("/deny-big")["object"]["metadata"]["labels"] == {"mutated-by": "hook"}

    st = refused(v1.create_namespaced_config_map, ns, {"metadata": {"name": "two"}, "data": {"a": "1", "b": "2"}})
    assert st == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                  "message": 'admission webhook "deny-big.kubesim.mkd.dev" denied the request: at most one key, please',
                  "reason": "Forbidden", "code": 403}
    # Updates and patches: oldObject is sent; a denied update leaves the object as it was.
    st = refused(v1.patch_namespaced_config_map, "one", ns, {"data": {"b": "2"}})
    assert st["code"] == 403
    assert hook.last("/deny-big")["operation"] == "UPDATE"
    assert hook.last("/deny-big")["oldObject"]["data"] == {"a": "1"}
    v1.patch_namespaced_config_map("one", ns, {"metadata": {"labels": {"x": "y"}}})
    cm = v1.read_namespaced_config_map("one", ns)
    assert cm.data == {"a": "1"} and cm.metadata.labels == {"mutated-by": "hook", "x": "y"}
    # Dry runs reach the webhooks with dryRun: true and store nothing.
    v1.create_namespaced_config_map(ns, {"metadata": {"name": "dry"}}, dry_run="All")
    assert hook.last("/mutate")["dryRun"] is True
    assert refused(v1.read_namespaced_config_map, "dry", ns)["code"] == 404
    # Outside the selected namespace nothing is called.
    before = len(hook.paths())
    v1.create_namespaced_config_map("default", {"metadata": {"name": f"plain-{tag}"}, "data": {"a": "1", "b": "2"}})
    v1.delete_namespaced_config_map(f"plain-{tag}", "default")
    assert len(hook.paths()) == before


def test_reinvocation_if_needed(api: client.ApiClient, ns: str, hooks: Any,
                                hook_server: tuple[Hook, int, str]) -> None:
    """A webhook with reinvocationPolicy IfNeeded runs again when a later webhook changed the object."""
    ar, tag = hooks
    hook, port, ca = hook_server
    ar.create_mutating_webhook_configuration({"metadata": {"name": f"a-{tag}"}, "webhooks": [
        webhook("reinvoke.kubesim.mkd.dev", url_config(port, "/reinvoke", ca), ["configmaps"], ["CREATE"],
                namespaceSelector=ON, reinvocationPolicy="IfNeeded")]})
    ar.create_mutating_webhook_configuration({"metadata": {"name": f"b-{tag}"}, "webhooks": [
        webhook("mutate.kubesim.mkd.dev", url_config(port, "/mutate", ca), ["configmaps"], ["CREATE"],
                namespaceSelector=ON)]})
    before = hook.paths().count("/reinvoke")
    cm = client.CoreV1Api(api).create_namespaced_config_map(ns, {"metadata": {"name": "r"}})
    assert cm.metadata.labels == {"mutated-by": "hook"}
    assert cm.metadata.annotations == {"kubesim.mkd.dev/labels-seen": "1"}  # the second call saw the label
    assert hook.paths().count("/reinvoke") == before + 2


def test_webhook_rules_operations_and_object_selector(api: client.ApiClient, ns: str, hooks: Any,
                                                      hook_server: tuple[Hook, int, str]) -> None:
    ar, tag = hooks
    hook, port, ca = hook_server
    ar.create_validating_webhook_configuration({"metadata": {"name": f"v-{tag}"}, "webhooks": [
        webhook("plain.kubesim.mkd.dev", url_config(port, "/deny-plain", ca), ["configmaps"], ["UPDATE"],
                namespaceSelector=ON, objectSelector={"matchLabels": {"guarded": "yes"}})]})
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_config_map(ns, {"metadata": {"name": "g", "labels": {"guarded": "yes"}}})  # CREATE: no rule
    v1.create_namespaced_config_map(ns, {"metadata": {"name": "free"}})
    v1.patch_namespaced_config_map("free", ns, {"data": {"a": "1"}})  # objectSelector does not match
    st = refused(v1.patch_namespaced_config_map, "g", ns, {"data": {"a": "1"}})
    assert st["code"] == 400 and "reason" not in st
    assert st["message"] == 'admission webhook "plain.kubesim.mkd.dev" denied the request without explanation'
    assert hook.paths().count("/deny-plain") == 1
    # DELETE: the webhook sees oldObject and DeleteOptions.
    ar.create_validating_webhook_configuration({"metadata": {"name": f"d-{tag}"}, "webhooks": [
        webhook("nodelete.kubesim.mkd.dev", url_config(port, "/deny-plain", ca), ["configmaps"], ["DELETE"],
                namespaceSelector=ON, objectSelector={"matchLabels": {"guarded": "yes"}})]})
    st = refused(v1.delete_namespaced_config_map, "g", ns, propagation_policy="Foreground")
    assert st["message"] == 'admission webhook "nodelete.kubesim.mkd.dev" denied the request without explanation'
    req = hook.last("/deny-plain")
    assert req["operation"] == "DELETE" and req["object"] is None and req["oldObject"]["metadata"]["name"] == "g"
    assert req["options"] == {"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1",
                              "propagationPolicy": "Foreground"}
    v1.delete_namespaced_config_map("free", ns)


def test_failure_policy_timeouts_and_tls(api: client.ApiClient, ns: str, hooks: Any,
                                         hook_server: tuple[Hook, int, str]) -> None:
    ar, tag = hooks
    hook, port, ca = hook_server
    v1 = client.CoreV1Api(api)
    dead = _free_port()
    other_ca = webhook_pki(["elsewhere"]).ca_bundle

    def only(name: str, cfg: dict[str, Any], **extra: Any) -> None:
        for c in ar.list_validating_webhook_configuration().items:
            if c.metadata.name.endswith(tag):
                ar.delete_validating_webhook_configuration(c.metadata.name)
        ar.create_validating_webhook_configuration({"metadata": {"name": f"v-{tag}"}, "webhooks": [
            webhook(name, cfg, ["configmaps"], ["CREATE"], namespaceSelector=ON, **extra)]})

    only("dead.kubesim.mkd.dev", url_config(dead, "/x", ca))
    st = refused(v1.create_namespaced_config_map, ns, {"metadata": {"name": "a"}})
    msg = (f'failed calling webhook "dead.kubesim.mkd.dev": failed to call webhook: Post '
           f'"https://127.0.0.1:{dead}/x?timeout=10s": dial tcp 127.0.0.1:{dead}: connect: connection refused')
    assert st == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                  "message": f"Internal error occurred: {msg}", "reason": "InternalError",
                  "details": {"causes": [{"message": msg}]}, "code": 500}

    only("dead.kubesim.mkd.dev", url_config(dead, "/x", ca), failurePolicy="Ignore")
    v1.create_namespaced_config_map(ns, {"metadata": {"name": "ignored"}})

    only("slow.kubesim.mkd.dev", url_config(port, "/slow", ca), timeoutSeconds=1)
    st = refused(v1.create_namespaced_config_map, ns, {"metadata": {"name": "b"}})
    assert st["code"] == 500 and st["message"].endswith(
        f'Post "https://127.0.0.1:{port}/slow?timeout=1s": context deadline exceeded')

    only("ca.kubesim.mkd.dev", url_config(port, "/deny-plain", other_ca))
    st = refused(v1.create_namespaced_config_map, ns, {"metadata": {"name": "c"}})
    assert st["code"] == 500 and "tls: failed to verify certificate: x509:" in st["message"]

    only("uid.kubesim.mkd.dev", url_config(port, "/bad-uid", ca))
    st = refused(v1.create_namespaced_config_map, ns, {"metadata": {"name": "d"}})
    assert st["message"].endswith('received invalid webhook response: expected response.uid="'
                                  + hook.last("/bad-uid")["uid"] + '", got "not-the-uid"')


def test_service_client_config(api: client.ApiClient, ns: str, hooks: Any,
                               hook_server: tuple[Hook, int, str]) -> None:
    """A service reference reaches the address in the Service's kubesim.mkd.dev/webhook-address annotation,
    and the certificate is checked against <service>.<namespace>.svc."""
    ar, tag = hooks
    _hook, port, ca = hook_server
    v1 = client.CoreV1Api(api)
    try:
        v1.create_namespace({"metadata": {"name": HOOK_NS}})
    except client.ApiException as e:
        if e.status != 409:
            raise
    svc_ref = {"service": {"namespace": HOOK_NS, "name": "hooks", "path": "/mutate"}, "caBundle": ca}
    ar.create_mutating_webhook_configuration({"metadata": {"name": f"m-{tag}"}, "webhooks": [
        webhook("svc.kubesim.mkd.dev", svc_ref, ["configmaps"], ["CREATE"], namespaceSelector=ON)]})
    assert ar.read_mutating_webhook_configuration(f"m-{tag}").webhooks[0].client_config.service.port == 443
    st = refused(v1.create_namespaced_config_map, ns, {"metadata": {"name": "a"}})
    assert st["message"] == ('Internal error occurred: failed calling webhook "svc.kubesim.mkd.dev": failed to call '
                             'webhook: Post "https://hooks.hooks.svc:443/mutate?timeout=10s": service "hooks" not found')
    v1.create_namespaced_service(HOOK_NS, {"metadata": {"name": "hooks"}, "spec": {"ports": [{"port": 443}]}})
    try:
        st = refused(v1.create_namespaced_config_map, ns, {"metadata": {"name": "a"}})
        assert st["message"].endswith('no endpoints available for service "hooks"')
        v1.patch_namespaced_service("hooks", HOOK_NS, {"metadata": {"annotations": {
            "kubesim.mkd.dev/webhook-address": f"127.0.0.1:{port}"}}})
        cm = v1.create_namespaced_config_map(ns, {"metadata": {"name": "a"}})
        assert cm.metadata.labels == {"mutated-by": "hook"}
    finally:
        v1.delete_namespaced_service("hooks", HOOK_NS)


def test_mutating_webhook_on_a_custom_resource(api: client.ApiClient, ns: str, hooks: Any,
                                               hook_server: tuple[Hook, int, str]) -> None:
    """What the handover work needs: a webhook that sets managedBy on PyTorchJobs, for create and apply."""
    ar, tag = hooks
    hook, port, ca = hook_server
    install_crd(api, "pytorchjobs.kubeflow.org")
    ar.create_mutating_webhook_configuration({"metadata": {"name": f"m-{tag}"}, "webhooks": [
        webhook("managedby.kubesim.mkd.dev", url_config(port, "/managedby", ca), ["pytorchjobs"], ["CREATE"],
                group="kubeflow.org", version="*", namespaceSelector=ON)]})
    co = client.CustomObjectsApi(api)
    body = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"generateName": "pj-"},
            "spec": {"runPolicy": {"suspend": True}, "pytorchReplicaSpecs": {"Master": {"replicas": 1}}}}
    got = co.create_namespaced_custom_object("kubeflow.org", "v1", ns, "pytorchjobs", body)
    assert got["spec"]["runPolicy"]["managedBy"] == "kueue.x-k8s.io/multikueue"
    assert got["metadata"]["name"].startswith("pj-")
    req = hook.last("/managedby")
    assert req["kind"] == {"group": "kubeflow.org", "version": "v1", "kind": "PyTorchJob"}
    # Server-side apply creating the object goes through the webhook too.
    co.patch_namespaced_custom_object(
        "kubeflow.org", "v1", ns, "pytorchjobs", "applied",
        {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "applied"},
         "spec": {"runPolicy": {"suspend": True}}}, field_manager="test", _content_type="application/apply-patch+yaml")
    applied = co.get_namespaced_custom_object("kubeflow.org", "v1", ns, "pytorchjobs", "applied")  # 201 has no body here
    assert applied["spec"]["runPolicy"]["managedBy"] == "kueue.x-k8s.io/multikueue"
    # A rule naming the status subresource sees status writes, and only those.
    ar.create_validating_webhook_configuration({"metadata": {"name": f"v-{tag}"}, "webhooks": [
        webhook("status.kubesim.mkd.dev", url_config(port, "/deny-plain", ca), ["pytorchjobs/status"], ["UPDATE"],
                group="kubeflow.org", version="v1", namespaceSelector=ON)]})
    co.patch_namespaced_custom_object("kubeflow.org", "v1", ns, "pytorchjobs", "applied", {"metadata": {"labels": {
        "x": "y"}}})
    st = refused(co.patch_namespaced_custom_object_status, "kubeflow.org", "v1", ns, "pytorchjobs", "applied",
                 {"status": {"conditions": [{"type": "Created", "status": "True"}]}})
    assert st["message"] == 'admission webhook "status.kubesim.mkd.dev" denied the request without explanation'
    req = hook.last("/deny-plain")
    assert req["subResource"] == "status" and req["requestSubResource"] == "status"
    assert req["resource"] == {"group": "kubeflow.org", "version": "v1", "resource": "pytorchjobs"}


def test_webhook_configuration_validation(api: client.ApiClient, hooks: Any) -> None:
    _ar, tag = hooks
    body = {"metadata": {"name": f"bad-{tag}"}, "webhooks": [
        {"name": "short.name", "clientConfig": {"url": "http://127.0.0.1:1/x"},
         "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["CREATE"]}]}]}
    # The typed client refuses a body without the required fields before sending it; the dynamic one sends it.
    res = DynamicClient(api).resources.get(api_version="admissionregistration.k8s.io/v1",
                                           kind="ValidatingWebhookConfiguration")
    st = refused(res.create, body=body)
    assert st["code"] == 422 and st["reason"] == "Invalid"
    fields = {c["field"]: c["message"] for c in st["details"]["causes"]}
    assert fields["webhooks[0].name"] == ('Invalid value: "short.name": should be a domain with at least three '
                                          "segments separated by dots")
    assert fields["webhooks[0].sideEffects"] == "Required value: must specify one of None, NoneOnDryRun"
    assert fields["webhooks[0].admissionReviewVersions"] == "Required value: must specify one of v1, v1beta1"
    assert fields["webhooks[0].clientConfig.url"] == ('Invalid value: "http://127.0.0.1:1/x": \'https\' is the only '
                                                      "allowed URL scheme")


def test_mutating_webhooks_see_the_schema_defaults(api: client.ApiClient, ns: str, hooks: Any,
                                                   hook_server: tuple[Hook, int, str]) -> None:
    """A real server prunes and defaults a custom resource while decoding the request, before admission:
    TrainJob's CRD defaults spec.managedBy, so a webhook sees it filled in (and unknown fields gone)."""
    ar, tag = hooks
    hook, port, ca = hook_server
    install_crd(api, "trainjobs.trainer.kubeflow.org")
    ar.create_mutating_webhook_configuration({"metadata": {"name": f"d-{tag}"}, "webhooks": [
        webhook("defaults.kubesim.mkd.dev", url_config(port, "/observe", ca), ["trainjobs"], ["CREATE"],
                group="trainer.kubeflow.org", version="*", namespaceSelector=ON)]})
    co = client.CustomObjectsApi(api)
    body = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "defaulted"},
            "spec": {"runtimeRef": {"name": "torch-distributed"}}}
    co.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", ns, "trainjobs", body)
    seen = hook.last("/observe")["object"]
    assert seen["spec"]["managedBy"] == "trainer.kubeflow.org/trainjob-controller"
