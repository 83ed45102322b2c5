"""Handover: Jobs of other controllers in a HandoverPolicy's scope (shadow records), and Job counts per
controller, namespace and kind.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


# a frozen copy, as in 0001 (a revision never imports the live models)
def UtcDateTime() -> sa.DateTime:
    return sa.DateTime(timezone=True)


revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "handover_jobs",
        sa.Column("uid", sa.String(128), nullable=False),
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
        sa.PrimaryKeyConstraint("uid", name="pk_handover_jobs"),
    )
    op.create_index("ix_handover_jobs_namespace_kind", "handover_jobs", ["namespace", "kind"])
    op.create_table(
        "handover_counts",
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("kind", sa.String(63), nullable=False),
        sa.Column("controller", sa.String(317), nullable=False),
        sa.Column("jobs", sa.Integer(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("namespace", "kind", "controller", name="pk_handover_counts"),
    )


def downgrade() -> None:
    op.drop_table("handover_counts")
    op.drop_index("ix_handover_jobs_namespace_kind", table_name="handover_jobs")
    op.drop_table("handover_jobs")
