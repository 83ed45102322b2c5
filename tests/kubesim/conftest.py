"""Fixtures for the kubesim scenario suite: a simulated cluster, or a real one named by MKD_TEST_KUBECONFIG.

``sim`` starts one kubesim cluster for a test module (reusable by other suites). ``api`` yields an
official-client ``ApiClient`` for kubesim, or for the real cluster when ``MKD_TEST_KUBECONFIG`` is set;
``ns`` is a fresh namespace per test so tests never see each other's objects. Against a real cluster
only ``realcluster`` tests run; ``kubesim_only("why")`` / ``needs_running_pods("why")`` ones skip saying
why (see tests/realcluster.py).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

import kubesim
from tests.realcluster import skip_on_real_clusters

REAL = os.environ.get("MKD_TEST_KUBECONFIG")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if REAL:
        skip_on_real_clusters(items, "kubesim", "MKD_TEST_KUBECONFIG")


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kubesim.Sim]:
    """One simulated cluster ``sim`` with two nodes (one with GPUs), alive for the test module."""
    specs = [kubesim.ClusterSpec("sim", [kubesim.NodeSpec("node-a", extended={"nvidia.com/gpu": "4"},
                                                          labels={"pool": "gpu"}),
                                         kubesim.NodeSpec("node-b", cpu="4", memory="16Gi")])]
    with kubesim.serve(specs, tmp_path_factory.mktemp("kubesim")) as s:
        yield s


@pytest.fixture(scope="module")
def kubeconfig(request: pytest.FixtureRequest) -> Path:
    if REAL:
        return Path(REAL)
    s: kubesim.Sim = request.getfixturevalue("sim")
    return s.kubeconfig("sim")


@pytest.fixture(scope="module")
def api(kubeconfig: Path) -> Iterator[client.ApiClient]:
    c = config.new_client_from_config(str(kubeconfig))
    yield c
    c.close()


@pytest.fixture
def sim_only(request: pytest.FixtureRequest) -> kubesim.Sim:
    if REAL:
        pytest.skip("needs kubesim (faults / restarts)")
    s: kubesim.Sim = request.getfixturevalue("sim")
    return s


@pytest.fixture
def ns(api: client.ApiClient) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    v1 = client.CoreV1Api(api)
    v1.create_namespace({"metadata": {"name": name}})
    yield name
    try:
        v1.delete_namespace(name)
    except client.ApiException as e:
        if e.status != 404:
            raise


WIDGET_GROUP = "kubesim.mkd.dev"


@pytest.fixture(scope="module")
def crd_group(api: client.ApiClient) -> Iterator[str]:
    """A namespaced ``widgets`` CRD (v1 storage + v1beta1 served, status subresource) for the module."""
    from kubesim.testing import eventually

    ext = client.ApiextensionsV1Api(api)
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    body = {"metadata": {"name": f"widgets.{WIDGET_GROUP}"}, "spec": {
        "group": WIDGET_GROUP, "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
        "versions": [
            {"name": "v1", "served": True, "storage": True, "schema": schema,
             "subresources": {"status": {}}},
            {"name": "v1beta1", "served": True, "storage": False, "schema": schema,
             "subresources": {"status": {}}},
        ]}}
    try:
        ext.create_custom_resource_definition(body)
    except client.ApiException as e:
        if e.status != 409:
            raise

    def established() -> bool:
        crd = ext.read_custom_resource_definition(f"widgets.{WIDGET_GROUP}")
        return any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or []))

    eventually(established, what="CRD Established")
    yield WIDGET_GROUP
    with contextlib.suppress(client.ApiException):
        ext.delete_custom_resource_definition(f"widgets.{WIDGET_GROUP}")
