"""``reorg submit copy`` options (``CopyJobType.submit_options``)."""

from __future__ import annotations

from typing import Annotated

import typer

from backfill.options import WhereOpt
from cli.plugin import Params, TableOpt


def copy(
    table: TableOpt,
    target: Annotated[str, typer.Option(help="Table to copy rows into.")],
    select: Annotated[list[str] | None, typer.Option(
        help="Spark SQL expression for one target column; repeat for each column.")] = None,
    create_target: Annotated[bool, typer.Option(
        "--create-target", help="Create the target table (dropped again on rollback).")] = False,
    where: WhereOpt = None,
) -> Params:
    """Copy rows into another table through Spark SQL select expressions."""
    return {"table": table, "target": target, "select": select or [],
            "create_target": create_target, "where": where}
