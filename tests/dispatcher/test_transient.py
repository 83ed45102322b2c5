"""What counts as a database outage: a PostgreSQL that is starting up is one (the chaos suite's
postgres-outage scenario saw the dispatcher exit on it, behind SQLAlchemy's asyncpg adapter)."""

from __future__ import annotations

import asyncpg
from sqlalchemy import exc as sa_exc

from dispatcher.db import transient


class AdaptedError(Exception):
    """Stands for SQLAlchemy's asyncpg adapter exception, which wraps the driver's as its __cause__."""


def _wrapped(driver_error: BaseException) -> sa_exc.DBAPIError:
    adapted = AdaptedError(str(driver_error))
    adapted.__cause__ = driver_error
    return sa_exc.DBAPIError("SELECT 1", {}, adapted)


def test_a_database_starting_up_is_an_outage() -> None:
    starting = asyncpg.exceptions.CannotConnectNowError("the database system is starting up")
    assert transient(starting)
    assert transient(_wrapped(starting))


def test_a_failing_statement_is_not_an_outage() -> None:
    assert not transient(_wrapped(asyncpg.exceptions.UniqueViolationError("duplicate key")))
    assert not transient(ValueError("bad value"))
