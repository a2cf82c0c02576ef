"""Which failures of a subtask are worth retrying, and the one line an error
is reported as."""

from __future__ import annotations

import sys

from framework.jobtype import RetryableError
from framework.redact import redact

# SQLSTATEs of transient conditions: serialization failure, deadlock, lock or
# statement timeout, admin shutdown / crash recovery, too many connections,
# disk full. Disk full is retried (a vacuum, a log rotation or an operator may
# free space between attempts; tests/fault/test_disk_full.py); once the
# attempts run out the job fails and reverts, or pauses for ``reorg retry``.
# (psycopg raises all of class 53 as OperationalError, retried anyway: the
# codes are named here so the decision does not rest on that mapping.)
_RETRYABLE_SQLSTATES = {"40001", "40P01", "55P03", "57014", "57P01", "57P02", "57P03", "53300",
                        "53100"}


def is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, RetryableError):
        return True
    # A SQLAlchemy error exists only where SQLAlchemy is loaded; a short
    # command that reads through psycopg alone (framework.directdb) never loads it.
    sa = sys.modules.get("sqlalchemy")
    if sa is not None and isinstance(exc, sa.exc.DBAPIError):
        if exc.connection_invalidated or isinstance(exc, sa.exc.OperationalError):
            return True
        sqlstate = getattr(exc.orig, "sqlstate", None) or ""
        return sqlstate in _RETRYABLE_SQLSTATES or sqlstate.startswith("08")
    return isinstance(exc, ConnectionError | TimeoutError)


def one_line(error: BaseException | str | None, *, limit: int | None = 500,
             empty: str | None = None) -> str:
    """The first non-empty line of an error, at most ``limit`` characters, so a
    multi-line driver error or stack trace is reported as one line. Of a DB-API
    error, the driver's message (``orig``), not SQLAlchemy's wrapper with the
    statement. No text gives ``empty``: by default the exception's class name,
    or "no details" for a message passed as text. A password in it (a URL's,
    a DSN's) is masked: this line is what events, status and logs show."""
    is_exc = isinstance(error, BaseException)
    text = str(getattr(error, "orig", None) or error) if is_exc else str(error or "")
    for line in text.splitlines():
        if line.strip():
            return redact(line.strip())[:limit]
    if empty is not None:
        return empty
    return type(error).__name__ if is_exc else "no details"
