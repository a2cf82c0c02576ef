"""``reorg revert JOB`` (swap a rewrite back within its --keep-old window)
and a rewrite's line under ``reorg status JOB``. Joined to the ``reorg``
command through the ``reorg.commands`` and ``reorg.status_lines`` entry
points (``cli.plugin``): cli/ names no job type.

A revert is the rewrite's rollback after its swap: ``reorg revert`` checks
that the job can still go back (swapped, its old table kept in step) and
then cancels it; the owner's rollback swaps the old table back in, with
every write made since (``swap.revert``), and drops the new one. A plain
``reorg cancel`` in that window does the same."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from cli.plugin import database
from framework import control
from framework.db import Database
from framework.errors import InvalidParams
from framework.records import Job
from framework.states import JobState
from framework.store import jobs

app = typer.Typer()

NAME = "rewrite"
SWAPPED = 5  # backfill.rewrite.job.SWAPPED (not imported: the job type pulls in the engine)
_GOING_BACK = {JobState.CANCELLING, JobState.REVERTING, JobState.CANCELLED, JobState.REVERTED}


def revert_job(db: Database, job_id: int) -> JobState:
    """Ask the owner to swap the rewrite ``job_id`` back; InvalidParams (one
    line) when it cannot go back."""
    with db.begin() as conn:
        job = jobs.get(db, conn, job_id)
    if job is None:
        raise InvalidParams(f"job {job_id} does not exist; `reorg status` lists jobs")
    if job.type != NAME:
        raise InvalidParams(f"job {job_id} is a {job.type} job; `reorg revert` swaps back a "
                            f"rewrite (`reorg cancel {job_id}` rolls other jobs back)")
    state = JobState(job.state)
    if state in _GOING_BACK:
        return state
    keep = job.params.get("keep_old_seconds") or 0
    if state is JobState.SUCCEEDED:
        raise InvalidParams(f"job {job_id} is over: its old table was dropped when "
                            f"--keep-old ({keep} s) ran out; there is nothing to revert to")
    if job.step != SWAPPED:
        raise InvalidParams(f"job {job_id} has not swapped yet ({state}); `reorg cancel "
                            f"{job_id}` rolls it back, leaving the table as it was")
    if not keep:
        raise InvalidParams(f"job {job_id} swapped without --keep-old: the old table does not "
                            "follow the new one's writes, so there is no way back")
    return control.cancel(db, job_id)


@app.command("revert")
def revert(
    ctx: typer.Context,
    job_id: Annotated[int, typer.Argument(
        metavar="JOB", help="Job id of a rewrite job that swapped with --keep-old.")],
) -> None:
    """Swap a rewrite back, within its --keep-old window: the old table becomes the table
    again, with every write made since the swap; the new one is dropped."""
    state = revert_job(database(ctx), job_id)
    typer.echo(f"job {job_id}: {state}; the owner swaps the old table back "
               f"(`reorg wait {job_id}`)")


def status_line(db: Database, job: dict[str, Any]) -> str | None:
    """The change log's backlog while the job copies and catches up; the
    keep-old window once it swapped."""
    with db.begin() as conn:
        found = jobs.get(db, conn, int(job["id"]))
        if found is None or JobState(found.state) not in (JobState.RUNNING, JobState.PAUSED,
                                                          JobState.PAUSING):
            return None
        return _line(conn, found)


def _line(conn: Any, job: Job) -> str | None:
    from sqlalchemy import text

    from backfill.rewrite import names

    work = job.params.get("work_schema", "reorg")
    if job.step == SWAPPED:
        keep = job.params.get("keep_old_seconds") or 0
        if not keep:
            return "swapped; validating what the swap re-made, then cleanup"
        return (f"swapped; the old table is kept in step for {keep} s after the swap: "
                f"`reorg revert {job.id}` swaps it back")
    log = names.log_table(work, job.id)
    if not conn.execute(text("SELECT to_regclass(:t) IS NOT NULL"), {"t": log}).scalar():
        return None
    rows, newest = conn.execute(text(
        f"SELECT count(*), max(seq) FROM (SELECT seq FROM {log} LIMIT 1000001) x")).one()
    shown = f"{rows:,}" if rows <= 1_000_000 else "over 1,000,000"
    return (f"change log: {shown} keys to replay into the shadow"
            + (f" ({newest:,} changes logged since the copy began)" if newest else ""))
