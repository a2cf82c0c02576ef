"""``reorg submit TYPE ...``: one command per registered job type.

The commands are built when asked for, from the job types registered
(``framework.jobtype``, the ``reorg.job_types`` entry point): ``reorg submit
sql-update`` imports sql-update alone; ``reorg submit --help`` lists every
type, one installed from another package too. A type's own options come
from its ``submit_options`` (``cli.plugin``); this module adds the options
every job shares (job key, priority, limits, dry run, JSON) and submits. It
names no job type.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from cli import plugin
from cli.context import cli_state
from cli.errors import INTERRUPTED, CliFailure
from cli.jobs import job_goes_on, succeeded_line, wait_until_ended
from cli.output import console, count, print_json, table_name
from cli.plugin import Params
from cli.stderr import child_stderr_hidden
from framework import jobtype
from framework.control import local_actor
from framework.errors import InvalidParams
from framework.keys import Key, shown, stored_json
from framework.splitting import SplitPlan
from framework.submit import SubmitInterrupted, SubmitRequest, SubmitResult, submit


class JobTypeCommands(TyperGroup):
    """``reorg submit``'s commands: one per registered job type, built when
    asked for, so a run imports only the job type it names."""

    # Click's types live in typer's private vendored copy: typer.Context is
    # its Context; a command is whatever ``typer.main.get_command`` builds.
    def list_commands(self, ctx: typer.Context) -> list[str]:  # type: ignore[override]
        return jobtype.names()

    def get_command(self, ctx: typer.Context, cmd_name: str) -> Any:  # type: ignore[override]
        try:
            kind = jobtype.get(cmd_name)
        except InvalidParams:
            return None
        return submit_command(cmd_name, plugin.submit_options(kind))

    def resolve_command(self, ctx: typer.Context, args: list[str]) -> Any:  # type: ignore[override]
        name = args[0] if args else ""
        if args and not name.startswith("-") and self.get_command(ctx, name) is None:
            known = ", ".join(jobtype.names()) or "none installed"
            raise InvalidParams(f"unknown job type {name!r}; choose one of: {known}")
        return super().resolve_command(ctx, args)


app = typer.Typer(cls=JobTypeCommands, no_args_is_help=True)


@app.callback()
def _submit() -> None:
    """Submit a job; prints its id."""

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
    _common("batch_rows", Annotated[int | None, typer.Option(
        envvar="REORG_BATCH_ROWS", help="Rows per batch (one transaction each); default: the "
                                        "job type's (10,000; rewrite: 50,000), at most "
                                        "--max-rows-per-sec.",
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
    _common("wait", Annotated[bool, typer.Option(
        "--wait", help="Stay until the job ends and exit as `reorg wait` does (0: it "
        "succeeded); the id still goes to stdout first, the outcome to stderr.",
        rich_help_panel=_PANEL)], False),
    _common("timeout", Annotated[float | None, typer.Option(
        min=0, metavar="S", help="With --wait: give up waiting after S seconds (exit 3); "
        "the job goes on.", rich_help_panel=_PANEL)], None),
]
_COMMON_NAMES = [p.name for p in _COMMON_OPTIONS]


def submit_command(name: str, to_params: Callable[..., Params]) -> Any:
    """``reorg submit NAME`` from a function that maps the type's own options
    to its params dict (its docstring is the help text), with the options
    every job shares."""
    own = inspect.signature(to_params, eval_str=True).parameters.values()

    def command(ctx: typer.Context, **options: Any) -> None:
        common = {k: options.pop(k) for k in _COMMON_NAMES}
        as_json, wait, timeout = common.pop("as_json"), common.pop("wait"), common.pop("timeout")
        if timeout is not None and not wait:
            raise InvalidParams("--timeout applies to --wait; add --wait, or drop --timeout")
        params = {k: v for k, v in to_params(**options).items() if v not in (None, [])}
        request = SubmitRequest(type=name, params=params, actor=local_actor(), **common)
        state = cli_state(ctx)
        result: SubmitResult | None = None
        shown = False  # the id is on stdout
        try:
            db = state.database()
            with child_stderr_hidden(enabled=not state.options.debug):
                result = submit(db, request)
            _report(result, as_json, waiting=wait)
            shown = True
            if not (wait and result.job_id is not None):
                return
            sys.stdout.flush()  # the id first
            # The wait runs in this process: a second one (`reorg wait`) would
            # start while the job's first batches run, and take the CPU they need.
            job = wait_until_ended(state.direct_database(), result.job_id, timeout)
        except KeyboardInterrupt as interrupt:
            raise _interrupted(interrupt, result, shown=shown, as_json=as_json,
                               waited=shown and wait) from None
        typer.echo(succeeded_line(job), err=True)

    # typer reads the signature: the type's own options, then the shared ones.
    ctx_param = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                  annotation=typer.Context)
    command.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [ctx_param, *(p.replace(kind=_KW) for p in own), *_COMMON_OPTIONS])
    # Else typer would also resolve the wrapper's own ``**options`` hint.
    command.__annotations__ = {}
    single = typer.Typer(add_completion=False)
    single.command(name, help=to_params.__doc__, no_args_is_help=True)(command)
    return typer.main.get_command(single)


def _interrupted(interrupt: KeyboardInterrupt, result: SubmitResult | None, *, shown: bool,
                 as_json: bool, waited: bool) -> CliFailure:
    """A Ctrl-C of a submit says whether a job was submitted, and if so
    prints its id as a submit does and says that the job goes on."""
    if isinstance(interrupt, SubmitInterrupted):
        result = interrupt.result
    if result is None or result.job_id is None:
        return CliFailure("interrupted; nothing was submitted", INTERRUPTED)
    if not shown:
        _report(result, as_json, waiting=True)
    sys.stdout.flush()  # the id before the error line
    return job_goes_on(result.job_id, waited=waited)


def _report(result: SubmitResult, as_json: bool, *, waiting: bool = False) -> None:
    if result.dry_run:
        _report_plan(result.target_table, result.plan, as_json, result.notes)
    elif as_json:
        print_json({"id": result.job_id, "created": result.created,
                    "table": table_name(result.target_table),
                    "awaiting_verdict": result.awaiting_verdict})
    else:
        if not result.created:
            typer.echo(f"note: job key already names job {result.job_id}; not submitted again",
                       err=True)
        if result.awaiting_verdict and not waiting:  # else the wait reports a rejection
            typer.echo(f"note: job {result.job_id} is queued; the owner has not finished "
                       f"checking its input yet (`reorg wait {result.job_id}` reports a "
                       "rejection)", err=True)
        print(result.job_id)  # alone on stdout: scripts capture it


def _report_plan(target: str, plan: SplitPlan | None, as_json: bool,
                 notes: tuple[str, ...] = ()) -> None:
    """A dry run's plan: the key ranges (of a type whose steps use them) and
    the type's description of each state."""
    if as_json:
        ranges = {} if plan is None else {
            "ranges": len(plan.ranges), "estimated_rows": plan.row_count,
            "rows_per_subtask": plan.rows_per_range,
            "key_ranges": [[stored_json(lo), stored_json(hi)] for lo, hi in plan.ranges]}
        print_json({"dry_run": True, "table": table_name(target), **ranges,
                    "plan": list(notes)})
        return
    console.print(f"dry run, nothing submitted: {table_name(target)}")
    if plan is not None:
        _print_ranges(plan)
    for line in notes:
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def _print_ranges(plan: SplitPlan) -> None:
    edge = 3  # ranges shown at each end of a long plan

    def fmt(ranges: Sequence[tuple[Key, Key]]) -> str:
        return "  ".join(f"[{shown(lo)}, {shown(hi)})" for lo, hi in ranges)

    console.print(f"  estimated rows  {count(plan.row_count)}")
    console.print(f"  ranges          {len(plan.ranges)} of up to "
                  f"{count(plan.rows_per_range)} rows")
    if len(plan.ranges) <= 2 * edge:
        console.print(f"  ranges          {fmt(plan.ranges) or '-'}")
    else:
        console.print(f"  first           {fmt(plan.ranges[:edge])}")
        console.print(f"  last            {fmt(plan.ranges[-edge:])}")
