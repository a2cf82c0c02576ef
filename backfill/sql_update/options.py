"""``reorg submit sql-update`` options (``SqlUpdate.submit_options``)."""

from __future__ import annotations

from backfill.options import AddColumnOpt, SetOpt, WhereOpt
from cli.plugin import Params, TableOpt


def sql_update(table: TableOpt, set_: SetOpt, where: WhereOpt = None,
               add_column: AddColumnOpt = None) -> Params:
    """Set a column from a PostgreSQL expression, range by range."""
    return {"table": table, "set": set_, "where": where, "add_column": add_column}
