"""The engine's compressed cache of manager Jobs (dispatcher/intake/jobcache.py) and the intake reading its header."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

from dispatcher.intake import watch as intake
from dispatcher.intake.jobcache import JobCache
from dispatcher.mirror.kubewriter import KubeWriter
from federation import labels
from federation.clock import SystemClock
from federation.kinds.registry import by_name


def job(uid: str = "u1", generation: int = 1, managed_by: str | None = labels.MULTIKUEUE) -> dict[str, Any]:
    spec: dict[str, Any] = {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": {"spec": {
        "containers": [{"name": "pytorch", "image": "example/train:1"}]}}}}}
    if managed_by is not None:
        spec["runPolicy"] = {"managedBy": managed_by}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": "train", "namespace": "team-a", "uid": uid, "generation": generation,
                         "resourceVersion": "7", "managedFields": [{"manager": "kubectl"}]},
            "spec": spec}


def test_a_cached_job_reads_back_whole_as_a_fresh_copy() -> None:
    cache = JobCache()
    obj = job()
    cache["u1"] = obj
    assert cache["u1"] == obj and cache.get("u1") == obj and cache.get("nope") is None
    got = cache["u1"]
    got["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 9  # the caller's copy, not the cache
    assert cache["u1"] == obj
    before = copy.deepcopy(obj)
    obj["metadata"]["name"] = "changed-after"  # nor does the stored object follow the caller's dict
    assert cache["u1"] == before
    assert "u1" in cache and len(cache) == 1 and list(cache) == ["u1"] and cache.held_bytes() > 0
    del cache["u1"]
    assert "u1" not in cache and cache.pop("u1", None) is None and len(cache) == 0


def test_the_kube_writers_status_is_kept_with_the_job_across_its_new_copies() -> None:
    """The status the kube writer wrote to a Job lives in the Job's own entry (no object per Job);
    a newer copy of the Job keeps it, as do the header's fields; forgetting it leaves the Job as it was."""
    from dispatcher.intake.jobcache import pack, unpack

    cache = JobCache()
    obj = job(generation=300)  # a generation of two varint bytes
    cache["u1"] = obj
    assert cache.written("u1") is None
    status = {"conditions": [{"type": "MultiClusterPending", "status": "True", "message": "m" * 300}]}
    cache.set_written("u1", pack(status))
    assert unpack(cache.written("u1")) == status and cache["u1"] == obj  # type: ignore[arg-type]
    head = cache.head("u1")
    assert head is not None and (head.generation, head.status, head.namespace) == (300, False, "team-a")
    newer = job(generation=301)
    newer["status"] = {"conditions": []}
    cache["u1"] = newer  # intake's newer copy: the written status stays
    assert unpack(cache.written("u1")) == status and cache["u1"] == newer  # type: ignore[arg-type]
    head = cache.head("u1")
    assert head is not None and (head.generation, head.status) == (301, True)
    assert cache.status("u1") == {"conditions": []}
    cache.set_written("u1", pack({"conditions": []}))  # replaced
    assert unpack(cache.written("u1")) == {"conditions": []}  # type: ignore[arg-type]
    cache.set_written("u1", None)
    assert cache.written("u1") is None and cache["u1"] == newer
    cache.set_written("gone", pack(status))  # a Job not cached (any more): kept beside, until forgotten
    assert unpack(cache.written("gone")) == status  # type: ignore[arg-type]
    cache.set_written("gone", None)
    assert cache.written("gone") is None
    many = {f"ns-{i}" for i in range(1 << 16)}  # namespaces past the index: a Job kept with a Head object
    for ns in many:
        cache._namespaces.index_of(ns)
    odd = job(uid="u2")
    odd["metadata"]["namespace"] = "one-too-many"
    cache["u2"] = odd
    cache.set_written("u2", pack(status))
    cache["u2"] = odd
    assert unpack(cache.written("u2")) == status and cache["u2"] == odd  # type: ignore[arg-type]
    del cache["u2"]
    assert cache.written("u2") is None


def test_the_header_holds_what_is_read_without_decoding() -> None:
    cache = JobCache()
    cache["u1"] = job(generation=3)
    head = cache.head("u1")
    assert head is not None
    assert (head.namespace, head.generation, head.managed_by, head.deleting) == (
        "team-a", 3, labels.MULTIKUEUE, False)
    deleting = job(managed_by=None)
    deleting["metadata"]["deletionTimestamp"] = "2026-11-24T07:00:00Z"
    cache["u1"] = deleting
    head = cache.head("u1")
    assert head is not None and head.managed_by is None and head.deleting
    cache["u2"] = {"kind": "NotAKind", "metadata": {"name": "x"}}  # no managedBy for a kind mkd does not run
    assert cache.head("u2") is not None and cache.head("u2").managed_by is None  # type: ignore[union-attr]
    assert cache.head("nope") is None


def test_the_header_says_whether_the_job_has_a_status() -> None:
    cache = JobCache()
    cache["u1"] = job(generation=300)  # a varint of more than one byte
    head = cache.head("u1")
    assert head is not None and not head.status and head.generation == 300 and cache.status("u1") is None
    running = job(generation=300)
    running["status"] = {"conditions": [{"type": "Running", "status": "True"}]}
    cache["u1"] = running
    head = cache.head("u1")
    assert head is not None and head.status and head.generation == 300
    assert cache.status("u1") == running["status"]
    cache["u2"] = {"kind": "NotAKind", "metadata": {"name": "x"}, "status": "odd"}
    assert cache.status("u2") is None and cache.status("nope") is None


def test_intake_passes_on_only_what_changed_for_a_claimed_job() -> None:
    kind = by_name("PyTorchJob")
    engine: Any = SimpleNamespace(known={"u1": "PyTorchJob"}, cache=JobCache(),
                                  writer=KubeWriter(None, JobCache(), SystemClock()))
    assert intake.relevant(kind, engine, job(), False)  # first sight: the engine needs it
    assert engine.cache["u1"] == job()
    status_only = job()
    status_only["status"] = {"conditions": [{"type": "Running", "status": "True"}]}
    assert not intake.relevant(kind, engine, status_only, False)  # a status write (not the writer's last)
    assert engine.cache["u1"] == status_only  # but the cache has the newest copy
    assert intake.relevant(kind, engine, job(generation=2), False)
    assert intake.relevant(kind, engine, job(generation=2, managed_by="someone-else"), False)
    gone = job(generation=2, managed_by="someone-else")
    gone["metadata"]["deletionTimestamp"] = "2026-11-24T07:00:00Z"
    assert intake.relevant(kind, engine, gone, False)


def test_the_echo_of_the_kube_writers_own_status_write_is_not_packed_again() -> None:
    kind = by_name("PyTorchJob")
    writer = KubeWriter(None, JobCache(), SystemClock())
    engine: Any = SimpleNamespace(known={"u1": "PyTorchJob"}, cache=writer.cache, writer=writer)
    assert intake.relevant(kind, engine, job(), False)
    engine.cache["u1"] = job()

    def at(version: str, **meta: Any) -> dict[str, Any]:
        obj = job()
        obj["metadata"].update(resourceVersion=version, **meta)
        obj["status"] = {"conditions": [{"type": "Running", "status": "True"}]}
        return obj

    writer.wrote("u1", "8")  # the write's answer first: the Job is at resourceVersion 8
    assert not intake.relevant(kind, engine, at("8"), False)
    assert engine.cache["u1"] == job()  # not packed again: the writer remembers the status it wrote
    assert not intake.relevant(kind, engine, at("8"), False)  # an echo is met once
    assert engine.cache["u1"] == at("8")

    writer._patching.add("u1")  # a write in flight: its echo may come before its answer
    assert not intake.relevant(kind, engine, at("9"), False)
    assert engine.cache["u1"] == at("8")  # held until the answer tells
    writer._patching.discard("u1")
    writer.wrote("u1", "9")
    assert engine.cache["u1"] == at("8")  # it was the echo

    writer._patching.add("u1")
    edited = at("10", labels={"team": "b"})  # someone else's change while the write is in flight
    assert not intake.relevant(kind, engine, edited, False)
    writer._patching.discard("u1")
    writer.wrote("u1", "11")
    assert engine.cache["u1"] == edited  # not the echo: the cache has it
    assert not intake.relevant(kind, engine, at("11", labels={"team": "b"}), False)  # the echo, after

    writer._patching.add("u1")
    assert not intake.relevant(kind, engine, at("12"), False)
    assert not intake.relevant(kind, engine, at("13"), False)  # a second change: the cache takes the newest
    assert engine.cache["u1"] == at("13")
    writer._patching.discard("u1")
    writer.wrote("u1", "12")
    assert engine.cache["u1"] == at("13")
    writer._patching.add("u1")
    assert not intake.relevant(kind, engine, at("14"), False)
    newer = job(generation=2)
    assert intake.relevant(kind, engine, newer, False)  # judged as ever, and newer than the one held
    writer._patching.discard("u1")
    writer.wrote("u1", None)  # the write failed
    assert engine.cache["u1"] == newer


def test_the_echo_of_the_kube_writers_own_status_write_is_told_from_the_line_undecoded() -> None:
    """``KubeWriter.echo_line`` (intake's informers' EchoCheck): the version the write's answer brought, with the
    Job's uid in the line, is the echo once; any other version, a line without the uid, a write whose answer
    came after its echo (``defer`` holds that one) or a Job forgotten is decoded as ever."""
    from dispatcher.mirror.kubewriter import JobKey

    writer = KubeWriter(None, JobCache(), SystemClock())
    key = JobKey("u1", "PyTorchJob", "ns", "j1")
    line = b'{"type":"MODIFIED","object":{"metadata":{"name":"j1","namespace":"ns","uid":"u1","resourceVersion":"8"}}}'
    writer.wrote("u1", "8", key)
    assert writer.echo_line(7, line) is None  # not the version written
    assert writer.echo_line(8, line.replace(b'"u1"', b'"u2"')) is None  # another object at that version
    assert writer.echo_line(8, line) == {"metadata": {"namespace": "ns", "name": "j1", "uid": "u1",
                                                      "resourceVersion": "8"}}
    assert writer.echo_line(8, line) is None  # once
    assert writer.echoes_not_decoded == 1
    assert not writer.defer("u1", {"metadata": {"uid": "u1", "resourceVersion": "8"}})  # told already

    writer.wrote("u1", "9", key)
    writer.wrote("u1", "10", key)  # a second write before the first one's echo came
    assert writer.echo_line(9, line) is None  # the first one's echo is a change like any other now
    assert writer._echo_keys.keys() == {10}  # nothing kept for it
    writer.forget("u1")
    assert writer.echo_line(10, line) is None and not writer._echo_keys

    writer.wrote("u1", "11")  # no key: told by ``defer`` once decoded, as before
    assert writer.echo_line(11, line) is None
    assert writer.defer("u1", {"metadata": {"uid": "u1", "resourceVersion": "11"}})


def test_intake_passes_on_a_relist_deletion_stub_of_a_job_not_claimed_yet() -> None:
    """A Job deleted during a watch gap while its claim still waits in the engine's inbox: the compact
    informer's DELETED stub has no spec (so no managedBy); the deletion must still reach the engine."""
    kind = by_name("PyTorchJob")
    engine: Any = SimpleNamespace(known={}, cache=JobCache())
    stub = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": "train", "namespace": "team-a", "uid": "u9", "resourceVersion": "8"}}
    assert intake.relevant(kind, engine, stub, True)
    assert not intake.relevant(kind, engine, job("u9", managed_by=None), True)  # not mkd's, seen whole
    assert not intake.relevant(kind, engine, job("u9", managed_by=None), False)


def test_packed_values_read_back_whatever_their_shape_and_jobs_of_a_kind_share_a_dictionary(monkeypatch: Any) -> None:
    import zlib

    import orjson

    from dispatcher.intake import jobcache

    monkeypatch.setattr(jobcache, "_DICTIONARIES", [b""])
    monkeypatch.setattr(jobcache, "_BY_SHAPE", {})
    values: list[Any] = [job("u1"), job("u2", generation=2), {"conditions": [{"type": "A"}]}, {"conditions": []},
                         [1, 2], "text", None, {}, {"kind": "", "x": 1}]
    packed = [jobcache.pack(v) for v in values]
    assert [jobcache.unpack(p) for p in packed] == values
    first, second = packed[0], packed[1]
    assert first[0] == second[0] != 0  # one dictionary for the kind
    plain = len(zlib.compress(orjson.dumps(values[1]), 1))
    assert len(second) * 2 < plain  # the second Job of a kind costs a fraction of plain zlib
    monkeypatch.setattr(jobcache, "MAX_DICTIONARIES", len(jobcache._DICTIONARIES))  # full: no new dictionary
    more = {"kind": "Other", "metadata": {"name": "n"}}
    raw = jobcache.pack(more)
    assert raw[0] == 0 and jobcache.unpack(raw) == more
    assert jobcache.unpack(jobcache.pack(values[0])) == values[0]  # the kinds registered before still use theirs


def test_the_header_reads_back_any_generation_namespace_and_managed_by_also_past_the_index_limits() -> None:
    cache = JobCache()
    cache._namespaces.limit = 3  # "" and two more fit an index; the rest fall back to a header object
    cache._managers.limit = 2    # None and one value
    cases = []
    for i, generation in enumerate((0, 1, 127, 128, 300, 2**40)):
        obj = job(f"u{i}", generation=generation, managed_by=(labels.MULTIKUEUE, None, "example.com/x")[i % 3])
        obj["metadata"]["namespace"] = f"ns-{i % 4}"
        if i % 2:
            obj["metadata"]["deletionTimestamp"] = "2026-11-24T07:00:00Z"
        cache[f"u{i}"] = obj
        cases.append((f"u{i}", obj))
    for uid, obj in cases:
        head = cache.head(uid)
        assert head is not None and cache[uid] == obj
        assert (head.namespace, head.generation, head.deleting, head.managed_by) == (
            obj["metadata"]["namespace"], obj["metadata"]["generation"], "deletionTimestamp" in obj["metadata"],
            obj["spec"].get("runPolicy", {}).get("managedBy"))
    assert any(isinstance(e, tuple) for e in cache._entries.values())  # some past the limits
    assert any(isinstance(e, bytes) for e in cache._entries.values())
    assert cache.held_bytes() > 0


def test_put_takes_the_packed_job_as_is() -> None:
    from dispatcher.engine.batch import JobChange
    from federation.kinds.pytorch import PYTORCHJOB

    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
           "metadata": {"name": "p", "namespace": "team-a", "uid": "u-1", "generation": 300},
           "spec": {"runPolicy": {"managedBy": "kueue.x-k8s.io/multikueue"}}}
    change = JobChange(PYTORCHJOB, job)
    assert change.obj == job and change.packed is not None  # decoded, and its packed form kept
    cache, again = JobCache(), JobCache()
    cache.put("u-1", change.obj, change.packed)
    again["u-1"] = job
    assert cache["u-1"] == job and cache._entries["u-1"] == again._entries["u-1"]
    head = cache.head("u-1")
    assert head is not None and (head.namespace, head.generation) == ("team-a", 300)
