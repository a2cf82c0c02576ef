"""reorg's own exceptions, which failures of a subtask are worth retrying,
and the one line an error is reported as."""

from __future__ import annotations

import sys

from framework.redact import redact


class InvalidParams(ValueError):
    """Bad user input: the message is one line saying what is wrong and how to fix it."""


class RetryableError(RuntimeError):
    """A transient failure: the subtask is retried with backoff."""


class LeaseLost(RuntimeError):
    """The worker no longer holds the subtask: roll back and stop."""


class Stopped(RuntimeError):
    """The subtask was asked to stop (pause, cancel, drain): release it."""


class NotReady(RuntimeError):
    """The subtask cannot start yet: something it needs, which another
    subtask of its step makes, is not there (a foreign key of a table to
    itself needs the key's index). Nothing failed: it is handed back, its
    attempt given back, and claimed again after ``seconds``. It does not wait
    holding its claim: with room for one subtask under the job's concurrency,
    the one it waits for could never be claimed."""

    def __init__(self, message: str, seconds: float) -> None:
        super().__init__(message)
        self.seconds = seconds


# SQLSTATEs of transient conditions: serialization failure, deadlock, lock or
# statement timeout, admin shutdown / crash recovery, too many connections,
# disk full. Disk full is retried (a vacuum, a log rotation or an operator may
# free space between attempts; tests/fault/test_disk_full.py); once the
# attempts run out the job fails and reverts, or pauses for ``reorg retry``.
# (psycopg raises all of class 53 as OperationalError, retried anyway: the
# codes are named here so the decision does not rest on that mapping.)
_RETRYABLE_SQLSTATES = {"40001", "40P01", "55P03", "57014", "57P01", "57P02", "57P03", "53300",
                        "53100"}


# A prepared statement whose result type a change of its table altered (a
# column's type, by a job or by anyone): PostgreSQL refuses to run it. psycopg
# prepares a statement run often enough on a connection (``prepare_threshold``),
# so a pooled connection keeps plans of the table's old shape. The function
# that raises it names it where the message may be translated (lc_messages).
_STALE_PLAN_SQLSTATE = "0A000"
_STALE_PLAN_SOURCE = "RevalidateCachedQuery"
_STALE_PLAN_MESSAGE = "cached plan must not change result type"


def is_stale_plan(exc: BaseException) -> bool:
    """Whether ``exc`` (psycopg's, or SQLAlchemy's around it) is a statement
    prepared before its table's shape changed: harmless once the connection
    is replaced (``framework.db``), never a failure of the job."""
    orig = getattr(exc, "orig", exc)
    if getattr(orig, "sqlstate", None) != _STALE_PLAN_SQLSTATE:
        return False
    diag = getattr(orig, "diag", None)
    return (getattr(diag, "source_function", None) == _STALE_PLAN_SOURCE
            or _STALE_PLAN_MESSAGE in str(orig))


def is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, RetryableError) or is_stale_plan(exc):
        return True
    # A SQLAlchemy error exists only where SQLAlchemy is loaded; a short
    # command that reads through psycopg alone (framework.directdb) never loads it.
    sa = sys.modules.get("sqlalchemy")
    if sa is not None and isinstance(exc, sa.exc.DBAPIError):
        if exc.connection_invalidated or isinstance(exc, sa.exc.OperationalError):
            return True
        return _transient_sqlstate(exc.orig)
    # psycopg's own, from a statement run on the driver's connection (a copy's
    # INSERT, a COPY into a stage): the same conditions, judged the same way.
    psycopg = sys.modules.get("psycopg")
    if psycopg is not None and isinstance(exc, psycopg.Error):
        return isinstance(exc, psycopg.OperationalError) or _transient_sqlstate(exc)
    return isinstance(exc, ConnectionError | TimeoutError)


def _transient_sqlstate(error: BaseException | None) -> bool:
    sqlstate = getattr(error, "sqlstate", None) or ""
    return sqlstate in _RETRYABLE_SQLSTATES or sqlstate.startswith("08")


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
