"""The ``reorg`` command: global options, the command groups, and ``main``.

A run imports only the command groups its arguments name (``reorg status``
loads neither the worker nor Spark), and builds only the commands it names:
start-up is most of a short command's time. Besides cli/'s own groups, job types add commands through the
``reorg.commands`` entry point (``cli.plugin``), imported the same way: only
when a run names them, or for ``--help``. ``app`` (the module attribute) has
every group.
"""

from __future__ import annotations

import gc
import importlib
import logging
import sys
from collections.abc import Sequence
from typing import Annotated, Any, NoReturn

import typer
from typer.core import TyperGroup

from cli import coercion, plugin, started
from cli.context import CliState, GlobalOptions
from cli.errors import INTERRUPTED, CliFailure, debug_requested, handle
from framework.config import Settings

# Module of cli/ -> (the name it is added under, or None to merge its
# commands; the commands it brings). tests/unit/test_cli_lazy.py checks it
# against the modules.
GROUPS: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "submit": ("submit", ("submit",)),
    "jobs": (None, ("status", "wait", "cancel", "pause", "resume", "retry", "alter", "events")),
    "history": (None, ("history",)),
    "nodes": (None, ("nodes",)),
    "worker": (None, ("worker",)),
    "db": ("db", ("db",)),
    "dashboard.command": (None, ("dashboard",)),
}
ALL_COMMANDS = frozenset(c for _, commands in GROUPS.values() for c in commands)

# Plain option values without pydantic: a tenth of a second of every command.
coercion.install()


class Commands(TyperGroup):
    """``reorg``'s own group: a Ctrl-C that no command explains is said
    in one line too, as every error is (typer would exit 130 silently)."""

    def invoke(self, ctx: typer.Context) -> Any:  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise CliFailure("interrupted", INTERRUPTED) from None


def build_app(args: Sequence[str] | None = None) -> typer.Typer:
    """The ``reorg`` app with the groups whose commands appear in ``args``
    (every group when ``args`` is None or names none, e.g. ``--help``)."""
    app = typer.Typer(
        cls=Commands,
        name="reorg",
        help="Distributed online backfill and reorg jobs on large PostgreSQL tables.",
        no_args_is_help=True,
        add_completion=False,
        # Our own handler prints one line per error (cli.errors), never a traceback.
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    app.callback()(global_options)
    named = set(args or ())
    if "--version" in named and not named & ALL_COMMANDS:
        return app  # an eager option: it prints and exits before any command
    wanted = [m for m, (_, commands) in GROUPS.items() if named & set(commands)]
    # The installed distributions are scanned for commands only when no command
    # of cli/'s own is named (``--help``, or a job type's command).
    contributed = {} if wanted else plugin.commands()
    wanted_plugins = [c for c in contributed if c in named and c not in ALL_COMMANDS]
    everything = not (wanted or wanted_plugins)
    for module in GROUPS if everything else wanted:
        name = GROUPS[module][0]
        group = importlib.import_module(f"cli.{module}").app
        if name:
            app.add_typer(group, name=name)
        else:
            app.add_typer(group if everything else only(group, named))
    for command in contributed if everything else wanted_plugins:
        if command not in ALL_COMMANDS:  # cli/'s own commands win a clash of names
            app.add_typer(contributed[command].load())
    return app


def only(group: typer.Typer, names: set[str]) -> typer.Typer:
    """The commands of a merged group that ``names`` names: typer turns every
    command it is given into click's, signature by signature, and the run
    needs one (``reorg status`` builds neither ``cancel`` nor ``alter``)."""
    picked = typer.Typer()
    picked.registered_commands = [
        c for c in group.registered_commands
        if (c.name or typer.main.get_command_name(c.callback.__name__ if c.callback else ""))
        in names]
    return picked


def __getattr__(name: str) -> Any:
    if name == "app":  # every command group, for tests and tools that walk them
        return build_app()
    raise AttributeError(name)


_PANEL = "Global options"
_DEFAULT = Settings("")


def _print_version(requested: bool) -> None:
    if requested:
        from framework.version import reorg_version

        print(f"reorg {reorg_version()}")
        raise typer.Exit()


def global_options(
    ctx: typer.Context,
    db_url: Annotated[str | None, typer.Option(
        "--db", envvar="REORG_DATABASE_URL", rich_help_panel=_PANEL, show_default=False,
        help="postgresql:// URL of the database holding the system tables "
             "(default: the embedded database, started on demand).")] = None,
    schema: Annotated[str, typer.Option(
        envvar="REORG_SCHEMA", rich_help_panel=_PANEL,
        help="PostgreSQL schema of the system tables.")] = _DEFAULT.schema,
    lease_seconds: Annotated[float, typer.Option(
        envvar="REORG_LEASE_SECONDS", rich_help_panel=_PANEL,
        help="How long a worker's claim on a subtask lasts without renewal.")] = (
        _DEFAULT.lease_seconds),
    owner_lease_seconds: Annotated[float, typer.Option(
        envvar="REORG_OWNER_LEASE_SECONDS", rich_help_panel=_PANEL,
        help="How long the owner's term lasts without renewal.")] = _DEFAULT.owner_lease_seconds,
    max_attempts: Annotated[int, typer.Option(
        envvar="REORG_MAX_ATTEMPTS", rich_help_panel=_PANEL,
        help="Attempts per subtask before it fails for good.")] = _DEFAULT.max_attempts,
    debug: Annotated[bool, typer.Option(
        "--debug", envvar="REORG_DEBUG", rich_help_panel=_PANEL,
        help="Show tracebacks and debug logs.")] = False,
    _version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=_print_version, expose_value=True,
        help="Print reorg's version and exit.")] = False,
) -> None:
    state = CliState(GlobalOptions(db_url, schema, lease_seconds, owner_lease_seconds,
                                   max_attempts, debug))
    ctx.obj = state
    ctx.call_on_close(state.close)


def run(argv: Sequence[str] | None = None) -> int:
    """Run ``reorg`` with ``argv``; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    started()
    if not debug_requested(args):
        _quiet_library_warnings()
    try:
        # standalone_mode=False: errors reach our handler instead of click's.
        code = build_app(args)(args=args, prog_name="reorg", standalone_mode=False)
    except (Exception, KeyboardInterrupt) as exc:
        return handle(exc, debug=debug_requested(args))
    return code if isinstance(code, int) else 0


def _quiet_library_warnings() -> None:
    """A command's failure is one line: the database libraries' own warnings
    (psycopg's "query cancellation failed" after a Ctrl-C under load, the
    pool's "Exception during reset") would reach stderr through logging's
    last resort. A configured log (the worker's) still gets them."""
    for name in ("psycopg", "sqlalchemy"):
        log = logging.getLogger(name)
        if not any(isinstance(h, logging.NullHandler) for h in log.handlers):
            log.addHandler(logging.NullHandler())


def main() -> NoReturn:
    code = run()
    # Interpreter shutdown runs a full garbage collection over every object
    # the imports made (SQLAlchemy, typer, psycopg): 0.1-0.25 s of a
    # command's wall time, after its work is done and its connections are
    # closed. Frozen objects are skipped by it; they are still released.
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    main()
