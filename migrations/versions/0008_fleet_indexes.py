"""Indexes for a large history: the admin API's Workload list in creation order.

``GET /api/v1/workloads`` and ``mkctl get`` page through Workloads oldest first; without an index on that
order PostgreSQL sorted every row for each page (1,000,000 finished Workloads: bench/fleet_db_bench.py).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_workloads_created_at_namespace_name_uid", "workloads",
                    ["created_at", "namespace", "name", "uid"])


def downgrade() -> None:
    op.drop_index("ix_workloads_created_at_namespace_name_uid", table_name="workloads")
