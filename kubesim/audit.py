"""Who asked the API server for what: kubesim's audit log, in RBAC's own terms.

A real API server authorizes every request as (user, verb, API group, resource, subresource,
namespace) and can write the same tuple to its audit log. kubesim keeps that tuple for every request,
keyed by the client's User-Agent (mkd's services name themselves there: ``mkd-dispatcher/<version>``,
``mkd-agent/<version>``), so a test can compare what a service really called with the ClusterRole
that ``deploy/`` grants it. The tuple is the one the authorizer judges (``kubesim.authz.request_attributes``,
the apiserver's RequestInfo): GET on a name is ``get``, on a collection ``list``, or ``watch`` when the
``watch`` parameter is neither ``0`` nor ``false`` or the path begins with ``watch/``; POST ``create``; PUT
``update``; PATCH ``patch``; DELETE on a name ``delete``, on a collection ``deletecollection``; a namespace's
own requests (``/api/v1/namespaces/<ns>``, its ``status`` and ``finalize``) are in that namespace. Discovery and
non-resource paths are kept with the path as their resource and group ``""``, under the lowercased method.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kubesim.authz import ANONYMOUS, UserInfo, request_attributes

if TYPE_CHECKING:
    from kubesim.httpserver import Request

_NOBODY = UserInfo(ANONYMOUS)


@dataclass(frozen=True)
class Access:
    """One authorization question, as RBAC sees it."""

    user_agent: str
    verb: str
    group: str
    resource: str  # "pods" or "pods/status"; a non-resource path such as "/apis" as it was asked
    namespace: str


def classify(method: str, path: str, watch: str | None) -> tuple[str, str, str, str]:
    """(verb, group, resource[/subresource], namespace) for one request: its method, path and the value of its
    ``watch`` query parameter (None without one)."""
    attrs = request_attributes(_NOBODY, method, path, {} if watch is None else {"watch": watch})
    if not attrs.resource_request:
        return attrs.verb, "", path, ""
    resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    return attrs.verb, attrs.group, resource, attrs.namespace


class AuditLog:
    """Every request this server answered, as :class:`Access` records (bounded, oldest dropped).

    A request is kept as it arrived (User-Agent, method, path, watch) and classified only when the records
    are read: the log is read by a few tests, and written on every request.
    """

    def __init__(self, limit: int = 200_000) -> None:
        self.limit = limit
        self._raw: list[tuple[str, str, str, str | None]] = []

    @property
    def records(self) -> list[Access]:
        return [Access(ua, *classify(method, path, watch)) for ua, method, path, watch in self._raw]

    def record(self, request: Request) -> None:
        """Keep one request (as it arrives: a watch is answered only when it ends)."""
        if len(self._raw) >= self.limit:
            del self._raw[: self.limit // 10]
        self._raw.append((request.headers.get("User-Agent", ""), request.method, request.path,
                          request.query.get("watch")))

    def by(self, user_agent_prefix: str) -> set[tuple[str, str, str]]:
        """The (verb, group, resource) triples that clients whose User-Agent starts with the prefix used."""
        return {(a.verb, a.group, a.resource) for a in self.records if a.user_agent.startswith(user_agent_prefix)}

