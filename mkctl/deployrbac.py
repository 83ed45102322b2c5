"""The RBAC of ``deploy/`` applied to a cluster, and kubeconfigs holding a ServiceAccount token bound to it.

The demo and the end-to-end tests run the dispatcher, the agents and the fencers as ``deploy/`` runs them
in a cluster: each with a token of its ServiceAccount (TokenRequest, as a Pod's projected token), bound
to the roles the service's manifest ships (``deploy/manager/dispatcher.yaml``, ``deploy/worker/agent.yaml``,
``deploy/worker/fencer.yaml``), never with the admin's credentials; so a rule missing from ``deploy/``
fails them. Only the RBAC objects of a manifest are applied (Namespaces, ServiceAccounts, Roles,
ClusterRoles and their bindings); a RoleBinding named ``*-workloads`` is the manifest's one-per-allowed-
namespace template: it is copied into each namespace jobs may land in, or, when the agent allows every
namespace, made a ClusterRoleBinding (what the manifest's comment tells an operator to do).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from federation.errors import AlreadyExists
from federation.kinds import manifests
from federation.kinds.base import JobKind
from federation.kube import NAMESPACES, SERVICEACCOUNTS, Kube, Resource

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
"""The source tree's deploy/ (absent from an installed wheel: then services run with the given kubeconfig)."""
RBAC = "rbac.authorization.k8s.io"
KINDS: dict[str, Resource] = {
    "Namespace": NAMESPACES,
    "ServiceAccount": SERVICEACCOUNTS,
    "ClusterRole": Resource(RBAC, "v1", "clusterroles", "ClusterRole", namespaced=False),
    "ClusterRoleBinding": Resource(RBAC, "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False),
    "Role": Resource(RBAC, "v1", "roles", "Role"),
    "RoleBinding": Resource(RBAC, "v1", "rolebindings", "RoleBinding"),
}
TOKEN_SECONDS = 24 * 3600
"""Lifetime asked for each service's token: longer than any demo or test run (a server may cap it)."""


@dataclass(frozen=True)
class Service:
    manifest: str
    """Relative to deploy/."""
    namespace: str
    account: str


SERVICES = {
    "dispatcher": Service("manager/dispatcher.yaml", "mkd-system", "mkd-dispatcher"),
    "agent": Service("worker/agent.yaml", "mkd-system", "mkd-agent"),
    "fencer": Service("worker/fencer.yaml", "mkd-system", "mkd-fencer"),
}


def available(deploy: Path = DEPLOY) -> bool:
    return all((deploy / s.manifest).is_file() for s in SERVICES.values())


def documents(service: str, namespaces: list[str] | None = None, *, deploy: Path = DEPLOY) -> list[dict[str, Any]]:
    """The RBAC objects of ``service``'s manifest; its ``*-workloads`` RoleBinding is bound in each of
    ``namespaces`` (where placed jobs land), or cluster-wide when that list is empty."""
    return _bound(service, (deploy / SERVICES[service].manifest).read_text(), namespaces)


def declared_documents(service: str, kinds: Sequence[JobKind], namespaces: list[str] | None = None
                       ) -> list[dict[str, Any]]:
    """What ``mkctl kinds --manifests`` writes for declared ``kinds``, the part bound to ``service``'s account,
    bound like :func:`documents` (the agent's writes in each of ``namespaces``, or cluster-wide)."""
    rendered = manifests.declared_manifests(kinds, ["mkd-jobs"])
    text = rendered["manager" if service == "dispatcher" else "worker"]
    account = SERVICES[service].account
    docs = [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]
    names = {d["roleRef"]["name"] for d in docs if d.get("roleRef") and d["subjects"][0]["name"] == account}
    mine = [d for d in docs if d["metadata"]["name"] in names]
    return _bound(service, yaml.safe_dump_all(mine), namespaces)


def _bound(service: str, text: str, namespaces: list[str] | None) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(text) if isinstance(d, dict) and d.get("kind") in KINDS]
    out: list[dict[str, Any]] = []
    for doc in docs:
        name = str(doc["metadata"]["name"])
        if doc["kind"] == "RoleBinding" and name.endswith("-workloads"):
            if not namespaces:
                binding = copy.deepcopy(doc)
                binding["kind"] = "ClusterRoleBinding"
                del binding["metadata"]["namespace"]
                out.append(binding)
            for ns in namespaces or []:
                binding = copy.deepcopy(doc)
                binding["metadata"]["namespace"] = ns
                out.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
                out.append(binding)
            continue
        if doc["kind"] == "Namespace" and namespaces is not None and name != SERVICES[service].namespace:
            continue  # the manifest's jobs namespace: the caller said where jobs land
        out.append(doc)
    return out


async def apply(kube: Kube, docs: list[dict[str, Any]]) -> list[tuple[Resource, str | None, str]]:
    """Create each object, or replace it with the manifest's version when it exists (Namespaces are kept);
    returns what was created (for a caller that removes it again)."""
    created: list[tuple[Resource, str | None, str]] = []
    for doc in docs:
        res = KINDS[doc["kind"]]
        meta = doc["metadata"]
        ns = meta.get("namespace") if res.namespaced else None
        try:
            await kube.create(res, doc, ns)
            created.append((res, ns, str(meta["name"])))
        except AlreadyExists:
            if doc["kind"] in ("Namespace", "ServiceAccount"):
                continue
            current = await kube.get(res, str(meta["name"]), ns)
            body = copy.deepcopy(doc)
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            if doc["kind"].endswith("Binding") and current.get("roleRef") != doc.get("roleRef"):
                await kube.delete(res, str(meta["name"]), ns)  # a binding's roleRef cannot change
                await kube.create(res, doc, ns)
            else:
                await kube.replace(res, body, ns)
    return created


def kubeconfig_with_token(admin: Path, token: str, user: str, out: Path) -> Path:
    """``admin``'s kubeconfig (its current context's cluster) with ``token`` as the only credential."""
    cfg = yaml.safe_load(admin.read_text())
    context = next(c for c in cfg["contexts"] if c["name"] == cfg["current-context"])["context"]
    cluster = next(c for c in cfg["clusters"] if c["name"] == context["cluster"])
    doc = {"apiVersion": "v1", "kind": "Config", "preferences": {}, "clusters": [cluster],
           "users": [{"name": user, "user": {"token": token}}],
           "contexts": [{"name": user, "context": {"cluster": cluster["name"], "user": user,
                                                    "namespace": context.get("namespace", "default")}}],
           "current-context": user}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    out.chmod(0o600)
    return out


async def service_kubeconfig(kube: Kube, admin: Path, service: str, out: Path) -> Path:
    """A kubeconfig for ``service`` (its ServiceAccount must exist: :func:`apply` its documents first)."""
    s = SERVICES[service]
    token = await kube.token(s.namespace, s.account, seconds=TOKEN_SECONDS)
    return kubeconfig_with_token(admin, token, s.account, out)
