"""Who may read and who may act: bearer tokens checked by the manager cluster, so RBAC decides.
"""

from __future__ import annotations

import hmac
import time
from dataclasses import dataclass, field
from typing import Any

from federation.errors import FederationError

CACHE_SECONDS = 10.0
STATIC_USER = "mkd:static-token"


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    static: bool = False


@dataclass(frozen=True)
class Access:
    """One SubjectAccessReview question: verb on group/resource[/name] in namespace ("" = all)."""

    verb: str
    group: str
    resource: str
    namespace: str = ""
    name: str = ""
    subresource: str = ""

    def describe(self) -> str:
        plural = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        what = f"{plural}.{self.group}" if self.group else plural
        where = f" in namespace {self.namespace}" if self.namespace else " (all namespaces)"
        return f"{self.verb} {what}{'/' + self.name if self.name else ''}{where}"


def read_access(namespace: str = "") -> Access:
    return Access("get", "batch", "jobs", namespace)


def pods_access(namespace: str) -> Access:
    """Listing a Job's pods and their Events: what ``kubectl get pods`` would need were they local."""
    return Access("list", "", "pods", namespace)


def log_access(namespace: str) -> Access:
    """Reading a container's log: what ``kubectl logs`` would need were the pods local."""
    return Access("get", "", "pods", namespace, subresource="log")


def action_access(verb: str, resource: str, name: str, namespace: str = "") -> Access:
    return Access(verb, "mkd.dev", resource, namespace, name)


class AuthError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Authenticator:
    """Checks tokens against ``kube`` (the manager cluster; None: only the static token works).

    A request's token (``Authorization: Bearer …``, or the ``mkd_token`` cookie the dashboard sets) is
    sent to the manager cluster's TokenReview; the user it names is then checked with a
    SubjectAccessReview: reading needs ``get`` on ``jobs`` (group ``batch``) in the namespace concerned
    (all namespaces for federation-wide views); an action needs the action's verb on an mkd resource
    (``cordon``/``uncordon``/``drain`` on ``clusters.mkd.dev``, ``requeue``/``evict``/``pin`` on
    ``workloads.mkd.dev``), so a ClusterRole such as::

        rules: [{apiGroups: [mkd.dev], resources: [clusters], verbs: [cordon, uncordon, drain]}]

    is what lets someone drain a cluster. A static token (``api_token``, for the demo and break-glass)
    is accepted for everything without asking the cluster. Answers are cached for ``CACHE_SECONDS``
    per token and per question, as kube-apiserver's webhook authorizer caches them.
    """

    kube: Any = None
    static_token: str | None = None
    token_review: bool = True
    _users: dict[str, tuple[float, User | None]] = field(default_factory=dict)
    _decisions: dict[tuple[str, Access], tuple[float, bool]] = field(default_factory=dict)

    async def user(self, token: str | None) -> User:
        if not token:
            raise AuthError(401, "no bearer token: send `Authorization: Bearer <token>` (mkctl --token)")
        if self.static_token and hmac.compare_digest(token.encode(), self.static_token.encode()):
            return User(STATIC_USER, ("system:authenticated",), static=True)
        if self.kube is None or not self.token_review:
            raise AuthError(401, "token not accepted (this server only takes its static token)")
        now = time.monotonic()
        cached = self._users.get(token)
        if cached is None or now - cached[0] > CACHE_SECONDS:
            cached = (now, await self._review(token))
            self._users[token] = cached
            if len(self._users) > 10_000:
                self._users.clear()
        if cached[1] is None:
            raise AuthError(401, "token not accepted by the manager cluster's TokenReview")
        return cached[1]

    async def require(self, user: User, access: Access) -> None:
        if user.static:
            return
        key = (user.name + "\0" + ",".join(user.groups), access)
        now = time.monotonic()
        cached = self._decisions.get(key)
        if cached is None or now - cached[0] > CACHE_SECONDS:
            cached = (now, await self._access_review(user, access))
            self._decisions[key] = cached
            if len(self._decisions) > 10_000:
                self._decisions.clear()
        if not cached[1]:
            raise AuthError(403, f"user {user.name!r} may not {access.describe()} (RBAC on the manager cluster)")

    async def _review(self, token: str) -> User | None:
        from federation.kube import Resource

        res = Resource("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", namespaced=False)
        try:
            answer = await self.kube.review(res, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                                                  "spec": {"token": token}})
        except FederationError as exc:
            raise AuthError(503, f"cannot check the token with the manager cluster: {exc}") from None
        status = answer.get("status") or {}
        if not status.get("authenticated"):
            return None
        u = status.get("user") or {}
        return User(str(u.get("username") or ""), tuple(u.get("groups") or ()), str(u.get("uid") or ""))

    async def _access_review(self, user: User, access: Access) -> bool:
        from federation.kube import Resource

        res = Resource("authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", namespaced=False)
        attrs = {"verb": access.verb, "group": access.group, "resource": access.resource}
        if access.namespace:
            attrs["namespace"] = access.namespace
        if access.name:
            attrs["name"] = access.name
        if access.subresource:
            attrs["subresource"] = access.subresource
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                "spec": {"user": user.name, "groups": list(user.groups), "resourceAttributes": attrs,
                         **({"uid": user.uid} if user.uid else {})}}
        try:
            answer = await self.kube.review(res, body)
        except FederationError as exc:
            raise AuthError(503, f"cannot check access with the manager cluster: {exc}") from None
        return bool((answer.get("status") or {}).get("allowed"))
