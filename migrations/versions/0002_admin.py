"""Admin controls: Job labels on Workloads (``--label`` filters), pinned Workloads, cordoned Clusters.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("workloads") as batch:
        batch.add_column(sa.Column("labels", sa.JSON(), nullable=False, server_default="{}"))
        batch.add_column(sa.Column("pinned", sa.String(63), nullable=True))
    with op.batch_alter_table("clusters") as batch:
        batch.add_column(sa.Column("cordoned", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("clusters") as batch:
        batch.drop_column("cordoned")
    with op.batch_alter_table("workloads") as batch:
        batch.drop_column("pinned")
        batch.drop_column("labels")
