"""Every request authenticated and authorized, as kube-apiserver with ``--authorization-mode=RBAC`` does:
ServiceAccount tokens from TokenRequest, RBAC's evaluation of Roles, ClusterRoles and their bindings, and
the real server's 401 and 403 bodies, word for word. On kubesim the cluster is started with
``ClusterSpec(authorize=True)``; with ``MKD_TEST_KUBECONFIG`` the same tests run against a real cluster
(whose kubeconfig user may create namespaces, ServiceAccounts, tokens and RBAC objects).
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

import kubesim
from tests.kubesim.conftest import REAL

pytestmark = pytest.mark.realcluster
RBAC = "rbac.authorization.k8s.io"


@pytest.fixture(scope="module")
def admin_kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if REAL:
        yield Path(REAL)
        return
    spec = kubesim.ClusterSpec("authz", [kubesim.NodeSpec("node-a")], authorize=True)
    with kubesim.serve([spec], tmp_path_factory.mktemp("authz")) as sim:
        yield sim.kubeconfig("authz")


@pytest.fixture(scope="module")
def admin(admin_kubeconfig: Path) -> Iterator[client.ApiClient]:
    c = config.new_client_from_config(str(admin_kubeconfig))
    yield c
    c.close()


def as_token(kubeconfig: Path, token: str) -> client.ApiClient:
    """A client for the same server that sends only ``token`` (no client certificate, no exec plugin)."""
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg, persist_config=False)
    cfg.cert_file = cfg.key_file = None
    cfg.api_key = {"authorization": f"Bearer {token}"} if token else {}
    cfg.api_key_prefix = {}
    cfg.refresh_api_key_hook = None
    return client.ApiClient(cfg)


@pytest.fixture
def ns(admin: client.ApiClient) -> Iterator[str]:
    name = f"authz-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(admin).create_namespace({"metadata": {"name": name}})
    yield name
    client.CoreV1Api(admin).delete_namespace(name)


@pytest.fixture
def robot(admin: client.ApiClient, admin_kubeconfig: Path, ns: str) -> Iterator[tuple[str, client.ApiClient]]:
    """A ServiceAccount ``robot`` in ``ns`` and a client with its TokenRequest token."""
    core = client.CoreV1Api(admin)
    core.create_namespaced_service_account(ns, {"metadata": {"name": "robot"}})
    answer = core.create_namespaced_service_account_token("robot", ns, {"spec": {"expirationSeconds": 3600}})
    api = as_token(admin_kubeconfig, answer.status.token)
    yield f"system:serviceaccount:{ns}:robot", api
    api.close()


def refusal(call: Callable[[], Any]) -> tuple[int, dict[str, Any]]:
    with pytest.raises(client.ApiException) as refused:
        call()
    return refused.value.status, json.loads(refused.value.body)


def bind(admin: client.ApiClient, ns: str | None, role: str, rules: list[dict[str, Any]], user: str,
         cluster_role: bool = False) -> None:
    """A Role (or ClusterRole) with ``rules`` bound to ``user`` in ``ns`` (or cluster-wide when ns is None)."""
    rbac = client.RbacAuthorizationV1Api(admin)
    subject = {"kind": "User", "name": user, "apiGroup": RBAC}
    if ns is None or cluster_role:
        rbac.create_cluster_role({"metadata": {"name": role}, "rules": rules})
    else:
        rbac.create_namespaced_role(ns, {"metadata": {"name": role}, "rules": rules})
    ref = {"apiGroup": RBAC, "kind": "ClusterRole" if ns is None or cluster_role else "Role", "name": role}
    if ns is None:
        rbac.create_cluster_role_binding({"metadata": {"name": role}, "roleRef": ref, "subjects": [subject]})
    else:
        rbac.create_namespaced_role_binding(ns, {"metadata": {"name": role}, "roleRef": ref, "subjects": [subject]})


def unbind_cluster(admin: client.ApiClient, role: str) -> None:
    rbac = client.RbacAuthorizationV1Api(admin)
    rbac.delete_cluster_role_binding(role)
    rbac.delete_cluster_role(role)


def test_a_service_account_without_bindings_is_refused_with_the_real_servers_words(
        robot: tuple[str, client.ApiClient], ns: str) -> None:
    user, api = robot
    core = client.CoreV1Api(api)
    code, body = refusal(lambda: core.list_namespaced_pod(ns))
    assert code == 403
    assert body == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": f'pods is forbidden: User "{user}" cannot list resource "pods" in API group "" '
                               f'in the namespace "{ns}"',
                    "reason": "Forbidden", "details": {"kind": "pods"}, "code": 403}
    _, body = refusal(lambda: core.read_namespaced_config_map("settings", ns))
    assert body["message"] == (f'configmaps "settings" is forbidden: User "{user}" cannot get resource "configmaps" '
                               f'in API group "" in the namespace "{ns}"')
    assert body["details"] == {"name": "settings", "kind": "configmaps"}
    batch = client.BatchV1Api(api)
    _, body = refusal(lambda: batch.patch_namespaced_job_status("j", ns, {"status": {}}))
    assert body["message"] == (f'jobs.batch "j" is forbidden: User "{user}" cannot patch resource "jobs/status" '
                               f'in API group "batch" in the namespace "{ns}"')
    assert body["details"] == {"name": "j", "group": "batch", "kind": "jobs"}
    _, body = refusal(lambda: client.RbacAuthorizationV1Api(api).list_cluster_role())
    assert body["message"] == (f'clusterroles.{RBAC} is forbidden: User "{user}" cannot list resource '
                               f'"clusterroles" in API group "{RBAC}" at the cluster scope')
    _, body = refusal(lambda: core.list_namespaced_pod(ns, watch=True, _preload_content=False))
    assert "cannot watch resource \"pods\"" in body["message"]
    answer = api.call_api(*api.param_serialize("GET", "/logs", auth_settings=["BearerToken"]))
    code, body = answer.status, json.loads(answer.read())
    assert (code, body["message"]) == (403, f'forbidden: User "{user}" cannot get path "/logs"')
    assert body["details"] == {}
    # discovery and the version are open to every authenticated user (the bootstrap policy)
    assert client.VersionApi(api).get_code().major
    assert client.CoreApi(api).get_api_versions().versions == ["v1"]


def test_an_unknown_token_is_401_and_no_token_is_the_anonymous_user(admin_kubeconfig: Path, ns: str) -> None:
    stranger = as_token(admin_kubeconfig, "not-a-token-anyone-issued")
    try:
        code, body = refusal(lambda: client.CoreV1Api(stranger).list_namespaced_pod(ns))
    finally:
        stranger.close()
    assert (code, body) == (401, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                  "message": "Unauthorized", "reason": "Unauthorized", "code": 401})
    anonymous = as_token(admin_kubeconfig, "")
    try:
        code, body = refusal(lambda: client.CoreV1Api(anonymous).list_namespaced_pod(ns))
    finally:
        anonymous.close()
    assert code == 403 and 'User "system:anonymous" cannot list resource "pods"' in body["message"]


def test_rules_match_verbs_groups_resources_subresources_and_names(
        admin: client.ApiClient, robot: tuple[str, client.ApiClient], ns: str) -> None:
    user, api = robot
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    client.CoreV1Api(admin).create_namespaced_config_map(ns, {"metadata": {"name": "mine"}})
    client.CoreV1Api(admin).create_namespaced_config_map(ns, {"metadata": {"name": "theirs"}})
    client.BatchV1Api(admin).create_namespaced_job(ns, {"metadata": {"name": "j"}, "spec": {
        "suspend": True, "template": {"spec": {"restartPolicy": "Never",
                                               "containers": [{"name": "c", "image": "busybox"}]}}}})
    bind(admin, ns, "robot", [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"], "resourceNames": ["mine"]},
        {"apiGroups": ["batch"], "resources": ["*/status"], "verbs": ["patch"]},
        {"apiGroups": ["*"], "resources": ["jobs"], "verbs": ["*"]}], user)

    def settled() -> None:  # a real server's RBAC cache follows the objects within moments
        deadline = time.monotonic() + 10
        while True:
            try:
                core.list_namespaced_pod(ns)
                return
            except client.ApiException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    settled()
    assert core.read_namespaced_config_map("mine", ns).metadata.name == "mine"
    assert refusal(lambda: core.read_namespaced_config_map("theirs", ns))[0] == 403
    assert refusal(lambda: core.list_namespaced_config_map(ns))[0] == 403  # a name-limited rule never lists
    assert batch.patch_namespaced_job_status("j", ns, {"metadata": {"labels": {"a": "b"}}}).metadata.name == "j"
    assert batch.read_namespaced_job("j", ns).metadata.name == "j"  # "*" verbs, "*" groups
    assert refusal(lambda: core.patch_namespaced_pod_status("p", ns, {}))[1]["message"].endswith(
        f'cannot patch resource "pods/status" in API group "" in the namespace "{ns}"')
    other = f"{ns}-other"
    client.CoreV1Api(admin).create_namespace({"metadata": {"name": other}})
    try:
        assert refusal(lambda: core.list_namespaced_pod(other))[0] == 403  # a RoleBinding stays in its namespace
    finally:
        client.CoreV1Api(admin).delete_namespace(other)


def test_a_cluster_role_binding_grants_everywhere_and_a_missing_role_is_named(
        admin: client.ApiClient, robot: tuple[str, client.ApiClient], ns: str) -> None:
    user, api = robot
    role = f"authz-{uuid.uuid4().hex[:6]}"
    bind(admin, None, role, [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list"]}], user)
    rbac = client.RbacAuthorizationV1Api(admin)
    ghost = f"{role}-ghost"
    rbac.create_cluster_role_binding({"metadata": {"name": ghost}, "subjects": [
        {"kind": "ServiceAccount", "name": "robot", "namespace": ns}],
        "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": ghost}})
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                assert client.CoreV1Api(api).list_namespace().items
                break
            except client.ApiException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        _, body = refusal(lambda: client.CoreV1Api(api).list_node())
        assert body["message"] == (f'nodes is forbidden: User "{user}" cannot list resource "nodes" in API group "" '
                                   f'at the cluster scope: RBAC: clusterrole.{RBAC} "{ghost}" not found')
    finally:
        rbac.delete_cluster_role_binding(ghost)
        unbind_cluster(admin, role)


def bind_aggregated(rbac: client.RbacAuthorizationV1Api, ns: str, user: str, tag: str) -> None:
    """A ClusterRole ``whole-<tag>`` aggregating the ClusterRoles labelled ``aggregate-<tag>``, bound to ``user``
    in ``ns``."""
    rbac.create_cluster_role({"metadata": {"name": f"whole-{tag}"}, "rules": [], "aggregationRule": {
        "clusterRoleSelectors": [{"matchLabels": {f"aggregate-{tag}": "true"}}]}})
    rbac.create_namespaced_role_binding(ns, {"metadata": {"name": "whole"}, "subjects": [
        {"kind": "User", "name": user, "apiGroup": RBAC}],
        "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": f"whole-{tag}"}})


def test_an_aggregated_cluster_role_holds_the_rules_of_the_roles_it_selects(
        admin: client.ApiClient, robot: tuple[str, client.ApiClient], ns: str) -> None:
    user, api = robot
    tag = uuid.uuid4().hex[:6]
    rbac = client.RbacAuthorizationV1Api(admin)
    rbac.create_cluster_role({"metadata": {"name": f"part-{tag}", "labels": {f"aggregate-{tag}": "true"}},
                              "rules": [{"apiGroups": [""], "resources": ["services"], "verbs": ["list"]}]})
    bind_aggregated(rbac, ns, user, tag)
    try:
        deadline = time.monotonic() + 10  # on a real server the aggregation controller fills the rules
        while True:
            try:
                client.CoreV1Api(api).list_namespaced_service(ns)
                break
            except client.ApiException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        assert refusal(lambda: client.CoreV1Api(api).list_namespaced_pod(ns))[0] == 403
    finally:
        rbac.delete_cluster_role(f"whole-{tag}")
        rbac.delete_cluster_role(f"part-{tag}")


def until(check: Callable[[], bool], what: str) -> None:
    """A real server's RBAC follows its objects within moments (informers): poll ``check`` for up to 10 s."""
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, f"RBAC never came to {what}"
        time.sleep(0.2)


def test_a_permission_taken_back_is_refused_again(
        admin: client.ApiClient, robot: tuple[str, client.ApiClient], ns: str) -> None:
    """Every change of a Role, a binding or an aggregated ClusterRole's parts is followed: an answer given before
    (allowed or refused) is not kept past the change that alters it."""
    user, api = robot
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(admin)

    def allowed(call: Callable[[], Any]) -> Callable[[], bool]:
        def check() -> bool:
            try:
                call()
                return True
            except client.ApiException as e:
                assert e.status == 403
                return False
        return check
    pods, services = allowed(lambda: core.list_namespaced_pod(ns)), allowed(lambda: core.list_namespaced_service(ns))
    assert not pods()
    bind(admin, ns, "robot", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}], user)
    until(pods, "allow listing pods once bound")
    rbac.patch_namespaced_role("robot", ns, {"rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]})
    until(lambda: not pods(), "refuse listing pods once the Role no longer has the verb")
    rbac.patch_namespaced_role("robot", ns, {"rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]})
    until(pods, "allow listing pods once the Role has the verb again")
    rbac.delete_namespaced_role_binding("robot", ns)
    until(lambda: not pods(), "refuse listing pods once the RoleBinding is gone")
    tag = uuid.uuid4().hex[:6]
    bind_aggregated(rbac, ns, user, tag)
    try:
        assert not services()
        rbac.create_cluster_role({"metadata": {"name": f"part-{tag}", "labels": {f"aggregate-{tag}": "true"}},
                                  "rules": [{"apiGroups": [""], "resources": ["services"], "verbs": ["list"]}]})
        until(services, "allow listing services once a selected part grants it")
        rbac.patch_cluster_role(f"part-{tag}", {"metadata": {"labels": {f"aggregate-{tag}": None}}})
        until(lambda: not services(), "refuse listing services once the part is no longer selected")
    finally:
        rbac.delete_cluster_role(f"whole-{tag}")
        with contextlib.suppress(client.ApiException):
            rbac.delete_cluster_role(f"part-{tag}")


def test_a_token_request_is_refused_below_ten_minutes_and_dies_with_its_service_account(
        admin: client.ApiClient, admin_kubeconfig: Path, ns: str) -> None:
    core = client.CoreV1Api(admin)
    core.create_namespaced_service_account(ns, {"metadata": {"name": "short"}})
    code, body = refusal(lambda: core.create_namespaced_service_account_token(
        "short", ns, {"spec": {"expirationSeconds": 60}}))
    assert code == 422 and body["details"]["causes"][0]["field"] == "spec.expirationSeconds"
    assert refusal(lambda: core.create_namespaced_service_account_token("nobody", ns, {"spec": {}}))[0] == 404
    answer = core.create_namespaced_service_account_token("short", ns, {"spec": {}})
    assert answer.status.token and answer.status.expiration_timestamp
    review = client.AuthenticationV1Api(admin).create_token_review({"spec": {"token": answer.status.token}}).status
    assert review.authenticated and review.user.username == f"system:serviceaccount:{ns}:short"
    assert {"system:serviceaccounts", f"system:serviceaccounts:{ns}", "system:authenticated"} <= set(review.user.groups)
    core.delete_namespaced_service_account("short", ns)
    api = as_token(admin_kubeconfig, answer.status.token)
    try:
        deadline = time.monotonic() + 10
        while True:
            code, _ = refusal(lambda: client.CoreV1Api(api).list_namespaced_pod(ns))
            if code == 401 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert code == 401
    finally:
        api.close()


@pytest.mark.kubesim_only("kubesim's authenticator itself")
def test_each_401_is_an_error_of_its_own_that_holds_no_earlier_request() -> None:
    """A refused token raises a fresh error each time: one error object raised again and again gathers every
    refused request's frames in its traceback (and keeps them, with their requests, alive)."""
    from kubesim.authz import Access
    from kubesim.errors import ApiError

    access = Access(store=None)
    depths = []
    for _ in range(3):
        with pytest.raises(ApiError) as caught:
            access.user_of("Bearer not-a-token-anyone-issued")
        assert caught.value.status() == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                         "message": "Unauthorized", "reason": "Unauthorized", "code": 401}
        tb, depth = caught.value.__traceback__, 0
        while tb is not None:
            tb, depth = tb.tb_next, depth + 1
        depths.append(depth)
    assert depths[0] == depths[1] == depths[2]
