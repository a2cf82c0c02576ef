# ruff: noqa: E501 - the samples are verbatim one-line Java messages
"""Reading Spark failures: the one line that says why, and whether to retry.

The texts are trimmed copies of what PySpark 4 raised on this machine."""

from __future__ import annotations

import pytest

from backfill.spark.failures import (
    SparkBatchError,
    as_batch_error,
    first_line,
    from_postgres,
    lost_connection,
    transient,
)
from framework.errors import RetryableError

READ_KILLED = """An error occurred while calling o61.getResult.
: org.apache.spark.SparkException: Exception thrown in awaitResult:
\tat org.apache.spark.util.SparkThreadUtils$.awaitResult(SparkThreadUtils.scala:56)
Caused by: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 0.0 failed 1 times, most recent failure: Lost task 0.0 in stage 0.0 (TID 0) (localhost executor driver): org.postgresql.util.PSQLException: FATAL: terminating connection due to administrator command
\tat org.postgresql.core.v3.QueryExecutorImpl.receiveErrorResponse(QueryExecutorImpl.java:2733)
Caused by: org.postgresql.util.PSQLException: FATAL: terminating connection due to administrator command
\tat org.postgresql.core.v3.QueryExecutorImpl.receiveErrorResponse(QueryExecutorImpl.java:2733)
"""

SCHEMA_QUERY_REFUSED = """An error occurred while calling o45.jdbc.
: org.postgresql.util.PSQLException: Connection to 127.0.0.1:5 refused. Check that the hostname and port are correct and that the postmaster is accepting TCP/IP connections.
\tat org.postgresql.core.v3.ConnectionFactoryImpl.openConnectionImpl(ConnectionFactoryImpl.java:352)
"""

BAD_CAST = """An error occurred while calling o89.getResult.
: org.apache.spark.SparkException: Exception thrown in awaitResult:
Caused by: org.apache.spark.SparkException: Job aborted due to stage failure: Lost task 0.0: org.postgresql.util.PSQLException: ERROR: invalid input syntax for type integer: "x"
Caused by: org.postgresql.util.PSQLException: ERROR: invalid input syntax for type integer: "x"
"""

UDF_FAILED = """An exception was thrown from the Python worker. Please see the stack trace below.
Traceback (most recent call last):
  File "/x/udfs.py", line 3, in shout
    raise ValueError("no shouting on Sundays")
ValueError: no shouting on Sundays
"""

EXECUTOR_LOST = ("Job aborted due to stage failure: Task 3 in stage 7.0 failed 4 times, most "
                 "recent failure: Lost task 3.3 (TID 41) (10.0.0.7 executor 2): "
                 "ExecutorLostFailure (executor 2 exited caused by one of the running tasks)")


class Failure(Exception):
    pass


@pytest.mark.parametrize(("text", "line"), [
    (READ_KILLED, "FATAL: terminating connection due to administrator command"),
    (SCHEMA_QUERY_REFUSED, "Connection to 127.0.0.1:5 refused. Check that the hostname and port "
                           "are correct and that the postmaster is accepting TCP/IP connections."),
    (BAD_CAST, 'invalid input syntax for type integer: "x"'),
    (UDF_FAILED, "ValueError: no shouting on Sundays"),
    ("plain message\nsecond line", "plain message"),
    ("", "Failure"),
])
def test_first_line_says_what_failed(text, line):
    assert first_line(Failure(text)) == line


@pytest.mark.parametrize(("text", "retry"), [
    (READ_KILLED, True),
    (SCHEMA_QUERY_REFUSED, True),
    (EXECUTOR_LOST, True),
    (BAD_CAST, False),
    (UDF_FAILED, False),
    # The marker words count only where PostgreSQL starts its message, not in
    # user data it quotes, nor in Spark's or a UDF's own messages.
    ("[CAST_INVALID_INPUT] The value 'terminating connection' cannot be cast", False),
    (BAD_CAST.replace('"x"', '"Connection reset"'), False),
    (BAD_CAST.replace('"x"', '"FATAL: terminating connection"'), False),
    ("ValueError: lost ExecutorLostFailure", False),
])
def test_only_lost_connections_and_executors_are_transient(text, retry):
    assert transient(Failure(text)) is retry


def test_from_postgres_tells_database_errors_from_spark_evaluation():
    assert from_postgres(Failure(BAD_CAST))
    assert not from_postgres(Failure(UDF_FAILED))
    assert not from_postgres(Failure("[DIVIDE_BY_ZERO] Division by zero."))


def test_a_broken_connection_during_a_check_is_not_the_inputs_fault():
    import sqlalchemy as sa

    ours = sa.exc.OperationalError(
        "COPY ...", {}, Exception("terminating connection due to idle-in-transaction timeout"))
    assert lost_connection(ours)
    assert lost_connection(Failure(READ_KILLED))  # Spark's JDBC read
    assert not lost_connection(Failure(BAD_CAST))
    assert not lost_connection(Failure(UDF_FAILED))


def test_a_dead_child_is_seen_dead_while_another_thread_polls_it():
    """Popen.poll says "running" while another thread holds its wait lock; the
    JVM check must not believe it (a subtask would fail instead of retrying)."""
    import subprocess
    import time

    from backfill.spark.session import _exited

    child = subprocess.Popen(["sleep", "0"])
    time.sleep(0.3)  # exited, not reaped: a zombie
    with child._waitpid_lock:  # noqa: SLF001  (another thread inside poll())
        assert child.poll() is None  # what misled the check
        assert _exited(child)
    child.wait()


# --- what a batch raises when its Spark part failed (pipeline, rewrite's Spark rows) ---

SCHEMA_QUERY_TIMED_OUT = """An error occurred while calling o133.jdbc.
: org.postgresql.util.PSQLException: ERROR: canceling statement due to lock timeout
\tat org.postgresql.core.v3.QueryExecutorImpl.receiveErrorResponse(QueryExecutorImpl.java:2733)
"""


class Py4JJavaError(Exception):
    """Stands for py4j's: ``is_spark`` knows Spark's errors by their module."""


Py4JJavaError.__module__ = "py4j.protocol"


@pytest.mark.parametrize(("text", "alive", "retried", "says"), [
    (READ_KILLED, True, True,
     "Spark's read failed, tried again: FATAL: terminating connection due to administrator "
     "command"),
    (SCHEMA_QUERY_TIMED_OUT, True, True,
     "Spark's read failed, tried again: canceling statement due to lock timeout"),
    (BAD_CAST, False, True, "Spark's JVM exited; tried again on a new session"),
    (BAD_CAST, True, False, 'invalid input syntax for type integer: "x"'),
])
def test_a_failure_a_retry_may_pass_is_retried_and_any_other_says_its_cause(
        text, alive, retried, says):
    got = as_batch_error(Py4JJavaError(text), alive)
    assert isinstance(got, RetryableError) == retried
    assert isinstance(got, SparkBatchError) == (not retried)
    assert str(got) == says


def test_a_failure_not_of_spark_is_left_as_it_is():
    error = ValueError("a bug")
    assert as_batch_error(error, True) is error
