"""federation.messages: every model round-trips; anything else is refused with MessageRefused, never a crash."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from federation.messages import (
    MAX_PAYLOAD_BYTES,
    Accepted,
    Capacity,
    Delete,
    Heartbeat,
    Inventory,
    InventoryItem,
    JobRef,
    MessageRefused,
    Place,
    PlacementKey,
    Rejected,
    Resync,
    Status,
    decode_command,
    decode_report,
    encode,
)

KEY = PlacementKey(workload_uid="0b6f-uid", attempt=2, epoch=7)
JOB = JobRef(kind="PyTorchJob", api_version="kubeflow.org/v1", namespace="team-a", name="train")
AT = datetime(2026, 11, 21, 4, 0, tzinfo=UTC)

COMMANDS = [
    Place(placement=KEY, spec_version=3, job=JOB, sent_at=AT,
          manifest={"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "train"},
                    "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1}}}}),
    Delete(placement=KEY, job=JOB, reason="finished", sent_at=AT),
    Resync(cluster="worker-1", epoch=7, expected=[KEY], sent_at=AT),
]
REPORTS = [
    Accepted(cluster="worker-1", placement=KEY, spec_version=3, seq=1, sent_at=AT),
    Rejected(cluster="worker-1", placement=KEY, spec_version=3, seq=2, reason="NoOperator",
             message="MPIJob is not served", permanent=False, sent_at=AT),
    Status(cluster="worker-1", placement=KEY, seq=3, status={"conditions": [{"type": "Running"}]},
           finished="Succeeded", sent_at=AT),
    Heartbeat(cluster="worker-1", agent_version="0.1.0", labels={"zone": "a"},
              capacity=Capacity(allocatable={"cpu": "8"}, free={"cpu": "500m"}, largest_node_free={"cpu": "4"}),
              kinds_reconciled=["PyTorchJob"], kinds_delegated={"MPIJob": "kubeflow.org/mpi-operator"},
              running=2, sent_at=AT),
    Inventory(cluster="worker-1", items=[InventoryItem(placement=KEY, spec_version=3, job=JOB, last_seq=9)],
              sent_at=AT),
]


@pytest.mark.parametrize("message", COMMANDS, ids=lambda m: m.type)
def test_command_round_trip(message: Any) -> None:
    assert decode_command(encode(message)) == message


@pytest.mark.parametrize("message", REPORTS, ids=lambda m: m.type)
def test_report_round_trip(message: Any) -> None:
    assert decode_report(encode(message)) == message


def test_commands_and_reports_do_not_cross() -> None:
    with pytest.raises(MessageRefused, match="type"):
        decode_command(encode(REPORTS[0]))
    with pytest.raises(MessageRefused, match="type"):
        decode_report(encode(COMMANDS[0]))


def test_oversize_refused_both_ways() -> None:
    big = Place(placement=KEY, spec_version=1, job=JOB, manifest={"data": "x" * MAX_PAYLOAD_BYTES})
    with pytest.raises(MessageRefused, match="limit"):
        encode(big)
    with pytest.raises(MessageRefused, match="bytes"):
        decode_command(b" " * (MAX_PAYLOAD_BYTES + 1))


@pytest.mark.parametrize(("payload", "why"), [
    (b"", "not JSON"),
    (b"[1, 2]", "JSON object"),
    (b'{"v": 2, "type": "place"}', "version"),
    (b'{"type": "place"}', "version"),
    (b'{"v": true, "type": "place"}', "version"),
    (b'{"v": 1, "type": "explode"}', "type"),
    (b"\xff\xfe", "not JSON"),
    (b"[" * 100_000, "JSON"),
])
def test_refusals_name_the_reason(payload: bytes, why: str) -> None:
    with pytest.raises(MessageRefused, match=why):
        decode_command(payload)


def test_not_bytes_refused() -> None:
    with pytest.raises(MessageRefused, match="bytes"):
        decode_report("{}")  # type: ignore[arg-type]


# --- properties ----------------------------------------------------------------------------

ALL = [(m, decode_command) for m in COMMANDS] + [(m, decode_report) for m in REPORTS]
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.append((*prefix, k))
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out.append((*prefix, i))
            out.extend(_paths(v, (*prefix, i)))
    return out


def _parent(doc: Any, path: tuple[Any, ...]) -> Any:
    for p in path[:-1]:
        doc = doc[p]
    return doc


def _decode_safely(decode: Any, payload: bytes) -> Any:
    """Decode; only MessageRefused may escape (anything else fails the property)."""
    try:
        return decode(payload)
    except MessageRefused as exc:
        assert exc.message  # a reason, in words
        return None


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.binary(max_size=2048))
def test_random_bytes_never_crash(payload: bytes) -> None:
    _decode_safely(decode_command, payload)
    _decode_safely(decode_report, payload)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_random_text_never_crashes(text: str) -> None:
    _decode_safely(decode_command, text.encode("utf-8", "surrogatepass"))
    _decode_safely(decode_report, text.encode("utf-8", "surrogatepass"))


MODEL_KEYS = {"v", "type", "placement", "job", "cluster", "seq", "spec_version", "epoch", "expected",
              "items", "reason", "message", "workload_uid", "attempt", "kind", "api_version", "namespace",
              "name", "capacity", "online", "running", "last_seq", "permanent", "finished", "gone", "sent_at"}
FREE_FORM = {"manifest", "status", "labels", "allocatable", "free", "largest_node_free", "kinds_delegated",
             "kinds_reconciled"}
REQUIRED = {"placement", "job", "cluster", "seq", "spec_version", "expected", "items", "workload_uid",
            "attempt", "epoch", "kind", "api_version", "namespace", "name", "manifest", "status", "last_seq"}


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(ALL), st.data())
def test_mutated_messages_are_refused_or_valid(case: tuple[Any, Any], data: st.DataObject) -> None:
    message, decode = case
    doc = json.loads(encode(message))
    mutation = data.draw(st.sampled_from(["drop", "add", "retype", "version", "oversize", "truncate"]))
    # only the model's own fields: inside free-form dicts (manifest, status, labels) anything goes
    paths = [p for p in _paths(doc) if p and p[-1] in MODEL_KEYS | REQUIRED and not FREE_FORM & set(p[:-1])]
    must_refuse = True
    if mutation == "drop":
        path = data.draw(st.sampled_from([p for p in paths if p[-1] in REQUIRED or p[-1] in ("v", "type")]))
        del _parent(doc, path)[path[-1]]
    elif mutation == "add":
        objects = [()] + [p for p in _paths(doc) if isinstance(_parent(doc, (*p, None)), dict)
                          and p[-1] in ("placement", "job", "capacity")]
        where = data.draw(st.sampled_from(objects))
        target = _parent(doc, (*where, None))
        name = "x-" + data.draw(st.text(max_size=10))  # no model field starts with "x-"
        target[name] = data.draw(JSON_VALUES)
    elif mutation == "retype":
        path = data.draw(st.sampled_from(paths))
        parent = _parent(doc, path)
        old = parent[path[-1]]
        new = data.draw(JSON_VALUES)
        parent[path[-1]] = new
        numbers = (int, float)
        same_shape = type(new) is type(old) or (
            isinstance(new, numbers) and isinstance(old, numbers) and not isinstance(new, bool))
        # same-typed values may be valid; ``finished`` is optional, so None is valid for it
        must_refuse = not same_shape and not (new is None and path[-1] == "finished")
    elif mutation == "version":
        doc["v"] = data.draw(st.sampled_from([0, 2, "1", 1.5, None, [1], -1, 10**20]))
    payload = json.dumps(doc).encode()
    if mutation == "oversize":  # a valid message padded past the limit (built as bytes: cheap)
        payload = payload[:-1] + b', "padding": "' + b"x" * MAX_PAYLOAD_BYTES + b'"}'
    if mutation == "truncate":
        payload = payload[: data.draw(st.integers(0, len(payload) - 1))]
    result = _decode_safely(decode, payload)
    if must_refuse:
        assert result is None, f"{mutation} accepted: {payload[:300]!r}"
