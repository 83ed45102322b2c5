"""Indexes for a large history: the Workload list filtered by state, and the count of Jobs holding each cluster.

``GET /api/v1/workloads?state=running`` walked the creation-order index past every finished Workload to find
the running ones, and ``GET /api/v1/clusters`` counted the accepted and running placements by reading every
placement (1,000,000 finished Workloads: bench/fleet_db_bench.py).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_workloads_state_created_at", "workloads", ["state", "created_at"])
    op.create_index("ix_placements_state_cluster", "placements", ["state", "cluster"])


def downgrade() -> None:
    op.drop_index("ix_placements_state_cluster", table_name="placements")
    op.drop_index("ix_workloads_state_created_at", table_name="workloads")
