"""Settings groups shared by the services: the MQTT link and the Kubernetes API client.

Plain pydantic models, not settings sources: each service builds its own pydantic-settings class
(env vars, CLI flags) and nests these groups in it, so there is one settings object per process,
passed explicitly, and no module globals.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

if TYPE_CHECKING:
    from federation.kinds.base import JobKind

MQTT_SCHEMES = ("mqtt", "mqtts", "tcp", "ssl")


def check_mqtt_url(url: str) -> tuple[str, int, bool]:
    """(host, port, tls) of a broker URL, or ValueError naming what is wrong and the fix. The one check
    of the URL: at settings time (a service with a bad URL refuses to start) and in ``federation.mqtt``."""
    parts = urlsplit(url)
    if parts.scheme not in MQTT_SCHEMES:
        raise ValueError(f"MQTT url {url!r}: the scheme must be mqtt:// or mqtts:// (got {parts.scheme or 'none'!r})")
    tls = parts.scheme in ("mqtts", "ssl")
    try:
        port = parts.port or (8883 if tls else 1883)
    except ValueError:
        raise ValueError(f"MQTT url {url!r}: the port must be a number from 1 to 65535") from None
    if not parts.hostname:
        raise ValueError(f"MQTT url {url!r}: no host; write mqtt://host:1883")
    return parts.hostname, port, tls


class MqttSettings(BaseModel):
    """How to reach the broker and how hard to retry it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = "mqtt://127.0.0.1:1883"
    """``mqtt://host:port`` or ``mqtts://host:port`` (TLS); ``user:password@`` is allowed in the URL.
    Default: a broker on this machine, what a development setup runs."""

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        check_mqtt_url(value)
        return value

    topic_root: str = "mkd/v1"
    """Prefix of every topic; change it so several federations (or test runs) share one broker."""

    client_id: str | None = None
    """MQTT client id. Must be stable across restarts for the persistent session to survive (QoS 1
    messages queued while the service was away are delivered on reconnect). None: the service picks
    one from its own identity (``mkd-dispatcher``, ``mkd-agent-<cluster>``)."""

    username: str | None = None
    """Broker user; overrides a user given in ``url``. None: anonymous (or the URL's user)."""

    password: str | None = None
    """Broker password; overrides a password given in ``url``."""

    tls_ca: Path | None = None
    """PEM file of the CA that signed the broker's certificate. None with ``mqtts://``: the system CAs."""

    tls_cert: Path | None = None
    """PEM client certificate, for brokers that authenticate clients by certificate."""

    tls_key: Path | None = None
    """PEM private key of ``tls_cert``."""

    keepalive: int = Field(default=30, ge=5, le=3600)
    """Seconds between pings. 30 s: the broker publishes the will (presence offline) after 1.5x this
    when a peer dies silently, so 45 s to notice a lost agent; shorter costs traffic for nothing."""

    backoff_initial: float = Field(default=0.5, gt=0)
    """Seconds to wait after the first failed connect; doubled after each further failure."""

    backoff_max: float = Field(default=30.0, gt=0)
    """Cap on the reconnect delay in seconds: a broker back after an outage is found within 30 s."""

    max_inflight: int = Field(default=32, ge=1, le=65535)
    """QoS 1 publishes awaiting their PUBACK at once (paho's in-flight window); more concurrent callers
    wait their turn, before their publish timeout starts. A few dozen keep the socket to a local
    Mosquitto busy; beyond paho's window a publish would wait in its queue with its timer running."""

    publish_timeout: float = Field(default=10.0, gt=0)
    """Seconds a publish waits for its PUBACK before it fails with Transport."""


class SigningSettings(BaseModel):
    """This side's Ed25519 key and how strictly incoming seals are checked (``federation.signing``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    private_key_file: Path | None = None
    """File holding this side's private key (base64 of 32 bytes, or PKCS#8 PEM): a mounted Secret."""

    private_key: SecretStr | None = None
    """The private key inline, from a Secret through an env var; wins over ``private_key_file``."""

    max_age_seconds: float = Field(default=300.0, gt=0)
    """A message sealed further than this from the receiver's clock (either way) is refused, and
    repeats are remembered this long. 5 minutes covers clock skew and a broker's queue during a
    short outage; what is older is recovered by the Inventory / Resync exchange, not replayed."""

    clock_skew_seconds: float = Field(default=2.0, ge=0)
    """The agent refuses Commands sealed before its process first connected, less this much skew
    between the two clocks (the dispatcher answers the link's Inventory with a fresh Resync and
    Places). A Command recorded within this long before an agent restart could be replayed once after it."""


class KubeSettings(BaseModel):
    """Which Kubernetes API server to talk to and how."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kubeconfig: Path | None = None
    """Kubeconfig file. None: the in-cluster service account when running in a pod, else ~/.kube/config."""

    context: str | None = None
    """Context inside the kubeconfig; None: its current-context."""

    max_concurrency: int = Field(default=16, ge=1, le=256)
    """Blocking API calls running at once (threads and pooled HTTP connections). 16 keeps a busy agent
    from queueing behind slow calls without opening hundreds of connections to one API server."""

    requests_on_loop: bool = True
    """Requests (not watches) over mkd's own keep-alive HTTP/1.1 connections on the event loop, set up from
    the official client's configuration and authentication (about 0.2 CPU-ms a request instead of 1.1).
    False: every request through the official client's urllib3 pool on threads, as a configuration with
    a proxy always does; the way back should an API server or an authentication plugin disagree."""

    timeout: float = Field(default=30.0, gt=0)
    """Seconds one API request may take (connect + read) before it fails with Transport."""

    watch_timeout: int = Field(default=300, ge=10)
    """``timeoutSeconds`` of each watch request; the informer re-watches from the last resourceVersion."""


KINDS_FILE_DOC = """YAML file declaring job kinds mkd has no module for (``externalFrameworks: [...]``, see "Kinds from
configuration" in docs/CONFIGURATION.md), in Kubernetes the ConfigMap ``mkd-kinds`` mounted as a file. The
dispatcher, every agent and every fencer read the same declarations; an invalid one stops the service at start,
naming the field and the fix. None: mkd's own kinds only."""


def check_kinds_file(path: Path | None) -> Path | None:
    """The settings check of ``kinds_file``: every declaration in it valid (ValueError listing the problems)."""
    from federation.kinds.declared import DeclarationsInvalid

    try:
        declared_kinds(path)
    except DeclarationsInvalid as exc:
        raise ValueError(str(exc)) from None
    return path


class KindsFileSetting(BaseModel):
    """``kinds_file``, the one setting the dispatcher, the agent and the fencer share by design: they must read
    the same declarations. Mixed into each service's settings class."""

    kinds_file: Path | None = Field(default=None, description=KINDS_FILE_DOC)

    @field_validator("kinds_file")
    @classmethod
    def _kinds_file(cls, value: Path | None) -> Path | None:
        return check_kinds_file(value)

    def declared_kinds(self) -> tuple[JobKind, ...]:
        """The kinds ``kinds_file`` declares (:class:`~federation.kinds.declared.DeclaredKind` s)."""
        return declared_kinds(self.kinds_file)


def declared_kinds(path: Path | None) -> tuple[Any, ...]:
    """The :class:`~federation.kinds.declared.DeclaredKind` s of ``kinds_file`` (none without one)."""
    if path is None:
        return ()
    from federation.kinds.declared import load
    from federation.kinds.registry import KINDS

    return load(path, KINDS)
