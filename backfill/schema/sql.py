"""Statements that carry SQL text the job did not write (a ``USING``
expression, a default, a comment, an index predicate from the catalogue):
sent as they are, on the driver's connection within the caller's
transaction. Through SQLAlchemy's ``text`` a ``:name`` in such text would be
taken for a bind parameter, and through the driver with parameters a ``%``
for a placeholder. Errors come back as SQLAlchemy's, so the framework's
``is_retryable`` (a lock timeout) and one-line reporting see them as usual."""

from __future__ import annotations

from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg import sql as pg_sql
from sqlalchemy.engine import Connection


def run(conn: Connection, statement: str) -> list[tuple[Any, ...]]:
    """Run one statement without parameters; its rows, if it returns any."""
    driver = conn.connection.driver_connection
    try:
        cursor = driver.execute(statement)  # type: ignore[union-attr]
        return cursor.fetchall() if cursor.description else []
    except psycopg.Error as exc:
        raise sa.exc.DBAPIError.instance(statement, None, exc, psycopg.Error) from None


def literal(value: str) -> str:
    """``value`` as an SQL string literal."""
    return pg_sql.Literal(value).as_string(None)
