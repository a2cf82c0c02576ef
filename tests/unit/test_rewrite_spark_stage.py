"""``rewrite --engine spark``'s temporary stage: one per column type, key
shape and submitter. The stage is made, and written, as the submitter
(the copy runs as them), so it is theirs alone: a job of another role that
met it on the same pooled session could not write it. And what a failure
of Spark's part of a write becomes: retried where a retry may pass."""

import pytest
from test_spark_failures import BAD_CAST, READ_KILLED

from backfill.rewrite.spark_rows import failed, stage_name
from backfill.spark.failures import SparkBatchError
from framework.errors import RetryableError


def test_each_role_has_a_stage_of_its_own():
    a = stage_name("text", ("bigint",), "alice")
    assert a == stage_name("text", ("bigint",), "alice")
    assert a != stage_name("text", ("bigint",), "bob")
    assert a != stage_name("text", ("bigint",), None)


def test_the_stage_follows_the_column_type_and_the_key():
    a = stage_name("text", ("bigint",), "alice")
    assert a != stage_name("integer", ("bigint",), "alice")
    assert a != stage_name("text", ("text", "integer"), "alice")
    assert len(a) <= 63 and a.startswith("reorg_rewrite_stage_")


# --- Spark's part of a write failing -------------------------------------------------

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
    got = failed(Py4JJavaError(text), alive)
    assert isinstance(got, RetryableError) == retried
    assert isinstance(got, SparkBatchError) == (not retried)
    assert str(got) == says


def test_a_failure_not_of_spark_is_left_as_it_is():
    error = ValueError("a bug")
    assert failed(error, True) is error
