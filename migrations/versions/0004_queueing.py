"""Queueing: queue time and claim order, resolved ClusterQueue, priority source, quota held.

Existing Workloads get their claim time as queue time and a claim order numbered by
(created_at, uid), so an upgraded database keeps the order the dispatcher used before.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def UtcDateTime() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("workloads") as batch:
        batch.add_column(sa.Column("queued_at", UtcDateTime(), nullable=True))
        batch.add_column(sa.Column("queue_seq", sa.BigInteger(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("priority_source", sa.String(253), nullable=False, server_default=""))
        batch.add_column(sa.Column("cluster_queue", sa.String(253), nullable=True))
        batch.add_column(sa.Column("flavors", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("usage", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("reserved_at", UtcDateTime(), nullable=True))
    conn = op.get_bind()
    w = sa.table("workloads", sa.column("uid", sa.String()), sa.column("created_at", UtcDateTime()),
                 sa.column("queued_at", UtcDateTime()), sa.column("queue_seq", sa.BigInteger()))
    conn.execute(sa.update(w).values(queued_at=w.c.created_at))
    uids = [r.uid for r in conn.execute(sa.select(w.c.uid).order_by(w.c.created_at, w.c.uid))]
    for n, uid in enumerate(uids, 1):
        conn.execute(sa.update(w).where(w.c.uid == uid).values(queue_seq=n))
    with op.batch_alter_table("workloads") as batch:
        batch.drop_index("ix_workloads_state_priority_created_at")
        batch.create_index("ix_workloads_state_priority_queued_at_queue_seq",
                           ["state", "priority", "queued_at", "queue_seq"])


def downgrade() -> None:
    with op.batch_alter_table("workloads") as batch:
        batch.drop_index("ix_workloads_state_priority_queued_at_queue_seq")
        batch.create_index("ix_workloads_state_priority_created_at", ["state", "priority", "created_at"])
        for col in ("reserved_at", "usage", "flavors", "cluster_queue", "priority_source", "queue_seq",
                    "queued_at"):
            batch.drop_column(col)
