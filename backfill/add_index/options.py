"""``reorg submit add-index`` options (``AddIndex.submit_options``)."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.plugin import Params, TableOpt


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
