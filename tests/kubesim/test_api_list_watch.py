"""Reads: label and field selectors, paging, all-namespace lists; watches from a version, bookmarks, 410."""

from __future__ import annotations

import json
import threading
import time

import pytest
from kubernetes import client, watch

import kubesim
from kubesim.testing import pod_body

pytestmark = pytest.mark.realcluster


def names(items: list) -> list[str]:
    # kube-root-ca.crt is in every namespace (root-ca-cert-publisher), on kubesim as on a real cluster.
    return sorted(i.metadata.name for i in items if i.metadata.name != "kube-root-ca.crt")


@pytest.fixture
def labelled(api: client.ApiClient, ns: str) -> str:
    v1 = client.CoreV1Api(api)
    for name, labels in [("a", {"tier": "web", "env": "prod"}), ("b", {"tier": "db", "env": "prod"}),
                         ("c", {"tier": "web"}), ("d", {})]:
        v1.create_namespaced_config_map(ns, {"metadata": {"name": name, "labels": labels}})
    return ns


@pytest.mark.parametrize(("selector", "expected"), [
    ("tier=web", ["a", "c"]), ("tier==web", ["a", "c"]), ("tier!=web", ["b", "d"]),
    ("tier in (web,db)", ["a", "b", "c"]), ("tier notin (web)", ["b", "d"]), ("env", ["a", "b"]),
    ("!env", ["c", "d"]), ("tier=web,env=prod", ["a"]), ("tier in (web),!env", ["c"]),
])
def test_label_selectors(api: client.ApiClient, labelled: str, selector: str, expected: list[str]) -> None:
    got = client.CoreV1Api(api).list_namespaced_config_map(labelled, label_selector=selector).items
    assert names(got) == expected


def test_bad_label_selector_is_400(api: client.ApiClient, labelled: str) -> None:
    with pytest.raises(client.ApiException) as ei:
        client.CoreV1Api(api).list_namespaced_config_map(labelled, label_selector="a in (b")
    assert ei.value.status == 400


def test_field_selectors(api: client.ApiClient, labelled: str) -> None:
    v1 = client.CoreV1Api(api)
    assert names(v1.list_namespaced_config_map(labelled, field_selector="metadata.name=b").items) == ["b"]
    assert names(v1.list_namespaced_config_map(labelled, field_selector="metadata.name!=b").items) == ["a", "c", "d"]
    everywhere = v1.list_config_map_for_all_namespaces(field_selector=f"metadata.namespace={labelled}").items
    assert names(everywhere) == ["a", "b", "c", "d"]
    with pytest.raises(client.ApiException) as ei:
        v1.list_namespaced_config_map(labelled, field_selector="data.x=y")
    assert ei.value.status == 400


def test_pod_field_selectors_phase_and_node(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_pod(ns, pod_body("unbound", schedulerName="no-such-scheduler"))
    assert names(v1.list_namespaced_pod(ns, field_selector="status.phase=Pending").items) == ["unbound"]
    assert names(v1.list_namespaced_pod(ns, field_selector="spec.nodeName=").items) == ["unbound"]
    assert v1.list_namespaced_pod(ns, field_selector="status.phase=Running,spec.nodeName=").items == []


def test_limit_and_continue(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    for i in range(7):
        v1.create_namespaced_config_map(ns, {"metadata": {"name": f"cm-{i}"}})
    seen: list[str] = []
    cont = None
    pages = 0
    while True:
        page = v1.list_namespaced_config_map(ns, limit=3, _continue=cont)
        pages += 1
        seen += [i.metadata.name for i in page.items if i.metadata.name.startswith("cm-")]
        cont = page.metadata._continue
        if not cont:
            break
        assert page.metadata.remaining_item_count is not None
    assert seen == [f"cm-{i}" for i in range(7)]
    assert pages >= 3


def test_all_namespaces_list(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_config_map(ns, {"metadata": {"name": "here", "labels": {"mark": ns}}})
    items = v1.list_config_map_for_all_namespaces(label_selector=f"mark={ns}").items
    assert [(i.metadata.namespace, i.metadata.name) for i in items] == [(ns, "here")]


def test_watch_from_resource_version_replays_history(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    start = v1.list_namespaced_config_map(ns).metadata.resource_version
    v1.create_namespaced_config_map(ns, {"metadata": {"name": "w1"}})
    v1.patch_namespaced_config_map("w1", ns, {"data": {"k": "v"}})
    v1.delete_namespaced_config_map("w1", ns)
    events = []
    w = watch.Watch()
    for ev in w.stream(v1.list_namespaced_config_map, ns, resource_version=start, timeout_seconds=5):
        events.append((ev["type"], ev["object"].metadata.name))
        if len(events) == 3:
            w.stop()
    assert events == [("ADDED", "w1"), ("MODIFIED", "w1"), ("DELETED", "w1")]


def test_watch_without_version_starts_with_synthetic_added(api: client.ApiClient, labelled: str) -> None:
    v1 = client.CoreV1Api(api)
    got = []
    w = watch.Watch()
    for ev in w.stream(v1.list_namespaced_config_map, labelled, label_selector="tier=web", timeout_seconds=5):
        got.append((ev["type"], ev["object"].metadata.name))
        if len(got) == 2:
            w.stop()
    assert sorted(got) == [("ADDED", "a"), ("ADDED", "c")]


def test_watch_label_selector_leaving_is_deleted(api: client.ApiClient, labelled: str) -> None:
    v1 = client.CoreV1Api(api)
    rv = v1.list_namespaced_config_map(labelled).metadata.resource_version
    v1.patch_namespaced_config_map("a", labelled, {"metadata": {"labels": {"tier": "cache"}}})
    w = watch.Watch()
    for ev in w.stream(v1.list_namespaced_config_map, labelled, label_selector="tier=web", resource_version=rv,
                       timeout_seconds=5):
        assert (ev["type"], ev["object"].metadata.name) == ("DELETED", "a")
        w.stop()
        break
    else:
        pytest.fail("no event")


def test_watch_timeout_seconds_ends_the_stream(api: client.ApiClient, ns: str) -> None:
    v1 = client.CoreV1Api(api)
    rv = v1.list_namespaced_config_map(ns).metadata.resource_version
    resp = v1.list_namespaced_config_map(ns, watch=True, resource_version=rv, timeout_seconds=1,
                                         _preload_content=False)
    body = resp.read()  # returns once the server closes the stream after ~1 s
    assert b"ERROR" not in body


@pytest.mark.kubesim_only("kubesim sends a bookmark every second; a real server about once a minute")
def test_watch_bookmarks(api: client.ApiClient, ns: str, sim_only: object) -> None:
    # A real server sends bookmarks about once a minute; kubesim every second, so this is kubesim-only.
    v1 = client.CoreV1Api(api)
    rv = v1.list_namespaced_config_map(ns).metadata.resource_version
    v1.create_namespaced_config_map(ns, {"metadata": {"name": "bm"}})
    resp = v1.list_namespaced_config_map(ns, watch=True, resource_version=rv, allow_watch_bookmarks=True,
                                         timeout_seconds=3, _preload_content=False)
    types = []
    for line in resp.stream(amt=None):
        for raw in line.splitlines():
            if raw.strip():
                ev = json.loads(raw)
                types.append(ev["type"])
                if ev["type"] == "BOOKMARK":
                    assert int(ev["object"]["metadata"]["resourceVersion"]) > int(rv)
        if "BOOKMARK" in types:
            break
    resp.release_conn()
    assert types[0] == "ADDED" and "BOOKMARK" in types


@pytest.mark.kubesim_only("kubesim sends a bookmark every second; a real server about once a minute")
def test_watch_bookmark_and_timeout_after_a_stream_of_events(api: client.ApiClient, ns: str,
                                                             sim_only: object) -> None:
    # Events that keep a watch busy for longer than a bookmark interval must not lose its quiet-time
    # bookmark nor its timeout (one timer serves all of a watch's waits).
    v1 = client.CoreV1Api(api)
    rv = v1.list_namespaced_config_map(ns).metadata.resource_version
    resp = v1.list_namespaced_config_map(ns, watch=True, resource_version=rv, allow_watch_bookmarks=True,
                                         timeout_seconds=4, _preload_content=False)

    def writer() -> None:
        for i in range(8):
            v1.create_namespaced_config_map(ns, {"metadata": {"name": f"busy-{i}"}})
            time.sleep(0.2)

    thread = threading.Thread(target=writer)
    thread.start()
    events: list[tuple[str, str]] = []
    started = time.monotonic()
    for chunk in resp.stream(amt=None):
        for raw in chunk.splitlines():
            if raw.strip():
                ev = json.loads(raw)
                events.append((ev["type"], ev["object"]["metadata"].get("name", "")))
    ended = time.monotonic() - started
    resp.release_conn()
    thread.join()
    added = [name for kind, name in events if kind == "ADDED"]
    assert added == [f"busy-{i}" for i in range(8)]
    last_added = max(i for i, (kind, _) in enumerate(events) if kind == "ADDED")
    assert any(kind == "BOOKMARK" for kind, _ in events[last_added:])
    assert ended < 30  # the stream ended on its own (timeoutSeconds), not on the client's patience


@pytest.mark.kubesim_only("forces a compaction through kubesim's store")
def test_watch_from_compacted_version_is_410_gone(api: client.ApiClient, ns: str, sim_only: kubesim.Sim) -> None:
    v1 = client.CoreV1Api(api)
    old = v1.list_namespaced_config_map(ns).metadata.resource_version
    v1.create_namespaced_config_map(ns, {"metadata": {"name": "after"}})
    store = sim_only.cluster("sim").store
    sim_only.run(store.compact)
    with pytest.raises(client.ApiException) as ei:
        for _ in watch.Watch().stream(v1.list_namespaced_config_map, ns, resource_version=old,
                                      timeout_seconds=5, _request_timeout=10, **{}):
            pass
    # The client does one silent re-list-free retry on 410 and raises on the second one.
    assert ei.value.status == 410


def test_list_items_of_built_in_kinds_carry_no_type_meta(api: client.ApiClient, ns: str) -> None:
    # Typed lists are encoded without each item's apiVersion/kind: clients must not rely on them.
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_config_map(ns, {"metadata": {"name": "tm"}})
    raw = json.loads(v1.list_namespaced_config_map(ns, field_selector="metadata.name=tm",
                                                   _preload_content=False).data)
    assert raw["kind"] == "ConfigMapList" and raw["apiVersion"] == "v1"
    assert raw["items"][0]["metadata"]["name"] == "tm"
    assert "kind" not in raw["items"][0] and "apiVersion" not in raw["items"][0]
