"""The agent's one settings object (env prefix ``MKD_AGENT_``, nested groups with ``__``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from federation.settings import (
    KindsFileSetting,
    KubeSettings,
    MqttSettings,
    SigningSettings,
)
from worker_agent.policy import PolicySettings


class AgentSettings(BaseSettings, KindsFileSetting):
    """Everything ``mkctl agent`` needs; passed explicitly, never read from module globals."""

    model_config = SettingsConfigDict(env_prefix="MKD_AGENT_", env_nested_delimiter="__", extra="forbid")

    cluster_name: str = Field(min_length=1, max_length=63)
    """This worker cluster's name as the dispatcher knows it (a DNS-1123 label); names the MQTT topics."""

    kubeconfig: Path | None = None
    """Kubeconfig of the worker cluster. None: in-cluster service account, else ~/.kube/config.
    Overrides ``kube.kubeconfig`` when set."""

    kube: KubeSettings = Field(default_factory=KubeSettings)
    """API client tuning (context, concurrency, timeouts)."""

    mqtt: MqttSettings = Field(default_factory=MqttSettings)
    """Broker connection; the client id defaults to ``mkd-agent-<cluster_name>`` (a stable persistent session)."""

    signing: SigningSettings = Field(default_factory=SigningSettings)
    """This agent's private key: every Report, heartbeat and will message is sealed with it. The
    dispatcher knows the cluster by the public half (``mkctl clusters register NAME --public-key``)."""

    dispatcher_public_keys: list[str] = Field(default_factory=list)
    """Public keys whose seal a Command must carry (two during a key rotation). Commands sealed by
    anything else, or not at all, are refused and counted."""

    origin: str = "mkd"
    """Which dispatcher origin this agent serves: stamped on everything it creates; GC only touches it."""

    heartbeat_interval_seconds: float = Field(default=10.0, gt=0)
    """Seconds between presence heartbeats; also sent at once when capacity changes. 10 s lets the
    dispatcher see capacity within one placement cycle without flooding the broker."""

    max_log_streams: int = Field(default=32, ge=1, le=1000)
    """Asks (log streams, pod listings) answered at once; one more is refused as busy. 32 covers a team
    following its jobs (20 follows cost about 1 % of a core) while bounding the worker API's open requests."""

    max_log_rate: int = Field(default=8_000_000, ge=1024)
    """Bytes per second one log stream may send at most (the dispatcher may ask for less): a large log
    cannot fill the broker's link, and 8 MB/s reads 50 MB in under 7 s."""

    capacity_debounce_seconds: float = Field(default=1.0, ge=0)
    """A capacity change is announced at most this often (pods come and go in bursts)."""

    delegate: dict[str, str] = Field(default_factory=dict)
    """JobKind name -> managedBy value of an operator installed in this cluster (e.g.
    ``{"MPIJob": "kubeflow.org/mpi-operator"}``). Delegated kinds are created with that value and
    only mirrored; the agent runs no reconciler for them."""

    namespace: str = Field(default="mkd-system", min_length=1, max_length=63)
    """The agent's own namespace: it keeps its report epoch there (ConfigMap ``mkd-agent-<cluster>-epoch``,
    see ``worker_agent.seq``); created when missing. ``deploy/worker/agent.yaml`` runs the agent in it."""

    policy: PolicySettings = Field(default_factory=PolicySettings)
    """Where placed Jobs may land and what their pods may do (``worker_agent/policy.py``): namespace
    mapping and deny list, allowed service accounts, the Pod Security level (baseline by default)."""

    create_namespaces: bool = True
    """Create a Job's namespace when missing. False: reject the placement (permanent=False) naming it."""

    cluster_labels: dict[str, str] = Field(default_factory=dict)
    """Labels announced in the heartbeat (region, gpu type, ...) that placement can match on."""

    discovery_interval_seconds: float = Field(default=30.0, gt=0)
    """Seconds between checks for job CRDs installed after the agent started (they are then watched and
    reconciled without a restart); 30 s is quick next to installing an operator, cheap for the API server."""

    concurrency: int = Field(default=16, ge=1, le=256)
    """Jobs reconciled at once (each job is always reconciled by one worker at a time)."""

    backlog_max: int = Field(default=64, ge=1)
    """A placed Job is created (and Accepted) once fewer than this many reconcile passes wait: a burst of
    Places waits unanswered in the dispatcher's outbox instead of as Jobs created here whose Services, Pods
    and status come long after. Keep it at a few times ``concurrency``."""

    status_hold_seconds: float = Field(default=1.0, ge=0, le=30)
    """A Job status whose latest condition is Kubeflow's ``Created``, or ``Running`` while replicas are still to
    start, is written once the Job's next one comes (its pods running) or this long after the pass that made it,
    whichever is first: a Job whose pods start within it gets one status write instead of one per step
    (``worker_agent.apply``). 0: written at once, as upstream does."""

    accept_hold_seconds: float = Field(default=1.5, ge=0, le=10)
    """An Accepted waits this long for the placement's first Status, which then goes alone: the dispatcher takes a
    Status of a Place it has no answer to as its Accepted, so a Job whose first status comes within it costs one
    Report instead of two (``worker_agent.reports.Outbox``). A little longer than ``status_hold_seconds``, so that a
    held Created still takes it along. A Rejected or an Inventory sends what is held first; the dispatcher sends an
    unanswered Place again only after ``place_resend_seconds`` (30 s). 0: sent at once."""

    lease_stop_before_seconds: float = Field(default=60.0, gt=0)
    """Fencing (worker_agent.lease): suspend every Job this long before the dispatcher's lease runs out
    unrenewed, so their pods are gone (terminationGracePeriod 30 s by default) before the lease ends.
    Capped at a quarter of the lease."""

    lease_startup_grace_seconds: float = Field(default=60.0, gt=0)
    """At start the agent holds no lease: it keeps its Jobs this long for the first renewal to arrive
    (one heartbeat round trip when the dispatcher is up), then fences them."""

    def kube_settings(self) -> KubeSettings:
        if self.kubeconfig is None:
            return self.kube
        return self.kube.model_copy(update={"kubeconfig": self.kubeconfig})

    def client_id(self) -> str:
        return self.mqtt.client_id or f"mkd-agent-{self.cluster_name}"

    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    """Port of the agent's ``/metrics``, ``/healthz`` and ``/readyz`` (deploy/ sets 9090). None: not
    served. 0: any free port."""

    metrics_host: str = "0.0.0.0"
    """Address the metrics port binds."""


class FencerSettings(BaseSettings, KindsFileSetting):
    """Everything ``mkctl fencer`` needs (env prefix ``MKD_FENCER_``): the worker cluster, where the agent
    records its lease, and whose Jobs to stop when that record runs out (``worker_agent.fencer``)."""

    model_config = SettingsConfigDict(env_prefix="MKD_FENCER_", env_nested_delimiter="__", extra="forbid")

    cluster_name: str = Field(min_length=1, max_length=63)
    """The worker cluster's name, as the agent's ``cluster_name``: names the Lease ``mkd-agent-<cluster>``."""

    kubeconfig: Path | None = None
    """Kubeconfig of the worker cluster. None: in-cluster service account, else ~/.kube/config."""

    kube: KubeSettings = Field(default_factory=KubeSettings)
    """API client tuning (context, concurrency, timeouts)."""

    namespace: str = Field(default="mkd-system", min_length=1, max_length=63)
    """The agent's namespace (the agent's ``namespace``), where it records its lease."""

    origin: str = "mkd"
    """The agent's origin: only Jobs labelled ``mkd.dev/origin`` with it are stopped."""

    poll_seconds: float = Field(default=2.0, gt=0, le=60)
    """Seconds between reads of the lease record. The fencer also wakes at the recorded end itself, so
    this bounds only how late it sees a renewal; 2 s is one cheap GET, far inside the dispatcher's
    ``lease_margin_seconds`` (5 min by default)."""

    sweep_seconds: float = Field(default=10.0, gt=0)
    """While the record stays out of date, sweep again this often (a pod the hung agent had in flight)."""

    concurrency: int = Field(default=8, ge=1, le=64)
    """API calls at once while sweeping: hundreds of Jobs stop within seconds without flooding the server."""

    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    """Port of the fencer's ``/metrics``, ``/healthz`` and ``/readyz`` (deploy/ sets 9090;
    ``worker_agent.fencermetrics``). None: not served. 0: any free port."""

    metrics_host: str = "0.0.0.0"
    """Address the metrics port binds."""

    def kube_settings(self) -> KubeSettings:
        if self.kubeconfig is None:
            return self.kube
        return self.kube.model_copy(update={"kubeconfig": self.kubeconfig})
