"""TokenReview and SubjectAccessReview (kubesim/reviews.py) through the official client: static tokens,
RBAC over the stored Roles and bindings, the reasons and refusals the real server gives."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client

import kubesim


@pytest.fixture
def bindings(api: client.ApiClient, ns: str) -> Iterator[str]:
    """alice may drain clusters.mkd.dev and get batch jobs everywhere; bob may get jobs in ``ns`` only
    (RoleBinding to a ClusterRole); the group ``readers`` may get pods/log; eve has no binding. Yields the tag of
    the ClusterRoles' names."""
    tag = uuid.uuid4().hex[:6]
    rbac = client.RbacAuthorizationV1Api(api)
    admin, reader = f"drainer-{tag}", f"reader-{tag}"
    rbac.create_cluster_role({"metadata": {"name": admin}, "rules": [
        {"apiGroups": ["mkd.dev"], "resources": ["clusters"], "verbs": ["cordon", "drain"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list"]}]})
    rbac.create_cluster_role({"metadata": {"name": reader}, "rules": [
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["*/log"], "verbs": ["get"], "resourceNames": ["p1"]}]})
    rbac.create_cluster_role_binding({"metadata": {"name": admin}, "roleRef": {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": admin},
        "subjects": [{"kind": "User", "name": "alice", "apiGroup": "rbac.authorization.k8s.io"}]})
    rbac.create_namespaced_role_binding(ns, {"metadata": {"name": "read"}, "roleRef": {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": reader},
        "subjects": [{"kind": "User", "name": "bob", "apiGroup": "rbac.authorization.k8s.io"},
                     {"kind": "Group", "name": "readers", "apiGroup": "rbac.authorization.k8s.io"}]})
    yield tag
    rbac.delete_cluster_role_binding(admin)
    rbac.delete_cluster_role(admin)
    rbac.delete_cluster_role(reader)


@pytest.fixture
def users(sim_only: kubesim.Sim) -> dict[str, str]:
    """Static bearer tokens (kube-apiserver's token file) for alice, bob, eve and carol (group ``readers``)."""
    tag = uuid.uuid4().hex[:6]
    reviews = sim_only.cluster("sim").server.reviews
    tokens = {name: f"{name}-{tag}" for name in ("alice", "bob", "eve", "carol")}
    reviews.add_token(tokens["alice"], "alice")
    reviews.add_token(tokens["bob"], "bob")
    reviews.add_token(tokens["eve"], "eve")
    reviews.add_token(tokens["carol"], "carol", groups=["readers"])
    return tokens


def review(api: client.ApiClient, token: str) -> client.V1TokenReviewStatus:
    return client.AuthenticationV1Api(api).create_token_review({"spec": {"token": token}}).status


def can(api: client.ApiClient, user: str, verb: str, group: str, resource: str, namespace: str = "",
        name: str = "", subresource: str = "", groups: list[str] | None = None) -> client.V1SubjectAccessReviewStatus:
    attrs = {"verb": verb, "group": group, "resource": resource, "namespace": namespace, "name": name,
             "subresource": subresource}
    body = {"spec": {"user": user, "groups": groups or [], "resourceAttributes": attrs}}
    return client.AuthorizationV1Api(api).create_subject_access_review(body).status


@pytest.mark.kubesim_only("static tokens are kube-apiserver's --token-auth-file, which a test cannot extend on a "
                           "real cluster")
def test_token_review_names_the_user(api: client.ApiClient, users: dict[str, str]) -> None:
    status = review(api, users["carol"])
    assert status.authenticated is True
    assert status.user.username == "carol" and status.user.groups == ["readers", "system:authenticated"]
    unknown = review(api, "no-such-token")
    assert not unknown.authenticated and not unknown.user.username
    admin = review(api, "kubesim-sim")  # the kubeconfig's own token
    assert admin.user.username == "kubesim-admin" and "system:masters" in admin.user.groups


@pytest.mark.realcluster
def test_token_review_of_a_service_account_token(api: client.ApiClient, ns: str) -> None:
    """pkg/serviceaccount: a TokenRequest's token reviews as system:serviceaccount:<ns>:<name> with the
    service account groups; an unknown token is not authenticated."""
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_service_account(ns, {"metadata": {"name": "robot"}})
    token = v1.create_namespaced_service_account_token("robot", ns, {"spec": {"expirationSeconds": 3600}})
    status = review(api, token.status.token)
    assert status.authenticated is True
    assert status.user.username == f"system:serviceaccount:{ns}:robot"
    assert status.user.groups == ["system:serviceaccounts", f"system:serviceaccounts:{ns}", "system:authenticated"]
    assert not review(api, "no-such-token").authenticated


@pytest.mark.realcluster
def test_access_review_follows_rbac(api: client.ApiClient, bindings: str, ns: str) -> None:
    drain = can(api, "alice", "drain", "mkd.dev", "clusters", name="worker-1")
    assert drain.allowed and drain.reason.startswith('RBAC: allowed by ClusterRoleBinding "drainer-')
    assert not can(api, "alice", "uncordon", "mkd.dev", "clusters").allowed  # verb not granted
    assert can(api, "alice", "get", "batch", "jobs", namespace=ns).allowed
    bob = can(api, "bob", "get", "batch", "jobs", namespace=ns)
    assert bob.allowed and f'RoleBinding "read/{ns}" of ClusterRole "reader-' in bob.reason
    assert not can(api, "bob", "get", "batch", "jobs").allowed  # all namespaces: the RoleBinding does not reach
    assert not can(api, "bob", "drain", "mkd.dev", "clusters").allowed
    assert not can(api, "eve", "get", "batch", "jobs", namespace=ns).allowed
    assert can(api, "carol", "get", "", "pods", namespace=ns, name="p1", subresource="log",
               groups=["readers"]).allowed  # */log, by group, resourceNames
    assert not can(api, "carol", "get", "", "pods", namespace=ns, name="p2", subresource="log",
                   groups=["readers"]).allowed
    assert can(api, "root", "delete", "", "nodes", groups=["system:masters"]).allowed


@pytest.mark.realcluster
def test_access_review_is_validated_and_create_only(api: client.ApiClient) -> None:
    authz = client.AuthorizationV1Api(api)
    with pytest.raises(client.ApiException) as err:
        authz.create_subject_access_review({"spec": {"resourceAttributes": {"verb": "get"}}})
    assert err.value.status == 422 and "at least one of user or group must be specified" in err.value.body
    with pytest.raises(client.ApiException) as err:
        authz.create_subject_access_review({"spec": {"user": "x"}})
    assert err.value.status == 422 and "exactly one of nonResourceAttributes or resourceAttributes" in err.value.body
    # Create-only (apiserver endpoints/installer.go registers no list verb): 405.
    method, url, headers, body, _ = api.param_serialize(
        "GET", "/apis/authorization.k8s.io/v1/subjectaccessreviews", header_params={"Accept": "application/json"},
        auth_settings=["BearerToken"])
    resp = api.call_api(method, url, header_params=headers, body=body)
    resp.read()
    assert resp.status == 405 and json.loads(resp.data)["reason"] == "MethodNotAllowed"
