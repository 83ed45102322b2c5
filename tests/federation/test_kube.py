"""federation.kube over HTTP through the official client's configuration and connection pool.

The server is a small in-test API server (aiohttp) that speaks the parts of the Kubernetes API that
``Kube`` uses: CRUD with resourceVersions, merge / JSON / apply patches, Status bodies, paging,
discovery, and watches with bookmarks, 410 Gone and fault injection (drop watches, fail with 5xx).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from aiohttp import web

from federation.errors import AlreadyExists, Conflict, Invalid, NotFound, Permanent, Transport
from federation.kube import (
    CONFIGMAPS,
    CRDS,
    EVENTS,
    JOBS,
    NAMESPACES,
    PODS,
    Kube,
    Resource,
    WatchEvent,
    resource_for,
)

TIMEOUT = 10.0
WIDGETS = Resource("example.com", "v1", "widgets", "Widget")
GADGETS = Resource("example.com", "v1", "gadgets", "Gadget")


# --- a tiny API server ---------------------------------------------------------------------


@dataclass
class FakeApi:
    objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)  # (plural, ns, name)
    history: list[tuple[int, str, str, dict[str, Any]]] = field(default_factory=list)  # rv, type, plural, obj
    rv: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    last_rv: int = 0
    compacted_below: int = 0
    fail_status: int = 0
    fail_count: int = 0
    watch_conns: list[web.StreamResponse] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    watch_requests: list[dict[str, str]] = field(default_factory=list)
    patches: list[tuple[str, str]] = field(default_factory=list)  # (content type, query)
    bookmark_sent: asyncio.Event = field(default_factory=asyncio.Event)

    def bump(self, type_: str, plural: str, obj: dict[str, Any]) -> None:
        self.last_rv = next(self.rv)
        obj["metadata"]["resourceVersion"] = str(self.last_rv)
        self.history.append((self.last_rv, type_, plural, json.loads(json.dumps(obj))))
        self.changed.set()
        self.changed = asyncio.Event()

    async def drop_watches(self) -> None:
        conns, self.watch_conns = self.watch_conns, []
        for c in conns:
            if c.task is not None:
                c.task.cancel()


def status(code: int, reason: str, message: str, causes: list[dict[str, str]] | None = None,
           headers: dict[str, str] | None = None) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason,
            "message": message}
    if causes:
        body["details"] = {"causes": causes}
    return web.json_response(body, status=code, headers=headers)


def make_app(api: FakeApi) -> web.Application:
    async def discovery(request: web.Request) -> web.Response:
        if request.match_info["group"] != "example.com":
            return status(404, "NotFound", "no such group")
        return web.json_response({"kind": "APIResourceList", "groupVersion": "example.com/v1",
                                  "resources": [{"name": "widgets", "namespaced": True, "kind": "Widget"}]})

    async def handle(request: web.Request) -> web.StreamResponse:
        if api.fail_count > 0:
            api.fail_count -= 1
            return status(api.fail_status, "InternalError", "injected", headers={"Retry-After": "0"})
        info = request.match_info
        plural, ns, name = info["plural"], info.get("ns", ""), info.get("name", "")
        method = request.method
        if method == "GET" and not name:
            if request.query.get("watch") == "true":
                return await watch(request, plural, ns)
            items = sorted((o for (p, n, _), o in api.objects.items() if p == plural and (not ns or n == ns)),
                           key=lambda o: o["metadata"]["name"])
            sel = request.query.get("labelSelector")
            if sel:
                k, v = sel.split("=")
                items = [o for o in items if (o["metadata"].get("labels") or {}).get(k) == v]
            limit = int(request.query.get("limit", "0") or 0)
            start = int(request.query.get("continue", "0") or 0)
            page = items[start:start + limit] if limit else items[start:]
            cont = str(start + limit) if limit and start + limit < len(items) else ""
            return web.json_response({"kind": "List", "metadata": {"resourceVersion": str(api.last_rv),
                                                                   "continue": cont}, "items": page})
        if method == "POST":
            body = await request.json()
            oname = body["metadata"].get("name", "")
            if not oname:
                return status(422, "Invalid", "name required",
                              [{"field": "metadata.name", "message": "Required value"}])
            if (plural, ns, oname) in api.objects:
                return status(409, "AlreadyExists", f'{plural} "{oname}" already exists')
            body["metadata"].update(namespace=ns or None, uid=f"uid-{oname}")
            api.objects[(plural, ns, oname)] = body
            api.bump("ADDED", plural, body)
            return web.json_response(body, status=201)
        key = (plural, ns, name)
        if key not in api.objects and not (method == "PATCH" and "apply" in request.content_type):
            return status(404, "NotFound", f'{plural} "{name}" not found')
        if method == "GET":
            return web.json_response(api.objects[key])
        if method == "DELETE":
            opts = await request.json()
            obj = api.objects.pop(key)
            obj.setdefault("metadata", {})["annotations"] = {"propagation": opts.get("propagationPolicy")}
            api.bump("DELETED", plural, obj)
            return web.json_response({"kind": "Status", "status": "Success"})
        if method == "PUT":
            body = await request.json()
            if body["metadata"].get("resourceVersion") != api.objects[key]["metadata"]["resourceVersion"]:
                return status(409, "Conflict", "the object has been modified")
            if info.get("sub") == "status":
                merged = dict(api.objects[key])
                merged["status"] = body.get("status")
                body = merged
            api.objects[key] = body
            api.bump("MODIFIED", plural, body)
            return web.json_response(body)
        if method == "PATCH":
            api.patches.append((request.content_type, request.query_string))
            patch = await request.json()
            current = json.loads(json.dumps(api.objects.get(key) or {"metadata": {"name": name}}))
            if request.content_type == "application/json-patch+json":
                for op in patch:
                    target = current
                    parts = op["path"].strip("/").split("/")
                    for p in parts[:-1]:
                        target = target.setdefault(p, {})
                    target[parts[-1]] = op["value"]
            else:
                merge(current, patch)
            api.objects[key] = current
            api.bump("MODIFIED", plural, current)
            return web.json_response(current)
        return status(405, "MethodNotAllowed", method)

    async def watch(request: web.Request, plural: str, ns: str) -> web.StreamResponse:
        api.watch_requests.append(dict(request.query))
        since = int(request.query["resourceVersion"] or 0)
        if since < api.compacted_below:
            return status(410, "Expired", "too old resource version")
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        api.watch_conns.append(resp)
        sent = since
        try:
            while True:
                if sent < api.compacted_below:
                    line = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
                    await resp.write(json.dumps(line).encode() + b"\n")
                    return resp
                for rv, type_, kind, obj in list(api.history):
                    if rv <= sent or kind != plural or (ns and obj["metadata"].get("namespace") != ns):
                        continue
                    await resp.write(json.dumps({"type": type_, "object": obj}).encode() + b"\n")
                    sent = rv
                if api.last_rv > sent:
                    bookmark = {"kind": "ConfigMap", "metadata": {"resourceVersion": str(api.last_rv)}}
                    await resp.write(json.dumps({"type": "BOOKMARK", "object": bookmark}).encode() + b"\n")
                    sent = api.last_rv
                    api.bookmark_sent.set()
                waiter = api.changed
                await waiter.wait()
        except (ConnectionResetError, asyncio.CancelledError):
            return resp

    app = web.Application()
    app.router.add_get("/apis/{group}/v1", discovery)
    for prefix in ("/api/v1", "/apis/{group}/{version}"):
        app.router.add_route("*", prefix + "/{plural}", handle)
        app.router.add_route("*", prefix + "/namespaces/{ns}/{plural}", handle)
        app.router.add_route("*", prefix + "/namespaces/{ns}/{plural}/{name}", handle)
        app.router.add_route("*", prefix + "/namespaces/{ns}/{plural}/{name}/{sub}", handle)
        app.router.add_route("*", prefix + "/{plural}/{name}", handle)
    return app


def merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            merge(target[k], v)
        else:
            target[k] = v


@pytest.fixture
async def fake(tmp_path: Path) -> AsyncIterator[tuple[FakeApi, Path]]:
    api = FakeApi()
    runner = web.AppRunner(make_app(api), shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t0ken"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}],
    }))
    try:
        yield api, kubeconfig
    finally:
        await api.drop_watches()
        await runner.cleanup()


# --- tests ---------------------------------------------------------------------------------


def test_resource_paths() -> None:
    assert PODS.path("ns1", "p", "status") == "/api/v1/namespaces/ns1/pods/p/status"
    assert PODS.path() == "/api/v1/pods"
    assert NAMESPACES.path(name="x") == "/api/v1/namespaces/x"
    assert JOBS.path("a") == "/apis/batch/v1/namespaces/a/jobs"
    assert JOBS.api_version == "batch/v1" and PODS.api_version == "v1"
    # a segment is escaped as quote(safe="") escapes it; the plain names most objects have pass unchanged
    for odd in ("a b", "a/b", "naïve", "x?y#z", "50%", "a+b", "", "job-1.v_2~x"):
        assert PODS.path("n s", odd) == f"/api/v1/namespaces/n%20s/pods/{quote(odd, safe='')}"

    class PyTorch:
        name = "PyTorchJob"
        group = "kubeflow.org"
        version = "v1"
        plural = "pytorchjobs"

    assert resource_for(PyTorch()).path("t", "j") == "/apis/kubeflow.org/v1/namespaces/t/pytorchjobs/j"


async def test_crud_and_errors(fake: tuple[FakeApi, Path]) -> None:
    api, kubeconfig = fake
    async with Kube(kubeconfig) as kube:
        cm = await kube.create(CONFIGMAPS, {"metadata": {"name": "a", "namespace": "ns"}, "data": {"k": "1"}})
        assert cm["metadata"]["uid"] == "uid-a"
        with pytest.raises(AlreadyExists):
            await kube.create(CONFIGMAPS, {"metadata": {"name": "a"}}, "ns")
        with pytest.raises(Invalid) as invalid:
            await kube.create(CONFIGMAPS, {"metadata": {"name": ""}}, "ns")
        assert invalid.value.field == "metadata.name"
        got = await kube.get(CONFIGMAPS, "a", "ns")
        assert got["data"] == {"k": "1"}
        got["data"]["k"] = "2"
        replaced = await kube.replace(CONFIGMAPS, got)
        with pytest.raises(Conflict) as conflict:
            await kube.replace(CONFIGMAPS, got)  # stale resourceVersion
        assert not isinstance(conflict.value, AlreadyExists)
        assert replaced["data"]["k"] == "2"
        await kube.delete(CONFIGMAPS, "a", "ns", propagation="Foreground")
        assert api.history[-1][3]["metadata"]["annotations"] == {"propagation": "Foreground"}
        with pytest.raises(NotFound):
            await kube.get(CONFIGMAPS, "a", "ns")
        with pytest.raises(NotFound):
            await kube.delete(CONFIGMAPS, "a", "ns")


async def test_list_pages_and_selectors(fake: tuple[FakeApi, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    _, kubeconfig = fake
    monkeypatch.setattr("federation.kube.LIST_PAGE", 3)
    async with Kube(kubeconfig) as kube:
        await asyncio.gather(*(kube.create(PODS, {"metadata": {"name": f"p{i:02}", "labels": {"odd": str(i % 2)}}},
                                           "ns") for i in range(10)))
        listed = await kube.list(PODS, "ns")
        assert [p["metadata"]["name"] for p in listed.items] == [f"p{i:02}" for i in range(10)]
        assert listed.resource_version == "10"
        assert all(p["kind"] == "Pod" and p["apiVersion"] == "v1" for p in listed.items)
        odd = await kube.list(PODS, "ns", label_selector="odd=1")
        assert len(odd.items) == 5


async def test_patch_types(fake: tuple[FakeApi, Path]) -> None:
    api, kubeconfig = fake
    async with Kube(kubeconfig) as kube:
        await kube.create(WIDGETS, {"metadata": {"name": "w"}, "spec": {"a": 1, "b": 2}}, "ns")
        merged = await kube.patch(WIDGETS, "w", {"spec": {"b": None, "c": 3}}, "ns")
        assert merged["spec"] == {"a": 1, "c": 3}
        jsoned = await kube.patch(WIDGETS, "w", [{"op": "replace", "path": "/spec/a", "value": 9}], "ns",
                                  patch_type="json")
        assert jsoned["spec"]["a"] == 9
        await kube.patch(WIDGETS, "w", {"spec": {"d": 4}}, "ns", patch_type="strategic")
        applied = await kube.patch(WIDGETS, "w2", {"apiVersion": "example.com/v1", "kind": "Widget",
                                                   "metadata": {"name": "w2"}, "spec": {"x": 1}}, "ns",
                                   patch_type="apply", field_manager="mkd-agent", force=True)
        assert applied["spec"] == {"x": 1}
        await kube.patch(WIDGETS, "w", {"status": {"phase": "Ok"}}, "ns", subresource="status")
    assert [ct for ct, _ in api.patches] == [
        "application/merge-patch+json", "application/json-patch+json",
        "application/strategic-merge-patch+json", "application/apply-patch+yaml",
        "application/merge-patch+json"]
    assert api.patches[3][1] == "fieldManager=mkd-agent&force=true"


async def test_transport_and_permanent_errors(fake: tuple[FakeApi, Path], tmp_path: Path) -> None:
    api, kubeconfig = fake
    async with Kube(kubeconfig) as kube:
        api.fail_status, api.fail_count = 503, 1
        with pytest.raises(Transport) as transport:
            await kube.get(PODS, "x", "ns")
        assert transport.value.delay == 0.0  # from Retry-After
        api.fail_status, api.fail_count = 403, 1
        with pytest.raises(Permanent) as forbidden:
            await kube.get(PODS, "x", "ns")
        assert forbidden.value.reason == "Forbidden"
    dead = tmp_path / "dead"
    config = json.loads(kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = "http://127.0.0.1:9"  # nothing listens there
    dead.write_text(json.dumps(config))
    async with Kube(dead) as kube:
        with pytest.raises(Transport):
            await kube.get(PODS, "x", "ns")
    with pytest.raises(Permanent, match="kubeconfig"):
        async with Kube(tmp_path / "missing"):
            pass


async def test_served_and_event(fake: tuple[FakeApi, Path]) -> None:
    api, kubeconfig = fake
    async with Kube(kubeconfig) as kube:
        assert await kube.served(WIDGETS)
        assert not await kube.served(GADGETS)
        assert not await kube.served(Resource("nothere.io", "v1", "things", "Thing"))
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "ns", "uid": "u1"}}
        await kube.event(job, type="Warning", reason="Rejected", message="no room", component="mkd-agent")
        events = (await kube.list(EVENTS, "ns")).items
        assert len(events) == 1
        assert events[0]["involvedObject"]["uid"] == "u1" and events[0]["reason"] == "Rejected"
        api.fail_status, api.fail_count = 500, 1
        await kube.event(job, type="Normal", reason="X", message="y", component="c")  # logged, not raised


async def test_events_are_named_as_client_go_names_them_and_never_collide(fake: tuple[FakeApi, Path]) -> None:
    """``<object>.<UnixNano in hex>`` (client-go's recorder), strictly increasing: many Events of one object at
    once each get a name of their own."""
    _, kubeconfig = fake
    async with Kube(kubeconfig) as kube:
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "ns", "uid": "u1"}}
        before = time.time_ns()
        for i in range(20):
            await kube.event(job, type="Normal", reason="R", message=str(i), component="c")
        names = [e["metadata"]["name"] for e in (await kube.list(EVENTS, "ns")).items]
        assert len(set(names)) == 20
        stamps = [int(n.removeprefix("j."), 16) for n in names]
        assert all(before <= t <= time.time_ns() for t in stamps)


async def next_event(it: AsyncIterator[WatchEvent]) -> WatchEvent:
    return await asyncio.wait_for(anext(it), TIMEOUT)


async def test_informer_lists_watches_and_resumes_after_drop(fake: tuple[FakeApi, Path]) -> None:
    api, kubeconfig = fake
    async with Kube(kubeconfig) as kube:
        await kube.create(CONFIGMAPS, {"metadata": {"name": "a"}}, "ns")
        it = kube.informer(CONFIGMAPS, "ns")
        first = await next_event(it)
        assert (first.type, first.object["metadata"]["name"]) == ("ADDED", "a")
        await kube.create(CONFIGMAPS, {"metadata": {"name": "b"}}, "ns")
        second = await next_event(it)
        assert (second.type, second.object["metadata"]["name"]) == ("ADDED", "b")
        # a change to another type moves the watched collection's version on only through a bookmark
        api.bookmark_sent.clear()
        await kube.create(PODS, {"metadata": {"name": "p"}}, "ns")
        await asyncio.wait_for(api.bookmark_sent.wait(), TIMEOUT)
        await api.drop_watches()
        await kube.patch(CONFIGMAPS, "a", {"data": {"x": "1"}}, "ns")
        third = await next_event(it)
        assert (third.type, third.object["data"]) == ("MODIFIED", {"x": "1"})
        # resumed from the bookmark's version (3, the pod), not relisted from scratch
        assert [w["resourceVersion"] for w in api.watch_requests] == ["1", "3"]
        assert all(w["allowWatchBookmarks"] == "true" for w in api.watch_requests)
        await it.aclose()  # type: ignore[attr-defined]
        assert not kube._watches


@pytest.mark.parametrize("compact", [False, True])
async def test_informer_relists_on_410_and_emits_the_difference(fake: tuple[FakeApi, Path], compact: bool) -> None:
    """The same events whether the informer keeps each object or (compact) only its version and uid."""
    api, kubeconfig = fake
    async with Kube(kubeconfig) as kube:
        created = {}
        for name in ("keep", "change", "gone"):
            created[name] = await kube.create(CONFIGMAPS, {"metadata": {"name": name}}, "ns")
        it = kube.informer(CONFIGMAPS, "ns", compact=compact)
        assert {(await next_event(it)).object["metadata"]["name"] for _ in range(3)} == {"keep", "change", "gone"}
        await kube.create(CONFIGMAPS, {"metadata": {"name": "x"}}, "ns")
        assert (await next_event(it)).object["metadata"]["name"] == "x"  # the watch is streaming now
        # Changes the watch never shows: history compacted, then the open watch sends ERROR 410
        api.history.clear()
        api.rv = itertools.count(100)
        api.objects[("configmaps", "ns", "change")]["data"] = {"v": "2"}
        api.objects[("configmaps", "ns", "change")]["metadata"]["resourceVersion"] = "98"
        del api.objects[("configmaps", "ns", "gone")]
        api.objects[("configmaps", "ns", "new")] = {"metadata": {"name": "new", "namespace": "ns",
                                                               "resourceVersion": "99"}}
        api.last_rv = 99
        api.compacted_below = 50
        api.changed.set()
        events = [await next_event(it) for _ in range(3)]
        got = {(e.type, e.object["metadata"]["name"]) for e in events}
        assert got == {("MODIFIED", "change"), ("DELETED", "gone"), ("ADDED", "new")}
        deleted = next(e.object for e in events if e.type == "DELETED")
        gone = created["gone"]["metadata"]
        assert deleted["metadata"]["uid"] == gone["uid"] and deleted["metadata"]["namespace"] == "ns"
        assert deleted["metadata"]["resourceVersion"] == gone["resourceVersion"]
        if compact:  # a stub: what the consumer needs to forget the object, nothing it did not keep
            assert deleted == {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
                "name": "gone", "namespace": "ns", "uid": gone["uid"], "resourceVersion": gone["resourceVersion"]}}
        # the next watch starts from the relist's version
        await kube.create(CONFIGMAPS, {"metadata": {"name": "later"}}, "ns")
        later = await next_event(it)
        assert (later.type, later.object["metadata"]["name"]) == ("ADDED", "later")
        assert api.watch_requests[-1]["resourceVersion"] == "99"
        # HTTP 410 on the watch request itself: relist, nothing changed, so nothing emitted but the new one
        api.compacted_below = 1000
        await api.drop_watches()
        api.objects[("configmaps", "ns", "after")] = {"metadata": {"name": "after", "namespace": "ns",
                                                                 "resourceVersion": "1001"}}
        api.last_rv = 1001
        after = await next_event(it)
        assert (after.type, after.object["metadata"]["name"]) == ("ADDED", "after")
        await it.aclose()  # type: ignore[attr-defined]


@pytest.mark.parametrize("compact", [False, True])
async def test_informer_told_what_is_known_lists_the_difference(fake: tuple[FakeApi, Path], compact: bool) -> None:
    """An informer replacing one that failed is told what its consumer holds: its first list then reports
    what vanished meanwhile as DELETED (the consumer's own copy), what changed as MODIFIED, and nothing for
    what is as it was -- as a relist does."""
    _, kubeconfig = fake
    async with Kube(kubeconfig) as kube:
        held = {}
        for name in ("keep", "change", "gone"):
            obj = await kube.create(CONFIGMAPS, {"metadata": {"name": name}}, "ns")
            held[("ns", name)] = {"metadata": {k: obj["metadata"][k] for k in ("name", "namespace", "uid",
                                                                              "resourceVersion")}}
        await kube.replace(CONFIGMAPS, {**await kube.get(CONFIGMAPS, "change", "ns"), "data": {"v": "2"}}, "ns")
        await kube.delete(CONFIGMAPS, "gone", "ns")
        await kube.create(CONFIGMAPS, {"metadata": {"name": "new"}}, "ns")
        it = kube.informer(CONFIGMAPS, "ns", compact=compact, known=held)
        events = [await next_event(it) for _ in range(3)]
        assert {(e.type, e.object["metadata"]["name"]) for e in events} == {
            ("MODIFIED", "change"), ("DELETED", "gone"), ("ADDED", "new")}
        deleted = next(e.object for e in events if e.type == "DELETED")
        assert deleted["metadata"]["uid"] == held[("ns", "gone")]["metadata"]["uid"]
        await kube.create(CONFIGMAPS, {"metadata": {"name": "later"}}, "ns")
        later = await next_event(it)  # the watch: nothing more came of the list ("keep" is as it was)
        assert (later.type, later.object["metadata"]["name"]) == ("ADDED", "later")
        await it.aclose()  # type: ignore[attr-defined]


@pytest.mark.parametrize("compact", [False, True])
async def test_informer_says_when_each_list_is_complete(fake: tuple[FakeApi, Path], compact: bool) -> None:
    """``listed`` runs once the consumer has taken every event of a (re)list, before the watch: the
    dispatcher's intake lists the manager once at start, the informer's list, and needs to know its end."""
    api, kubeconfig = fake
    async with Kube(kubeconfig) as kube:
        for name in ("a", "b", "c"):
            await kube.create(CONFIGMAPS, {"metadata": {"name": name}}, "ns")
        taken: list[str] = []
        calls: list[int] = []
        it = kube.informer(CONFIGMAPS, "ns", compact=compact, listed=lambda: calls.append(len(taken)))
        for _ in range(3):
            taken.append((await next_event(it)).object["metadata"]["name"])
        assert calls == []  # the consumer has not asked for more yet
        await kube.create(CONFIGMAPS, {"metadata": {"name": "x"}}, "ns")
        taken.append((await next_event(it)).object["metadata"]["name"])
        assert calls == [3] and taken[3] == "x"  # the list ended after the three, then the watch
        api.compacted_below = 1000  # the next watch is refused with 410: a relist, complete again
        await api.drop_watches()
        api.objects[("configmaps", "ns", "after")] = {"metadata": {"name": "after", "namespace": "ns",
                                                                 "resourceVersion": "1001"}}
        api.last_rv = 1001
        taken.append((await next_event(it)).object["metadata"]["name"])
        assert taken[4] == "after" and calls == [3]  # the relist's one new object; its end not reached yet
        api.rv = itertools.count(2000)
        await kube.create(CONFIGMAPS, {"metadata": {"name": "y"}}, "ns")
        assert (await next_event(it)).object["metadata"]["name"] == "y"
        assert calls == [3, 5]
        await it.aclose()  # type: ignore[attr-defined]


async def test_informer_retries_transport_errors(fake: tuple[FakeApi, Path]) -> None:
    api, kubeconfig = fake
    async with Kube(kubeconfig) as kube:
        api.fail_status, api.fail_count = 500, 2
        it = kube.informer(CONFIGMAPS, "ns")
        task = asyncio.ensure_future(next_event(it))
        api.objects[("configmaps", "ns", "a")] = {"metadata": {"name": "a", "namespace": "ns",
                                                             "resourceVersion": "1"}}
        event = await task
        assert (event.type, event.object["metadata"]["name"]) == ("ADDED", "a")
        await it.aclose()  # type: ignore[attr-defined]


async def test_used_outside_context_is_an_error(fake: tuple[FakeApi, Path]) -> None:
    _, kubeconfig = fake
    kube = Kube(kubeconfig)
    with pytest.raises(RuntimeError):
        await kube.get(PODS, "x", "ns")
    async with kube:
        pass
    with pytest.raises(RuntimeError):
        await kube.get(PODS, "x", "ns")


# --- against kubesim (the emulator every other suite uses) ----------------------------------

import kubesim  # noqa: E402  (tests may import kubesim; production code may not)
from tests.waiting import eventually  # noqa: E402

GIZMOS = Resource("gizmo.mkd.dev", "v1", "gizmos", "Gizmo")


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[kubesim.Sim]:
    spec = kubesim.ClusterSpec("w1", [kubesim.NodeSpec("n1")])
    async with kubesim.serve_async([spec], tmp_path / "sim") as s:
        yield s


def gizmo_crd() -> dict[str, Any]:
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "gizmos.gizmo.mkd.dev"},
            "spec": {"group": "gizmo.mkd.dev", "scope": "Namespaced",
                     "names": {"plural": "gizmos", "singular": "gizmo", "kind": "Gizmo"},
                     "versions": [{"name": "v1", "served": True, "storage": True, "schema": schema,
                                   "subresources": {"status": {}}}]}}


async def eventually_served(kube: Kube, res: Resource) -> None:
    async def served() -> bool:
        kube._discovery.clear()
        return await kube.served(res)
    await eventually(served, what=f"{res.plural} to be served")


async def test_kubesim_crud_patches_and_errors(sim: kubesim.Sim) -> None:
    async with Kube(sim.kubeconfig("w1")) as kube:
        assert not await kube.served(GIZMOS)
        await kube.create(CRDS, gizmo_crd())
        await eventually_served(kube, GIZMOS)
        body = {"apiVersion": "gizmo.mkd.dev/v1", "kind": "Gizmo", "metadata": {"name": "g", "namespace": "default"},
                "spec": {"size": 1, "color": "red"}}
        created = await kube.create(GIZMOS, body)
        assert created["metadata"]["uid"] and created["metadata"]["resourceVersion"]
        with pytest.raises(AlreadyExists):
            await kube.create(GIZMOS, body)
        merged = await kube.patch(GIZMOS, "g", {"spec": {"color": None, "size": 2}}, "default")
        assert merged["spec"] == {"size": 2}
        patched = await kube.patch(GIZMOS, "g", [{"op": "add", "path": "/spec/shape", "value": "round"}], "default",
                                   patch_type="json")
        assert patched["spec"]["shape"] == "round"
        status = await kube.patch(GIZMOS, "g", {"status": {"ready": True}}, "default", subresource="status")
        assert status["status"] == {"ready": True}
        stale = dict(created)
        with pytest.raises(Conflict) as conflict:
            await kube.replace(GIZMOS, stale)
        assert not isinstance(conflict.value, AlreadyExists)
        fresh = await kube.get(GIZMOS, "g", "default")
        fresh["spec"]["size"] = 3
        assert (await kube.replace(GIZMOS, fresh))["spec"]["size"] == 3
        applied = await kube.patch(CONFIGMAPS, "cm", {"apiVersion": "v1", "kind": "ConfigMap",
                                                      "metadata": {"name": "cm"}, "data": {"a": "1"}},
                                   "default", patch_type="apply", field_manager="mkd-test", force=True)
        assert applied["data"] == {"a": "1"}
        strategic = await kube.patch(CONFIGMAPS, "cm", {"data": {"b": "2"}}, "default", patch_type="strategic")
        assert strategic["data"] == {"a": "1", "b": "2"}
        with pytest.raises(Invalid) as invalid:
            await kube.create(CONFIGMAPS, {"metadata": {"name": "Bad_Name"}}, "default")
        assert invalid.value.field == "metadata.name"
        await kube.delete(GIZMOS, "g", "default")
        with pytest.raises(NotFound):
            await kube.delete(GIZMOS, "g", "default")
        sim.cluster("w1").faults.fail(status=429, seconds=30)
        with pytest.raises(Transport) as throttled:
            await kube.get(GIZMOS, "g", "default")
        assert throttled.value.delay == 1.0  # Retry-After
        sim.cluster("w1").faults.fail(status=500, seconds=30)
        with pytest.raises(Transport):
            await kube.list(PODS, "default")
        sim.cluster("w1").faults.clear()


async def test_kubesim_informer_resumes_after_dropped_watches(sim: kubesim.Sim) -> None:
    async with Kube(sim.kubeconfig("w1")) as kube:
        await kube.create(CONFIGMAPS, {"metadata": {"name": "a"}, "data": {}}, "default")
        it = kube.informer(CONFIGMAPS, "default")
        seen = {(await next_event(it)).object["metadata"]["name"]}
        while "a" not in seen:
            seen.add((await next_event(it)).object["metadata"]["name"])
        sim.cluster("w1").faults.drop_watches()
        await kube.patch(CONFIGMAPS, "a", {"data": {"x": "1"}}, "default")
        event = await next_event(it)
        while event.object["metadata"]["name"] != "a":  # other ConfigMaps (kube-root-ca.crt is in every namespace)
            event = await next_event(it)
        assert (event.type, event.object["metadata"]["name"], event.object["data"]) == ("MODIFIED", "a", {"x": "1"})
        await kube.delete(CONFIGMAPS, "a", "default")
        deleted = await next_event(it)
        assert (deleted.type, deleted.object["metadata"]["name"]) == ("DELETED", "a")
        await it.aclose()  # type: ignore[attr-defined]
        assert not kube._watches


async def test_kubesim_informer_relists_after_compaction(sim: kubesim.Sim) -> None:
    store = sim.cluster("w1").store
    async with Kube(sim.kubeconfig("w1")) as kube:
        for name in ("keep", "change", "gone"):
            await kube.create(CONFIGMAPS, {"metadata": {"name": name, "labels": {"t": "r"}}, "data": {}}, "default")
        it = kube.informer(CONFIGMAPS, "default", label_selector="t=r")
        assert {(await next_event(it)).object["metadata"]["name"] for _ in range(3)} == {"keep", "change", "gone"}
        # The generator is parked at its last yield, so no watch is open: changes made now and then
        # compacted away are invisible to the watch it starts next, which gets ERROR 410 and relists.
        lists = 0
        real_list = kube.list

        async def counting_list(*args: Any, **kwargs: Any) -> Any:
            nonlocal lists
            lists += 1
            return await real_list(*args, **kwargs)

        kube.list = counting_list  # type: ignore[method-assign]
        await kube.patch(CONFIGMAPS, "change", {"data": {"v": "2"}}, "default")
        await kube.delete(CONFIGMAPS, "gone", "default")
        await kube.create(CONFIGMAPS, {"metadata": {"name": "new", "labels": {"t": "r"}}}, "default")
        await asyncio.to_thread(sim.run, store.compact)
        got = {(e.type, e.object["metadata"]["name"]) for e in [await next_event(it) for _ in range(3)]}
        assert got == {("MODIFIED", "change"), ("DELETED", "gone"), ("ADDED", "new")}
        await kube.create(CONFIGMAPS, {"metadata": {"name": "later", "labels": {"t": "r"}}}, "default")
        later = await next_event(it)
        assert (later.type, later.object["metadata"]["name"]) == ("ADDED", "later")
        assert lists == 1  # exactly one relist
        await it.aclose()  # type: ignore[attr-defined]


async def test_kubesim_informer_leaves_the_echo_its_consumer_claims_undecoded(sim: kubesim.Sim) -> None:
    """The watch event of the consumer's own create, which it holds already, is claimed
    before decoding and not yielded; other objects' events, and later changes of its own object, still are. The
    informer's resume point and what it was told move on with the claimed event."""
    from worker_agent.cache import ObjectCache

    cache = ObjectCache("configmaps")
    async with Kube(sim.kubeconfig("w1")) as kube:
        await kube.create(CONFIGMAPS, {"metadata": {"name": "seed", "labels": {"t": "e"}}}, "default")
        it = kube.informer(CONFIGMAPS, "default", label_selector="t=e", echoes=cache.echo)
        first = await next_event(it)
        assert (first.type, first.object["metadata"]["name"]) == ("ADDED", "seed")
        cache.upsert(first.object, watched=True)
        # the generator is parked at its yield: the watch it starts next sees these three
        mine = await kube.create(CONFIGMAPS, {"metadata": {"name": "mine", "labels": {"t": "e"}}}, "default")
        cache.upsert(dict(mine))  # the answer to the consumer's own write
        await kube.create(CONFIGMAPS, {"metadata": {"name": "other", "labels": {"t": "e"}}}, "default")
        changed = await kube.patch(CONFIGMAPS, "mine", {"data": {"x": "1"}}, "default")
        informer = it.ag_frame.f_locals["self"]  # type: ignore[attr-defined]
        other = await next_event(it)
        assert (other.type, other.object["metadata"]["name"]) == ("ADDED", "other")
        assert informer.known["default/mine"]["metadata"]["resourceVersion"] == mine["metadata"]["resourceVersion"]
        assert cache.watched_at(("default", "mine"), int(mine["metadata"]["resourceVersion"]))
        later = await next_event(it)
        assert (later.type, later.object["metadata"]["name"], later.object["data"]) == ("MODIFIED", "mine", {"x": "1"})
        assert informer.resource_version == changed["metadata"]["resourceVersion"]
        await it.aclose()  # type: ignore[attr-defined]
