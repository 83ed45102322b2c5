"""Initial schema: clusters, workloads, placements, events, outbox, dispatcher_epochs.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the column types (a revision never imports the live models, which move on).
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def UtcDateTime() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "dispatcher_epochs",
        sa.Column("epoch", BigId, primary_key=True, autoincrement=True),
        sa.Column("origin", sa.String(63), nullable=False),
        sa.Column("started_at", UtcDateTime(), nullable=False),
        sa.Column("host", sa.String(253), nullable=False, server_default=""),
        sa.PrimaryKeyConstraint("epoch", name="pk_dispatcher_epochs"),
    )
    op.create_table(
        "clusters",
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("capacity", sa.JSON(), nullable=False),
        sa.Column("kinds", sa.JSON(), nullable=False),
        sa.Column("online", sa.Boolean(), nullable=False),
        sa.Column("agent_version", sa.String(64), nullable=False, server_default=""),
        sa.Column("interval_seconds", sa.Float(), nullable=False, server_default="10"),
        sa.Column("last_heartbeat", UtcDateTime(), nullable=True),
        sa.Column("lost_since", UtcDateTime(), nullable=True),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_clusters"),
    )
    op.create_table(
        "workloads",
        sa.Column("uid", sa.String(128), nullable=False),
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
        sa.PrimaryKeyConstraint("uid", name="pk_workloads"),
    )
    op.create_index("ix_workloads_state_priority_created_at", "workloads", ["state", "priority", "created_at"])
    op.create_index("ix_workloads_namespace_name", "workloads", ["namespace", "name"])
    op.create_table(
        "placements",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("workload_uid", sa.String(128), nullable=False),
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
        sa.PrimaryKeyConstraint("id", name="pk_placements"),
        sa.ForeignKeyConstraint(["workload_uid"], ["workloads.uid"], ondelete="CASCADE",
                                name="fk_placements_workload_uid_workloads"),
        sa.UniqueConstraint("workload_uid", "attempt", name="uq_placements_workload_uid_attempt"),
    )
    op.create_index("ix_placements_cluster_state", "placements", ["cluster", "state"])
    op.create_table(
        "events",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("workload_uid", sa.String(128), nullable=True),
        sa.Column("at", UtcDateTime(), nullable=False),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("cluster", sa.String(63), nullable=True),
        sa.Column("reason", sa.String(128), nullable=False, server_default=""),
        sa.Column("message", sa.Text(), nullable=False, server_default=""),
        sa.PrimaryKeyConstraint("id", name="pk_events"),
    )
    op.create_index("ix_events_workload_uid_id", "events", ["workload_uid", "id"])
    op.create_table(
        "outbox",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("cluster", sa.String(63), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("workload_uid", sa.String(128), nullable=True),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("sent_at", UtcDateTime(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("id", name="pk_outbox"),
    )
    op.create_index("ix_outbox_sent_at_id", "outbox", ["sent_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_outbox_sent_at_id", table_name="outbox")
    op.drop_table("outbox")
    op.drop_index("ix_events_workload_uid_id", table_name="events")
    op.drop_table("events")
    op.drop_index("ix_placements_cluster_state", table_name="placements")
    op.drop_table("placements")
    op.drop_index("ix_workloads_namespace_name", table_name="workloads")
    op.drop_index("ix_workloads_state_priority_created_at", table_name="workloads")
    op.drop_table("workloads")
    op.drop_table("clusters")
    op.drop_table("dispatcher_epochs")
