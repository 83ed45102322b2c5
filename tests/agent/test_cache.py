"""The agent's object cache: newest version wins, local deletes are not resurrected, label indexes stay right."""

from __future__ import annotations

from typing import Any

import pytest

from worker_agent.cache import ObjectCache, Selector, Stored


def obj(name: str, rv: int, uid: str = "u", **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv), "uid": uid,
                         "labels": labels}}


def test_newest_version_wins_and_tombstones_block_stale_events() -> None:
    cache = ObjectCache("configmaps")
    assert cache.upsert(obj("a", 5, app="x"))
    assert not cache.upsert(obj("a", 4, app="y"))  # a late watch event of an older version
    assert cache.select("ns", "app=x")[0]["metadata"]["resourceVersion"] == "5"
    cache.remove(("ns", "a"))
    assert not cache.upsert(obj("a", 5, app="x"))  # the watch catching up after a local delete
    assert cache.upsert(obj("a", 9, uid="u2", app="x"))  # re-created under the same name
    cache.delete_event(obj("a", 6, uid="u"))  # the old object's DELETED must not remove the new one
    assert cache.get(("ns", "a")) is not None


def test_label_index_follows_label_changes() -> None:
    cache = ObjectCache("configmaps")
    cache.upsert(obj("a", 1, job="j1", role="w"))
    cache.upsert(obj("b", 1, job="j1", role="m"))
    assert {o["metadata"]["name"] for o in cache.select("ns", "job=j1")} == {"a", "b"}
    assert [o["metadata"]["name"] for o in cache.select("ns", "job=j1,role=m")] == ["b"]
    cache.upsert(obj("a", 2, job="j2", role="w"))
    assert [o["metadata"]["name"] for o in cache.select("ns", "job=j1")] == ["b"]
    assert [o["metadata"]["name"] for o in cache.select("ns", "job=j2,role!=m")] == ["a"]
    cache.remove(("ns", "b"))
    assert cache.select("ns", "job=j1") == []
    assert cache.select("other", "job=j2") == []


def test_pods_trimmed_and_kept_compact() -> None:
    cache = ObjectCache("pods")
    pod = {"metadata": {"name": "p", "namespace": "ns", "resourceVersion": "1", "managedFields": [{}],
                        "ownerReferences": [{"uid": "j", "controller": True, "kind": "PyTorchJob"}]},
           "spec": {"containers": [{"name": "c", "image": "i", "env": [{"name": "A"}],
                                    "resources": {"requests": {"cpu": "1"}}}], "nodeName": "n"},
           "status": {"phase": "Running", "podIP": "1.2.3.4",
                      "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "t"}],
                      "containerStatuses": [{"name": "c", "image": "i", "restartCount": 2,
                                             "state": {"running": {"startedAt": "t"}}}]}}
    cache.upsert(pod)
    assert pod == {"metadata": {"name": "p", "namespace": "ns", "resourceVersion": "1",
                                "ownerReferences": [{"uid": "j", "controller": True}]}}  # the header, in place
    assert cache.pod_usage[("ns", "p")][:2] == ("Running", "n")
    pod = cache.get(("ns", "p")) or {}
    assert pod["spec"] == {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}  # node: pod_usage
    assert pod["status"] == {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                             "containerStatuses": [{"name": "c", "restartCount": 2,
                                                    "state": {"running": {"startedAt": "t"}}}]}
    assert pod["metadata"]["ownerReferences"] == [{"uid": "j", "controller": True}]


def test_selector_terms() -> None:
    sel = Selector.parse("a=1, b==2,c!=3,d,!e")
    assert sel.matches({"a": "1", "b": "2", "c": "4", "d": ""})
    assert not sel.matches({"a": "1", "b": "2", "d": "", "e": "x"})
    with pytest.raises(ValueError):
        Selector.parse("a in (1,2)")


def test_echo_of_a_held_version_keeps_the_local_deleting_mark() -> None:
    """The watch delivering the version the agent created, after the agent deleted the pod, must not show
    it alive again: the next pass would count it active (and a Failed one would be deleted twice)."""
    cache = ObjectCache("pods")
    created = {"metadata": {"name": "p", "namespace": "ns", "resourceVersion": "7", "uid": "u"},
               "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Pending"}}
    cache.upsert(dict(created))  # the create's answer
    cache.mark_deleting(("ns", "p"), "2026-01-01T00:00:00Z")
    echo = {**created, "metadata": dict(created["metadata"])}
    assert cache.upsert(echo)  # the watch's ADDED of that same version, arriving late
    assert (cache.get(("ns", "p")) or {})["metadata"].get("deletionTimestamp") == "2026-01-01T00:00:00Z"
    assert echo == {"metadata": {"name": "p", "namespace": "ns", "resourceVersion": "7", "uid": "u"}}  # shrunk


def test_upsert_tells_a_change_reconcilers_read_from_a_new_version_alone() -> None:
    """A pod scheduled (its node is for capacity only) or rewritten unchanged is SAME_CONTENT, which the agent
    does not requeue its job for; a phase change is CHANGED; the agent's own write and its echo are never
    SAME_CONTENT for the next watched version (the write's pass-after comes from its echo)."""
    cache = ObjectCache("pods")

    def pod(rv: int, phase: str = "Pending", node: str | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}
        if node:
            spec["nodeName"] = node
        return {"metadata": {"name": "p", "namespace": "ns", "resourceVersion": str(rv), "uid": "u"},
                "spec": spec, "status": {"phase": phase}}

    assert cache.upsert(pod(1)) is Stored.CHANGED  # the create's answer
    assert cache.upsert(pod(2, node="n1"), watched=True) is Stored.CHANGED  # the echo of 1 never came
    assert cache.pod_usage[("ns", "p")][:2] == ("Pending", "n1")
    assert cache.upsert(pod(2, node="n1"), watched=True) is Stored.HELD
    assert cache.upsert(pod(3, node="n1"), watched=True) is Stored.SAME_CONTENT
    got = cache.get(("ns", "p")) or {}
    assert got["metadata"]["resourceVersion"] == "3" and "nodeName" not in got["spec"]
    assert cache.upsert(pod(4, "Running", node="n1"), watched=True) is Stored.CHANGED
    assert cache.upsert(pod(3), watched=True) is Stored.REFUSED
    cache.mark_deleting(("ns", "p"), "2026-01-01T00:00:00Z")  # the agent's own change
    assert cache.pod_usage[("ns", "p")][:2] == ("Running", "n1")
    assert cache.upsert(pod(5, "Running", node="n1"), watched=True) is Stored.CHANGED


def test_held_is_what_a_restarted_informer_is_told() -> None:
    cache = ObjectCache("configmaps")
    cache.upsert(obj("a", 5, app="x"), watched=True)
    cache.upsert(obj("b", 6, app="y"), watched=True)
    cache.upsert({"metadata": {"name": "c", "namespace": "other", "resourceVersion": "7", "uid": "u"}}, watched=True)
    cache.upsert(obj("mine", 8, app="x"))  # from the agent's own write: its echo has not come
    assert set(cache.held()) == {("ns", "a"), ("ns", "b"), ("other", "c"), ("ns", "mine")}
    assert set(cache.held("ns", "app=x")) == {("ns", "a"), ("ns", "mine")}
    held = cache.held("ns")
    assert held[("ns", "a")]["metadata"]["resourceVersion"] == "5"
    # no version: the list reports it again, so whatever its echo was to cause is caused
    assert held[("ns", "mine")]["metadata"]["resourceVersion"] == ""
    assert held[("ns", "mine")]["metadata"]["uid"] == "u"
    assert cache.header(("ns", "mine"))["metadata"]["resourceVersion"] == "8"  # type: ignore[index]


def line(etype: str, o: dict[str, Any]) -> bytes:
    import orjson

    return orjson.dumps({"type": etype, "object": o})


def test_echo_claims_only_the_watch_event_of_a_version_the_agent_wrote_itself() -> None:
    """``echo`` (the informer's check before decoding) claims the event of a version stored from the
    agent's own write, once, with the object's uid in the line; not a version the watch brought, not an older or
    newer one, not a line of another object that happens to carry that resourceVersion."""
    cache = ObjectCache("configmaps")
    cache.upsert(obj("mine", 7, uid="u-mine"))  # the answer to the agent's own create
    cache.upsert(obj("theirs", 8, uid="u-theirs"), watched=True)
    stranger = obj("other", 9, uid="u-other")
    stranger["metadata"]["annotations"] = {"resourceVersion": "7"}  # a lookalike elsewhere in another object
    assert cache.echo(7, line("ADDED", stranger)) is None
    assert cache.echo(8, line("ADDED", obj("theirs", 8, uid="u-theirs"))) is None  # from the watch already
    header = cache.echo(7, line("ADDED", obj("mine", 7, uid="u-mine")))
    assert header is not None and header["metadata"]["uid"] == "u-mine"
    assert cache.watched_at(("ns", "mine"), 7)  # counts as watched now, as upsert(watched=True) would
    assert cache.echo(7, line("ADDED", obj("mine", 7, uid="u-mine"))) is None  # once
    cache.upsert(obj("mine", 10, uid="u-mine"))  # written again, then the watch brings a newer version first
    cache.upsert(obj("mine", 11, uid="u-mine"), watched=True)
    assert cache.echo(10, line("MODIFIED", obj("mine", 10, uid="u-mine"))) is None  # no longer the version held


def test_echo_remembers_a_bounded_number_of_own_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    from worker_agent import cache as cache_module

    monkeypatch.setattr(cache_module, "OWN_VERSIONS", 3)
    cache = ObjectCache("configmaps")
    for i in range(5):
        cache.upsert(obj(f"o{i}", 100 + i, uid=f"u{i}"))
    assert len(cache._own) == 3
    assert cache.echo(100, line("ADDED", obj("o0", 100, uid="u0"))) is None  # forgotten: decoded as any event
    assert cache.echo(104, line("ADDED", obj("o4", 104, uid="u4"))) is not None
