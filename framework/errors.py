"""Which failures of a subtask are worth retrying."""

from __future__ import annotations

import sqlalchemy as sa

from framework.jobtype import RetryableError

# SQLSTATEs of transient conditions: serialization failure, deadlock, lock or
# statement timeout, admin shutdown / crash recovery, too many connections.
_RETRYABLE_SQLSTATES = {"40001", "40P01", "55P03", "57014", "57P01", "57P02", "57P03", "53300"}


def is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, RetryableError):
        return True
    if isinstance(exc, sa.exc.DBAPIError):
        if exc.connection_invalidated or isinstance(exc, sa.exc.OperationalError):
            return True
        sqlstate = getattr(exc.orig, "sqlstate", None) or ""
        return sqlstate in _RETRYABLE_SQLSTATES or sqlstate.startswith("08")
    return isinstance(exc, ConnectionError | TimeoutError)


def one_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:500]
