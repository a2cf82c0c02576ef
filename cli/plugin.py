"""What a job type brings to the ``reorg`` command, so that ``cli/`` knows no
job type by name: its ``reorg submit TYPE`` options, its own commands, a line
of its own in ``reorg status JOB``. The one module of ``cli`` a job type's
package may import (tests/unit/test_layout.py); the protocol as a whole is in
docs/design.md, "Job-type protocol".

``reorg submit TYPE`` options. The registered job type's ``submit_options``:
a function whose keyword parameters, annotated with typer options, are the
type's own options, returning the job's params; its docstring is the help
text. To keep worker processes from importing typer, it may be given as a
``"module:function"`` string, imported only by ``reorg submit``::

    class MyType:
        name = "my-type"
        submit_options = "my_package.options:my_type"

    # my_package/options.py
    def my_type(table: TableOpt, thing: Annotated[str, typer.Option()]) -> Params:
        \"\"\"Help text of `reorg submit my-type`.\"\"\"
        return {"table": table, "thing": thing}

A type without ``submit_options`` gets ``--table`` and ``--param KEY=VALUE``
(``generic_options``). The options every job shares (priority, limits,
``--dry-run``, ``--json``...) are added by ``cli.submit``.

Commands. The entry point group ``reorg.commands``: its name is the command's,
its value a ``typer.Typer`` holding that one command (e.g. ``reorg
checksum-report``, from backfill/checksum). ``database(ctx)`` gives the
command the database the global options name.

Worker options. The entry point group ``reorg.worker_options``: its value a
function whose keyword parameters, annotated with typer options, become
options of ``reorg worker`` (e.g. ``--spark-master``, from backfill/spark);
the worker calls it once with their values before its node starts, and runs
what it returns, if anything, on a thread once the node runs, with the
database URL (e.g. a warm-up that reads from the database).

Status lines. The entry point group ``reorg.status_lines``: its name is a job
type's, its value a function ``(db, job status row) -> str | None``, printed
under ``reorg status JOB`` of a job of that type. Only the one of the shown
job's type is imported.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.context import cli_state
from cli.output import count, print_json, table_name
from framework.db import Database
from framework.durations import duration
from framework.entry_points import installed_entry_points
from framework.errors import InvalidParams

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

    from framework.directdb import DirectDatabase

COMMANDS_GROUP = "reorg.commands"
STATUS_LINES_GROUP = "reorg.status_lines"
WORKER_OPTIONS_GROUP = "reorg.worker_options"

Params = dict[str, Any]
TableOpt = Annotated[str, typer.Option("--table", help="Table to work on, e.g. public.items.")]
# Schema changes whose backfill updates every row (add-column, alter-type).
AllowUserTriggersOpt = Annotated[bool, typer.Option(
    "--allow-user-triggers",
    help="Accept that the backfill fires the table's own triggers for UPDATE on every "
         "row or batch (an updated_at stamp, an audit log); without it such a table is "
         "refused.")]

MethodOpt = Annotated[str, typer.Option(
    "--method", metavar="column|rewrite",
    help="column: change the table in place (a new column, a backfill UPDATE of every row, "
         "a cut-over); rewrite: copy the table with the change into a new one and swap it "
         "in (a rewrite job: the column keeps its place, no trigger fires, the table's size "
         "again in disk).")]

__all__ = ["AllowUserTriggersOpt", "MethodOpt", "Params", "TableOpt", "count", "database",
           "duration", "generic_options", "print_json", "read_database", "table_name"]


def database(ctx: typer.Context) -> Database:
    """The database the ``reorg`` global options name (migrated, reachable)."""
    return cli_state(ctx).database()


def read_database(ctx: typer.Context) -> DirectDatabase:
    """The same database for a command that only reads the system tables
    through the framework's read functions: one psycopg connection, without
    SQLAlchemy (``framework.directdb``; ``database`` for anything else)."""
    return cli_state(ctx).direct_database()


def generic_options(
    table: TableOpt,
    param: Annotated[list[str] | None, typer.Option(
        "--param", metavar="KEY=VALUE",
        help="A parameter of the job type; repeat for each. VALUE is read as JSON "
             "when it is JSON (numbers, true, lists), as text otherwise.")] = None,
) -> Params:
    """Submit a job of this type with its parameters given as --param KEY=VALUE."""
    params: Params = {"table": table}
    for pair in param or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidParams(f"--param {pair!r} is not KEY=VALUE; write e.g. --param column=d")
        try:
            params[key.strip()] = json.loads(value)
        except ValueError:
            params[key.strip()] = value
    return params


def submit_options(kind: object) -> Callable[..., Params]:
    """The type's ``submit_options`` (a function, or "module:function" to import)."""
    declared = getattr(kind, "submit_options", None)
    if declared is None:
        return generic_options
    if isinstance(declared, str):
        module, _, name = declared.partition(":")
        return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]
    return declared  # type: ignore[no-any-return]


def commands() -> dict[str, EntryPoint]:
    """Command name -> its entry point (not loaded: ``reorg`` imports only the
    commands a run names)."""
    return {ep.name: ep for ep in installed_entry_points(COMMANDS_GROUP)}


def status_line(database: Callable[[], Database], job: dict[str, Any]) -> str | None:
    """The line the job's type adds under ``reorg status JOB``, if it adds one;
    ``database()`` is called only then (an engine is not free to make)."""
    for ep in installed_entry_points(STATUS_LINES_GROUP).select(name=job["type"]):
        line = ep.load()(database(), job)
        if line:
            return str(line)
    return None


WorkerStart = Callable[[str], None]  # given the database URL


@functools.cache
def _worker_option_functions() -> tuple[Callable[..., WorkerStart | None], ...]:
    entry_points = sorted(installed_entry_points(WORKER_OPTIONS_GROUP), key=lambda ep: ep.name)
    return tuple(ep.load() for ep in entry_points)


def _parameters(function: Callable[..., object]) -> list[inspect.Parameter]:
    return [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
            for p in inspect.signature(function, eval_str=True).parameters.values()]


def worker_option_parameters() -> list[inspect.Parameter]:
    """The options the installed job types add to ``reorg worker``."""
    return [p for function in _worker_option_functions() for p in _parameters(function)]


def apply_worker_options(values: dict[str, Any]) -> list[WorkerStart | None]:
    """Call each contributor with its own options' values; what each returns
    runs once the worker's node runs."""
    return [function(**{p.name: values[p.name] for p in _parameters(function)})
            for function in _worker_option_functions()]
