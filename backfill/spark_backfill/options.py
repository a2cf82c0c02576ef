"""``reorg submit backfill`` options (``BackfillJobType.submit_options``)."""

from __future__ import annotations

from typing import Annotated

import typer

from backfill.options import AddColumnOpt, SetOpt, WhereOpt
from cli.plugin import Params, TableOpt


def backfill(
    table: TableOpt, set_: SetOpt, where: WhereOpt = None, add_column: AddColumnOpt = None,
    udf: Annotated[str | None, typer.Option(
        help="module:function computing the value in Python instead of EXPRESSION.")] = None,
) -> Params:
    """Set a column from a Spark SQL expression (or a Python UDF), on Spark."""
    return {"table": table, "set": set_, "where": where, "add_column": add_column, "udf": udf}
