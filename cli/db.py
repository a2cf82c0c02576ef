"""``reorg db``: the system tables' schema, and the embedded server."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.context import cli_state, upgrade_if_behind
from cli.errors import BAD_INPUT, OPERATIONAL, CliFailure
from cli.output import print_json
from framework import revisions

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
    version needs (the head): exit 0 when it is, 5 (one error line) when
    not. Changes nothing."""
    from framework.directdb import DirectDatabase  # one query: no SQLAlchemy engine

    db = DirectDatabase(cli_state(ctx).settings())
    try:
        revision = db.schema_revision()
    finally:
        db.dispose()
    head = revisions.head_revision()
    if as_json:
        print_json({"schema": db.schema, "revision": revision, "head": head,
                    "is_head": revision == head})
    elif revision == head:
        print(f"schema {db.schema} at revision {revision} (head)")
    if revision == head:
        return
    if revision is None:
        why = f"schema {db.schema}: not installed; this version needs {head}: run `reorg db upgrade`"
    elif revision not in revisions.known_revisions():
        why = (f"schema {db.schema} at revision {revision}, newer than this version's head "
               f"{head}: a newer reorg upgraded it; install that version here")
    else:
        why = f"schema {db.schema} at revision {revision}, not the head {head}: run `reorg db upgrade`"
    # What a script or a container's health check needs: not ready to run jobs.
    raise CliFailure(why, OPERATIONAL)


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


@app.command()
def grants(
    ctx: typer.Context,
    worker_role: Annotated[str, typer.Option(
        "--worker-role", envvar="REORG_WORKER_ROLE",
        help="The role `reorg worker` connects as (create it LOGIN NOINHERIT).")],
    user_role: Annotated[list[str] | None, typer.Option(
        "--user-role", help="A role that runs reorg submit/status/cancel (repeatable).")] = None,
    table: Annotated[list[str] | None, typer.Option(
        "--table", help="A table jobs will run on, SCHEMA.TABLE (repeatable).")] = None,
    apply: Annotated[bool, typer.Option(
        "--apply", help="Run the statements (as a role allowed to run them all, e.g. a "
                        "superuser) instead of printing them.")] = False,
) -> None:
    """Print (or --apply) the GRANT statements of a least-privilege setup: the
    workers' role, the users' roles, the target tables (docs/security.md)."""
    from sqlalchemy import text

    from framework.grants import GrantPlan, grant_script, statements

    db = cli_state(ctx).unchecked_database()
    with db.begin() as conn:
        admin = conn.execute(text(
            "SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = :s"),
            {"s": db.schema}).scalar()
        if admin is None:
            raise CliFailure(f"schema {db.schema} does not exist: run `reorg db upgrade` "
                             "as the role that is to own reorg's system tables first", BAD_INPUT)
        roles = [worker_role, *(user_role or [])]
        known = set(conn.execute(text("SELECT rolname FROM pg_roles WHERE rolname = ANY(:r)"),
                                 {"r": roles}).scalars())
        for role in roles:
            if role not in known:
                raise CliFailure(f"role {role!r} does not exist; create it first "
                                 f"(CREATE ROLE {role} LOGIN NOINHERIT for the workers)",
                                 BAD_INPUT)
        for name in table or []:
            if conn.execute(text("SELECT to_regclass(:t)"), {"t": name}).scalar() is None:
                raise CliFailure(f"table {name!r} does not exist; give SCHEMA.TABLE, "
                                 "e.g. --table public.items", BAD_INPUT)
    script = grant_script(GrantPlan(db.schema, admin, worker_role, tuple(user_role or ()),
                                    tuple(table or ())))
    if not apply:
        print(script, end="")
        return
    with db.begin() as conn:
        for statement in statements(script):
            conn.execute(text(statement))
    print(f"applied {len(statements(script))} statements")
