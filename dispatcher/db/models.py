"""The dispatcher's tables as SQLAlchemy Core metadata: the shape queries are written against.

The alembic migrations in ``migrations/versions`` are the only source of the schema in a real
database; this module mirrors them so queries can name columns, and a test checks that the two
agree (``alembic check`` finds no difference). Times are stored in UTC; :class:`UtcDateTime`
gives aware datetimes back on SQLite too, which keeps naive values out of the code.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

from dispatcher.states import PlacementState, WorkloadState

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
metadata = sa.MetaData(naming_convention=NAMING)

# BIGINT ids on PostgreSQL; SQLite only auto-increments an INTEGER PRIMARY KEY (the rowid alias).
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


class UtcDateTime(sa.TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on every backend (SQLite drops the offset; we put it back)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime stored; use datetime.now(UTC) or the injected clock")
        return value.astimezone(UTC)

    def result_processor(self, dialect: Dialect, coltype: Any) -> Any:
        if dialect.name == "postgresql" and dialect.driver == "asyncpg":
            return None  # asyncpg reads timestamptz as aware UTC datetimes already (~20 a Job, 5 us each)
        return super().result_processor(dialect, coltype)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):  # pragma: no cover - SQLite returns datetime with our adapter
            value = datetime.fromisoformat(value)
        stamp: datetime = value
        return stamp.replace(tzinfo=UTC) if stamp.tzinfo is None else stamp.astimezone(UTC)


WORKLOAD_STATES = tuple(s.value for s in WorkloadState)
"""The values of ``workloads.state``; meanings and legal transitions in ``dispatcher.states``."""
PLACEMENT_STATES = tuple(s.value for s in PlacementState)
EVENT_TYPES = (
    "claimed", "placed", "accepted", "running", "finished", "failed", "rejected", "requeued",
    "deleted", "suspended", "resumed", "invalid", "pending", "updated", "cluster_online", "cluster_lost",
    "cordoned", "uncordoned", "drained", "evicted", "pinned",
)

dispatcher_epochs = sa.Table(
    "dispatcher_epochs", metadata,
    sa.Column("epoch", BigId, primary_key=True, autoincrement=True),
    sa.Column("origin", sa.String(63), nullable=False),
    sa.Column("started_at", UtcDateTime(), nullable=False),
    sa.Column("host", sa.String(253), nullable=False, server_default=""),
)

def _totals(ctx: Any, key: str) -> dict[str, Any]:
    """An inserted cluster row's ``allocatable`` or ``free``, from its ``capacity`` when not given."""
    capacity = ctx.get_current_parameters().get("capacity") or {}
    return dict(capacity.get(key) or {}) if isinstance(capacity, dict) else {}


def capacity_totals(capacity: Any) -> dict[str, dict[str, Any]]:
    """The ``allocatable`` and ``free`` columns for a cluster row whose ``capacity`` is written."""
    cap = capacity if isinstance(capacity, dict) else {}
    return {"allocatable": dict(cap.get("allocatable") or {}), "free": dict(cap.get("free") or {})}


clusters = sa.Table(
    "clusters", metadata,
    sa.Column("name", sa.String(63), primary_key=True),
    sa.Column("labels", sa.JSON(), nullable=False),
    sa.Column("capacity", sa.JSON(), nullable=False),
    # the cluster's totals out of ``capacity`` (its allocatable and free, without the node list), written with
    # it: what lists of clusters read, so they never decode 1,000 node lists
    sa.Column("allocatable", sa.JSON(), nullable=False, server_default="{}",
              default=lambda ctx: _totals(ctx, "allocatable")),
    sa.Column("free", sa.JSON(), nullable=False, server_default="{}", default=lambda ctx: _totals(ctx, "free")),
    sa.Column("kinds", sa.JSON(), nullable=False),
    sa.Column("online", sa.Boolean(), nullable=False),
    sa.Column("agent_version", sa.String(64), nullable=False, server_default=""),
    sa.Column("interval_seconds", sa.Float(), nullable=False, server_default="10"),
    sa.Column("last_heartbeat", UtcDateTime(), nullable=True),
    sa.Column("lost_since", UtcDateTime(), nullable=True),
    sa.Column("lease_until", UtcDateTime(), nullable=True),  # latest end of a lease granted (fencing)
    sa.Column("updated_at", UtcDateTime(), nullable=False),
    sa.Column("cordoned", sa.Boolean(), nullable=False, server_default=sa.false()),
    sa.Column("public_key", sa.String(128), nullable=True),
    sa.Column("registered_at", UtcDateTime(), nullable=True),
)

cluster_refusals = sa.Table(
    "cluster_refusals", metadata,
    sa.Column("name", sa.String(63), primary_key=True),
    sa.Column("reason", sa.String(64), nullable=False),
    sa.Column("message", sa.Text(), nullable=False, server_default=""),
    sa.Column("count", sa.BigInteger(), nullable=False, server_default="0"),
    sa.Column("first_at", UtcDateTime(), nullable=False),
    sa.Column("last_at", UtcDateTime(), nullable=False),
)
"""Messages refused because their sender is no registered cluster (shown by ``mkctl clusters refused``)."""

workloads = sa.Table(
    "workloads", metadata,
    sa.Column("uid", sa.String(128), primary_key=True),
    sa.Column("namespace", sa.String(253), nullable=False),
    sa.Column("name", sa.String(253), nullable=False),
    sa.Column("kind", sa.String(63), nullable=False),
    sa.Column("api_version", sa.String(253), nullable=False),
    sa.Column("queue", sa.String(253), nullable=False),
    sa.Column("priority", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("reason", sa.Text(), nullable=False, server_default=""),
    sa.Column("spec_version", sa.Integer(), nullable=False, server_default="1"),
    sa.Column("generation", sa.BigInteger(), nullable=False, server_default="0"),
    sa.Column("suspended", sa.Boolean(), nullable=False, server_default=sa.false()),
    sa.Column("requests", sa.JSON(), nullable=False),
    sa.Column("podsets", sa.JSON(), nullable=False),
    sa.Column("attempt", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("cluster", sa.String(63), nullable=True),
    sa.Column("excluded", sa.JSON(), nullable=False),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.Column("updated_at", UtcDateTime(), nullable=False),
    sa.Column("labels", sa.JSON(), nullable=False, server_default="{}"),
    sa.Column("pinned", sa.String(63), nullable=True),
    sa.Column("queued_at", UtcDateTime(), nullable=True),
    # Queue time: the Job's creationTimestamp (kept when it is preempted; NULL: created_at); order is
    # priority, this, queue_seq.
    sa.Column("queue_seq", sa.BigInteger(), nullable=False, server_default="0"),
    # Claim order: breaks ties within one second of creationTimestamp (never the uid).
    sa.Column("priority_source", sa.String(253), nullable=False, server_default=""),
    sa.Column("cluster_queue", sa.String(253), nullable=True),
    sa.Column("flavors", sa.JSON(), nullable=True),
    # PodSet -> resource -> ResourceFlavor of the quota reservation.
    sa.Column("usage", sa.JSON(), nullable=True),
    # Quota held while placed or running: ``flavor/resource`` -> quantity.
    sa.Column("reserved_at", UtcDateTime(), nullable=True),
    sa.Index(None, "state", "priority", "queued_at", "queue_seq"),
    sa.Index(None, "namespace", "name"),
    sa.Index(None, "created_at", "namespace", "name", "uid"),  # the admin list's order (migration 0008)
    sa.Index(None, "state", "created_at"),  # the admin list of one state (migration 0009)
)

placements = sa.Table(
    "placements", metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("workload_uid", sa.String(128), sa.ForeignKey("workloads.uid", ondelete="CASCADE"),
              nullable=False),
    sa.Column("attempt", sa.Integer(), nullable=False),
    sa.Column("cluster", sa.String(63), nullable=False),
    sa.Column("epoch", sa.BigInteger(), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("reason", sa.Text(), nullable=False, server_default=""),
    sa.Column("spec_version", sa.Integer(), nullable=False, server_default="1"),
    sa.Column("last_status_seq", sa.BigInteger(), nullable=False, server_default="-1"),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.Column("accepted_at", UtcDateTime(), nullable=True),
    sa.Column("finished_at", UtcDateTime(), nullable=True),
    sa.UniqueConstraint("workload_uid", "attempt"),
    sa.Index(None, "cluster", "state"),
    sa.Index(None, "state", "cluster"),  # the Jobs holding each cluster (migration 0009)
)

events = sa.Table(
    "events", metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("workload_uid", sa.String(128), nullable=True),
    sa.Column("at", UtcDateTime(), nullable=False),
    sa.Column("type", sa.String(32), nullable=False),
    sa.Column("cluster", sa.String(63), nullable=True),
    sa.Column("reason", sa.String(128), nullable=False, server_default=""),
    sa.Column("message", sa.Text(), nullable=False, server_default=""),
    sa.Index(None, "workload_uid", "id"),
)

outbox = sa.Table(
    "outbox", metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("cluster", sa.String(63), nullable=False),
    sa.Column("topic", sa.Text(), nullable=False),
    sa.Column("payload", sa.LargeBinary(), nullable=False),
    sa.Column("workload_uid", sa.String(128), nullable=True),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.Column("sent_at", UtcDateTime(), nullable=True),
    sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
    sa.Index(None, "sent_at", "id"),
)

# Handover (dispatcher/handover): the Jobs of other controllers that a HandoverPolicy puts in scope, with
# what mkd would have done with each (shadow), and the count of Jobs per controller, namespace and kind.
handover_jobs = sa.Table(
    "handover_jobs", metadata,
    sa.Column("uid", sa.String(128), primary_key=True),
    sa.Column("namespace", sa.String(253), nullable=False),
    sa.Column("name", sa.String(253), nullable=False),
    sa.Column("kind", sa.String(63), nullable=False),
    sa.Column("controller", sa.String(317), nullable=False),
    sa.Column("policy", sa.String(253), nullable=False),
    sa.Column("mode", sa.String(16), nullable=False),
    sa.Column("would_accept", sa.Boolean(), nullable=False),
    sa.Column("reason", sa.Text(), nullable=False, server_default=""),
    sa.Column("queue", sa.String(253), nullable=False, server_default=""),
    sa.Column("cluster", sa.String(63), nullable=True),
    sa.Column("warned", sa.Boolean(), nullable=False, server_default=sa.false()),
    sa.Column("first_seen", UtcDateTime(), nullable=False),
    sa.Column("last_seen", UtcDateTime(), nullable=False),
    sa.Column("gone", sa.Boolean(), nullable=False, server_default=sa.false()),
    sa.Index(None, "namespace", "kind"),
)

handover_counts = sa.Table(
    "handover_counts", metadata,
    sa.Column("namespace", sa.String(253), nullable=False),
    sa.Column("kind", sa.String(63), nullable=False),
    sa.Column("controller", sa.String(317), nullable=False),
    sa.Column("jobs", sa.Integer(), nullable=False),
    sa.Column("updated_at", UtcDateTime(), nullable=False),
    sa.PrimaryKeyConstraint("namespace", "kind", "controller"),
)
