"""Which driver errors a subtask retries (framework.errors.is_retryable):
transient conditions yes, a bad expression or a constraint never."""

from __future__ import annotations

import psycopg
import psycopg.errors as pg
import pytest
import sqlalchemy as sa

from framework.errors import is_retryable


def _wrapped(error: Exception) -> sa.exc.DBAPIError:
    """As SQLAlchemy hands a psycopg error to the worker."""
    return sa.exc.DBAPIError.instance("UPDATE items ...", {}, error, psycopg.Error)


@pytest.mark.parametrize("error", [
    pg.DiskFull("could not extend file \"base/1/2\": No space left on device"),
    pg.SerializationFailure("could not serialize access"),
    pg.DeadlockDetected("deadlock detected"),
    pg.LockNotAvailable("canceling statement due to lock timeout"),
    pg.QueryCanceled("canceling statement due to statement timeout"),
    pg.AdminShutdown("terminating connection due to administrator command"),
    pg.TooManyConnections("sorry, too many clients already"),
])
def test_transient_errors_are_retried(error):
    assert is_retryable(_wrapped(error))


@pytest.mark.parametrize("error", [
    pg.DivisionByZero("division by zero"),
    pg.UniqueViolation("duplicate key value violates unique constraint"),
    pg.UndefinedColumn("column \"x\" does not exist"),
])
def test_errors_of_the_job_itself_are_not(error):
    assert not is_retryable(_wrapped(error))
