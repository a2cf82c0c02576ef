"""``reorg nodes``: the worker processes registered in this installation."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.context import cli_state
from cli.output import print_rows
from framework import control

app = typer.Typer()


@app.command()
def nodes(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
) -> None:
    """Nodes: host, pid, slots, state, heartbeat age, running subtasks, owner."""
    rows = control.nodes(cli_state(ctx).direct_database())
    print_rows(rows, as_json=as_json, empty="no nodes; start one with `reorg worker`", columns={
        "NODE": False, "HOST": False, "PID": True, "SLOTS": True, "STATE": False,
        "HEARTBEAT": False, "RUNNING": True, "OWNER": False,
    }, cells=lambda r: (r["node_id"], r["host"], str(r["pid"]), str(r["slots"]), r["state"],
                        f"{r['heartbeat_age']:.1f}s ago", str(r["running"]),
                        _owner_flag(r["owner_revision"])))


def _owner_flag(revision: int | None) -> str:
    return "" if revision is None else f"yes (revision {revision})"
