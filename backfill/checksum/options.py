"""``reorg submit checksum`` options (``ChecksumJobType.submit_options``)."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.plugin import Params, TableOpt


def checksum(
    table: TableOpt,
    target: Annotated[str, typer.Option(help="Table to compare with, e.g. a copy.")],
    columns: Annotated[list[str] | None, typer.Option(
        help="Column to compare (repeat, or separate with commas); default all.")] = None,
) -> Params:
    """Compare two tables range by range; report mismatching ranges and keys."""
    names = [c.strip() for value in columns or [] for c in value.split(",") if c.strip()]
    return {"table": table, "target": target, "columns": names}
