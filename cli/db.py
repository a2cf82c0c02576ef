"""``reorg db``: the system tables' schema, and the embedded server."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.context import cli_state, upgrade_if_behind
from cli.errors import BAD_INPUT, CliFailure
from cli.output import print_json
from framework import migrate

app = typer.Typer(no_args_is_help=True,
                  help="Install, upgrade or inspect reorg's system tables; stop the embedded server.")


@app.command()
def upgrade(ctx: typer.Context) -> None:
    """Create or upgrade the system tables to this version (safe to repeat)."""
    db = cli_state(ctx).unchecked_database()
    upgrade_if_behind(db)
    print(f"schema {db.schema} at revision {db.schema_revision()}")


@app.command()
def current(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
) -> None:
    """The system tables' alembic revision, and whether it is the one this
    version needs (the head). Changes nothing."""
    db = cli_state(ctx).unchecked_database()
    revision, head = db.schema_revision(), migrate.head_revision()
    if as_json:
        print_json({"schema": db.schema, "revision": revision, "head": head,
                    "is_head": revision == head})
    elif revision == head:
        print(f"schema {db.schema} at revision {revision} (head)")
    elif revision is None:
        print(f"schema {db.schema}: not installed; this version needs {head}: "
              "run `reorg db upgrade`")
    elif revision not in migrate.known_revisions():
        print(f"schema {db.schema} at revision {revision}, newer than this version's head "
              f"{head}: a newer reorg upgraded it; install that version here")
    else:
        print(f"schema {db.schema} at revision {revision}, not the head {head}: "
              "run `reorg db upgrade`")


@app.command()
def stop(ctx: typer.Context) -> None:
    """Stop the embedded PostgreSQL (the default without --db); its data stays,
    and the next command starts it again."""
    state = cli_state(ctx)
    if state.options.db_url:
        raise CliFailure("`reorg db stop` stops only the embedded database, and --db (or "
                         "REORG_DATABASE_URL) names another server: stop that one where it runs",
                         BAD_INPUT)
    from framework.localpg.embedded import embedded_dir, stop_embedded

    where = embedded_dir()
    if stop_embedded():
        print(f"embedded PostgreSQL stopped; its data stays in {where}")
    else:
        print(f"embedded PostgreSQL is not running (data directory {where})")
