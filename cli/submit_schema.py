"""``reorg submit add-index`` and ``reorg submit add-column``: the options of
the online schema-change job types (``backfill.add_index``,
``backfill.add_column``), mapped to their params. Plain functions in the
form a job type's ``submit_options`` takes, registered by cli/submit.py, so
they move into the job types' own packages (``backfill/*/options.py``,
importing ``cli.plugin``) in one step once job types bring their own options."""

from __future__ import annotations

from typing import Annotated, Any

import typer

# cli.submit's, which registers these functions (imported from here, not
# there: no import cycle); cli.plugin's once job types bring their options.
Params = dict[str, Any]
TableOpt = Annotated[str, typer.Option("--table", help="Table to work on, e.g. public.items.")]


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
