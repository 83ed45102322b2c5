"""TokenReview and SubjectAccessReview, as kube-apiserver answers them, so a service can ask "who is this
token" and "may they do that" (mkd's admin API lets RBAC decide who may drain a cluster).

Both are answered by the cluster's :class:`~kubesim.authz.Access`, the same authentication and RBAC
authorizer that judges requests when the cluster authorizes them: a token is one of the static table
(the cluster's kubeconfig token is ``kubesim-admin`` in ``system:masters``; tests add more with
:meth:`Reviews.add_token`) or a ServiceAccount token from TokenRequest; a token not known answers
``authenticated`` unset and an empty ``user``. The access review's ``reason`` names the binding and role,
worded as the real authorizer words it. Not modelled: the ``Node``/webhook authorizers. Both resources are
create-only: another verb is 405 MethodNotAllowed, and the request objects are validated as the real server
does (a SubjectAccessReview must name a user or a group, and exactly one of ``resourceAttributes`` /
``nonResourceAttributes``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubesim.authz import ADMIN_USER, MASTERS, Access, Attributes, UserInfo
from kubesim.errors import ApiError, invalid

TOKEN_REVIEWS = ("authentication.k8s.io", "tokenreviews", "TokenReview")
ACCESS_REVIEWS = ("authorization.k8s.io", "subjectaccessreviews", "SubjectAccessReview")
__all__ = ["ADMIN_USER", "MASTERS", "Reviews", "UserInfo"]


@dataclass
class Reviews:
    """The two review resources of one simulated cluster, answered by its ``access``."""

    store: Any
    access: Access = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.access is None:
            self.access = Access(self.store)

    def add_token(self, token: str, username: str, groups: Iterable[str] = (), uid: str = "") -> None:
        """One line of a ``--token-auth-file``: ``token,user,uid,"group1,group2"``."""
        self.access.add_token(token, username, groups, uid)

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

    def _token_review(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        user = self.access.authenticate(str(spec.get("token") or ""))
        if user is None:
            return {"user": {}}
        return {"authenticated": True, "user": {"username": user.username, "uid": user.uid, "groups": list(user.groups)},
                "audiences": list(spec.get("audiences") or [])}

    def _access_review(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        user = str(spec.get("user") or "")
        groups = [str(g) for g in spec.get("groups") or []]
        attrs = spec.get("resourceAttributes")
        other = spec.get("nonResourceAttributes")
        causes = []
        if not user and not groups:
            causes.append({"reason": "FieldValueInvalid", "field": "spec.user",
                           "message": 'Invalid value: "": at least one of user or group must be specified'})
        if (attrs is None) == (other is None):
            causes.append({"reason": "FieldValueInvalid", "field": "spec.resourceAttributes",
                           "message": 'Invalid value: "null": exactly one of nonResourceAttributes or '
                                      "resourceAttributes must be specified"})
        if causes:
            raise invalid(ACCESS_REVIEWS[2], ACCESS_REVIEWS[0], "", causes)
        who = UserInfo(user, str(spec.get("uid") or ""), tuple(groups))
        if isinstance(attrs, Mapping):
            asked = Attributes(who, str(attrs.get("verb") or ""), True, group=str(attrs.get("group") or ""),
                               version=str(attrs.get("version") or ""), resource=str(attrs.get("resource") or ""),
                               subresource=str(attrs.get("subresource") or ""),
                               namespace=str(attrs.get("namespace") or ""), name=str(attrs.get("name") or ""))
        else:
            other = other if isinstance(other, Mapping) else {}
            asked = Attributes(who, str(other.get("verb") or ""), False, path=str(other.get("path") or ""))
        allowed, reason = self.access.authorize(asked)
        if allowed:
            return {"allowed": True, "reason": reason} if reason else {"allowed": True}
        return {"allowed": False, "reason": reason} if reason else {"allowed": False}
