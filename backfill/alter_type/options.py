"""``reorg submit alter-type`` options (``AlterType.submit_options``)."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.plugin import AllowUserTriggersOpt, MethodOpt, Params, TableOpt


def alter_type(
    table: TableOpt,
    column: Annotated[str, typer.Option(help="Column whose type changes.")],
    type_: Annotated[str, typer.Option("--type", help="Its new type, e.g. bigint.")],
    using: Annotated[str | None, typer.Option(
        help="Expression of the row computing the new value (as ALTER TABLE ... USING); "
             "default: CAST(column AS TYPE).")] = None,
    allow_user_triggers: AllowUserTriggersOpt = False,
    method: MethodOpt = "column",
) -> Params:
    """Change a column's type online (ALTER TABLE ... ALTER COLUMN ... TYPE without the
    long lock): shadow column and trigger, backfill, verify, indexes built beforehand,
    then one short cut-over. The column moves to the end of SELECT *. With --method
    rewrite: a rewrite job (the table copied with the change, then swapped)."""
    return {"table": table, "column": column, "type": type_, "using": using,
            "allow_user_triggers": allow_user_triggers, "method": method}
