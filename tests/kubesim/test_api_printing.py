"""Server-side printing: ``Accept: application/json;as=Table;g=meta.k8s.io;v=v1`` (what ``kubectl get`` sends)
returns a meta.k8s.io Table with a CRD's additionalPrinterColumns, or a built-in kind's usual columns."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from federation.kinds.crds import load_crds
from kubesim.testing import eventually, pod_body

pytestmark = pytest.mark.realcluster

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io," \
        "application/json"


def get_table(api: client.ApiClient, path: str, **query: str) -> dict[str, Any]:
    method, url, headers, body, _ = api.param_serialize("GET", path, query_params=list(query.items()),
                                                        header_params={"Accept": TABLE},
                                                        auth_settings=["BearerToken"])
    resp = api.call_api(method, url, header_params=headers, body=body)
    resp.read()
    assert resp.status == 200, resp.data
    out: dict[str, Any] = json.loads(resp.data)
    return out


def columns(table: dict[str, Any]) -> list[str]:
    return [c["name"] for c in table["columnDefinitions"]]


def rows(table: dict[str, Any]) -> dict[str, list[Any]]:
    return {r["cells"][0]: r["cells"] for r in table["rows"]}


@pytest.fixture(scope="module")
def pytorchjobs(api: client.ApiClient) -> client.CustomObjectsApi:
    ext = client.ApiextensionsV1Api(api)
    co = client.CustomObjectsApi(api)
    crd = next(c for c in load_crds() if c["metadata"]["name"] == "pytorchjobs.kubeflow.org")
    try:
        ext.create_custom_resource_definition(crd)
    except client.ApiException as e:
        if e.status != 409:
            raise

    def served() -> bool:
        try:
            co.list_namespaced_custom_object("kubeflow.org", "v1", "default", "pytorchjobs")
        except client.ApiException as e:
            if e.status in (404, 429, 503):
                return False
            raise
        return True

    eventually(served, timeout=30, what="pytorchjobs served")
    return co


def test_crd_printer_columns_show_the_last_condition_as_state(api: client.ApiClient,
                                                             pytorchjobs: client.CustomObjectsApi, ns: str) -> None:
    body = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "pt"},
            "spec": {"pytorchReplicaSpecs": {}}}
    pytorchjobs.create_namespaced_custom_object("kubeflow.org", "v1", ns, "pytorchjobs", body)
    pytorchjobs.patch_namespaced_custom_object_status("kubeflow.org", "v1", ns, "pytorchjobs", "pt", {"status": {
        "conditions": [{"type": "Created", "status": "True"}, {"type": "Running", "status": "True"}]}})
    table = get_table(api, f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs")
    assert table["kind"] == "Table" and table["apiVersion"] == "meta.k8s.io/v1"
    assert columns(table) == ["Name", "State", "Age"]
    name_col, state_col, age_col = table["columnDefinitions"]
    assert name_col["format"] == "name" and state_col["type"] == "string" and age_col["type"] == "date"
    _, state, age = rows(table)["pt"]
    assert state == "Running"
    assert isinstance(age, str) and age.endswith(("s", "m"))
    obj = table["rows"][0]["object"]
    assert obj["kind"] == "PartialObjectMetadata" and obj["metadata"]["name"] == "pt"
    # One object, and an object without status: the cell is null.
    pytorchjobs.create_namespaced_custom_object("kubeflow.org", "v1", ns, "pytorchjobs",
                                                {**body, "metadata": {"name": "fresh"}})
    single = get_table(api, f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs/fresh")
    assert [r["cells"][:2] for r in single["rows"]] == [["fresh", None]]


def test_builtin_pod_job_service_and_configmap_columns(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_pod(ns, pod_body("waiting", schedulerName="kubesim-nobody"))
    pods = get_table(api, f"/api/v1/namespaces/{ns}/pods")
    assert columns(pods)[:5] == ["Name", "Ready", "Status", "Restarts", "Age"]
    assert "Node" in columns(pods) and "IP" in columns(pods)
    assert rows(pods)["waiting"][1:4] == ["0/1", "Pending", "0"]
    client.BatchV1Api(api).create_namespaced_job(ns, {"metadata": {"name": "j"}, "spec": {
        "suspend": True, "completions": 3, "template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox:1.36"}]}}}})

    def suspended() -> Any:
        row = rows(get_table(api, f"/apis/batch/v1/namespaces/{ns}/jobs"))["j"]
        return row if row[1] == "Suspended" else None

    row = eventually(suspended, timeout=30, what="the Job printed as Suspended")
    assert row[2] == "0/3"
    jobs = get_table(api, f"/apis/batch/v1/namespaces/{ns}/jobs")
    assert columns(jobs)[:5] == ["Name", "Status", "Completions", "Duration", "Age"]
    v1.create_namespaced_service(ns, {"metadata": {"name": "svc"}, "spec": {"ports": [{"port": 80}]}})
    svc = get_table(api, f"/api/v1/namespaces/{ns}/services")
    assert columns(svc)[:6] == ["Name", "Type", "Cluster-IP", "External-IP", "Port(s)", "Age"]
    assert rows(svc)["svc"][1] == "ClusterIP" and rows(svc)["svc"][3:5] == ["<none>", "80/TCP"]
    v1.create_namespaced_config_map(ns, {"metadata": {"name": "cm"}, "data": {"a": "1", "b": "2"}})
    cms = get_table(api, f"/api/v1/namespaces/{ns}/configmaps")
    assert columns(cms) == ["Name", "Data", "Age"] and rows(cms)["cm"][1] == 2
    nss = get_table(api, f"/api/v1/namespaces/{ns}")
    assert columns(nss) == ["Name", "Status", "Age"] and rows(nss)[ns][1] == "Active"


def test_include_object_none_and_object(api: client.ApiClient, ns: str) -> None:
    client.CoreV1Api(api).create_namespaced_config_map(ns, {"metadata": {"name": "cm"}, "data": {"a": "1"}})
    bare = get_table(api, f"/api/v1/namespaces/{ns}/configmaps/cm", includeObject="None")
    # meta/v1 TableRow.object is a RawExtension: a struct, so omitempty keeps it, and empty it marshals as null.
    assert "object" in bare["rows"][0] and bare["rows"][0]["object"] is None
    full = get_table(api, f"/api/v1/namespaces/{ns}/configmaps/cm", includeObject="Object")
    assert full["rows"][0]["object"]["data"] == {"a": "1"}


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_kubectl_get_prints_the_crd_columns(api: client.ApiClient, pytorchjobs: client.CustomObjectsApi,
                                            kubeconfig: Path, ns: str, tmp_path: Path) -> None:
    pytorchjobs.create_namespaced_custom_object("kubeflow.org", "v1", ns, "pytorchjobs", {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "shown"},
        "spec": {"pytorchReplicaSpecs": {}}})
    pytorchjobs.patch_namespaced_custom_object_status("kubeflow.org", "v1", ns, "pytorchjobs", "shown", {
        "status": {"conditions": [{"type": "Created", "status": "True"}]}})
    out = subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), "get", "pytorchjobs", "-A"],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "KUBECACHEDIR": str(tmp_path / "cache")})
    assert out.returncode == 0, out.stderr
    lines = [line.split() for line in out.stdout.splitlines()]
    assert lines[0] == ["NAMESPACE", "NAME", "STATE", "AGE"]
    assert [ns, "shown", "Created"] in [line[:3] for line in lines[1:]]


def test_watch_as_table_sends_one_row_tables(api: client.ApiClient, ns: str) -> None:
    """``kubectl get -w``: the watch events of an as=Table request carry Tables, one row each."""
    v1 = client.CoreV1Api(api)
    rv = v1.list_namespaced_config_map(ns).metadata.resource_version
    v1.create_namespaced_config_map(ns, {"metadata": {"name": "watched"}, "data": {"k": "v"}})
    method, url, headers, body, _ = api.param_serialize(
        "GET", f"/api/v1/namespaces/{ns}/configmaps",
        query_params=[("watch", "true"), ("resourceVersion", rv), ("timeoutSeconds", "5")],
        header_params={"Accept": TABLE}, auth_settings=["BearerToken"])
    resp = api.call_api(method, url, header_params=headers, body=body, _request_timeout=30)
    first = None
    for raw_line in resp.response.stream(amt=None):
        for part in raw_line.splitlines():
            if part.strip():
                event = json.loads(part)
                if event["object"].get("kind") == "Table" and event["object"]["rows"] and \
                        event["object"]["rows"][0]["cells"][0] == "watched":
                    first = event
                    break
        if first:
            break
    resp.response.release_conn()
    assert first is not None and first["type"] == "ADDED"
    assert columns(first["object"]) == ["Name", "Data", "Age"]
    assert first["object"]["rows"][0]["cells"][1] == 1
