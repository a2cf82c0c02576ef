"""``reorg submit add-index`` and ``reorg submit add-column``: the options of
the online schema-change job types (``backfill.add_index``,
``backfill.add_column``), mapped to their params. Kept apart from
cli/submit.py so they can move into the job types' own packages in one step
once job types bring their own options."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.submit import Params, TableOpt, job_type


@job_type("add-index")
def add_index(
    table: TableOpt,
    columns: Annotated[str, typer.Option(help="The index's columns, in order: A[,B...].")],
    unique: Annotated[bool, typer.Option(
        "--unique", help="A unique index; duplicate keys are looked for first.")] = False,
    name: Annotated[str | None, typer.Option(
        help="The index's name (default: TABLE_COLUMNS_idx, numbered if taken).")] = None,
    where: Annotated[str | None, typer.Option(
        "--where", help="A partial index: only rows matching this predicate.")] = None,
) -> Params:
    """Build an index online (CREATE INDEX CONCURRENTLY under the job), for --unique
    after looking for duplicate keys; dropped again on cancel or failure."""
    return {"table": table, "columns": columns, "unique": unique, "name": name, "where": where}


@job_type("add-column")
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
) -> Params:
    """Add a column and fill every row with a per-row value online; then its default
    and NOT NULL. Dropped again on cancel or failure."""
    return {"table": table, "column": column, "value": value, "default": default,
            "not_null": not_null}
