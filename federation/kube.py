"""The Kubernetes boundary: the only module importing ``kubernetes`` (and urllib3).

``Kube`` is one API server (one cluster): async CRUD, patch in its four flavours, a list-then-watch
``informer`` and discovery, over the official client's configuration and authentication.
Requests go out as raw paths built by ``Resource.path()`` and bodies are parsed with orjson —
model (de)serialisation would cost more than the request. Requests (not watches) go over
``federation.keepalive.Http``: HTTP/1.1 keep-alive connections on the event loop, set up from the official client's
``Configuration`` (host, TLS files and checks) with the headers its ``update_params_for_auth``
gives (bearer tokens, refreshed by exec plugins, re-read every ``AUTH_TTL`` seconds and after a 401).
Handing each request to a urllib3 thread cost about 1.1 CPU-ms per request, this about 0.2
(bench/RESULTS.md). A configuration with a proxy keeps the official client's urllib3
pool, on a thread pool sized ``KubeSettings.max_concurrency``, and so does
``KubeSettings.requests_on_loop = False``. Each watch streams in its own thread
feeding an ``asyncio.Queue``. Every HTTP failure and every client exception becomes a
``federation.errors`` error in ``_error_for_status`` / ``_guard`` and nowhere else; a 403 becomes
``Forbidden`` naming the RBAC rule the call needs. Every call can be heard as RBAC judges it (a
:class:`Call`: verb, API group, resource/subresource) through ``Kube.recorder``, which the tests use to
derive deploy/'s roles from what the services call.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import hashlib
import importlib.metadata
import logging
import os
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Protocol
from urllib.parse import quote, urlencode

import orjson
import urllib3
import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from federation.clock import Clock, SystemClock
from federation.errors import (
    AlreadyExists,
    Conflict,
    FederationError,
    Forbidden,
    Invalid,
    NotFound,
    Permanent,
    Transport,
)
from federation.keepalive import Http
from federation.retry import capped
from federation.settings import KubeSettings

if TYPE_CHECKING:
    from federation.tasks import SideWork

log = logging.getLogger(__name__)

PatchType = Literal["merge", "json", "strategic", "apply"]
CONTENT_TYPES: dict[str, str] = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "apply": "application/apply-patch+yaml",  # JSON is YAML: the body is sent as JSON
}
DEFAULT_FIELD_MANAGER = "mkd"
LIST_PAGE = 500
DISCOVERY_TTL = 10.0
"""Seconds a discovery answer is trusted: a CRD installed now is seen within this."""
AUTH_TTL = 5.0
"""Seconds the authentication headers the official client computed are reused (a 401 re-reads them at once).
Computing them runs the kubeconfig's refresh hook, which costs as much as the request itself."""


_UNRESERVED = re.compile(r"[A-Za-z0-9_.~-]*")


def _segment(value: str) -> str:
    """``value`` as one path segment: what ``quote(value, safe="")`` gives, without its cost for the names
    nearly every object has (DNS labels and subdomains need no escaping; ~2.5 us saved per segment)."""
    return value if _UNRESERVED.fullmatch(value) else quote(value, safe="")


@dataclass(frozen=True)
class Resource:
    """A resource type on the API server: where its objects live and what they are called."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_version_path(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def path(self, namespace: str | None = None, name: str | None = None,
             subresource: str | None = None) -> str:
        """``/api/v1/namespaces/x/pods/y/status``; without namespace a namespaced type is listed cluster-wide."""
        parts = [self.group_version_path]
        if self.namespaced and namespace:
            parts.append(f"namespaces/{_segment(namespace)}")
        parts.append(self.plural)
        if name is not None:
            parts.append(_segment(name))
            if subresource:
                parts.append(subresource)
        elif subresource:
            raise ValueError("a subresource needs an object name")
        return "/".join(parts)


PODS = Resource("", "v1", "pods", "Pod")
SERVICES = Resource("", "v1", "services", "Service")
CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap")
SECRETS = Resource("", "v1", "secrets", "Secret")
EVENTS = Resource("", "v1", "events", "Event")
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
SERVICEACCOUNTS = Resource("", "v1", "serviceaccounts", "ServiceAccount")
JOBS = Resource("batch", "v1", "jobs", "Job")
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition",
                namespaced=False)


class _KindLike(Protocol):
    """What ``resource_for`` reads of a kind (a JobKind, read-only)."""

    @property
    def name(self) -> str: ...
    @property
    def group(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def plural(self) -> str: ...


def resource_for(kind: _KindLike) -> Resource:
    """The Resource of a JobKind (every job kind is namespaced)."""
    return Resource(kind.group, kind.version, kind.plural, kind.name)


@dataclass(frozen=True)
class Call:
    """One request as RBAC judges it: ``verb`` (get, list, watch, create, update, patch, delete), API ``group``,
    ``resource`` (the plural, or ``plural/subresource``), the ``namespace`` it is confined to ("" for a
    cluster-scoped object or a call across all namespaces); a discovery request is ``get`` on its path with
    group ``""`` (``nonresource``)."""

    verb: str
    group: str
    resource: str
    namespace: str = ""
    nonresource: bool = False


def call_of(method: str, path: str, watch: bool = False) -> Call:
    """The :class:`Call` a request path makes (the API server's RequestInfo, for the paths ``Resource.path`` builds)."""
    parts = path.split("?", 1)[0].strip("/").split("/")
    if parts[0] == "api" and len(parts) >= 3:
        group, rest = "", parts[2:]
    elif parts[0] == "apis" and len(parts) >= 4:
        group, rest = parts[1], parts[3:]
    else:
        return Call("get", "", path, nonresource=True)
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    named = len(rest) > 1
    verb = {"GET": "get" if named else ("watch" if watch else "list"), "POST": "create", "PUT": "update",
            "PATCH": "patch", "DELETE": "delete" if named else "deletecollection"}.get(method, method.lower())
    return Call(verb, group, resource, namespace)


Recorder = Callable[[str, Call], None]
"""Told the User-Agent and the :class:`Call` of every request a :class:`Kube` makes (``Kube.recorder``)."""


@dataclass(frozen=True)
class WatchEvent:
    type: Literal["ADDED", "MODIFIED", "DELETED"]
    object: dict[str, Any]


@dataclass(frozen=True)
class ListResult:
    items: list[dict[str, Any]]
    resource_version: str


# --- error mapping: the one place ------------------------------------------------------------


def _error_for_status(status: int, body: bytes, headers: Mapping[str, str], what: str,
                      call: Callable[[], Call] | None = None) -> FederationError:
    """Map an HTTP status and its ``Status`` body onto the federation error tree; ``call`` says which request
    it answered (a 403 names the rule that would allow it)."""
    doc: dict[str, Any] = {}
    with contextlib.suppress(ValueError, TypeError):
        parsed = orjson.loads(body) if body else {}
        doc = parsed if isinstance(parsed, dict) else {}
    message = str(doc.get("message") or body[:300].decode(errors="replace") or f"HTTP {status}")
    reason = str(doc.get("reason") or "")
    text = f"{what}: {message}"
    if status == 404:
        return NotFound(text)
    if status == 409:
        return AlreadyExists(text) if reason == "AlreadyExists" else Conflict(text)
    if status == 410:
        return Conflict(f"{what}: resource version expired (410 Gone): {message}")
    if status in (400, 422):
        causes = (doc.get("details") or {}).get("causes") or []
        first = causes[0] if causes and isinstance(causes[0], dict) else {}
        return Invalid(str(first.get("field") or "(request)"), str(first.get("message") or message))
    if status == 403 and call is not None:
        asked = call()
        return Forbidden(text, verb=asked.verb, group=asked.group, resource=asked.resource)
    if status in (401, 403):
        return Permanent(text, reason="Unauthorized" if status == 401 else "Forbidden")
    if status == 429 or status >= 500 or status == 0:
        delay = 1.0
        retry_after = headers.get("Retry-After") or headers.get("retry-after")
        with contextlib.suppress(TypeError, ValueError):
            delay = max(0.0, float(retry_after)) if retry_after is not None else delay
        return Transport(f"{what}: HTTP {status}: {message}", delay=delay)
    return Permanent(f"{what}: HTTP {status}: {message}", reason=reason or f"HTTP{status}")


@contextlib.contextmanager
def _guard(what: str) -> Iterator[None]:
    """Library exceptions (client, urllib3, sockets, config) become federation errors."""
    try:
        yield
    except FederationError:
        raise
    except ApiException as exc:
        body = exc.body if isinstance(exc.body, bytes) else str(exc.body or exc.reason or "").encode()
        raise _error_for_status(int(exc.status or 0), body, dict(exc.headers or {}), what) from exc
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise Transport(f"{what}: {type(exc).__name__}: {exc}") from exc
    except (ConfigException, yaml.YAMLError) as exc:  # the kubeconfig a user pointed at is wrong: their input
        detail = " ".join(str(exc).split())
        raise Invalid("kubeconfig", f"{what}: unusable ({type(exc).__name__}: {detail})",
                      fix="set --kubeconfig (or KUBECONFIG) to a kubeconfig file with a current context and its "
                          "cluster and user, or run in a Pod with a ServiceAccount") from exc


def _key(obj: Mapping[str, Any]) -> str:
    """An informer's key of an object: ``namespace/name`` (neither has a ``/``), one string (the
    dispatcher's informer keeps 100,000; a tuple of two was one object more each)."""
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def _rv(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


# --- the client ----------------------------------------------------------------------------


def _version() -> str:
    try:
        return importlib.metadata.version("mkd")
    except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"


class Kube:
    """One API server; an async context manager (state: new → open → closed)."""

    def __init__(self, kubeconfig: str | Path | None = None, *, context: str | None = None,
                 settings: KubeSettings | None = None, clock: Clock | None = None,
                 user_agent: str = "mkd") -> None:
        base = settings or KubeSettings()
        # Who is asking, as API server audit logs (and kubesim's) show it: "mkd-dispatcher/0.1.0".
        self.user_agent = f"{user_agent}/{_version()}"
        self.kubeconfig = Path(kubeconfig) if kubeconfig is not None else base.kubeconfig
        self.context = context if context is not None else base.context
        self.settings = base
        self.clock = clock or SystemClock()
        self.state: Literal["new", "open", "closed"] = "new"
        self._api: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self._http: Http | None = None
        self._auth: tuple[float, dict[str, str]] | None = None
        self._blocks: dict[str | None, bytes] = {}
        """Encoded request headers per content type for the authentication in ``_auth`` (``_header_block``)."""
        self._discovery: dict[str, tuple[float, set[str]]] = {}
        self._watches: set[_WatchStream] = set()
        self._event_ns = 0
        """The last Event name's timestamp (``event``)."""
        self.side: SideWork | None = None
        """The service's side work (``federation.tasks``): failed Events are reported there as ``events``."""

    @classmethod
    def from_settings(cls, settings: KubeSettings, *, clock: Clock | None = None, user_agent: str = "mkd") -> Kube:
        return cls(settings.kubeconfig, context=settings.context, settings=settings, clock=clock,
                   user_agent=user_agent)

    async def __aenter__(self) -> Kube:
        if self.state != "new":
            raise RuntimeError(f"Kube is {self.state}; enter a new one")
        self._api = await asyncio.to_thread(self._load_client)
        self._pool = ThreadPoolExecutor(self.settings.max_concurrency, thread_name_prefix="kube")
        # no proxy and not turned off: requests on the loop
        if self.settings.requests_on_loop and type(self._api.rest_client.pool_manager) is urllib3.PoolManager:
            with _guard("set up TLS from the Kubernetes configuration"):
                self._http = Http(self._api.configuration, self.settings.max_concurrency)
        self.state = "open"
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.state = "closed"
        for stream in list(self._watches):
            stream.stop()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self._http is not None:
            self._http.close()
        if self._api is not None:
            with contextlib.suppress(Exception):
                self._api.rest_client.pool_manager.clear()

    def _load_client(self) -> Any:
        configuration = k8s_client.Configuration()
        with _guard("load Kubernetes configuration"):
            if self.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
                k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            else:
                path = str(self.kubeconfig) if self.kubeconfig else None
                k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=path, context=self.context, client_configuration=configuration,
                    persist_config=False)
        # Every informer holds a connection for its watch and calls need max_concurrency more; the pool
        # opens connections on demand, so a generous cap costs nothing and avoids connection churn.
        configuration.connection_pool_maxsize = self.settings.max_concurrency + 64
        api = k8s_client.ApiClient(configuration)
        api.user_agent = self.user_agent  # sent on every request, watches included
        return api

    # --- raw requests (run in threads) ---

    def _open_response(self, method: str, path: str, query: list[tuple[str, str]] | None,
                       body: bytes | None, content_type: str | None,
                       timeout: urllib3.Timeout) -> urllib3.BaseHTTPResponse:
        if self.state != "open":
            raise RuntimeError("Kube used outside `async with`")
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        # param_serialize applies the kubeconfig's auth (bearer token, refreshed by exec plugins).
        _, url, headers, _, _ = self._api.param_serialize(method, path, header_params=headers,
                                                          auth_settings=["BearerToken"])
        if query:
            url += "?" + urlencode(query)
        response: urllib3.BaseHTTPResponse = self._api.rest_client.pool_manager.request(
            method, url, body=body, headers=headers, timeout=timeout, retries=False, preload_content=False)
        return response

    recorder: Recorder | None = None
    """Every request of every Kube, as (User-Agent, :class:`Call`): set by a test that derives RBAC from what
    the services call; None (no cost) otherwise."""

    on_call: Callable[[str, int], None] | None = None
    """Called (from a worker thread) with the verb and HTTP status of every request; 0: no answer.
    The services' metrics count API calls with it."""

    def _request_sync(self, method: str, path: str, query: list[tuple[str, str]] | None,
                      body: bytes | None, content_type: str | None, what: str) -> Any:
        with _guard(what):
            timeout = urllib3.Timeout(connect=self.settings.timeout, read=self.settings.timeout)
            try:
                response = self._open_response(method, path, query, body, content_type, timeout)
            except Exception:
                if self.on_call is not None:
                    self.on_call(method, 0)
                raise
            try:
                data = response.read()
            finally:
                response.release_conn()
            if self.on_call is not None:
                self.on_call(method, response.status)
            if not 200 <= response.status < 300:
                raise _error_for_status(response.status, data, dict(response.headers), what,
                                        lambda: call_of(method, path))
            return orjson.loads(data) if data else {}

    async def _request(self, method: str, path: str, *, query: list[tuple[str, str]] | None = None,
                       body: Any = None, content_type: str | None = None, what: str = "") -> Any:
        if self.state != "open" or self._pool is None:
            raise RuntimeError(f"Kube is {self.state}; use it inside `async with`")
        if Kube.recorder is not None:
            Kube.recorder(self.user_agent, call_of(method, path))
        payload = orjson.dumps(body) if body is not None else None
        if payload is not None and content_type is None:
            content_type = "application/json"
        what = what or f"{method} {path}"
        if self._http is not None:
            return await self._request_async(self._http, method, path, query, payload, content_type, what)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._request_sync, method, path, query, payload,
                                          content_type, what)

    def _headers(self, method: str, path: str, content_type: str | None, *, fresh: bool = False) -> dict[str, str]:
        """Accept, User-Agent, Content-Type and what the official client's auth settings add (cached ``AUTH_TTL``)."""
        now = time.monotonic()
        if fresh or self._auth is None or now - self._auth[0] > AUTH_TTL:
            auth: dict[str, str] = {}
            with _guard(f"{method} {path}: authentication"):
                self._api.update_params_for_auth(auth, [], ["BearerToken"], path, method, None)
            self._auth = (now, {str(k): str(v) for k, v in auth.items()})
            self._blocks = {}
        headers = {"Accept": "application/json", "User-Agent": self.user_agent, **self._auth[1]}
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def _header_block(self, method: str, path: str, content_type: str | None, *, fresh: bool = False) -> bytes:
        """``_headers`` encoded for ``Http.request``, kept per content type while the authentication is."""
        auth = self._auth
        if not fresh and auth is not None and time.monotonic() - auth[0] <= AUTH_TTL:
            block = self._blocks.get(content_type)
            if block is not None:
                return block
        headers = self._headers(method, path, content_type, fresh=fresh)
        block = self._blocks[content_type] = Http.header_block(headers)
        return block

    async def _request_async(self, http: Http, method: str, path: str, query: list[tuple[str, str]] | None,
                             payload: bytes | None, content_type: str | None, what: str) -> Any:
        target = path + ("?" + urlencode(query) if query else "")
        for attempt in range(2):
            try:
                status, headers, data = await http.request(
                    method, target, self._header_block(method, path, content_type, fresh=attempt > 0), payload,
                    self.settings.timeout)
            except Transport as exc:
                if self.on_call is not None:
                    self.on_call(method, 0)
                raise Transport(f"{what}: {exc}") from None
            if self.on_call is not None:
                self.on_call(method, status)
            if status == 401 and attempt == 0:
                continue  # the token may have just expired: ask the client for the headers again
            if not 200 <= status < 300:
                raise _error_for_status(status, data, headers, what, lambda: call_of(method, path))
            return orjson.loads(data) if data else {}
        raise AssertionError("unreachable")

    # --- CRUD ---

    async def get(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        obj: dict[str, Any] = await self._request("GET", res.path(namespace, name),
                                                  what=f"get {res.kind} {_where(namespace, name)}")
        return obj

    async def list(self, res: Resource, namespace: str | None = None, *, label_selector: str | None = None,
                   field_selector: str | None = None) -> ListResult:
        """Every object, paging through ``continue`` tokens; items carry kind and apiVersion."""
        items: list[dict[str, Any]] = []
        resource_version = ""
        async for page in self.list_pages(res, namespace, label_selector=label_selector,
                                          field_selector=field_selector):
            items.extend(page.items)
            resource_version = resource_version or page.resource_version
        return ListResult(items, resource_version)

    async def list_pages(self, res: Resource, namespace: str | None = None, *, label_selector: str | None = None,
                         field_selector: str | None = None) -> AsyncIterator[ListResult]:
        """:meth:`list` a page at a time (the list's resourceVersion on each), for a consumer that need
        not hold every object at once."""
        resource_version = ""
        token = ""
        while True:
            query = [("limit", str(LIST_PAGE))]
            if label_selector:
                query.append(("labelSelector", label_selector))
            if field_selector:
                query.append(("fieldSelector", field_selector))
            if token:
                query.append(("continue", token))
            page = await self._request("GET", res.path(namespace), query=query,
                                       what=f"list {res.plural} in {namespace or 'all namespaces'}")
            meta = page.get("metadata") or {}
            resource_version = resource_version or str(meta.get("resourceVersion") or "")
            items = page.get("items") or []
            for item in items:
                item.setdefault("kind", res.kind)
                item.setdefault("apiVersion", res.api_version)
            del page
            yield ListResult(items, resource_version)
            token = str(meta.get("continue") or "")
            if not token:
                return

    async def pod_log(self, namespace: str, name: str, query: builtins.list[tuple[str, str]]) -> AsyncIterator[bytes]:
        """``GET pods/{name}/log`` as it arrives (with ``follow`` it streams until the container ends); the
        connection is closed when the iterator is (a follow the reader left ends at once). A refusal raises
        the federation error with the server's message (400: ``Invalid`` whose message says why)."""
        path = PODS.path(namespace, name, "log")
        what = f"GET {path}"
        if Kube.recorder is not None:
            Kube.recorder(self.user_agent, call_of("GET", path))
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(maxsize=0)
        stopped = threading.Event()
        holder: builtins.list[urllib3.BaseHTTPResponse] = []

        def put(item: tuple[str, Any]) -> None:
            with contextlib.suppress(RuntimeError):  # loop closed
                loop.call_soon_threadsafe(queue.put_nowait, item)

        def read() -> None:
            try:
                with _guard(what):
                    timeout = urllib3.Timeout(connect=self.settings.timeout, read=None)
                    response = self._open_response("GET", path, query, None, None, timeout)
                    holder.append(response)
                    if response.status != 200:
                        data = response.read()
                        response.release_conn()
                        raise _error_for_status(response.status, data, dict(response.headers), what,
                                                lambda: call_of("GET", path))
                    for chunk in _chunks(response):
                        if stopped.is_set():
                            break
                        put(("data", chunk))
                    response.release_conn()
                put(("end", None))
            except FederationError as exc:
                put(("error", exc))
            except Exception as exc:  # the thread must always report
                put(("error", Transport(f"{what}: {type(exc).__name__}: {exc}")))

        thread = threading.Thread(target=read, name=f"log {namespace}/{name}", daemon=True)
        thread.start()
        try:
            while True:
                kind, item = await queue.get()
                if kind == "data":
                    yield item
                elif kind == "end":
                    return
                else:
                    raise item
        finally:
            stopped.set()
            for response in holder:
                with contextlib.suppress(Exception):
                    response.shutdown()  # type: ignore[attr-defined]

    async def review(self, res: Resource, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST a nameless, create-only review (TokenReview, SubjectAccessReview); the answer has its status."""
        obj: dict[str, Any] = await self._request("POST", res.path(None), body=dict(body), what=f"create {res.kind}")
        return obj

    async def token(self, namespace: str, service_account: str, *, seconds: int = 3600,
                    audiences: builtins.list[str] | None = None) -> str:
        """A token of the ServiceAccount from its TokenRequest subresource (what ``kubectl create token`` does)."""
        spec: dict[str, Any] = {"expirationSeconds": seconds}
        if audiences:
            spec["audiences"] = audiences
        answer = await self._request(
            "POST", SERVICEACCOUNTS.path(namespace, service_account, "token"),
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
            what=f"create token for ServiceAccount {namespace}/{service_account}")
        return str((answer.get("status") or {}).get("token") or "")

    async def create(self, res: Resource, body: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        ns = namespace or _namespace_of(body)
        obj: dict[str, Any] = await self._request(
            "POST", res.path(ns), body=dict(body),
            what=f"create {res.kind} {_where(ns, _name_of(body))}")
        return obj

    async def replace(self, res: Resource, body: Mapping[str, Any], namespace: str | None = None, *,
                      subresource: str | None = None) -> dict[str, Any]:
        ns = namespace or _namespace_of(body)
        name = _name_of(body)
        obj: dict[str, Any] = await self._request(
            "PUT", res.path(ns, name, subresource), body=dict(body),
            what=f"replace {res.kind} {_where(ns, name)}{'/' + subresource if subresource else ''}")
        return obj

    async def patch(self, res: Resource, name: str, patch: Any, namespace: str | None = None, *,
                    patch_type: PatchType = "merge", subresource: str | None = None,
                    field_manager: str | None = None, force: bool = False) -> dict[str, Any]:
        """Patch; ``json`` takes a list of operations, the others an object; ``apply`` is server-side apply."""
        query: list[tuple[str, str]] = []
        if patch_type == "apply":
            query.append(("fieldManager", field_manager or DEFAULT_FIELD_MANAGER))
            if force:
                query.append(("force", "true"))
        elif field_manager:
            query.append(("fieldManager", field_manager))
        obj: dict[str, Any] = await self._request(
            "PATCH", res.path(namespace, name, subresource), query=query, body=patch,
            content_type=CONTENT_TYPES[patch_type],
            what=f"patch ({patch_type}) {res.kind} {_where(namespace, name)}"
                 f"{'/' + subresource if subresource else ''}")
        return obj

    async def delete(self, res: Resource, name: str, namespace: str | None = None, *,
                     propagation: Literal["Background", "Foreground", "Orphan"] = "Background") -> None:
        await self._request("DELETE", res.path(namespace, name),
                            body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation},
                            what=f"delete {res.kind} {_where(namespace, name)}")

    # --- discovery and events ---

    async def served(self, res: Resource) -> bool:
        """Is ``res`` served now (its CRD installed)? Discovery answers are cached ``DISCOVERY_TTL`` seconds."""
        path = res.group_version_path
        cached = self._discovery.get(path)
        now = self.clock.monotonic()
        if cached is None or now - cached[0] > DISCOVERY_TTL:
            try:
                doc = await self._request("GET", path, what=f"discover {res.api_version}")
                plurals = {str(r.get("name")) for r in doc.get("resources") or [] if isinstance(r, dict)}
            except NotFound:
                plurals = set()
            cached = (now, plurals)
            self._discovery[path] = cached
        return res.plural in cached[1]

    async def event(self, involved: Mapping[str, Any], *, type: Literal["Normal", "Warning"], reason: str,
                    message: str, component: str, once: bool = False) -> None:
        """Record a core/v1 Event on ``involved``; best effort: failures are reported to ``side`` (logged once per
        cause, counted) or logged, never raised. ``once``: one such Event per object and reason, whichever process
        records it (while the server keeps Events): it is named after the object's uid and the reason, and one
        already there is the one."""
        meta = involved.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        # named as client-go's recorder names them, "<object>.<its UnixNano in hex>", made strictly increasing in
        # this process so that two Events of one object in the same nanosecond do not collide
        stamp = self._event_ns = max(time.time_ns(), self._event_ns + 1)
        suffix = hashlib.sha256(f"{meta.get('uid')}/{reason}".encode()).hexdigest()[:16] if once else f"{stamp:x}"
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta.get('name', 'object')}.{suffix}", "namespace": namespace},
            "involvedObject": {
                "apiVersion": involved.get("apiVersion"), "kind": involved.get("kind"),
                "name": meta.get("name"), "namespace": meta.get("namespace"), "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "type": type, "reason": reason, "message": message[:1024],
            "source": {"component": component}, "reportingComponent": component,
            "reportingInstance": component, "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            await self.create(EVENTS, body, namespace)
        except AlreadyExists:
            if not once:  # (a name of its own each time: two Events of this process never collide)
                log.warning("could not record event %s on %s/%s: its name is taken", reason, namespace,
                            meta.get("name"))
                return
        except (FederationError, RuntimeError) as exc:
            if self.side is not None:
                self.side.failed("events", exc)
            else:
                log.warning("could not record event %s on %s/%s: %s", reason, namespace, meta.get("name"), exc)
            return
        if self.side is not None and self.side.faults:
            self.side.ok("events")

    # --- informer ---

    def informer(self, res: Resource, namespace: str | None = None, *,
                 label_selector: str | None = None, compact: bool = False,
                 listed: Callable[[], None] | None = None,
                 known: Mapping[tuple[str, str], Mapping[str, Any]] | None = None,
                 echoes: EchoCheck | None = None) -> AsyncIterator[WatchEvent]:
        """List (ADDED for each), then watch; see ``_Informer``. Never ends by itself. ``compact``: the
        informer keeps only each object's resourceVersion and uid (not the object), for a consumer that
        holds what it needs itself; a DELETED event found by a relist then carries a stub (apiVersion,
        kind, metadata name / namespace / uid / resourceVersion) instead of the last object seen.
        ``listed`` is called each time a (re)list is complete and its every event was taken, before
        the watch starts (a consumer that must know when it has seen everything once).
        ``known``: what the consumer holds already, by (namespace, name) -- each at least its metadata's
        name, uid and resourceVersion -- when it was told by an informer before this one (one that
        failed and is being replaced): the first list then reports DELETED for what of it is gone and
        MODIFIED for what changed, as a relist does, instead of ADDED for everything and nothing for
        what vanished meanwhile. Only what the list would hold (same namespace, matching selector).
        ``echoes``: see :data:`EchoCheck`; a watch event it claims is not decoded and not yielded."""
        return _Informer(self, res, namespace, label_selector, compact, listed, known, echoes).run()

    def _start_watch(self, res: Resource, namespace: str | None, label_selector: str | None,
                     resource_version: str) -> _WatchStream:
        query = [("watch", "true"), ("resourceVersion", resource_version), ("allowWatchBookmarks", "true"),
                 ("timeoutSeconds", str(self.settings.watch_timeout))]
        if label_selector:
            query.append(("labelSelector", label_selector))
        if Kube.recorder is not None:
            Kube.recorder(self.user_agent, Call("watch", res.group, res.plural, namespace or ""))
        stream = _WatchStream(self, res.path(namespace), query, f"watch {res.plural}")
        self._watches.add(stream)
        stream.start()
        return stream


def _where(namespace: str | None, name: str | None) -> str:
    return f"{namespace}/{name}" if namespace else str(name)


def _name_of(body: Mapping[str, Any]) -> str:
    name = (body.get("metadata") or {}).get("name")
    if not name:
        raise Invalid("metadata.name", "is required", fix="set metadata.name")
    return str(name)


def _namespace_of(body: Mapping[str, Any]) -> str | None:
    ns = (body.get("metadata") or {}).get("namespace")
    return str(ns) if ns else None


@dataclass
class _WatchStream:
    """One watch request streaming in its own thread; lines, the end, or an error go to ``queue``."""

    kube: Kube
    path: str
    query: list[tuple[str, str]]
    what: str
    queue: asyncio.Queue[tuple[str, Any]] = field(default_factory=asyncio.Queue)
    _loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop)
    _stopped: threading.Event = field(default_factory=threading.Event)
    _response: urllib3.BaseHTTPResponse | None = None
    _pending: list[tuple[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __hash__(self) -> int:
        return id(self)

    def start(self) -> None:
        threading.Thread(target=self._run, name=self.what, daemon=True).start()

    def stop(self) -> None:
        """Unblock the thread's read and let it exit; safe from any thread, any number of times."""
        self._stopped.set()
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()  # type: ignore[attr-defined]
        self.kube._watches.discard(self)

    def _put(self, item: tuple[str, Any]) -> None:
        """Queue ``item`` for the loop. Items that arrive while the loop has not yet taken the previous
        ones join them: one wake-up of the loop for many watch events when it is busy."""
        if self._stopped.is_set():
            return
        with self._lock:
            self._pending.append(item)
            if len(self._pending) > 1:
                return  # a hand-over is already scheduled and will carry this one too
        with contextlib.suppress(RuntimeError):  # loop closed
            self._loop.call_soon_threadsafe(self._hand_over)

    def _hand_over(self) -> None:
        with self._lock:
            items, self._pending = self._pending, []
        for item in items:
            self.queue.put_nowait(item)

    def _run(self) -> None:
        try:
            with _guard(self.what):
                settings = self.kube.settings
                # A read timeout beyond the server's timeoutSeconds notices a connection that died silently.
                timeout = urllib3.Timeout(connect=settings.timeout, read=settings.watch_timeout + 30)
                response = self.kube._open_response("GET", self.path, self.query, None, None, timeout)
                self._response = response
                if self._stopped.is_set():
                    response.shutdown()  # type: ignore[attr-defined]
                if response.status != 200:
                    data = response.read()
                    response.release_conn()
                    if response.status == 410:
                        self._put(("gone", None))
                        return
                    raise _error_for_status(response.status, data, dict(response.headers), self.what,
                                            lambda: call_of("GET", self.path, watch=True))
                buffer = b""
                for chunk in _chunks(response):
                    if self._stopped.is_set():
                        break
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if line.strip():
                            self._put(("line", line))
                response.release_conn()
            self._put(("end", None))
        except FederationError as exc:
            self._put(("error", exc))
        except Exception as exc:  # the thread must always report, never die silently
            self._put(("error", Transport(f"{self.what}: {type(exc).__name__}: {exc}")))
        finally:
            self.kube._watches.discard(self)


def _chunks(response: urllib3.BaseHTTPResponse) -> Iterator[bytes]:
    if getattr(response, "chunked", False):
        yield from response.read_chunked(decode_content=True)  # type: ignore[attr-defined]
        return
    while chunk := response.read1(65536):  # type: ignore[attr-defined]
        yield chunk


EchoCheck = Callable[[int, bytes], dict[str, Any] | None]
"""An informer consumer's check of a watch event before it is decoded: called with the first resourceVersion
in an ADDED or MODIFIED event's line (the object's own, unless its metadata lists labels or annotations first
and one of them looks like it) and the line; when that version is one
the consumer wrote itself and already holds (the watch echoing its own create or write), it returns what it
holds of the object (at least metadata name, namespace, uid, resourceVersion), handles the echo itself, and the
event is neither decoded nor yielded; otherwise None. A check must not claim a line that is not the echo: the
agent's (``ObjectCache.echo``) also wants the object's uid in the line."""

_WATCH_OBJECT_RV = re.compile(rb'"resourceVersion":"([0-9]+)"')
_ECHO_TYPES = (b'{"type":"ADDED"', b'{"type":"MODIFIED"')


class _Informer:
    """List, then watch from the list's resourceVersion; resume after drops, relist on 410 Gone.

    ``known`` is what the consumer has been told (at first, what it says it holds: ``Kube.informer``'s
    ``known``); after a relist the difference between it and the new list is emitted (ADDED / MODIFIED /
    DELETED) so the consumer's view is complete.
    Transport errors back off (capped, on the Kube's clock) and retry; NotFound (the CRD is not
    installed yet) retries too; Permanent errors (forbidden, invalid selector) are raised.
    """

    BACKOFF_INITIAL = 0.2
    BACKOFF_MAX = 5.0
    """Capped low: after an API-server outage the informer is back within seconds (one client per kind)."""

    def __init__(self, kube: Kube, res: Resource, namespace: str | None, label_selector: str | None,
                 compact: bool = False, listed: Callable[[], None] | None = None,
                 known: Mapping[tuple[str, str], Mapping[str, Any]] | None = None,
                 echoes: EchoCheck | None = None) -> None:
        self.kube = kube
        self.echoes = echoes
        self.listed = listed
        self.res = res
        self.namespace = namespace
        self.label_selector = label_selector
        self.compact = compact
        self.known: dict[str, dict[str, Any] | tuple[str | int, str]] = {
            f"{ns}/{name}": self._kept(dict(obj)) for (ns, name), obj in (known or {}).items()}
        """What the consumer was told, by ``namespace/name`` (:func:`_key`): the object, or (resourceVersion, uid)
        when ``compact``; at first what the consumer said it holds (``Kube.informer``'s ``known``)."""
        self.resource_version = ""
        self.failures = 0

    async def _backoff(self, exc: FederationError) -> None:
        self.failures += 1
        delay = capped(self.failures, self.BACKOFF_INITIAL, self.BACKOFF_MAX,
                       exc.delay if isinstance(exc, Transport) else 0.0)
        log.warning("%s informer: %s; retrying in %.1fs", self.res.plural, exc, delay)
        await self.kube.clock.sleep(delay)

    async def _relist(self) -> list[WatchEvent]:
        listed = await self.kube.list(self.res, self.namespace, label_selector=self.label_selector)
        fresh = {_key(o): o for o in listed.items}
        events: list[WatchEvent] = []
        for key, obj in fresh.items():
            old = self.known.get(key)
            if old is None:
                events.append(WatchEvent("ADDED", obj))
            elif self._rv_known(old) != _rv(obj):
                events.append(WatchEvent("MODIFIED", obj))
        events.extend(WatchEvent("DELETED", self._last(key, old)) for key, old in self.known.items()
                      if key not in fresh)
        self.known = {key: self._kept(obj) for key, obj in fresh.items()} if self.compact else dict(fresh)
        self.resource_version = listed.resource_version
        return events

    async def _relist_paged(self) -> AsyncIterator[WatchEvent]:
        """``compact``: the relist's events a page at a time, never the whole list at once; what is
        known is replaced only once the list is complete."""
        fresh: dict[str, dict[str, Any] | tuple[str | int, str]] = {}
        resource_version = ""
        async for page in self.kube.list_pages(self.res, self.namespace, label_selector=self.label_selector):
            resource_version = resource_version or page.resource_version
            events: list[WatchEvent] = []
            for obj in page.items:
                key = _key(obj)
                old = self.known.get(key)
                fresh[key] = self._kept(obj)
                if old is None:
                    events.append(WatchEvent("ADDED", obj))
                elif self._rv_known(old) != _rv(obj):
                    events.append(WatchEvent("MODIFIED", obj))
            del page
            events.reverse()
            while events:
                yield events.pop()
        for key in [k for k in self.known if k not in fresh]:
            yield WatchEvent("DELETED", self._last(key, self.known[key]))
        self.known = fresh
        self.resource_version = resource_version

    def _apply(self, line: bytes) -> WatchEvent | Literal["gone"] | None:
        if self.echoes is not None and line.startswith(_ECHO_TYPES):
            # the first resourceVersion in the line: the object's own wherever its metadata has it before labels
            # and annotations (a typed object's does); when it is not, the check finds no version of its own
            found = _WATCH_OBJECT_RV.search(line)
            held = None if found is None else self.echoes(int(found.group(1)), line)
            if found is not None and held is not None:  # the consumer's own write, held and handled (EchoCheck)
                self.resource_version = found.group(1).decode()
                self.known[_key(held)] = self._kept(held)  # the consumer's own dict: it holds it anyway
                return None
        try:
            doc = orjson.loads(line)
        except orjson.JSONDecodeError:
            log.warning("%s watch: undecodable line dropped: %r", self.res.plural, line[:200])
            return None
        kind = doc.get("type")
        obj = doc.get("object") or {}
        if kind == "BOOKMARK":
            self.resource_version = _rv(obj) or self.resource_version
            return None
        if kind == "ERROR":
            if obj.get("code") == 410:
                return "gone"
            raise _error_for_status(int(obj.get("code") or 500), line, {}, f"watch {self.res.plural}")
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            return None
        self.resource_version = _rv(obj) or self.resource_version
        if kind == "DELETED":
            self.known.pop(_key(obj), None)
        else:
            self.known[_key(obj)] = self._kept(obj)
        return WatchEvent(kind, obj)

    def _kept(self, obj: dict[str, Any]) -> dict[str, Any] | tuple[str | int, str]:
        if not self.compact:
            return obj
        rv = _rv(obj)  # kept as a number when it is one (the API server's are): 100,000 of them
        number = rv.isascii() and rv.isdigit() and (rv == "0" or rv[0] != "0")
        return (int(rv) if number else rv, str((obj.get("metadata") or {}).get("uid") or ""))

    @staticmethod
    def _rv_known(kept: dict[str, Any] | tuple[str | int, str]) -> str:
        return str(kept[0]) if isinstance(kept, tuple) else _rv(kept)

    def _last(self, key: str, kept: dict[str, Any] | tuple[str | int, str]) -> dict[str, Any]:
        """The last object seen under ``key``, or its stub when ``compact``."""
        if not isinstance(kept, tuple):
            return kept
        namespace, _, name = key.partition("/")
        meta = {"name": name, "uid": kept[1], "resourceVersion": str(kept[0])}
        if namespace:
            meta["namespace"] = namespace
        return {"apiVersion": self.res.api_version, "kind": self.res.kind, "metadata": meta}

    async def run(self) -> AsyncIterator[WatchEvent]:
        need_list = True
        while True:
            if need_list and self.compact:
                try:
                    async for event in self._relist_paged():
                        yield event
                except (Transport, NotFound, Conflict) as exc:
                    await self._backoff(exc)  # listed again from the start: what was sent comes as ADDED again
                    continue
                need_list = False
                self.failures = 0
                if self.listed is not None:
                    self.listed()
            elif need_list:
                try:
                    events = await self._relist()
                except (Transport, NotFound, Conflict) as exc:
                    await self._backoff(exc)
                    continue
                need_list = False
                self.failures = 0  # listed: the next failure starts from the initial delay again
                events.reverse()
                while events:  # each object let go once handed over (a list may hold every Job of a cluster)
                    yield events.pop()
                if self.listed is not None:
                    self.listed()
            stream = self.kube._start_watch(self.res, self.namespace, self.label_selector, self.resource_version)
            started = time.monotonic()
            try:
                while True:
                    what, value = await stream.queue.get()
                    if what == "line":
                        try:
                            outcome = self._apply(value)
                        except Permanent:
                            raise
                        except FederationError as exc:  # an ERROR event other than 410
                            await self._backoff(exc)
                            break
                        if outcome == "gone":
                            need_list = True
                            break
                        if outcome is not None:
                            self.failures = 0
                            yield outcome
                    elif what == "gone":
                        need_list = True
                        break
                    elif what == "end":
                        break
                    else:
                        error: FederationError = value
                        if isinstance(error, Permanent):
                            raise error
                        await self._backoff(error)
                        break
            finally:
                stream.stop()
            if not need_list and time.monotonic() - started < 0.05 and self.failures == 0:
                # A watch that ends at once every time (a proxy closing it) must not spin.
                await self.kube.clock.sleep(self.BACKOFF_INITIAL)
