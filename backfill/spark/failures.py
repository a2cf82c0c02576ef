"""What a Spark failure says, in one line, and whether it is worth a retry.

A failed Spark job reaches Python as one exception whose text carries the
Java cause chain. Its first line names only the py4j call ("An error
occurred while calling o89.getResult."); the last ``Caused by:`` says what
failed. A failed ``--udf`` call carries the Python traceback instead, whose
last line says it.

A database that restarts, fails over or drops connections fails a batch's
JDBC read just as a bad expression fails its transform; only the first is
transient. Retried, the subtask resumes from its last checkpoint after a
backoff; failed, it would roll the whole job back.
"""

from __future__ import annotations

import re

from framework.errors import one_line

# "Caused by: org.postgresql.util.PSQLException: ERROR: invalid input syntax ..."
_JAVA_CAUSE = re.compile(r"^Caused by: ([\w.$]+): (.+)$", re.MULTILINE)
_DRIVER_EXCEPTION = re.compile(r"^: ([\w.$]+): (.+)$", re.MULTILINE)
_PY4J_CALL = "An error occurred while calling"
_PYTHON_WORKER = "An exception was thrown from the Python worker"
_PSQL = re.compile(r"org\.postgresql\.util\.PSQLException: (.+)")

# How PostgreSQL (and its JDBC driver) say it went away or refuses for now,
# as opposed to errors in what was asked of it. Matched at the start of the
# message: later on, messages quote user data.
_TRANSIENT_DB = (
    "FATAL: terminating connection",  # 57P01 shutdown or pg_terminate_backend; crash recovery
    "FATAL: the database system is",  # 57P03 starting up / shutting down / in recovery mode
    "FATAL: sorry, too many clients",  # 53300
    "FATAL: remaining connection slots are reserved",  # 53300
    "ERROR: could not serialize access",  # 40001
    "ERROR: canceling statement due to conflict with recovery",  # 40001 on a standby
    "ERROR: deadlock detected",  # 40P01
    "ERROR: canceling statement due to lock timeout",  # 55P03: a read waited out lock_timeout
    "Connection to ",  # "Connection to host:port refused."
    "The connection attempt failed",
    "An I/O error occurred while sending to the backend",
    "This connection has been closed",
)
# Spark losing an executor or shuffle output (cluster mode), after its own
# task retries. (An executor that dies of the same cause every time is retried
# too, up to the subtask's attempts.)
_TRANSIENT_SPARK = re.compile(r"\bExecutorLostFailure \(executor |\bFetchFailedException\b")


class SparkBatchError(RuntimeError):
    """A batch's Spark job failed for a reason a retry would not change (its
    message is the one line that says why)."""


def is_spark(exc: BaseException) -> bool:
    """True for errors raised by Spark through PySpark or py4j."""
    return type(exc).__module__.split(".")[0] in ("py4j", "pyspark")


def first_line(exc: BaseException) -> str:
    """One line saying what went wrong (at most 300 characters): ``one_line``,
    after digging the cause out of a Spark or UDF failure's text."""
    text = str(getattr(exc, "orig", None) or exc).strip()
    if text.startswith(_PY4J_CALL):
        # The deepest cause; a call that failed in the driver has none, its
        # exception is on the next line (": java.Class: message").
        causes = _JAVA_CAUSE.findall(text) or _DRIVER_EXCEPTION.findall(text)[:1]
        if causes:
            text = causes[-1][1].removeprefix("ERROR: ")
    elif text.startswith(_PYTHON_WORKER):
        text = [line for line in text.splitlines() if line.strip()][-1].strip()
    return one_line(text, limit=300, empty=type(exc).__name__)


def from_postgres(exc: BaseException) -> bool:
    """True when a Spark failure came from PostgreSQL through the JDBC driver,
    not from Spark's own evaluation."""
    return any(cls.startswith("org.postgresql.") for cls, _ in _JAVA_CAUSE.findall(str(exc)))


def transient(exc: BaseException) -> bool:
    """True when a Spark failure came from a lost connection or executor, so
    the same batch may well succeed if tried again."""
    text = str(exc)
    if _TRANSIENT_SPARK.search(text):
        return True
    return any(message.startswith(_TRANSIENT_DB) for message in _PSQL.findall(text))


def as_batch_error(exc: Exception, jvm_alive: bool) -> Exception:
    """What a batch raises when its Spark part failed with ``exc``:
    RetryableError where a retry may pass (the subtask resumes from its
    checkpoint): a JVM that exited (``jvm_alive`` False: only a new session
    can run the batch), a lost connection or executor, a read that waited
    out its lock_timeout. Else Spark's own error as SparkBatchError, whose
    text is its cause in one line, not py4j's call and a Java stack; any
    other error as it is."""
    from framework.errors import RetryableError

    if not jvm_alive:
        return RetryableError("Spark's JVM exited; tried again on a new session")
    if transient(exc):
        return RetryableError(f"Spark's read failed, tried again: {first_line(exc)}")
    if is_spark(exc):
        return SparkBatchError(first_line(exc))
    return exc


def lost_connection(exc: BaseException) -> bool:
    """True when a check failed because a database connection broke (ours,
    through psycopg, or Spark's, through JDBC): not the input's fault."""
    from framework.errors import is_retryable

    return is_retryable(exc) or transient(exc)
