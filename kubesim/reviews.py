"""TokenReview and SubjectAccessReview, as kube-apiserver answers them, so a service can ask "who is this
token" and "may they do that" (mkd's admin API lets RBAC decide who may drain a cluster).

**Authentication** is kube-apiserver's static token file (``--token-auth-file``): a table of bearer
tokens, each naming a user, a uid and groups. The cluster's own kubeconfig token (``kubesim-<cluster>``)
is ``kubesim-admin`` in ``system:masters``; tests add more with :meth:`Reviews.add_token`. An
authenticated user also gets ``system:authenticated``, as the real server adds it. A token not in the
table answers ``authenticated`` unset and an empty ``user``.

**Authorization** is the RBAC authorizer, evaluated over the Roles, ClusterRoles, RoleBindings and
ClusterRoleBindings in the store: ClusterRoleBindings first, then the RoleBindings of the request's
namespace (whose ``roleRef`` may name a ClusterRole); a subject matches a User by name, a Group by
membership, a ServiceAccount as ``system:serviceaccount:<namespace>:<name>`` (the binding's namespace
when the subject names none); a rule matches when verb, API group, resource (``resource/subresource``,
``*``, ``*/subresource``) and, if it lists any, resource name all match. ``system:masters`` is allowed
everything (the real server's privileged-group authorizer). The answer's ``reason`` names the binding
and role, worded as the real authorizer words it. Not modelled: aggregated ClusterRoles (their rules
are filled by a controller kubesim does not run), non-resource URLs (always denied), and the
``Node``/webhook authorizers. Both resources are create-only: another verb is 405 MethodNotAllowed,
and the request objects are validated as the real server does (a SubjectAccessReview must name a user
or a group, and exactly one of ``resourceAttributes`` / ``nonResourceAttributes``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubesim.errors import ApiError, invalid

TOKEN_REVIEWS = ("authentication.k8s.io", "tokenreviews", "TokenReview")
ACCESS_REVIEWS = ("authorization.k8s.io", "subjectaccessreviews", "SubjectAccessReview")
ADMIN_USER = "kubesim-admin"
MASTERS = "system:masters"
RBAC = "rbac.authorization.k8s.io"


@dataclass(frozen=True)
class UserInfo:
    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()


@dataclass
class Reviews:
    """The two review resources of one simulated cluster (``store`` holds its RBAC objects)."""

    store: Any
    tokens: dict[str, UserInfo] = field(default_factory=dict)

    def __post_init__(self) -> None:
        name = getattr(getattr(self.store, "spec", None), "name", "")
        self.tokens.setdefault(f"kubesim-{name}", UserInfo(ADMIN_USER, "kubesim-admin", (MASTERS,)))

    def add_token(self, token: str, username: str, groups: Iterable[str] = (), uid: str = "") -> None:
        """One line of a ``--token-auth-file``: ``token,user,uid,"group1,group2"``."""
        self.tokens[token] = UserInfo(username, uid or username, tuple(groups))

    def handles(self, group: str, version: str, rest: list[str]) -> bool:
        return version == "v1" and len(rest) == 1 and (group, rest[0]) in (TOKEN_REVIEWS[:2], ACCESS_REVIEWS[:2])

    def answer(self, method: str, group: str, body: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
        """(HTTP status, object) for a request to one of the two collections."""
        kind = TOKEN_REVIEWS[2] if group == TOKEN_REVIEWS[0] else ACCESS_REVIEWS[2]
        if method != "POST":
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested "
                                                    "resource", {"kind": kind.lower() + "s", "group": group})
        spec = body.get("spec") if isinstance(body.get("spec"), Mapping) else {}
        assert isinstance(spec, Mapping)
        status = self._token_review(spec) if kind == TOKEN_REVIEWS[2] else self._access_review(spec)
        return 201, {"kind": kind, "apiVersion": f"{group}/v1", "metadata": {"creationTimestamp": None},
                     "spec": dict(spec), "status": status}

    # --- authentication -----------------------------------------------------------------------------

    def _token_review(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        user = self.tokens.get(str(spec.get("token") or ""))
        if user is None:
            return {"user": {}}
        groups = [*user.groups, "system:authenticated"]
        return {"authenticated": True, "user": {"username": user.username, "uid": user.uid, "groups": groups},
                "audiences": list(spec.get("audiences") or [])}

    # --- authorization ------------------------------------------------------------------------------

    def _access_review(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        user = str(spec.get("user") or "")
        groups = [str(g) for g in spec.get("groups") or []]
        attrs = spec.get("resourceAttributes")
        causes = []
        if not user and not groups:
            causes.append({"reason": "FieldValueInvalid", "field": "spec.user",
                           "message": 'Invalid value: "": at least one of user or group must be specified'})
        if (attrs is None) == (spec.get("nonResourceAttributes") is None):
            causes.append({"reason": "FieldValueInvalid", "field": "spec.resourceAttributes",
                           "message": 'Invalid value: "null": exactly one of nonResourceAttributes or '
                                      "resourceAttributes must be specified"})
        if causes:
            raise invalid(ACCESS_REVIEWS[2], ACCESS_REVIEWS[0], "", causes)
        if MASTERS in groups:
            return {"allowed": True}
        if not isinstance(attrs, Mapping):
            return {"allowed": False}  # non-resource URLs are not modelled: denied
        reason = self._allowed_by(user, groups, attrs)
        return {"allowed": True, "reason": reason} if reason else {"allowed": False}

    def _allowed_by(self, user: str, groups: list[str], attrs: Mapping[str, Any]) -> str | None:
        namespace = str(attrs.get("namespace") or "")
        for binding in self.store.list(f"clusterrolebindings.{RBAC}"):
            subject = _subject(binding, user, groups, "")
            if subject and any(_allows(r, attrs) for r in self._rules(binding, "")):
                return (f'RBAC: allowed by ClusterRoleBinding "{_name(binding)}" of ClusterRole '
                        f'"{binding["roleRef"]["name"]}" to {subject}')
        if not namespace:
            return None
        for binding in self.store.list(f"rolebindings.{RBAC}", namespace):
            subject = _subject(binding, user, groups, namespace)
            if subject and any(_allows(r, attrs) for r in self._rules(binding, namespace)):
                ref = binding["roleRef"]
                return (f'RBAC: allowed by RoleBinding "{_name(binding)}/{namespace}" of {ref["kind"]} '
                        f'"{ref["name"]}" to {subject}')
        return None

    def _rules(self, binding: Mapping[str, Any], namespace: str) -> list[Mapping[str, Any]]:
        ref = binding.get("roleRef") or {}
        if ref.get("kind") == "ClusterRole":
            role = self.store.get(f"clusterroles.{RBAC}", None, str(ref.get("name")))
        elif ref.get("kind") == "Role" and namespace:
            role = self.store.get(f"roles.{RBAC}", namespace, str(ref.get("name")))
        else:
            role = None
        return list((role or {}).get("rules") or [])


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _subject(binding: Mapping[str, Any], user: str, groups: list[str], namespace: str) -> str | None:
    """How the matching subject is named in the authorizer's reason, or None when none matches."""
    for s in binding.get("subjects") or []:
        kind, name = s.get("kind"), str(s.get("name") or "")
        if kind == "User" and name == user:
            return f'User "{user}"'
        if kind == "Group" and name in groups:
            return f'Group "{name}"'
        if kind == "ServiceAccount":
            ns = str(s.get("namespace") or namespace)
            if user == f"system:serviceaccount:{ns}:{name}":
                return f'ServiceAccount "{name}/{ns}"'
    return None


def _allows(rule: Mapping[str, Any], attrs: Mapping[str, Any]) -> bool:
    verbs = rule.get("verbs") or []
    groups = rule.get("apiGroups") or []
    resources = rule.get("resources") or []
    names = rule.get("resourceNames") or []
    verb, group = str(attrs.get("verb") or ""), str(attrs.get("group") or "")
    resource, sub = str(attrs.get("resource") or ""), str(attrs.get("subresource") or "")
    combined = f"{resource}/{sub}" if sub else resource
    if not ("*" in verbs or verb in verbs) or not ("*" in groups or group in groups):
        return False
    if not any(r == "*" or r == combined or (sub and r == f"*/{sub}") for r in resources):
        return False
    return not names or str(attrs.get("name") or "") in names
