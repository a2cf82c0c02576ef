"""Which driver errors a subtask retries (framework.errors.is_retryable):
transient conditions yes, a bad expression or a constraint never; the same
whether SQLAlchemy hands the error on or psycopg raises it itself (a
statement on the driver's connection: a copy's INSERT, a COPY)."""

from __future__ import annotations

import psycopg
import psycopg.errors as pg
import pytest
import sqlalchemy as sa

from framework.errors import is_retryable


def _wrapped(error: Exception) -> sa.exc.DBAPIError:
    """As SQLAlchemy hands a psycopg error to the worker."""
    return sa.exc.DBAPIError.instance("UPDATE items ...", {}, error, psycopg.Error)


def _raw(error: Exception) -> Exception:
    """As psycopg raises it on the driver's connection."""
    return error


RAISED = pytest.mark.parametrize("raised", [_wrapped, _raw], ids=["sqlalchemy", "psycopg"])


@pytest.mark.parametrize("error", [
    pg.DiskFull("could not extend file \"base/1/2\": No space left on device"),
    pg.SerializationFailure("could not serialize access"),
    pg.DeadlockDetected("deadlock detected"),
    pg.LockNotAvailable("canceling statement due to lock timeout"),
    pg.QueryCanceled("canceling statement due to statement timeout"),
    pg.AdminShutdown("terminating connection due to administrator command"),
    pg.TooManyConnections("sorry, too many clients already"),
    # A statement prepared before its table's shape changed
    # (tests/integration/test_table_shape_change.py).
    pg.FeatureNotSupported("cached plan must not change result type"),
])
@RAISED
def test_transient_errors_are_retried(error, raised):
    assert is_retryable(raised(error))


@pytest.mark.parametrize("error", [
    pg.DivisionByZero("division by zero"),
    pg.UniqueViolation("duplicate key value violates unique constraint"),
    pg.UndefinedColumn("column \"x\" does not exist"),
    pg.FeatureNotSupported("cannot alter type of a column used by a view or rule"),
])
@RAISED
def test_errors_of_the_job_itself_are_not(error, raised):
    assert not is_retryable(raised(error))
