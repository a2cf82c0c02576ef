"""``reorg submit add-column`` options (``AddColumn.submit_options``)."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.plugin import AllowUserTriggersOpt, MethodOpt, Params, TableOpt


def add_column(
    table: TableOpt,
    column: Annotated[str, typer.Option(help="COLUMN:TYPE to add, e.g. c:text.")],
    value: Annotated[str, typer.Option(
        help="PostgreSQL expression of the row's columns: every row's value, existing "
             "and written during the job.")],
    default: Annotated[str | None, typer.Option(
        help="The column's default once the job is done.")] = None,
    not_null: Annotated[bool, typer.Option(
        "--not-null", help="Make the column NOT NULL at the end (checked without a long lock).")
    ] = False,
    allow_user_triggers: AllowUserTriggersOpt = False,
    method: MethodOpt = "column",
) -> Params:
    """Add a column and fill every row with a per-row value online; then its default
    and NOT NULL. Dropped again on cancel or failure. With --method rewrite: a rewrite
    job (the table copied with the new column, then swapped)."""
    return {"table": table, "column": column, "value": value, "default": default,
            "not_null": not_null, "allow_user_triggers": allow_user_triggers,
            "method": method}
