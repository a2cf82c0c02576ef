"""``reorg nodes``: the worker processes registered in this installation."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from cli.context import cli_state
from cli.output import console, print_json
from framework.db import Database
from framework.store import nodes as node_store
from framework.store import owner_lease

app = typer.Typer()


@app.command()
def nodes(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
) -> None:
    """Nodes: host, pid, slots, state, heartbeat age, running subtasks, owner."""
    db = cli_state(ctx).database()
    with db.begin() as conn:
        rows = node_store.list_all(db, conn)
    revision = _owner_revision(db)
    for r in rows:
        r["heartbeat_age"] = round(float(r["heartbeat_age"]), 1)
        r["is_owner"] = bool(r["is_owner"])
    if as_json:
        print_json(rows)
        return
    if not rows:
        console.print("no nodes; start one with `reorg worker`")
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for name in ("NODE", "HOST", "PID", "SLOTS", "STATE", "HEARTBEAT", "RUNNING", "OWNER"):
        table.add_column(name, overflow="fold",
                         justify="right" if name in ("PID", "SLOTS", "RUNNING") else "left")
    for r in rows:
        table.add_row(r["node_id"], r["host"], str(r["pid"]), str(r["slots"]), r["state"],
                      f"{r['heartbeat_age']:.1f}s ago", str(r["running"]),
                      _owner_flag(r["is_owner"], revision))
    console.print(table)


def _owner_flag(is_owner: bool, revision: int | None) -> str:
    if not is_owner:
        return ""
    return "yes" if revision is None else f"yes (revision {revision})"


def _owner_revision(db: Database) -> int:
    with db.begin() as conn:
        return int(owner_lease.current(db, conn)["revision"])  # type: ignore[call-overload]
