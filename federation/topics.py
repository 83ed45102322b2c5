"""MQTT topic names, built and parsed here only.

``mkd/v1/<cluster>/commands`` (dispatcher → agent), ``mkd/v1/<cluster>/reports`` (agent →
dispatcher), ``mkd/v1/<cluster>/presence`` (retained heartbeat; the agent's will message
marks it offline) and ``mkd/v1/<cluster>/streams`` (agent → dispatcher: the answers to an Ask, a Job's
pods and container logs, apart from the Reports so that they never wait behind them). The root ``mkd/v1`` can be changed (settings ``topic_root``) so that several
federations, or parallel test runs, share one broker without hearing each other. Cluster names are DNS-1123 labels, so they never contain ``/``, ``+`` or ``#``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from federation.errors import Invalid

ROOT = "mkd/v1"
Channel = Literal["commands", "reports", "presence", "streams"]
CHANNELS: tuple[Channel, ...] = ("commands", "reports", "presence", "streams")
_CLUSTER = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")



def all_reports(root: str = ROOT) -> str:
    """Filter matching every cluster's reports under ``root``."""
    return f"{root}/+/reports"


def all_presence(root: str = ROOT) -> str:
    """Filter matching every cluster's presence under ``root``."""
    return f"{root}/+/presence"


def all_streams(root: str = ROOT) -> str:
    """Filter matching every cluster's answer streams under ``root``."""
    return f"{root}/+/streams"


def check_cluster_name(name: str, field: str = "cluster") -> str:
    """Return ``name`` if it is a DNS-1123 label, else raise Invalid naming ``field``."""
    if not _CLUSTER.match(name):
        raise Invalid(field, f"{name!r} is not a valid cluster name",
                      fix="use lower-case letters, digits and '-', at most 63 characters")
    return name


def commands(cluster: str, root: str = ROOT) -> str:
    return f"{root}/{check_cluster_name(cluster)}/commands"


def reports(cluster: str, root: str = ROOT) -> str:
    return f"{root}/{check_cluster_name(cluster)}/reports"


def presence(cluster: str, root: str = ROOT) -> str:
    return f"{root}/{check_cluster_name(cluster)}/presence"


def streams(cluster: str, root: str = ROOT) -> str:
    return f"{root}/{check_cluster_name(cluster)}/streams"


@dataclass(frozen=True)
class Topic:
    cluster: str
    channel: Channel


def parse(topic: str, root: str = ROOT) -> Topic:
    """Split a concrete topic into cluster and channel; raise Invalid for anything else."""
    prefix = root + "/"
    rest = topic[len(prefix):].split("/") if topic.startswith(prefix) else []
    if len(rest) != 2 or rest[1] not in CHANNELS:
        raise Invalid("topic", f"{topic!r} is not an mkd topic",
                      fix=f"expected {root}/<cluster>/<commands|reports|presence|streams>")
    channel: Channel = rest[1]  # type: ignore[assignment]
    return Topic(check_cluster_name(rest[0], "topic"), channel)
