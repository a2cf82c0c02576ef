"""``reorg submit rewrite`` options (``Rewrite.submit_options``). Imported by
``reorg submit`` alone: workers never import typer."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.plugin import Params, TableOpt
from framework.errors import InvalidParams


def rewrite(
    table: TableOpt,
    order_by: Annotated[str | None, typer.Option(
        "--order-by", help="Columns to order the new table by, e.g. a,b (an online CLUSTER); "
                           "an index must start with them.")] = None,
    alter: Annotated[str | None, typer.Option(
        "--alter", help="Actions of one ALTER TABLE giving the new shape, e.g. "
                        "\"ALTER COLUMN id TYPE bigint, ADD COLUMN d text, DROP COLUMN e\".")
    ] = None,
    like: Annotated[Path | None, typer.Option(
        "--like", metavar="FILE", help="A file with the new shape's CREATE TABLE (any form, "
                                       "e.g. PARTITION BY with its partitions) and its indexes.")
    ] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", metavar="COLUMN=EXPR", help="A column's value in the new table, an expression "
                                             "of the old row; repeat for each column.")] = None,
    engine: Annotated[str, typer.Option(
        "--engine", metavar="sql|spark",
        help="sql: each --set is SQL, computed by PostgreSQL in the copy; spark: one --set, a "
             "Spark SQL expression computed by Spark (the backfill data plane) for each row "
             "copied or replayed.")] = "sql",
    udf: Annotated[str | None, typer.Option(
        "--udf", metavar="MODULE:FUNCTION",
        help="With --engine spark: a Python function the --set may call by its name.")] = None,
    keep_old: Annotated[str, typer.Option(
        "--keep-old", metavar="DURATION", help="Keep the old table in step after the swap for "
                                               "this long (e.g. 30m, 2h), so `reorg revert JOB` "
                                               "can swap back with every write made since; "
                                               "0: drop it at once.")] = "0",
    verify: Annotated[str, typer.Option(
        "--verify", metavar="full|off",
        help="full: before the swap, compare every range of the table with the new one by "
             "checksum, reading every row of both again (a range that differs is copied "
             "again); off: compare nothing, as pg_repack.")] = "full",
    kill_blockers: Annotated[bool, typer.Option(
        "--kill-blockers", help="When a session's lock keeps the swap waiting, end that "
                                "session (pg_terminate_backend) instead of only waiting.")] = False,
) -> Params:
    """Rewrite a table online into a new table and swap it in: repack (no option), re-order
    (--order-by), change its shape (--alter, --like) and compute columns (--set). Copy by
    range on every worker, indexes built after, changes replayed from a log, every range
    verified, then one short swap; the old table can be kept for `reorg revert`."""
    return {"table": table, "order_by": order_by, "alter": alter,
            "like": _read(like) if like is not None else None, "sets": list(set_ or []),
            "keep_old": keep_old, "kill_blockers": kill_blockers, "verify": verify,
            "engine": engine, "udf": udf}


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise InvalidParams(f"--like {path}: cannot read the file ({exc.strerror}); give the "
                            "path of a file holding the new shape's CREATE TABLE") from None
