"""The dispatcher's one settings object: every field settable from the environment or a CLI flag.

Environment variables carry the prefix ``MKD_DISPATCHER_``; nested groups use ``__``
(``MKD_DISPATCHER_MQTT__URL``). ``mkctl dispatcher`` maps its flags onto the same fields.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from federation.settings import (
    KindsFileSetting,
    KubeSettings,
    MqttSettings,
    SigningSettings,
)


class FairSharingSettings(BaseModel):
    """Fair sharing between the ClusterQueues of a cohort (Kueue's configuration ``fairSharing``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enable: bool = False
    """Admit first from the ClusterQueue whose weighted dominant resource share (usage above nominal
    quota over what the cohort can lend, divided by ``fairSharing.weight``) would be lowest after the
    admission, and preempt by share (``preemption_strategies``) instead of ``borrowWithinCohort``."""

    preemption_strategies: list[str] = Field(
        default_factory=lambda: ["LessThanOrEqualToFinalShare", "LessThanInitialShare"])
    """Kueue's ``fairSharing.preemptionStrategies``: ``LessThanOrEqualToFinalShare`` takes a Workload when
    the preemptor's share with it admitted is at most the target's share without the victim;
    ``LessThanInitialShare`` when it is below the target's share now. One of them, or both in this order."""

    @field_validator("preemption_strategies")
    @classmethod
    def _known_strategies(cls, value: list[str]) -> list[str]:
        allowed = (["LessThanOrEqualToFinalShare"], ["LessThanInitialShare"],
                   ["LessThanOrEqualToFinalShare", "LessThanInitialShare"])
        if value not in allowed:
            raise ValueError(f"{value} is not one of {', '.join(str(a) for a in allowed)}")
        return value


class PreemptionSettings(BaseModel):
    """How a Workload that preempted others is ordered while its victims leave."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prioritize_preemptors: bool = True
    """A Workload whose victims are leaving is tried first in its pass, before what needs no borrowing, and
    keeps the quota they free, so nothing takes that room back and makes it preempt again: Kueue's feature
    gate ``PrioritizePreemptorWorkloads``. On by default in mkd; off by default in Kueue
    v0.19, whose order mkd then follows exactly: like Kueue, it can then evict the same Workloads over and
    over for one preemptor while a Workload within its nominal quota keeps reclaiming the room (a livelock
    that lasts until a Job arrives or finishes; see docs/QUEUEING.md)."""


class HandoverSettings(BaseModel):
    """Gradual handover between controllers (dispatcher/handover, README "Handing jobs over")."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    """Read HandoverPolicies (when their CRD is installed), count Jobs per controller and keep shadow records.
    Off: none of it, and the webhook routes nothing."""

    webhook_port: int | None = Field(default=None, ge=0, le=65535)
    """HTTPS port of the mutating admission webhook that sets managedBy on new Jobs a Route policy selects.
    None: not served (deploy/ sets 9443). 0: any free port."""

    webhook_host: str = "0.0.0.0"
    """Address the webhook binds."""

    webhook_cert_file: Path | None = None
    """The webhook's TLS certificate (PEM), mounted from a Secret; required with webhook_port."""

    webhook_key_file: Path | None = None
    """The private key of webhook_cert_file (PEM)."""

    flush_seconds: float = Field(default=5.0, gt=0)
    """How often shadow records and Job counts are written to the database."""

    extra_controllers: list[str] = Field(default_factory=list)
    """managedBy values of controllers running on the manager beyond the kinds' own and MultiKueue;
    a Job in a policy's scope with any other value gets one Warning Event."""


class AdmissionCheckSettings(BaseModel):
    """Kueue mode: mkd as Kueue's AdmissionCheck controller ``mkd.dev/dispatcher`` (docs/KUEUE.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    """Beside a running Kueue: dispatch only the Jobs of ClusterQueues whose AdmissionChecks include one with
    controllerName ``mkd.dev/dispatcher``, once Kueue reserved quota for their Workloads, and set that check's
    state; mkd's own queueing is off (Kueue's quota, priority and preemption decide). Off: mkd queues itself."""

    sync_seconds: float = Field(default=1.0, gt=0)
    """How often the check's state on each Workload is brought in line with mkd's decision (and the
    AdmissionChecks' Active condition written)."""

    no_fit_retry_seconds: float = Field(default=60.0, ge=0)
    """A Workload no worker cluster fits for this long after Kueue reserved its quota gets the check ``Retry``
    (with why): Kueue releases the quota and requeues it, so it does not hold quota it cannot use."""


class DispatcherSettings(BaseSettings, KindsFileSetting):
    """Settings of one dispatcher process (manager cluster)."""

    model_config = SettingsConfigDict(env_prefix="MKD_DISPATCHER_", env_nested_delimiter="__", extra="forbid")

    kube: KubeSettings = Field(default_factory=KubeSettings)
    """The manager cluster's API server (kubeconfig, context, concurrency)."""

    database_url: str = "sqlite+aiosqlite:///state/mkd.db"
    """SQLAlchemy async URL. SQLite file by default (one dispatcher, demo, small setups);
    ``postgresql+asyncpg://user@host/db`` in production. Run ``mkctl db upgrade`` first."""

    mqtt: MqttSettings = Field(default_factory=MqttSettings)
    """The broker link; ``mqtt.topic_root`` must match the agents'."""

    signing: SigningSettings = Field(default_factory=SigningSettings)
    """The dispatcher's private key: every Command is sealed with it (agents trust its public key)."""

    cluster_public_keys: dict[str, str] = Field(default_factory=dict)
    """Cluster name -> its agent's public key, trusted in addition to those registered in the database
    (``mkctl clusters register``). Reports of a cluster with no key are refused, never adopted."""

    cluster_keys_refresh_seconds: float = Field(default=5.0, gt=0)
    """How often registered keys are read again (a cluster registered while the dispatcher runs is
    heard within this long) and refused senders are written for ``mkctl clusters list``."""

    origin: str = Field(default="mkd", min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    """Name of this federation, stamped as the origin label on every object placed on a worker; an
    agent's garbage collection only touches objects of its own origin."""

    replica_id: str = Field(default="", max_length=100)
    """This replica's name in its MQTT client ids (``<mqtt.client_id>-<replica_id>-in`` / ``-out``).
    Empty: the host name (the pod name in Kubernetes), so replicas never share a broker session."""

    namespaces: list[str] = Field(default_factory=list)
    """Namespaces of the manager cluster to watch; empty: all namespaces."""

    heartbeat_timeout_seconds: float = Field(default=30.0, gt=0)
    """A Cluster whose last heartbeat is older than this is lost: nothing new is placed on it.
    30 s = three missed heartbeats at the agents' default 10 s interval."""

    worker_lost_timeout_seconds: float | None = Field(default=900.0, gt=0)
    """Workloads an agent accepted on a Cluster lost for this long are placed again elsewhere, and never
    before the agent's lease (``lease_seconds`` after the last heartbeat granted) plus
    ``lease_margin_seconds`` is over: by then the cut-off agent has suspended its copies itself
    (``worker_agent.lease``), so the Job never runs twice. 15 min, MultiKueue's default: a broker or
    network outage of up to ``lease_seconds`` leaves training alone, and re-placing (a restart from
    the last checkpoint at best) only happens for a Cluster that is really gone. None: wait forever."""

    lease_seconds: float = Field(default=600.0, gt=0, le=86_400)
    """Length of the lease each heartbeat renews (sent back as a Lease Command). An agent that hears
    nothing for this long (minus its ``lease_stop_before_seconds``) suspends every Job it runs. 10 min:
    longer than any routine outage of the broker or of this dispatcher (a standby takes over in seconds)."""

    lease_margin_seconds: float = Field(default=300.0, ge=0)
    """Added to the lease before a lost Cluster's Workloads are placed elsewhere: clock-rate skew
    between the machines, the agent's watchdog period and a delayed suspension (pods terminating)."""

    unaccepted_replace_seconds: float = Field(default=60.0, gt=0)
    """A Place still unanswered on a Cluster lost for this long is placed elsewhere, but never before
    the agent's lease (plus ``lease_margin_seconds``) is over: the agent may have applied it and its
    Accepted been lost as it was cut off, so until then it is treated like the Cluster's other Jobs.
    Unlike those it does not wait for ``worker_lost_timeout_seconds`` (nor forever when that is None).
    The attempt gets a Delete that the agent applies before anything else when it comes back, and a
    Resync deletes any copy it did make."""

    max_placement_attempts: int = Field(default=5, ge=1)
    """Placement attempts per Workload (rejections, lost clusters) before it is marked failed."""

    batch_size: int = Field(default=500, ge=1, le=10_000)
    """Events (Job changes and Reports) handled in one database transaction. Batching is what lets
    the dispatcher claim and place hundreds of Jobs a second on two cores."""

    batch_linger_seconds: float = Field(default=0.05, ge=0)
    """After the first item arrives, wait this long for more before starting a batch (not when a full batch
    waits already). Every batch costs a handful of database round trips whatever its size: at 100 Jobs/s, 50 ms
    instead of 20 halved the transactions (0.28 to 0.15 per Job) and cut the federation's CPU per Job by 15 %
    (the dispatcher's by a sixth, PostgreSQL's by a third) for ~45 ms more from created to Running mirrored;
    under a burst batches are full and it costs nothing."""

    lease_linger_seconds: float = Field(default=0.25, ge=0, le=5)
    """Once a heartbeat comes in, the lease desk waits this long for more before writing their leases (one
    statement for all) and publishing them. A Lease runs for ``lease_seconds``, so a fraction of a second
    later costs nothing; with 1,000 clusters beating every 10 s it turns about 100 transactions a second
    into 4."""

    outbox_batch_size: int = Field(default=500, ge=1, le=10_000)
    """Outbox rows published (concurrently, QoS 1) per round. Every Place is answered at once, so a
    round is also a burst of Reports; Mosquitto drops QoS 1 messages for a subscriber with more than
    ``max_queued_messages`` (default 1000) waiting, so a round stays well below that."""

    max_unanswered_places: int = Field(default=800, ge=1)
    """Places published whose agent has not answered yet, at most. Agents answer at once, and
    Mosquitto drops QoS 1 messages for a subscriber with more than ``max_queued_messages`` (default
    1000) waiting: this keeps the dispatcher's Report subscription below that."""

    outbox_memory_bytes: int = Field(default=32 * 1024 * 1024, ge=0)
    """Bytes of committed Commands (sealed Places, mostly) held in memory for the publisher; past this,
    rows wait in the database only and the publisher reads them back as it takes them. A burst of
    100,000 claims would otherwise hold every Place no agent can take yet (the budget above) in RSS."""

    outbox_poll_seconds: float = Field(default=2.0, gt=0)
    """How often the publisher looks for unsent rows, at most, when it has nothing fresh to send (rows
    written by a second dispatcher, or left by a crash, once this old)."""

    outbox_retention_seconds: float = Field(default=3600.0, ge=0)
    """Sent outbox rows are deleted after this long; they only serve debugging."""

    history_retention_seconds: float | None = Field(default=30 * 86_400.0, ge=0)
    """The rows of a Workload whose manager Job was deleted (its history: placements, events) are removed
    this long after the deletion, and cluster events (lost, back online) this long after they happened, so
    the database holds what the fleet ran within this time, not everything it ever ran. A Workload whose
    Job still exists keeps its history as long as the Job does. 30 days by default; None: keep everything."""

    report_gap_grace_seconds: float = Field(default=5.0, gt=0)
    """How long a hole in an agent's numbered report stream may stay open before the Reports in it
    count as lost and the cluster is sent a Resync (every expected placement is reported again).
    Concurrent publishers reorder a few Reports; seconds of reordering never happen."""

    place_resend_seconds: float = Field(default=30.0, gt=0)
    """A Place that got neither Accepted nor Rejected within this long is sent again: a broker may
    drop QoS 1 messages for a slow subscriber (Mosquitto's ``max_queued_messages``), and the agent
    answers a repeated Place again without applying it twice. Counted from the Place's last sending,
    and after a restart from when this dispatcher's Report subscription came up: the answers its
    predecessor's Places got while nobody listened arrive first, they are not re-sent blindly."""

    place_resend_batch: int = Field(default=200, ge=1)
    """At most this many unanswered Places are sent again per cluster per tick, oldest first; the
    others stay unanswered in the database and go at the next ticks (none is ever skipped). 200: a
    restarted dispatcher or a broker that dropped a burst does not answer with a burst of its own to
    every agent (Mosquitto drops QoS 1 messages beyond ``max_queued_messages``, 1000 by default)."""

    placement_retry_seconds: float = Field(default=10.0, gt=0)
    """A placement pass runs at least this often even if nothing woke one: it tries the head of each
    queue. Workloads set aside for quota or capacity come back, as in Kueue, on what can make room:
    quota released in their cohort, a capacity change, a silent cluster heard again, a queue change."""

    capacity_settle_seconds: float = Field(default=5.0, ge=0)
    """A placement's requests are subtracted from its Cluster's free capacity until a heartbeat sent
    this long after the agent accepted it arrives (by then its pods show in the agent's figures)."""

    outage_retry_max_seconds: float = Field(default=2.0, gt=0)
    """While the database or the manager cluster's API is unreachable, the held batch is tried again
    with a backoff from 0.1 s up to this cap (jittered, reset after the first success): an outage of
    any length is ridden out, and the dispatcher catches up within this long of the recovery."""

    parked_retry_max_seconds: float = Field(default=300.0, gt=0)
    """An item that fails on its own (not an outage) is recorded as an error on its Workload and Job,
    set aside and tried again with a backoff up to this cap; a newer change of the Job replaces it."""

    leader_poll_seconds: float = Field(default=1.0, gt=0)
    """Active / standby on PostgreSQL (dispatcher/replica/leader.py): how often a standby tries to take the
    leader lock and the active checks its session. A crashed active is replaced within about this long."""

    leader_idle_timeout_seconds: float = Field(default=10.0, gt=0)
    """PostgreSQL ends the active's lock session when it sent nothing for this long (a hung or frozen
    process), so a standby takes over; well above ``leader_poll_seconds`` so a busy loop is not mistaken
    for a hung one."""

    kind_recheck_seconds: float = Field(default=30.0, gt=0)
    """How often a JobKind whose CRD is not installed is checked again."""

    gil_switch_interval_seconds: float | None = Field(default=0.0005, gt=0)
    """``sys.setswitchinterval`` while the dispatcher runs (process-wide). The event loop does many
    short socket calls, each giving up the GIL; with the Kubernetes client's threads busy, getting
    it back waits up to the interval (CPython's default 5 ms). 0.5 ms lifted throughput by a third
    in the benchmark. None: leave the interpreter's value."""

    starvation_seconds: float = Field(default=300.0, ge=0)
    """A Workload at the head of its queue that has been set aside (no quota, or no cluster fits) for
    this long is tried first in every pass and, if it still fits no cluster, holds the cluster that
    comes closest: nothing queued after it is placed there until it fits (short of quota it could
    have, it blocks its ClusterQueue instead). Kueue has no such rule; without it a stream of small
    jobs can starve a large gang forever."""

    starvation_hold_seconds: float = Field(default=60.0, gt=0)
    """A starving Workload's hold (a cluster, or its ClusterQueue) is let go when the room it waits for
    has not grown for this long: it would not fit there as things stand (long runners, nodes too small
    for its pods), and holding on would block everything queued after it. Its reason says so (``mkctl
    why``); it may hold again after ``starvation_seconds``."""

    fair_sharing: FairSharingSettings = Field(default_factory=lambda: FairSharingSettings())
    """Kueue's fair sharing (its configuration's ``fairSharing.enable``), off by default as there."""

    preemption: PreemptionSettings = Field(default_factory=lambda: PreemptionSettings())
    """How a preempting Workload is ordered while its victims leave."""

    max_admissions_per_pass: int = Field(default=2000, ge=1)
    """Admission attempts in one scheduling pass at most (each pending Workload is still considered:
    the pass goes on where it stopped at the next round)."""

    kube_writers: int = Field(default=16, ge=1, le=256)
    """Concurrent writes to manager Jobs (conditions, status mirror, Events); per Job they are serial."""

    stop_flush_seconds: float = Field(default=5.0, ge=0)
    """On a graceful stop, how long the manager Job writes still to do (those waiting to share a write
    included) may take before the dispatcher exits; nothing writes them again until the Job changes."""

    api_port: int | None = Field(default=None, ge=0, le=65535)
    """Port of the HTTP server: the admin API (``/api/v1``, OpenAPI at ``/openapi.json``), the dashboard,
    ``/metrics``, ``/healthz`` and ``/readyz``. None: not served (deploy/ sets 8080). 0: any free port."""

    handover: HandoverSettings = Field(default_factory=HandoverSettings)
    """Gradual handover between controllers: policies, the admission webhook, shadow records."""

    admission_check: AdmissionCheckSettings = Field(default_factory=AdmissionCheckSettings)
    """Kueue mode: mkd as the AdmissionCheck controller ``mkd.dev/dispatcher`` beside a running Kueue."""

    api_host: str = "0.0.0.0"
    """Address the HTTP server binds (``127.0.0.1`` to keep it local)."""

    api_token: SecretStr | None = None
    """A static bearer token accepted for every read and action without asking the manager cluster (the
    demo's; break-glass). None: only manager-cluster tokens, checked with TokenReview and
    SubjectAccessReview so RBAC decides."""

    log_streams_per_cluster: int = Field(default=32, ge=1, le=1000)
    """Log streams and pod listings open at once from one worker cluster (each holds a worker API request
    and an agent task); one more is refused with 429 until one ends. Matches the agent's max_log_streams."""

    log_streams_per_user: int = Field(default=8, ge=1, le=1000)
    """Log streams one user may hold open at once across the federation (a dashboard tab and a few
    terminals), so one user cannot take a cluster's streams."""

    log_stream_rate: int = Field(default=8_000_000, ge=1024)
    """Bytes per second asked of an agent for one log stream (the agent caps it at its max_log_rate)."""

    worker_causes_seconds: float = Field(default=20.0, ge=0)
    """Every this many seconds the dispatcher asks the agents why the pods of up to 20 placed Jobs do not run
    and writes each new cause as a Warning Event on the manager Job (at most one per Job and minute). 0: never.
    20 s tells a user within a minute of an image that cannot be pulled, at one small Ask per Job and round."""

    log_follow_idle_seconds: float = Field(default=300.0, gt=0, le=86_400)
    """A follow ends after this many seconds without a new log byte (the user follows again if needed)."""
