"""Commands on submitted jobs: status, wait, cancel, pause, resume, alter, events."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli import plugin, progress
from cli.context import cli_state
from cli.errors import (
    INTERRUPTED,
    JOB_DID_NOT_SUCCEED,
    PAUSED_ON_FAILURE,
    TIMEOUT,
    CliFailure,
)
from cli.output import colour_wanted, count, print_json, print_table
from framework import control
from framework.durations import duration

if TYPE_CHECKING:  # not imported: these commands run without SQLAlchemy
    from framework.db import Database
    from framework.directdb import DirectDatabase

app = typer.Typer()

JobArg = Annotated[int, typer.Argument(metavar="JOB", help="Job id, as printed by `reorg submit`.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


@app.command()
def status(
    ctx: typer.Context,
    job_id: Annotated[int | None, typer.Argument(metavar="[JOB]", help="Show only this job.")] = None,
    watch: Annotated[bool, typer.Option("--watch", "-w",
                                        help="Redraw live progress until every shown job ends.")] = False,
    as_json: JsonOpt = False,
    limit: Annotated[int, typer.Option(min=1, help="Show the newest N jobs.")] = 20,
) -> None:
    """Progress of jobs: state, percent, rows, rows/s, ETA, subtasks, nodes."""
    state = cli_state(ctx)
    if watch and not as_json:
        try:
            progress.watch(state.direct_database(), job_id, limit)
        except KeyboardInterrupt:
            # How a watch is left (from its first moment: connecting too):
            # nothing to explain, but not a success for a script that waited
            # on it (`reorg wait` is for that).
            raise typer.Exit(INTERRUPTED) from None
        return
    db = state.direct_database()
    if as_json:
        print_json(progress.status_for_json(db, job_id, limit))
        return
    jobs = control.status(db, job_id, limit)
    if not jobs:
        print("no jobs; submit one with `reorg submit`")
    else:
        print(progress.status_table(jobs, colour=colour_wanted()))
        for job in jobs:
            for line in progress.throttle_lines(job):
                print(line)
        found = plugin.status_line(state.database, jobs[0]) if job_id is not None else None
        if found:
            print(found)


@app.command()
def wait(
    ctx: typer.Context,
    job_id: JobArg,
    timeout: Annotated[float | None, typer.Option(min=0, help="Give up after S seconds (exit 3).")] = None,
) -> None:
    """Wait until a job ends: exit 0 when it succeeded, 1 when it failed, was
    cancelled or reverted, 3 on timeout, 4 when it paused on a failure
    (--on-failure pause), 5 when the database cannot be reached."""
    with job_goes_on_if_interrupted(job_id):
        job = wait_until_ended(cli_state(ctx).direct_database(), job_id, timeout)
    print(succeeded_line(job))


@contextlib.contextmanager
def job_goes_on_if_interrupted(job_id: int) -> Iterator[None]:
    """Ctrl-C of a wait stops the wait, not the job: say so, and how to stop
    the job (exit 130)."""
    try:
        yield
    except KeyboardInterrupt:
        raise job_goes_on(job_id, waited=True) from None


def job_goes_on(job_id: int, *, waited: bool) -> CliFailure:
    """What a Ctrl-C that stops a command, not the job, says (exit 130)."""
    again = " again" if waited else ""
    return CliFailure(f"interrupted; job {job_id} goes on: `reorg cancel {job_id}` "
                      f"cancels it, `reorg wait {job_id}` waits for it{again}", INTERRUPTED)


def wait_until_ended(db: Database | DirectDatabase, job_id: int,
                     timeout: float | None) -> dict[str, Any]:
    """The job once it has ended, if it succeeded; else the failure that
    ``reorg wait`` (and ``reorg submit --wait``) exits with."""
    job = progress.wait_ended(db, job_id, timeout)
    if job is None:
        raise CliFailure(f"job {job_id} has not finished after {timeout:g}s; "
                         "`reorg status` shows where it is", TIMEOUT)
    if progress.paused_on_failure(job):
        raise CliFailure(f"job {job_id} paused on a failure: "
                         f"{job['error'] or 'a subtask failed for good'}; fix the cause, "
                         f"then `reorg retry {job_id}` re-queues the failed subtasks and "
                         f"resumes, or `reorg cancel {job_id}` rolls the job back",
                         PAUSED_ON_FAILURE)
    if job["state"] != "succeeded":
        why = job["error"] or ("cancelled on request; what it had changed was rolled back"
                               if job["state"] == "cancelled" else "no error recorded")
        raise CliFailure(f"job {job_id} {job['state']}: {why}", JOB_DID_NOT_SUCCEED)
    return job


def succeeded_line(job: dict[str, Any]) -> str:
    return (f"job {job['id']} succeeded: {count(job['rows_done'])} rows in "
            f"{duration(job['elapsed_seconds'])}")


@app.command()
def cancel(ctx: typer.Context, job_id: JobArg) -> None:
    """Cancel a job; the owner rolls back whatever it already changed."""
    print(control.cancel(cli_state(ctx).direct_database(), job_id, actor=control.local_actor()))


@app.command()
def pause(ctx: typer.Context, job_id: JobArg) -> None:
    """Pause a running job: workers finish their batch, checkpoint and release."""
    print(control.pause(cli_state(ctx).direct_database(), job_id, actor=control.local_actor()))


@app.command()
def resume(ctx: typer.Context, job_id: JobArg) -> None:
    """Resume a paused job from where it stopped."""
    print(control.resume(cli_state(ctx).direct_database(), job_id, actor=control.local_actor()))


@app.command()
def retry(ctx: typer.Context, job_id: JobArg) -> None:
    """Re-queue a paused job's failed subtasks (attempts reset) and resume it."""
    requeued = control.retry(cli_state(ctx).direct_database(), job_id, actor=control.local_actor())
    print(f"job {job_id}: {requeued} failed subtasks re-queued; resuming")


@app.command()
def alter(
    ctx: typer.Context,
    job_id: JobArg,
    batch_rows: Annotated[int | None, typer.Option(help="Rows per batch.")] = None,
    max_rows_per_sec: Annotated[int | None, typer.Option(
        help="Rows/s limit; 0 removes it. A batch size never given follows it: at most one "
             "second of the limit.")] = None,
    concurrency: Annotated[int | None, typer.Option(help="Subtasks running at once.")] = None,
    max_replica_lag: Annotated[float | None, typer.Option(
        metavar="SECONDS", help="Standby replay lag limit; 0 removes it.")] = None,
    max_active_sessions: Annotated[int | None, typer.Option(
        metavar="N", help="Active sessions limit; 0 removes it.")] = None,
) -> None:
    """Change a live job's knobs; workers pick them up at their next batch."""
    changed = control.alter(cli_state(ctx).direct_database(), job_id, batch_rows=batch_rows,
                            max_rows_per_sec=max_rows_per_sec, concurrency=concurrency,
                            max_replica_lag=max_replica_lag,
                            max_active_sessions=max_active_sessions, actor=control.local_actor())
    print(f"job {job_id} altered: {changed}")


@app.command()
def events(ctx: typer.Context, job_id: JobArg, as_json: JsonOpt = False) -> None:
    """The audit log of a job: every state change, who made it and why."""
    rows = control.events(cli_state(ctx).direct_database(), job_id)
    if as_json:
        print_json(rows)
        return
    print_table(dict.fromkeys(("AT", "ACTOR", "FROM", "TO", "DETAIL"), False), [
        (e["at"].isoformat(timespec="seconds"), e["actor"], e["from_state"] or "-",
         e["to_state"], e["detail"] or "") for e in rows])

