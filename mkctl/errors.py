"""How a failure reads on the command line: one line, ``error: <what>; <how to fix it>``.

Every command runs inside :class:`ReportedErrors` (installed once, on the root command group):
mkd's own errors, settings validation errors, database and network failures all become one line on
stderr and a non-zero exit code. ``--debug`` (or ``MKD_DEBUG=1``) lets the traceback through.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from federation.errors import FederationError, Invalid, NotFound, Permanent, Temporary, Transport

EXIT_FAILURE = 1
"""Anything that went wrong at run time."""
EXIT_USAGE = 2
"""Bad flags or settings (click uses 2 for usage errors too)."""
EXIT_UNFINISHED = 3
"""The demo (or a wait) ended before every job reached its expected end."""


class CommandFailed(Exception):
    """Raised by a command to stop with a message it already phrased, and an exit code."""

    def __init__(self, message: str, *, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def describe(exc: BaseException, *, flag_for: Callable[[tuple[str | int, ...]], str] | None = None) -> tuple[
        str, int]:
    """The one line (without the ``error:`` prefix) and the exit code for ``exc``.

    ``flag_for`` turns a settings field path into the flag/env names to blame, for validation errors.
    """
    if isinstance(exc, CommandFailed):
        return exc.message, exc.code
    if isinstance(exc, ValidationError):
        return _validation(exc, flag_for), EXIT_USAGE
    if isinstance(exc, Invalid):
        return str(exc), EXIT_USAGE
    if isinstance(exc, Transport):
        return f"{exc.message}; check the address and that the service is up (retried: no)", EXIT_FAILURE
    if isinstance(exc, Permanent | Temporary):
        return exc.message, EXIT_FAILURE
    if isinstance(exc, NotFound | FederationError):
        return str(exc) or type(exc).__name__, EXIT_FAILURE
    db = _database_error(exc)
    if db:
        return db, EXIT_FAILURE
    if isinstance(exc, ConnectionError | TimeoutError | OSError):
        return f"{type(exc).__name__}: {exc}", EXIT_FAILURE
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else 'unexpected failure'} (rerun with --debug for the traceback)", \
        EXIT_FAILURE


def _validation(exc: ValidationError, flag_for: Callable[[tuple[str | int, ...]], str] | None) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        loc = tuple(err.get("loc", ()))
        where = flag_for(loc) if flag_for else ".".join(str(p) for p in loc)
        parts.append(f"{where}: {err.get('msg', 'invalid value')}")
    return "; ".join(parts) or str(exc)


def _database_error(exc: BaseException) -> str | None:
    """SQLAlchemy failures name the URL's database, never the password, and say what to run."""
    try:
        from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError, ProgrammingError
    except ImportError:  # pragma: no cover - SQLAlchemy is a dependency
        return None
    from dispatcher.db import missing_database_fix

    missing = missing_database_fix(exc)
    if missing is not None:
        return f"database: {missing}"
    if isinstance(exc, NoSuchModuleError | ArgumentError):
        return (f"--database-url: {_first_line(exc)}; use sqlite+aiosqlite:///path/mkd.db or "
                "postgresql+asyncpg://user@host:5432/db")
    if isinstance(exc, ProgrammingError):
        return f"database: {_first_line(exc)}; is the schema current? run `mkctl db upgrade`"
    if isinstance(exc, OperationalError):
        return f"database: {_first_line(exc)}; check --database-url / MKD_DATABASE_URL and run `mkctl db upgrade`"
    return None


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def print_error(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)


def flag_namer(flags: Mapping[tuple[str, ...], str]) -> Callable[[tuple[Any, ...]], str]:
    """A ``flag_for`` that looks a settings path up in a {path: "--flag / ENV"} table."""

    def name(loc: tuple[Any, ...]) -> str:
        for n in range(len(loc), 0, -1):
            key = tuple(str(p) for p in loc[:n])
            if key in flags:
                return flags[key]
        return ".".join(str(p) for p in loc)

    return name
