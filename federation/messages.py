"""Commands (dispatcher → agent) and Reports (agent → dispatcher): versioned pydantic models.

``decode_command`` and ``decode_report`` never raise anything but :class:`MessageRefused`: unknown fields,
wrong types, oversize payloads, bad JSON and unknown versions are refused with a reason.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from federation.errors import Permanent
from federation.policy import PolicySettings

SCHEMA_VERSION: Final = 1
MAX_PAYLOAD_BYTES = 1_048_576
"""1 MiB: a Kubernetes object is at most ~1.5 MiB in etcd; a Job this large is refused, not truncated."""

Name = Annotated[str, Field(min_length=1, max_length=253)]
Uid = Annotated[str, Field(min_length=1, max_length=128)]
Counter = Annotated[int, Field(ge=0, le=2**63 - 1)]
_STREAM = re.compile(r"[A-Za-z0-9_.-]{0,64}")
"""What a stream id may hold (as ``federation.signing`` seals it): nothing JSON would escape."""


def now() -> datetime:
    return datetime.now(UTC)


class MessageRefused(Permanent):
    """A payload that cannot be accepted; ``reason`` says why in one line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, reason="MessageRefused")


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    v: Literal[1] = SCHEMA_VERSION


class JobRef(BaseModel):
    """Where a Job lives: kind (JobKind name), apiVersion, namespace, name."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Name
    api_version: Name
    namespace: Name
    name: Name


class PlacementKey(BaseModel):
    """The identifiers of one placement attempt.

    Delivery over MQTT is at least once; these identifiers make the effects exactly once:

    * ``workload_uid`` — uid of the Job in the manager cluster (the Workload key);
    * ``attempt`` — placement attempt number, one per Placement row;
    * ``epoch`` — the dispatcher's fencing epoch (bumped each time a dispatcher instance starts);
      an agent refuses a Command whose (epoch, attempt) is older than the newest it has applied
      for that workload;
    * ``spec_version`` — bumped when the manager Job's spec changes (suspend, resume, edits);
      a Place with the same (workload, attempt, spec_version) as the last applied one is a no-op;
    * ``seq`` — per-placement sequence number on Reports; the dispatcher drops a Status whose
      seq is not newer than the last one it stored.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    workload_uid: Uid
    attempt: Counter
    epoch: Counter


# --- Commands -------------------------------------------------------------------------------


class PodScheduling(BaseModel):
    """What the quota reservation's ResourceFlavors add to one PodSet's pods (Kueue stamps the same)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, str]] = Field(default_factory=list)


class Place(_Message):
    """Create or update the Job on the worker. ``manifest`` is the object prepared by the JobKind."""

    type: Literal["place"] = "place"
    placement: PlacementKey
    spec_version: Counter
    job: JobRef
    manifest: dict[str, Any]
    sent_at: datetime = Field(default_factory=now)
    pod_scheduling: dict[str, PodScheduling] = Field(default_factory=dict)
    """PodSet name -> its flavors' nodeSelector and tolerations; the agent stamps them on the pod templates."""


class Delete(_Message):
    """Delete the Job placed under ``placement`` and everything it owns."""

    type: Literal["delete"] = "delete"
    placement: PlacementKey
    job: JobRef
    reason: str = ""
    sent_at: datetime = Field(default_factory=now)


class Chunk(BaseModel):
    """Part ``part`` of ``parts`` of the list message ``id`` (a Resync or an Inventory too large for one
    payload); the receiver acts only on the whole (see ``federation.chunks``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str = Field(default="", max_length=64)
    part: int = Field(default=1, ge=1)
    parts: int = Field(default=1, ge=1, le=100_000)


class Resync(_Message):
    """The dispatcher's answer to an Inventory: the complete set of placements it expects on the cluster.

    The agent deletes what it runs that is not listed (garbage), and reports status for the rest.
    Missing placements are re-sent by the dispatcher as Place commands.
    """

    type: Literal["resync"] = "resync"
    cluster: Name
    epoch: Counter
    expected: list[PlacementKey]
    sent_at: datetime = Field(default_factory=now)
    chunk: Chunk = Field(default_factory=lambda: Chunk())
    """One of several parts when the whole is above the payload limit (``federation.chunks``)."""


class Lease(_Message):
    """The dispatcher renews an agent's lease: valid for ``seconds`` from when the agent SENT the
    heartbeat stamped ``heartbeat_sent_at`` (the agent measures on its own monotonic clock, so neither
    delivery delay nor clock offset lengthens it). An agent whose lease runs out stops its Jobs
    (``worker_agent.lease``); the dispatcher re-places them only after the lease surely ended."""

    type: Literal["lease"] = "lease"
    cluster: Name
    epoch: Counter
    heartbeat_sent_at: datetime
    seconds: float = Field(gt=0, le=86_400)
    sent_at: datetime = Field(default_factory=now)


ASK_ID = r"^[A-Za-z0-9_-]{8,48}$"


class Ask(_Message):
    """A question about a placed Job's pods, answered on the cluster's streams topic (``federation.podstream``),
    sealed to the dispatcher's keys: ``pods`` lists the copy's pods (with their Events), ``logs`` streams one
    container's log (``follow`` until the container ends, the dispatcher says ``stop`` or ``idle_seconds`` pass
    without a byte), ``stop`` ends the stream ``id``. ``placement`` must be the copy the agent runs: an Ask
    cannot reach pods of anything else. ``rate`` caps the stream's bytes per second (the agent caps it too)."""

    type: Literal["ask"] = "ask"
    id: Annotated[str, Field(pattern=ASK_ID)]
    what: Literal["pods", "logs", "stop"]
    placement: PlacementKey
    job: JobRef
    pod: str = Field(default="", max_length=253)
    role: str = Field(default="", max_length=63)
    index: int | None = Field(default=None, ge=0)
    """Without ``pod``: the first pod of this role / index (neither: the lead role's first pod)."""
    container: str = Field(default="", max_length=253)
    previous: bool = False
    tail_lines: int | None = Field(default=None, ge=0)
    since_seconds: int | None = Field(default=None, ge=1)
    timestamps: bool = False
    follow: bool = False
    limit_bytes: int | None = Field(default=None, ge=1)
    rate: int = Field(default=8_000_000, ge=1024)
    idle_seconds: float = Field(default=300.0, gt=0, le=86_400)
    sent_at: datetime = Field(default_factory=now)


Command = Annotated[Place | Delete | Resync | Lease | Ask, Field(discriminator="type")]

MAX_COMMANDS_PER_MESSAGE = 256
"""At most this many Commands share one message to an agent (``encode_commands``)."""
COMMANDS_PREFIX: Final = b'{"v":1,"type":"commands","items":['
"""How every batch of Commands begins: ``{"v":1,"type":"commands","items":[<Command>, ...]}`` + seal.

An item is a Command's JSON, or a sealed Place (``federation.sealing``, encrypted on its own). The
batch is signed once; the agent applies the items in order, each as if it came alone
(``worker_agent.identity``). There is no pydantic model for it: the items are decoded one by one."""

# --- Reports --------------------------------------------------------------------------------


class ReportBase(_Message):
    """Every Report is numbered on its agent's **stream** so the dispatcher can see loss.

    A stream is one MQTT connection of one agent (a random id, new on every reconnect); ``n``
    counts the Reports published on it, heartbeats included, from 1. The sender stamps both as it
    publishes. A broker may drop QoS 1 messages for a slow subscriber (Mosquitto's
    ``max_queued_messages``), so at-least-once is not a given end to end: a hole in ``n`` that does
    not fill tells the dispatcher to answer with a Resync, which makes the agent report every
    expected placement again. ``n`` 0 means unnumbered (the will message, a tool's one-off report).
    """

    stream: str = Field(default="", max_length=64)
    n: Counter = 0


class Accepted(ReportBase):
    """The agent created (or already had) the Job for this placement and spec version."""

    type: Literal["accepted"] = "accepted"
    cluster: Name
    placement: PlacementKey
    spec_version: Counter
    seq: Counter
    sent_at: datetime = Field(default_factory=now)


REJECTED_TWO_CONTROLLERS = "TwoControllers"
"""``Rejected.reason`` when another controller (an upstream operator) also ran the copy: the agent deleted it
(``worker_agent.foreign``), so even after an Accepted the placement is over and goes elsewhere."""
REJECTED_LEASE_EXPIRED = "LeaseExpired"
"""``Rejected.reason`` (temporary) of an agent whose lease ran out (``worker_agent.lease``): it starts nothing
until a renewal reaches it, then takes the same Place; the dispatcher sends it again, spending no attempt."""


class Rejected(ReportBase):
    """The agent refused the placement. ``permanent`` False means another try on this cluster may work."""

    type: Literal["rejected"] = "rejected"
    cluster: Name
    placement: PlacementKey
    spec_version: Counter
    seq: Counter
    reason: str
    message: str
    permanent: bool = True
    sent_at: datetime = Field(default_factory=now)


class Status(ReportBase):
    """The worker Job's ``.status`` as its controller wrote it, copied whole.

    ``finished`` is ``"Succeeded"`` / ``"Failed"`` once the JobKind says so, else None.
    ``gone`` is True when the worker Job no longer exists (deleted there, or by TTL).
    """

    type: Literal["status"] = "status"
    cluster: Name
    placement: PlacementKey
    seq: Counter
    status: dict[str, Any]
    finished: Literal["Succeeded", "Failed"] | None = None
    gone: bool = False
    sent_at: datetime = Field(default_factory=now)


class NodeTaint(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    key: str
    value: str = ""
    effect: str = "NoSchedule"


class NodeFree(BaseModel):
    """One ready node: its labels, taints, free and allocatable capacity (quantity strings per resource)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[NodeTaint] = Field(default_factory=list)
    free: dict[str, str] = Field(default_factory=dict)
    allocatable: dict[str, str] = Field(default_factory=dict)
    """The most the node can ever give its pods: what tells "never fits" from "no room now" (empty from
    agents that do not send it; a dispatcher that does not know the field refuses the heartbeat, so
    upgrade the dispatcher before the agents)."""


MAX_NODES_REPORTED = 2000
"""Per-node figures are sent for clusters up to this many ready nodes (a heartbeat stays far below
the 1 MiB message limit); a larger cluster sends totals and ``largest_node_free`` only."""


class Capacity(BaseModel):
    """Per resource name, Kubernetes quantity strings (``"8"``, ``"64Gi"``, ``"500m"``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    allocatable: dict[str, str] = Field(default_factory=dict)
    free: dict[str, str] = Field(default_factory=dict)
    largest_node_free: dict[str, str] = Field(default_factory=dict)
    """Free capacity of the node with the most of it, per resource: what one pod can get at most."""
    nodes: list[NodeFree] = Field(default_factory=list)
    """Every ready node (up to ``MAX_NODES_REPORTED``): what the dispatcher's pod-by-pod gang fit reads."""


class Heartbeat(ReportBase):
    """Retained on the presence topic; the will message is the same with ``online=False``."""

    type: Literal["heartbeat"] = "heartbeat"
    cluster: Name
    online: bool = True
    agent_version: str = ""
    interval_seconds: float = 10.0
    labels: dict[str, str] = Field(default_factory=dict)
    capacity: Capacity = Field(default_factory=Capacity)
    kinds_reconciled: list[str] = Field(default_factory=list)
    kinds_delegated: dict[str, str] = Field(default_factory=dict)
    """JobKind name → the managedBy value of the operator the agent hands it to."""
    running: Counter = 0
    policy: PolicySettings | None = None
    """What the cluster lets placed Jobs do (``federation.policy``); the dispatcher skips a cluster whose
    policy would refuse a Job. None: not announced (the agent still enforces its own)."""
    sent_at: datetime = Field(default_factory=now)


class InventoryItem(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    placement: PlacementKey
    spec_version: Counter
    job: JobRef
    last_seq: Counter


class Inventory(ReportBase):
    """Sent by the agent on every (re)connect: what it runs. The dispatcher answers with a Resync."""

    type: Literal["inventory"] = "inventory"
    cluster: Name
    items: list[InventoryItem]
    sent_at: datetime = Field(default_factory=now)
    chunk: Chunk = Field(default_factory=lambda: Chunk())
    """One of several parts when the whole is above the payload limit (``federation.chunks``)."""


Report = Annotated[Accepted | Rejected | Status | Heartbeat | Inventory, Field(discriminator="type")]
Batched = Annotated[Accepted | Rejected | Status | Inventory, Field(discriminator="type")]

MAX_REPORTS_PER_MESSAGE = 256
"""At most this many Reports share one message (and its one seal); a sender also keeps the whole under
``MAX_BATCH_BYTES``, so one message never holds the dispatcher's subscriber long."""
MAX_BATCH_BYTES = 256 * 1024
"""A batch grows to about this size at most; a single Report up to ``MAX_PAYLOAD_BYTES`` goes alone."""


class Reports(_Message):
    """Several Reports of one agent in one message: one seal, one broker message, one decode.

    An agent sends every Report on its reports topic in this form (heartbeats stay alone, retained on
    the presence topic). Each item keeps its own ``stream`` and ``n`` (consecutive, in the order they
    were queued) and the message's seal carries the last item's ``n``, so the dispatcher's loss
    detection and replay refusal work as for single Reports; items are handled in order. The dispatcher
    still takes a single Report (an agent of an earlier version).
    """

    type: Literal["reports"] = "reports"
    items: list[Batched] = Field(min_length=1, max_length=MAX_REPORTS_PER_MESSAGE)

_COMMAND: TypeAdapter[Place | Delete | Resync | Lease | Ask] = TypeAdapter(Command)
_REPORT: TypeAdapter[Accepted | Rejected | Status | Heartbeat | Inventory] = TypeAdapter(Report)
_REPORTS: TypeAdapter[Reports] = TypeAdapter(Reports)
REPORTS_PREFIX: Final = b'{"v":1,"type":"reports","items":['
"""How every batch of Reports begins (``encode_reports``): a receiver tells it from a single Report unparsed."""
_UNNUMBERED: Final = b'{"v":1,"stream":"","n":0,'
_CURRENT: Final = b'{"v":1,'
"""How every message this version encodes begins (``v`` is the first field of every model)."""


def numbered(report: ReportBase, stream: str, n: int) -> ReportBase:
    """The same Report stamped with its place on a stream (see :class:`ReportBase`)."""
    return report.model_copy(update={"stream": stream, "n": n})


def encode_numbered(report: ReportBase, stream: str, n: int) -> bytes:
    """``encode(numbered(report, stream, n))`` without copying the model: the numbers are written into
    the JSON of an unnumbered Report (its first members, by field order)."""
    data = report.model_dump_json().encode()
    if not data.startswith(_UNNUMBERED) or not _STREAM.fullmatch(stream) or n < 0:
        return encode(numbered(report, stream, n))
    return _within_limit(b'{"v":1,"stream":"%s","n":%d,' % (stream.encode(), n) + data[len(_UNNUMBERED):])


def encode_reports(items: list[bytes]) -> bytes:
    """One :class:`Reports` message of Reports already encoded (``encode_numbered``), in order."""
    return REPORTS_PREFIX + b",".join(items) + b"]}"


def encode(message: _Message) -> bytes:
    """Serialise any Command or Report to the JSON bytes sent on the wire."""
    return _within_limit(message.model_dump_json().encode())


def _within_limit(data: bytes) -> bytes:
    if len(data) > MAX_PAYLOAD_BYTES:
        raise MessageRefused(
            f"message is {len(data)} bytes, above the {MAX_PAYLOAD_BYTES}-byte limit; "
            "shrink the Job (large inline data belongs in a ConfigMap or volume)")
    return data


def _decode(payload: bytes, adapter: TypeAdapter[Any], what: str) -> Any:
    if not isinstance(payload, bytes | bytearray):
        raise MessageRefused(f"{what} payload must be bytes, got {type(payload).__name__}")
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise MessageRefused(f"{what} payload is {len(payload)} bytes, above {MAX_PAYLOAD_BYTES}")
    if not payload.startswith(_CURRENT):  # what this code encodes needs no second parse: strict validation checks v
        try:
            raw = orjson.loads(payload)  # only the envelope is read here; a tenth of json.loads' cost
        except (ValueError, RecursionError) as exc:
            raise MessageRefused(f"{what} payload is not JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise MessageRefused(f"{what} payload must be a JSON object")
        version = raw.get("v")
        if type(version) is not int or version != SCHEMA_VERSION:  # true == 1 and 1.0 == 1 in Python
            raise MessageRefused(f"{what} schema version {version!r} is not supported "
                                 f"(this side speaks {SCHEMA_VERSION})")
    return _validate(payload, adapter, what)


def _validate(payload: bytes, adapter: TypeAdapter[Any], what: str) -> Any:
    try:
        # strict: JSON false is not attempt 0, "3" is not seq 3 (lax mode would coerce both)
        return adapter.validate_json(bytes(payload), strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(root)"
        raise MessageRefused(f"{what} field {where}: {first['msg']}") from None
    except (RecursionError, ValueError, TypeError) as exc:
        raise MessageRefused(f"{what} is malformed: {exc}") from None


def decode_command(payload: bytes) -> Place | Delete | Resync | Lease | Ask:
    return _decode(payload, _COMMAND, "command")  # type: ignore[no-any-return]


def decode_report(payload: bytes) -> Accepted | Rejected | Status | Heartbeat | Inventory:
    return _decode(payload, _REPORT, "report")  # type: ignore[no-any-return]


def decode_reports(payload: bytes) -> list[Accepted | Rejected | Status | Heartbeat | Inventory]:
    """The Reports in a message: the items of a :class:`Reports` batch, or a single Report."""
    if not payload.startswith(REPORTS_PREFIX):
        return [decode_report(payload)]
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise MessageRefused(f"report payload is {len(payload)} bytes, above {MAX_PAYLOAD_BYTES}")
    batch: Reports = _validate(payload, _REPORTS, "report")
    return list(batch.items)


def encode_commands(items: list[bytes]) -> bytes:
    """One batch message of Commands already encoded (a Command's JSON, or a sealed Place), in order."""
    return COMMANDS_PREFIX + b",".join(items) + b"]}"


def split_commands(payload: bytes) -> list[bytes]:
    """The items of a batch of Commands (see ``COMMANDS_PREFIX``), each as its own JSON bytes, or
    ``[payload]`` for a single Command; raises :class:`MessageRefused` for a malformed batch."""
    if not payload.startswith(COMMANDS_PREFIX):
        return [payload]
    try:
        raw = orjson.loads(payload)
    except (ValueError, RecursionError) as exc:
        raise MessageRefused(f"command batch is not JSON: {exc}") from None
    items = raw.get("items") if isinstance(raw, dict) and set(raw) == {"v", "type", "items"} else None
    if not isinstance(items, list) or not 0 < len(items) <= MAX_COMMANDS_PER_MESSAGE \
            or not all(isinstance(item, dict) for item in items):
        raise MessageRefused(f"command batch must hold 1 to {MAX_COMMANDS_PER_MESSAGE} JSON objects")
    return [orjson.dumps(item) for item in items]
