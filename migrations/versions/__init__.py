"""Revision scripts, one per schema change (alembic skips this file)."""
