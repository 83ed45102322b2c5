"""Who is asking and may they: kube-apiserver's authentication and RBAC authorization of every request.
"""

from __future__ import annotations

import base64
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from kubesim.admission import selector_matches
from kubesim.errors import ApiError, invalid, not_found

ADMIN_USER = "kubesim-admin"
MASTERS = "system:masters"
AUTHENTICATED = "system:authenticated"
UNAUTHENTICATED = "system:unauthenticated"
ANONYMOUS = "system:anonymous"
RBAC = "rbac.authorization.k8s.io"
DEFAULT_TOKEN_SECONDS = 3600
MIN_TOKEN_SECONDS = 600
DECISIONS_KEPT = 10_000
"""RBAC answers remembered at most (a few per verb and resource each service uses; names make more)."""

_DISCOVERY_PATHS = ("/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*",
                    "/readyz", "/version", "/version/")
_PUBLIC_PATHS = ("/healthz", "/livez", "/readyz", "/version", "/version/")
BOOTSTRAP: tuple[tuple[str, tuple[str, ...], tuple[dict[str, Any], ...]], ...] = (
    ("system:discovery", (AUTHENTICATED,), ({"verbs": ["get"], "nonResourceURLs": list(_DISCOVERY_PATHS)},)),
    ("system:public-info-viewer", (AUTHENTICATED, UNAUTHENTICATED),
     ({"verbs": ["get"], "nonResourceURLs": list(_PUBLIC_PATHS)},)),
    ("system:basic-user", (AUTHENTICATED,), (
        {"verbs": ["create"], "apiGroups": ["authorization.k8s.io"],
         "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"]},
        {"verbs": ["create"], "apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"]})),
)
"""(ClusterRole, the groups its bootstrap ClusterRoleBinding names, its rules)."""


@dataclass(frozen=True)
class UserInfo:
    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class Attributes:
    """One request as the authorizer sees it (the apiserver's RequestInfo plus the user)."""

    user: UserInfo
    verb: str
    resource_request: bool
    path: str = ""
    group: str = ""
    version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""


def query_true(value: str | None) -> bool:
    """A bool query parameter as the API server reads it: absent, "0" or "false" (any case) is false, any other
    value true, the empty one included."""
    return value is not None and value != "0" and value.lower() != "false"


def request_attributes(user: UserInfo, method: str, path: str, query: Mapping[str, str]) -> Attributes:
    """What RequestInfoFactory makes of a request: a resource request under /api/v1 or /apis/<g>/<v>, with at
    least a resource; anything else (discovery included) is a non-resource request with the method as verb."""
    parts = [p for p in path.split("/") if p]
    verb = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch",
            "DELETE": "delete"}.get(method, method.lower())
    if parts[:1] == ["api"] and len(parts) >= 3:
        group, version, rest = "", parts[1], parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return Attributes(user, method.lower(), False, path=path)
    special = ""
    if rest[0] in ("watch", "proxy") and len(rest) > 1:  # the special verbs: /api/v1/watch/..., .../proxy/...
        special, rest = rest[0], rest[1:]
    namespace = ""
    if rest and rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in ("status", "finalize"):
            rest = rest[2:]
    if not rest:
        return Attributes(user, method.lower(), False, path=path)
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    sub = rest[2] if len(rest) > 2 and special != "proxy" else ""
    if special:
        verb = special
    elif not name and verb == "get":  # a watch parameter that is neither 0 nor false is true (ListOptions)
        watch = query.get("watch")
        verb = "watch" if query_true(watch) else "list"
    elif not name and verb == "delete":
        verb = "deletecollection"
    if verb in ("list", "watch") and not name:
        for term in query.get("fieldSelector", "").split(","):
            key, _, value = term.partition("=")
            if key.strip() == "metadata.name" and value and not value.startswith("="):
                name = value.strip()
    return Attributes(user, verb, True, path=path, group=group, version=version, resource=resource,
                      subresource=sub, namespace=namespace, name=name)


def forbidden(attrs: Attributes, reason: str) -> ApiError:
    """The 403 the real server writes (responsewriters.Forbidden, apierrors.NewForbidden)."""
    user = attrs.user.username
    if not attrs.resource_request:
        msg = f'User "{user}" cannot {attrs.verb} path "{attrs.path}"'
    else:
        resource = attrs.resource + (f"/{attrs.subresource}" if attrs.subresource else "")
        where = f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
        msg = f'User "{user}" cannot {attrs.verb} resource "{resource}" in API group "{attrs.group}" {where}'
    if reason:
        msg = f"{msg}: {reason}"
    if not attrs.resource_request or not attrs.resource:
        return ApiError(403, "Forbidden", f"forbidden: {msg}", {})
    qualified = f"{attrs.resource}.{attrs.group}" if attrs.group else attrs.resource
    details: dict[str, Any] = {"kind": attrs.resource}
    if attrs.name:
        details = {"name": attrs.name, **({"group": attrs.group} if attrs.group else {}), "kind": attrs.resource}
    elif attrs.group:
        details = {"group": attrs.group, "kind": attrs.resource}
    text = f'{qualified} "{attrs.name}" is forbidden: {msg}' if attrs.name else f"{qualified} is forbidden: {msg}"
    return ApiError(403, "Forbidden", text, details)


def token_request_target(method: str, path: str) -> tuple[str, str] | None:
    """(namespace, ServiceAccount) of a TokenRequest (``POST /api/v1/namespaces/<ns>/serviceaccounts/<n>/token``)."""
    if method != "POST" or not path.endswith("/token"):
        return None
    parts = path.strip("/").split("/")
    if len(parts) == 7 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "serviceaccounts":
        return parts[3], parts[5]
    return None


def unauthorized() -> ApiError:
    """The 401 for a token nobody issued (a new error each time: a raised error keeps the frames it passed)."""
    return ApiError(401, "Unauthorized", "Unauthorized")


@dataclass
class _Minted:
    namespace: str
    name: str
    uid: str
    expires: float


@dataclass
class Access:
    """Authentication and authorization of one simulated cluster (``store`` holds its RBAC objects).

    **Authentication** (always, for TokenReview; for requests only when the cluster authorizes): a bearer
    token is either in the static token table (kube-apiserver's ``--token-auth-file``; the cluster's own
    kubeconfig token ``kubesim-<cluster>`` is ``kubesim-admin`` in ``system:masters``) or a ServiceAccount
    token minted by the TokenRequest subresource (``POST .../serviceaccounts/<name>/token``, what
    ``kubectl create token`` and a Pod's projected token use), valid until it expires and while its
    ServiceAccount (same uid) exists; its user is ``system:serviceaccount:<namespace>:<name>`` in
    ``system:serviceaccounts`` and ``system:serviceaccounts:<namespace>``. Every authenticated user is also
    in ``system:authenticated``; a request without a token is ``system:anonymous`` in
    ``system:unauthenticated``; an unknown or expired token is 401 Unauthorized.

    **Authorization** is the request's attributes (the apiserver's RequestInfo: verb from the method, ``list``
    / ``watch`` / ``deletecollection`` on collections, resource, subresource, name, namespace, or a
    non-resource path) judged by the privileged ``system:masters`` group, then the RBAC authorizer over the
    stored Roles, ClusterRoles and bindings: ClusterRoleBindings, then the RoleBindings of the request's
    namespace; rules match by verb, API group, resource (``*``, ``resource/subresource``, ``*/subresource``),
    resource name, and for ClusterRoles non-resource URLs (exact, ``*``, or a prefix ending in ``*``). A
    ClusterRole with an ``aggregationRule`` holds the rules of the ClusterRoles its selectors match (what the
    aggregation controller writes into it). The bootstrap policy's discovery roles (``system:discovery``,
    ``system:public-info-viewer``, ``system:basic-user``) apply without being stored. A denial is the real 403:
    ``<resource>.<group> "<name>" is forbidden: User "<user>" cannot <verb> resource "<resource>[/<sub>]" in API
    group "<group>" in the namespace "<ns>"`` (``at the cluster scope`` without one; ``forbidden: User ... cannot
    get path "/x"`` for a non-resource path), followed by the RBAC authorizer's reason when it has one (a
    binding naming a role that does not exist).
    """

    store: Any
    enforce: bool = False
    """Authenticate and authorize every request (ClusterSpec.authorize); off, every request is served."""
    tokens: dict[str, UserInfo] = field(default_factory=dict)
    minted: dict[str, _Minted] = field(default_factory=dict)
    clock: Any = time.time
    decisions: dict[Attributes, tuple[bool, str]] = field(default_factory=dict)
    """``authorize``'s answers by request attributes (user and groups included), until an RBAC object changes."""

    def __post_init__(self) -> None:
        name = getattr(getattr(self.store, "spec", None), "name", "")
        self.tokens.setdefault(f"kubesim-{name}", UserInfo(ADMIN_USER, ADMIN_USER, (MASTERS,)))
        if hasattr(self.store, "subscribe_raw"):  # RBAC's answers depend on these objects alone
            for plural in ("roles", "clusterroles", "rolebindings", "clusterrolebindings"):
                self.store.subscribe_raw(lambda *_: self.decisions.clear(), f"{plural}.{RBAC}")

    def add_token(self, token: str, username: str, groups: Iterable[str] = (), uid: str = "") -> None:
        """One line of a ``--token-auth-file``: ``token,user,uid,"group1,group2"``."""
        self.tokens[token] = UserInfo(username, uid or username, tuple(groups))

    # --- authentication -------------------------------------------------------------------------------

    def authenticate(self, token: str) -> UserInfo | None:
        """The user a bearer token belongs to (``system:authenticated`` added), or None."""
        user = self.tokens.get(token)
        if user is None:
            minted = self.minted.get(token)
            if minted is None or self.clock() >= minted.expires:
                return None
            sa = self.store.get("serviceaccounts", minted.namespace, minted.name)
            if sa is None or (sa.get("metadata") or {}).get("uid") != minted.uid:
                return None
            user = UserInfo(f"system:serviceaccount:{minted.namespace}:{minted.name}", minted.uid,
                            ("system:serviceaccounts", f"system:serviceaccounts:{minted.namespace}"))
        return UserInfo(user.username, user.uid, (*user.groups, AUTHENTICATED))

    def user_of(self, authorization: str) -> UserInfo:
        """The request's user from its ``Authorization`` header; raises 401 for a token nobody issued."""
        scheme, _, token = authorization.partition(" ")
        if not authorization:
            return UserInfo(ANONYMOUS, "", (UNAUTHENTICATED,))
        user = self.authenticate(token.strip()) if scheme.lower() == "bearer" else None
        if user is None:
            raise unauthorized()
        return user

    def token_request(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /api/v1/namespaces/<ns>/serviceaccounts/<name>/token``: a TokenRequest answered."""
        sa = self.store.get("serviceaccounts", namespace, name)
        if sa is None:
            raise not_found("serviceaccounts", "", name)
        spec = body.get("spec") if isinstance(body.get("spec"), Mapping) else {}
        assert isinstance(spec, Mapping)
        seconds = spec.get("expirationSeconds")
        seconds = DEFAULT_TOKEN_SECONDS if seconds is None else seconds
        if not isinstance(seconds, int) or seconds < MIN_TOKEN_SECONDS:
            raise invalid("TokenRequest", "authentication.k8s.io", "", [{
                "reason": "FieldValueInvalid", "field": "spec.expirationSeconds",
                "message": f"Invalid value: {seconds}: may not specify a duration less than 10 minutes"}])
        now = self.clock()
        uid = str((sa.get("metadata") or {}).get("uid") or "")
        audiences = [str(a) for a in spec.get("audiences") or []] or ["https://kubernetes.default.svc.cluster.local"]
        claims = {"aud": audiences, "exp": int(now + seconds), "iat": int(now),
                  "iss": "https://kubernetes.default.svc.cluster.local", "sub": f"system:serviceaccount:{namespace}:{name}",
                  "kubernetes.io": {"namespace": namespace, "serviceaccount": {"name": name, "uid": uid}}}
        token = ".".join(_b64(orjson.dumps(part)) for part in ({"alg": "RS256", "kid": "kubesim"}, claims))
        token += "." + _b64(secrets.token_bytes(32))
        self.minted[token] = _Minted(namespace, name, uid, now + seconds)
        expires = datetime.fromtimestamp(now + seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {"kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
                "metadata": {"name": name, "namespace": namespace, "creationTimestamp": None},
                "spec": {"audiences": audiences, "expirationSeconds": seconds, "boundObjectRef": spec.get("boundObjectRef")},
                "status": {"token": token, "expirationTimestamp": expires}}

    # --- authorization --------------------------------------------------------------------------------

    def check(self, method: str, path: str, query: Mapping[str, str], authorization: str) -> None:
        """Raise the 401 or 403 the real server answers this request with; return when it may proceed."""
        user = self.user_of(authorization)
        attrs = request_attributes(user, method, path, query)
        allowed, reason = self.authorize(attrs)
        if not allowed:
            raise forbidden(attrs, reason)

    def authorize(self, attrs: Attributes) -> tuple[bool, str]:
        """(allowed, reason): the reason names the binding that allowed, or why RBAC could not decide."""
        if MASTERS in attrs.user.groups:
            return True, ""
        decision = self.decisions.get(attrs)
        if decision is None:
            if len(self.decisions) >= DECISIONS_KEPT:
                self.decisions.clear()
            decision = self.decisions[attrs] = self._authorize(attrs)
        return decision

    def _authorize(self, attrs: Attributes) -> tuple[bool, str]:
        user = attrs.user
        if MASTERS in user.groups:
            return True, ""
        for role, groups, rules in BOOTSTRAP:
            group = next((g for g in groups if g in user.groups), None)
            if group is not None and any(_allows(r, attrs) for r in rules):
                return True, f'RBAC: allowed by ClusterRoleBinding "{role}" of ClusterRole "{role}" to Group "{group}"'
        errors: list[str] = []
        for binding in self.store.list(f"clusterrolebindings.{RBAC}"):
            subject = _subject(binding, user, "")
            if subject is None:
                continue
            found = self._rules(binding, "", errors)
            if any(_allows(r, attrs) for r in found):
                return True, (f'RBAC: allowed by ClusterRoleBinding "{_name(binding)}" of ClusterRole '
                              f'"{binding["roleRef"]["name"]}" to {subject}')
        if attrs.namespace:
            for binding in self.store.list(f"rolebindings.{RBAC}", attrs.namespace):
                subject = _subject(binding, user, attrs.namespace)
                if subject is None:
                    continue
                found = self._rules(binding, attrs.namespace, errors)
                if any(_allows(r, attrs) for r in found if "nonResourceURLs" not in r):
                    ref = binding["roleRef"]
                    return True, (f'RBAC: allowed by RoleBinding "{_name(binding)}/{attrs.namespace}" of '
                                  f'{ref["kind"]} "{ref["name"]}" to {subject}')
        if not errors:
            return False, ""
        text = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
        return False, f"RBAC: {text}"

    def _rules(self, binding: Mapping[str, Any], namespace: str, errors: list[str]) -> list[Mapping[str, Any]]:
        ref = binding.get("roleRef") or {}
        name = str(ref.get("name") or "")
        if ref.get("kind") == "ClusterRole":
            role = self.store.get(f"clusterroles.{RBAC}", None, name)
            if role is None:
                errors.append(f'clusterrole.{RBAC} "{name}" not found')
                return []
            return self._cluster_role_rules(role)
        if ref.get("kind") == "Role" and namespace:
            role = self.store.get(f"roles.{RBAC}", namespace, name)
            if role is None:
                errors.append(f'role.{RBAC} "{name}" not found')
                return []
            return list(role.get("rules") or [])
        return []

    def _cluster_role_rules(self, role: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        rules = list(role.get("rules") or [])
        selectors = (role.get("aggregationRule") or {}).get("clusterRoleSelectors") or []
        if selectors:
            for other in self.store.list(f"clusterroles.{RBAC}"):
                if other is role or _name(other) == _name(role):
                    continue
                labels = (other.get("metadata") or {}).get("labels") or {}
                if any(selector_matches(s, labels) for s in selectors):
                    rules.extend(r for r in other.get("rules") or [] if r not in rules)
        return rules


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _subject(binding: Mapping[str, Any], user: UserInfo, namespace: str) -> str | None:
    """How the matching subject is named in the authorizer's reason, or None when none matches."""
    for s in binding.get("subjects") or []:
        kind, name = s.get("kind"), str(s.get("name") or "")
        if kind == "User" and name == user.username:
            return f'User "{name}"'
        if kind == "Group" and name in user.groups:
            return f'Group "{name}"'
        if kind == "ServiceAccount":
            ns = str(s.get("namespace") or namespace)
            if user.username == f"system:serviceaccount:{ns}:{name}":
                return f'ServiceAccount "{name}/{ns}"'
    return None


def _allows(rule: Mapping[str, Any], attrs: Attributes) -> bool:
    """rbac/v1 RuleAllows: verb, then for a resource request group, resource and name, else the URL."""
    verbs = rule.get("verbs") or []
    if not ("*" in verbs or attrs.verb in verbs):
        return False
    if not attrs.resource_request:
        return any(u == "*" or u == attrs.path or (u.endswith("*") and attrs.path.startswith(u[:-1]))
                   for u in rule.get("nonResourceURLs") or [])
    groups = rule.get("apiGroups") or []
    if not ("*" in groups or attrs.group in groups):
        return False
    sub = attrs.subresource
    combined = f"{attrs.resource}/{sub}" if sub else attrs.resource
    if not any(r == "*" or r == combined or (sub and r == f"*/{sub}") for r in rule.get("resources") or []):
        return False
    names = rule.get("resourceNames") or []
    return not names or attrs.name in names
