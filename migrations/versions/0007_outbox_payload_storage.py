"""The outbox's payloads are stored without a compression attempt (PostgreSQL).

A Place is sealed to its cluster's key before it is queued (``federation.sealing``): ciphertext does
not compress, yet the column's default storage (``EXTENDED``) had the server try pglz on every row
before moving it out of line, about a quarter of what the outbox cost the server.
``EXTERNAL`` moves large values out of line as before, without the attempt. SQLite has no storage
modes: nothing changes there.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _storage(mode: str) -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"ALTER TABLE outbox ALTER COLUMN payload SET STORAGE {mode}")


def upgrade() -> None:
    _storage("EXTERNAL")


def downgrade() -> None:
    _storage("EXTENDED")
