"""What the Spark job types' submit-time checks share: Spark started before
the checks' transaction opens, and the dry run on sample rows.


``framework.submit`` validates in one REPEATABLE READ transaction, which
PostgreSQL opens at its first statement. Starting Spark takes seconds (more
when the JDBC driver is fetched through ``spark.jars.packages``); started in
the middle of that transaction, it would leave the transaction idle long
enough for ``idle_in_transaction_session_timeout`` to end the session, and a
good expression would be rejected. So Spark starts first, while no
transaction is open. An unknown table is still reported at once: it is
checked on a separate connection before Spark starts.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from sqlalchemy.engine import Connection

from backfill.spark.failures import first_line, from_postgres, lost_connection
from backfill.tables import FIX_WHERE, inspect_table
from framework.db import DatabaseUnreachable
from framework.errors import InvalidParams
from framework.keys import KeySpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import DataType

    from backfill.spark.transform import Transform

DRY_RUN_ROWS = 100  # sample rows a submit computes and lands (rolled back) to check the input


def start_spark_first(conn: Connection, table: str) -> None:
    """Start the validation SparkSession unless it runs; call this before
    ``conn`` executes anything."""
    from backfill.spark import session

    if session.started():
        return
    with conn.engine.connect() as quick:
        inspect_table(quick, table)  # raises InvalidParams: unknown table, no usable key
    session.get_validation_spark()


@contextmanager
def dry_run(shown: str, display: str, where: str | None) -> Iterator[None]:
    """Turn a failed dry run of ``shown`` (e.g. ``--set c=expr``) on sample rows
    of ``display`` into the error that says whose fault it was: the database
    connection's (try again), the ``--where`` predicate's (PostgreSQL failed
    evaluating it on the rows read, after EXPLAIN accepted it), or the
    expression's."""
    try:
        yield
    except Exception as exc:
        if lost_connection(exc):
            raise DatabaseUnreachable(
                f"the dry run of {shown} on sample rows was cut off by the database "
                f"({first_line(exc)}); submit again") from None
        if where and from_postgres(exc):
            raise InvalidParams(
                f"--where fails on rows of {display}: {first_line(exc)}; {FIX_WHERE}") from None
        raise InvalidParams(
            f"{shown} fails on sample rows of {display}: {first_line(exc)}; "
            "fix the expression") from None


def check_on_sample(conn: Connection, sample: DataFrame, transform: Transform, target: DataType,
                    column_type: str, key: KeySpec, display: str, where: str | None) -> None:
    """``transform``'s expression analysed on ``sample`` (rows of ``display``
    as the subtasks read them, keyed by ``key``), its type against the
    column's (``target``, PostgreSQL's ``column_type``), then computed on the
    sample and landed in a stage inside a savepoint rolled back on ``conn``.
    InvalidParams, one line naming ``--set``, otherwise."""
    from backfill.spark import compat, landing
    from backfill.spark.expression_guard import check_spark_expression

    column, expr = transform.column, transform.expr
    shown = f"--set {column}={expr}"
    check_spark_expression(sample.sparkSession, expr, "--set")
    try:
        transform.register(sample.sparkSession, target)
        result = sample.selectExpr(expr).schema[0].dataType
    except Exception as exc:
        raise InvalidParams(
            f"{shown} is not a Spark SQL expression over {display}: {first_line(exc)}") from None
    if not compat.can_land(result, target):
        raise InvalidParams(
            f"{shown} yields {result.simpleString()} but {column} is {column_type}; "
            f"wrap it in CAST(... AS {target.simpleString()})")
    with dry_run(shown, display, where):
        rows = transform.output(sample, key, target).toArrow()
        with conn.begin_nested() as savepoint:
            conn.exec_driver_sql(landing.create_staging_sql(column_type, key))
            landing.copy_in(conn.connection.driver_connection, column_type,
                            landing.stage_columns(key), landing.to_csv(rows), key)
            savepoint.rollback()
