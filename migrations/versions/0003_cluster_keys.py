"""Cluster identity: each cluster's registered public key, and the senders refused for having none.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


# a frozen copy, as in 0001 (a revision never imports the live models)
def UtcDateTime() -> sa.DateTime:
    return sa.DateTime(timezone=True)

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("clusters") as batch:
        batch.add_column(sa.Column("public_key", sa.String(128), nullable=True))
        batch.add_column(sa.Column("registered_at", UtcDateTime(), nullable=True))
    op.create_table(
        "cluster_refusals",
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("reason", sa.String(64), nullable=False),
        sa.Column("message", sa.Text(), nullable=False, server_default=""),
        sa.Column("count", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("first_at", UtcDateTime(), nullable=False),
        sa.Column("last_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_cluster_refusals"),
    )


def downgrade() -> None:
    op.drop_table("cluster_refusals")
    with op.batch_alter_table("clusters") as batch:
        batch.drop_column("registered_at")
        batch.drop_column("public_key")
