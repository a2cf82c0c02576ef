"""``reorg submit TYPE ...``: one command per job type.

A job type's command only maps its own options to a params dict; the
``job_type`` decorator adds the options every job shares (job key, priority,
limits, dry run, JSON) and does the submitting. Adding a job type::

    @job_type("my-type")
    def my_type(table: TableOpt, thing: Annotated[str, typer.Option()]) -> Params:
        \"\"\"Help text of `reorg submit my-type`.\"\"\"
        return {"table": table, "thing": thing}
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Any

import typer

from cli.context import cli_state
from cli.output import console, count, print_json, table_name
from cli.stderr import child_stderr_hidden
from framework.control import local_actor
from framework.splitting import SplitPlan
from framework.submit import SubmitRequest, SubmitResult, submit

app = typer.Typer(no_args_is_help=True, help="Submit a job; prints its id.")

Params = dict[str, Any]
TableOpt = Annotated[str, typer.Option("--table", help="Table to work on, e.g. public.items.")]
SetOpt = Annotated[str, typer.Option("--set", help="COLUMN=EXPRESSION to write into each row.")]
WhereOpt = Annotated[str | None, typer.Option("--where", help="Only rows matching this predicate.")]
AddColumnOpt = Annotated[str | None, typer.Option(
    "--add-column", help="COLUMN:TYPE to create first (dropped again on rollback).")]

_DEFAULTS = SubmitRequest(type="")
_PANEL = "Options of every job"
_KW = inspect.Parameter.KEYWORD_ONLY


def _common(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    return inspect.Parameter(name, _KW, annotation=annotation, default=default)


# Knobs read REORG_* like every option; the job's identity (key, dry run) does not,
# so a stray environment variable cannot turn every submit into the same job.
_COMMON_OPTIONS = [
    _common("job_key", Annotated[str | None, typer.Option(
        help="Idempotency key: submitting the same key again returns the same job.",
        rich_help_panel=_PANEL)], None),
    _common("priority", Annotated[int, typer.Option(
        envvar="REORG_PRIORITY", help="Higher runs first.", rich_help_panel=_PANEL)],
        _DEFAULTS.priority),
    _common("concurrency", Annotated[int, typer.Option(
        envvar="REORG_CONCURRENCY", help="Subtasks of this job running at once.",
        rich_help_panel=_PANEL)], _DEFAULTS.concurrency),
    _common("batch_rows", Annotated[int, typer.Option(
        envvar="REORG_BATCH_ROWS", help="Rows per batch (one transaction each).",
        rich_help_panel=_PANEL)], _DEFAULTS.batch_rows),
    _common("max_rows_per_sec", Annotated[int | None, typer.Option(
        envvar="REORG_MAX_ROWS_PER_SEC", help="Rows/s limit for the whole job.",
        rich_help_panel=_PANEL)], _DEFAULTS.max_rows_per_sec),
    _common("max_replica_lag", Annotated[float | None, typer.Option(
        envvar="REORG_MAX_REPLICA_LAG", metavar="SECONDS",
        help="Hold batches while any standby replays more than SECONDS behind.",
        rich_help_panel=_PANEL)], _DEFAULTS.max_replica_lag),
    _common("max_active_sessions", Annotated[int | None, typer.Option(
        envvar="REORG_MAX_ACTIVE_SESSIONS", metavar="N",
        help="Hold batches while more than N sessions (not reorg's) are active.",
        rich_help_panel=_PANEL)], _DEFAULTS.max_active_sessions),
    _common("on_failure", Annotated[str, typer.Option(
        envvar="REORG_ON_FAILURE", metavar="rollback|pause",
        help="A subtask failing for good rolls the job back, or pauses it keeping "
             "finished ranges (`reorg retry` then).", rich_help_panel=_PANEL)],
        _DEFAULTS.on_failure),
    _common("rows_per_subtask", Annotated[int | None, typer.Option(
        envvar="REORG_ROWS_PER_SUBTASK", help="Rows per range (default: sized to the table).",
        rich_help_panel=_PANEL)], _DEFAULTS.rows_per_subtask),
    _common("dry_run", Annotated[bool, typer.Option(
        "--dry-run", help="Validate and print the plan; change nothing.",
        rich_help_panel=_PANEL)], False),
    _common("as_json", Annotated[bool, typer.Option(
        "--json", help="Print JSON for scripts.", rich_help_panel=_PANEL)], False),
]
_COMMON_NAMES = [p.name for p in _COMMON_OPTIONS]


def job_type(name: str) -> Callable[[Callable[..., Params]], Callable[..., Params]]:
    """Register ``reorg submit NAME`` from a function that maps the type's own
    options to its params dict (its docstring is the help text)."""

    def register(to_params: Callable[..., Params]) -> Callable[..., Params]:
        own = inspect.signature(to_params, eval_str=True).parameters.values()

        def command(ctx: typer.Context, **options: Any) -> None:
            common = {k: options.pop(k) for k in _COMMON_NAMES}
            as_json = common.pop("as_json")
            params = {k: v for k, v in to_params(**options).items() if v not in (None, [])}
            request = SubmitRequest(type=name, params=params, actor=local_actor(), **common)
            state = cli_state(ctx)
            db = state.database()
            with child_stderr_hidden(enabled=not state.options.debug):
                result = submit(db, request)
            _report(result, as_json)

        # typer reads the signature: the type's own options, then the shared ones.
        ctx_param = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                      annotation=typer.Context)
        command.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [ctx_param, *(p.replace(kind=_KW) for p in own), *_COMMON_OPTIONS])
        # Else typer would also resolve the wrapper's own ``**options`` hint.
        command.__annotations__ = {}
        app.command(name, help=to_params.__doc__, no_args_is_help=True)(command)
        return to_params

    return register


def _report(result: SubmitResult, as_json: bool) -> None:
    if result.plan is not None:
        _report_plan(result.target_table, result.plan, as_json)
    elif as_json:
        print_json({"id": result.job_id, "created": result.created,
                    "table": table_name(result.target_table),
                    "awaiting_verdict": result.awaiting_verdict})
    else:
        if not result.created:
            typer.echo(f"note: job key already names job {result.job_id}; not submitted again",
                       err=True)
        if result.awaiting_verdict:
            typer.echo(f"note: job {result.job_id} is queued; the owner has not finished "
                       f"checking its input yet (`reorg wait {result.job_id}` reports a "
                       "rejection)", err=True)
        print(result.job_id)  # alone on stdout: scripts capture it


def _report_plan(target: str, plan: SplitPlan, as_json: bool) -> None:
    if as_json:
        print_json({"dry_run": True, "table": table_name(target), "ranges": len(plan.ranges),
                    "estimated_rows": plan.row_count, "rows_per_subtask": plan.rows_per_range,
                    "key_ranges": plan.ranges})
        return
    shown = 3

    def fmt(ranges: list[tuple[int, int]]) -> str:
        return "  ".join(f"[{lo}, {hi})" for lo, hi in ranges)

    console.print(f"dry run, nothing submitted: {table_name(target)}")
    console.print(f"  estimated rows  {count(plan.row_count)}")
    console.print(f"  ranges          {len(plan.ranges)} of up to "
                  f"{count(plan.rows_per_range)} rows")
    if len(plan.ranges) <= 2 * shown:
        console.print(f"  ranges          {fmt(plan.ranges) or '-'}")
    else:
        console.print(f"  first           {fmt(plan.ranges[:shown])}")
        console.print(f"  last            {fmt(plan.ranges[-shown:])}")


# --- job types ------------------------------------------------------------------


@job_type("sql-update")
def sql_update(table: TableOpt, set_: SetOpt, where: WhereOpt = None,
               add_column: AddColumnOpt = None) -> Params:
    """Set a column from a PostgreSQL expression, range by range."""
    return {"table": table, "set": set_, "where": where, "add_column": add_column}


@job_type("backfill")
def backfill(
    table: TableOpt, set_: SetOpt, where: WhereOpt = None, add_column: AddColumnOpt = None,
    udf: Annotated[str | None, typer.Option(
        help="module:function computing the value in Python instead of EXPRESSION.")] = None,
) -> Params:
    """Set a column from a Spark SQL expression (or a Python UDF), on Spark."""
    return {"table": table, "set": set_, "where": where, "add_column": add_column, "udf": udf}


@job_type("copy")
def copy(
    table: TableOpt,
    target: Annotated[str, typer.Option(help="Table to copy rows into.")],
    select: Annotated[list[str] | None, typer.Option(
        help="Spark SQL expression for one target column; repeat for each column.")] = None,
    create_target: Annotated[bool, typer.Option(
        "--create-target", help="Create the target table (dropped again on rollback).")] = False,
    where: WhereOpt = None,
) -> Params:
    """Copy rows into another table through Spark SQL select expressions."""
    return {"table": table, "target": target, "select": select or [],
            "create_target": create_target, "where": where}


@job_type("checksum")
def checksum(
    table: TableOpt,
    target: Annotated[str, typer.Option(help="Table to compare with, e.g. a copy.")],
    columns: Annotated[list[str] | None, typer.Option(
        help="Column to compare (repeat, or separate with commas); default all.")] = None,
) -> Params:
    """Compare two tables range by range; report mismatching ranges and keys."""
    names = [c.strip() for value in columns or [] for c in value.split(",") if c.strip()]
    return {"table": table, "target": target, "columns": names}
