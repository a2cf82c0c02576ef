"""Start Spark for submit-time checks before the checks' transaction opens.

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

from sqlalchemy.engine import Connection

from backfill.tables import inspect_table


def start_spark_first(conn: Connection, table: str) -> None:
    """Start the validation SparkSession unless it runs; call this before
    ``conn`` executes anything."""
    from backfill.spark import session

    if session.started():
        return
    with conn.engine.connect() as quick:
        inspect_table(quick, table)  # raises InvalidParams: unknown table, no usable key
    session.get_validation_spark()
