"""The column a ``--set COL=EXPR [--add-column COL:TYPE]`` job writes, as
``sql-update`` (a PostgreSQL expression) and ``backfill`` (a Spark SQL one)
share it: the submit checks of the table, the column and the submitter's
privileges, and the rollback's last step. Each job type checks EXPR in its
own dialect."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from sqlalchemy import text
from sqlalchemy.engine import Connection

from backfill.before_images import BeforeImages
from backfill.tables import (
    TableInfo,
    inspect_table,
    parse_assignment,
    quote,
    set_ddl_lock_timeout,
    target_column,
)
from framework import privileges
from framework.privileges import as_role, run_as
from framework.records import Job


class Assignment(NamedTuple):
    table: TableInfo
    column: str
    expr: str  # as written; the job type's to check
    column_type: str  # PostgreSQL type: of the column it adds, or of the existing one
    adding: bool  # --add-column: the job adds the column (else overwrites it)


def check(conn: Connection, params: dict[str, Any]) -> Assignment:
    """The table (any key), ``--set`` parsed, the column's type, and that the
    submitter may do what the job will do as them (``framework.privileges``):
    read and update the table, and, to add the column, own it."""
    table = inspect_table(conn, params.get("table", ""), any_key=True)
    column, expr = parse_assignment(params.get("set", ""))
    adding = bool(params.get("add_column"))
    column_type = target_column(conn, table, column, params.get("add_column"))
    privileges.check_table_privileges(conn, table.qualified, table.display,
                                      ("SELECT", "UPDATE"))
    if adding:
        privileges.check_owns_table(conn, table.qualified, table.display, "--add-column")
    return Assignment(table, column, expr, column_type, adding)


def revert(conn: Connection, job: Job, kept: Callable[[], BeforeImages]) -> None:
    """A rollback's last step (``JobType.revert``): the column the job added
    goes, as the submitter, as its ADD COLUMN was made; or, the overwritten
    values being back (the revert subtasks'), the before-images ``kept()``
    go. Again after a crash, harmlessly."""
    set_ddl_lock_timeout(conn)
    if job.params["overwrite"]:
        for stmt in kept().drop():
            conn.execute(text(stmt))
        return
    with as_role(conn, run_as(job)):
        conn.execute(text(f"ALTER TABLE IF EXISTS {job.target_table} "
                          f"DROP COLUMN IF EXISTS {quote(job.params['column'])}"))
