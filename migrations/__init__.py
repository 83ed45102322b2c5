"""Alembic migrations for the dispatcher's database: the only source of its schema.

Shipped as a package (with ``alembic.ini``, ``env.py`` and ``versions/``) so that
``mkctl db upgrade`` works from an installed wheel; ``dispatcher.db`` runs them programmatically.
"""

from pathlib import Path

DIRECTORY = Path(__file__).resolve().parent
INI = DIRECTORY / "alembic.ini"
