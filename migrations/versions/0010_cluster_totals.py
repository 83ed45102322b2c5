"""Each cluster's totals (allocatable and free) in columns of their own, filled from its capacity.

``GET /api/v1/clusters`` took every cluster's totals out of a capacity document that also holds its node
list: at 1,000 clusters of 8-64 nodes, decoding those documents was most of the list's time
(bench/fleet_db_bench.py). The dispatcher writes the columns with every capacity; this fills them for the
rows already there.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("clusters") as batch:
        batch.add_column(sa.Column("allocatable", sa.JSON(), nullable=False, server_default="{}"))
        batch.add_column(sa.Column("free", sa.JSON(), nullable=False, server_default="{}"))
    conn = op.get_bind()
    table = sa.table("clusters", sa.column("name", sa.String()), sa.column("capacity", sa.JSON()),
                     sa.column("allocatable", sa.JSON()), sa.column("free", sa.JSON()))
    for name, capacity in conn.execute(sa.select(table.c.name, table.c.capacity)).all():
        cap: Any = json.loads(capacity) if isinstance(capacity, str) else capacity
        cap = cap if isinstance(cap, dict) else {}
        conn.execute(sa.update(table).where(table.c.name == name).values(
            allocatable=dict(cap.get("allocatable") or {}), free=dict(cap.get("free") or {})))


def downgrade() -> None:
    with op.batch_alter_table("clusters") as batch:
        batch.drop_column("free")
        batch.drop_column("allocatable")
