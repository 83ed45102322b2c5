"""Who asked the API server for what: kubesim's audit log, in RBAC's own terms.

A real API server authorizes every request as (user, verb, API group, resource, subresource,
namespace) and can write the same tuple to its audit log. kubesim keeps that tuple for every request,
keyed by the client's User-Agent (mkd's services name themselves there: ``mkd-dispatcher/<version>``,
``mkd-agent/<version>``), so a test can compare what a service really called with the ClusterRole
that ``deploy/`` grants it. Verbs follow the authorizer: GET on a name is ``get``, on a collection
``list``, with ``watch=true`` ``watch``; POST ``create``; PUT ``update``; PATCH ``patch``; DELETE on a
name ``delete``, on a collection ``deletecollection``. Discovery and non-resource paths are kept with
the path as their resource and group ``""``, under the verb ``get``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kubesim.httpserver import Request


@dataclass(frozen=True)
class Access:
    """One authorization question, as RBAC sees it."""

    user_agent: str
    verb: str
    group: str
    resource: str  # "pods" or "pods/status"; a non-resource path such as "/apis" as it was asked
    namespace: str


def classify(method: str, path: str, watch: bool) -> tuple[str, str, str, str]:
    """(verb, group, resource[/subresource], namespace) for one request path."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 2:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return "get", "", path, ""
    if not rest:
        return "get", "", path, ""
    namespace = ""
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    resource, name, sub = rest[0], rest[1] if len(rest) > 1 else "", rest[2] if len(rest) > 2 else ""
    if rest[0] == "namespaces" and len(rest) <= 2:
        resource, name = "namespaces", rest[1] if len(rest) > 1 else ""
    if sub:
        resource = f"{resource}/{sub}"
    if method == "GET":
        verb = "watch" if watch else ("get" if name else "list")
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, "")
        if method == "DELETE":
            verb = "delete" if name else "deletecollection"
        verb = verb or method.lower()
    return verb, group, resource, namespace


class AuditLog:
    """Every request this server answered, as :class:`Access` records (bounded, oldest dropped).

    A request is kept as it arrived (User-Agent, method, path, watch) and classified only when the records
    are read: the log is read by a few tests, and written on every request.
    """

    def __init__(self, limit: int = 200_000) -> None:
        self.limit = limit
        self._raw: list[tuple[str, str, str, bool]] = []

    @property
    def records(self) -> list[Access]:
        return [Access(ua, *classify(method, path, watch)) for ua, method, path, watch in self._raw]

    def record(self, request: Request) -> None:
        """Keep one request (as it arrives: a watch is answered only when it ends)."""
        if len(self._raw) >= self.limit:
            del self._raw[: self.limit // 10]
        self._raw.append((request.headers.get("User-Agent", ""), request.method, request.path,
                          request.query.get("watch", "") in ("1", "true")))

    def by(self, user_agent_prefix: str) -> set[tuple[str, str, str]]:
        """The (verb, group, resource) triples that clients whose User-Agent starts with the prefix used."""
        return {(a.verb, a.group, a.resource) for a in self.records if a.user_agent.startswith(user_agent_prefix)}

