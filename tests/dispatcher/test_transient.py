"""What counts as a database outage, mapped onto the error tree as ``DatabaseUnavailable``: a PostgreSQL
that is starting up is one (the chaos suite's postgres-outage scenario saw the dispatcher exit on it, behind
SQLAlchemy's asyncpg adapter); a statement that fails on its own is not, and stays what it was."""

from __future__ import annotations

import asyncpg
import pytest
from sqlalchemy import exc as sa_exc

from dispatcher.db import database_error, mapped
from federation.errors import DatabaseUnavailable, Temporary, Transport


class AdaptedError(Exception):
    """Stands for SQLAlchemy's asyncpg adapter exception, which wraps the driver's as its __cause__."""


def _wrapped(driver_error: BaseException) -> sa_exc.DBAPIError:
    adapted = AdaptedError(str(driver_error))
    adapted.__cause__ = driver_error
    return sa_exc.DBAPIError("SELECT 1", {}, adapted)


def test_a_database_starting_up_is_an_outage() -> None:
    starting = asyncpg.exceptions.CannotConnectNowError("the database system is starting up")
    assert isinstance(database_error(starting), DatabaseUnavailable)
    mapped_error = database_error(_wrapped(starting))
    assert isinstance(mapped_error, DatabaseUnavailable)
    assert isinstance(mapped_error, Transport) and isinstance(mapped_error, Temporary)
    assert mapped_error.delay == 0.0  # the retrying loop's own backoff decides
    assert "DBAPIError" in str(mapped_error) and "starting up" in str(mapped_error)


def test_a_failing_statement_is_not_an_outage() -> None:
    assert database_error(_wrapped(asyncpg.exceptions.UniqueViolationError("duplicate key"))) is None
    assert database_error(ValueError("bad value")) is None


def test_mapped_raises_an_outage_as_database_unavailable_and_anything_else_unchanged() -> None:
    lost = sa_exc.OperationalError("SELECT 1", {}, ConnectionResetError("connection reset by peer"))
    with pytest.raises(DatabaseUnavailable) as caught:
        with mapped():
            raise lost
    assert caught.value.__cause__ is lost
    violation = _wrapped(asyncpg.exceptions.UniqueViolationError("duplicate key"))
    with pytest.raises(sa_exc.DBAPIError) as raw:
        with mapped():
            raise violation
    assert raw.value is violation
    already = DatabaseUnavailable("mapped before")
    with pytest.raises(DatabaseUnavailable) as again:
        with mapped():
            raise already
    assert again.value is already


async def test_mapped_wraps_async_work() -> None:
    async def fails() -> None:
        raise sa_exc.OperationalError("SELECT 1", {}, OSError("connection refused"))
    with pytest.raises(DatabaseUnavailable):
        with mapped():
            await fails()
