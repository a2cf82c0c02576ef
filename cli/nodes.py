"""``reorg nodes``: the worker processes registered in this installation."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.context import cli_state
from cli.output import print_rows
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
    print_rows(rows, as_json=as_json, empty="no nodes; start one with `reorg worker`", columns={
        "NODE": False, "HOST": False, "PID": True, "SLOTS": True, "STATE": False,
        "HEARTBEAT": False, "RUNNING": True, "OWNER": False,
    }, cells=lambda r: (r["node_id"], r["host"], str(r["pid"]), str(r["slots"]), r["state"],
                        f"{r['heartbeat_age']:.1f}s ago", str(r["running"]),
                        _owner_flag(r["is_owner"], revision)))


def _owner_flag(is_owner: bool, revision: int | None) -> str:
    if not is_owner:
        return ""
    return "yes" if revision is None else f"yes (revision {revision})"


def _owner_revision(db: Database) -> int:
    with db.begin() as conn:
        return int(owner_lease.current(db, conn)["revision"])  # type: ignore[call-overload]
