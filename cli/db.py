"""``reorg db``: the system tables' schema."""

from __future__ import annotations

import typer

from cli.context import cli_state, upgrade_if_behind

app = typer.Typer(no_args_is_help=True, help="Install or upgrade reorg's system tables.")


@app.command()
def upgrade(ctx: typer.Context) -> None:
    """Create or upgrade the system tables to this version (safe to repeat)."""
    db = cli_state(ctx).unchecked_database()
    upgrade_if_behind(db)
    print(f"schema {db.schema} at revision {db.schema_revision()}")
