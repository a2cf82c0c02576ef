"""How jobs look: the status table, live progress bars, and waiting for a
job to finish. Shared by ``status``, ``wait`` and ``demo``. rich is imported
by what draws live (``--watch``, the demo): the table is plain columns
(``cli.output.table_text``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cli.output import Cell, Styled, console, count, rate, table_name, table_text
from framework import control
from framework.db import Database
from framework.durations import duration

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.text import Text

    from framework.directdb import DirectDatabase
from framework.records import STEP_REVERT
from framework.states import JOB_TERMINAL

POLL_SECONDS = 0.5
# `reorg wait` looks more often: a script waiting on a job should go on within
# a fraction of a second of its end (one small status read each time).
WAIT_POLL_SECONDS = 0.2
# ... unless it hears every job move as it happens (the NOTIFY of each one,
# ``jobs.channel``): it then looks at once, and otherwise only this often, so
# its reads do not compete with the job's batches for the CPUs.
WAIT_LISTENING_POLL_SECONDS = 1.0

# Called between polls; may raise to stop waiting (the demo checks its workers).
Tick = Callable[[], None]

_STATE_STYLE = {
    "succeeded": "green", "running": "cyan", "queued": "dim", "failed": "red",
    "reverting": "red", "reverted": "red", "cancelling": "yellow", "cancelled": "yellow",
    "pausing": "yellow", "paused": "yellow", "resuming": "cyan",
}


def is_terminal(job: dict[str, Any]) -> bool:
    return job["state"] in JOB_TERMINAL


def paused_on_failure(job: dict[str, Any]) -> bool:
    """Paused because a subtask failed for good (``--on-failure pause``): the
    job waits for ``reorg retry`` or ``reorg cancel``, not for its end. (A
    running job's failed subtasks stay live until it ends, so they count.)"""
    return job["state"] == "paused" and job["failed"] > 0


def status_for_json(db: Database | DirectDatabase, job_id: int | None = None,
                    limit: int = 20) -> list[dict[str, Any]]:
    """The jobs as ``reorg status --json`` prints them and the dashboard's
    ``/api/jobs`` answers: one builder for both."""
    return [for_json(j) for j in control.status(db, job_id, limit)]


def for_json(job: dict[str, Any]) -> dict[str, Any]:
    """A status row as scripts see it: every column, plus the table as users
    write it."""
    return {**job, "table": table_name(job["target_table"])}


def _state(job: dict[str, Any]) -> Text:
    from rich.text import Text

    return Text(job["state"], style=_STATE_STYLE.get(job["state"], ""))


def _state_cell(job: dict[str, Any]) -> Cell:
    style = _STATE_STYLE.get(job["state"])
    return Styled(job["state"], style) if style else job["state"]


def step_label(job: dict[str, Any]) -> str:
    """The step: of a job type of several steps its name, place and percent
    (``verify 2/3 (40.0%)``), of a type of one its number; while a job
    reverts, the revert's own progress (its forward figures stay as they were
    when it stopped). The schema state a job type reports follows."""
    state = f" {job['schema_state']}" if job.get("schema_state") else ""
    if job["step"] == STEP_REVERT:
        return (f"revert {job['revert_done']}/{job['revert_total']} "
                f"({job['revert_percent'] or 0.0:.1f}%){state}")
    if (job.get("step_count") or 0) > 1 and job.get("step_name"):
        return (f"{job['step_name']} {job['step']}/{job['step_count']} "
                f"({job['step_percent'] or 0.0:.1f}%){state}")
    return f"{job['step']}{state}"


def _rows(job: dict[str, Any]) -> str:
    """The job's rows done of its total (``framework.store.progress``: of a
    type of several steps, its current range step's)."""
    return f"{count(job['rows_done'])}/{count(job['rows_total'])}"


def _subtasks(job: dict[str, Any]) -> str:
    return f"{job['pending']}/{job['running']}/{job['succeeded']}/{job['failed']}"


def throttle_lines(job: dict[str, Any]) -> list[str]:
    """What holds a job back now, and its limits, for ``status``: e.g.
    ``job 3 throttled: replica lag 12s > 5s (standby1)``."""
    limits = []
    if job.get("max_rows_per_sec"):
        limits.append(f"{count(job['max_rows_per_sec'])} rows/s")
    if job.get("max_replica_lag"):
        limits.append(f"replica lag {job['max_replica_lag']:g}s")
    if job.get("max_active_sessions"):
        limits.append(f"{job['max_active_sessions']} active sessions")
    lines = []
    if job.get("throttled"):
        lines.append(f"job {job['id']} throttled: {job['throttled']}")
    if limits and not is_terminal(job):
        lines.append(f"job {job['id']} limits: " + ", ".join(limits))
    return lines


STATUS_COLUMNS = {  # name -> right-aligned
    "ID": True, "TYPE": False, "TABLE": False, "STATE": False, "STEP": True, "%": True,
    "ROWS": False, "ROWS/S": True, "ETA": False, "SUBTASKS P/R/S/F": False, "NODES": False,
    "ERROR": False,
}


def status_table(jobs: list[dict[str, Any]], *, colour: bool = False) -> str:
    """``reorg status``'s table: a line per job, the state in its colour when
    ``colour``."""
    return table_text(STATUS_COLUMNS, [(
        str(job["id"]), job["type"], table_name(job["target_table"]),
        _state_cell(job),
        step_label(job), f"{job['percent']:.1f}", _rows(job),
        rate(job["rows_per_sec"]), duration(job["eta_seconds"]), _subtasks(job),
        ", ".join(job["nodes"]) or "-", job["error"] or "",
    ) for job in jobs], colour=colour)


def progress_view(jobs: list[dict[str, Any]]) -> RenderableType:
    """Two lines per job, a progress bar and the figures, so it fits 80 columns;
    for ``--watch`` and the demo."""
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    parts: list[RenderableType] = []
    for job in jobs:
        head = Table.grid(expand=True, padding=(0, 1))
        head.add_column(no_wrap=True)
        head.add_column(ratio=1)
        head.add_column(no_wrap=True, justify="right")
        head.add_row(
            Text.assemble(f"job {job['id']} ", _state(job), f" {table_name(job['target_table'])}"),
            ProgressBar(total=100.0, completed=job["percent"]), f"{job['percent']:5.1f}%",
        )
        parts.append(head)
        parts.append(Text(
            f"  rows {_rows(job)}"
            f"  {rate(job['rows_per_sec'])} rows/s  ETA {duration(job['eta_seconds'])}"
            f"  subtasks {job['pending']} pending, {job['running']} running, "
            f"{job['succeeded']} succeeded, {job['failed']} failed"
            f"  nodes {len(job['nodes'])}", style="dim"))
        if job["step"] == STEP_REVERT:
            parts.append(Text(f"  {step_label(job)} of the ranges to restore done",
                              style="yellow"))
        elif (job.get("step_count") or 0) > 1 and job.get("step_name"):
            parts.append(Text(f"  step {step_label(job)}"))
        if job.get("throttled"):
            parts.append(Text(f"  throttled: {job['throttled']}", style="yellow"))
        if job["error"]:
            parts.append(Text(f"  error: {job['error']}", style="red"))
    return Group(*parts)


def watch(db: Database | DirectDatabase, job_id: int | None, limit: int,
          on_tick: Tick | None = None) -> list[dict[str, Any]]:
    """Redraw progress until every shown job is terminal; returns the last
    status read. ``on_tick`` runs before every redraw and may raise to stop
    (the demo checks that its workers are alive)."""
    from rich.live import Live

    jobs = control.status(db, job_id, limit)
    with Live(progress_view(jobs), console=console.get(), refresh_per_second=4) as live:
        while not all(is_terminal(j) for j in jobs):
            time.sleep(POLL_SECONDS)
            if on_tick is not None:
                on_tick()
            jobs = control.status(db, job_id, limit)
            live.update(progress_view(jobs))
    if not console.is_terminal:
        console.line()  # Live ends a terminal's last line itself, not a pipe's
    return jobs


def wait_ended(db: Database | DirectDatabase, job_id: int, timeout: float | None,
               on_tick: Tick | None = None) -> dict[str, Any] | None:
    """Poll until the job is terminal, or paused on a failure (it would
    never end by itself); None when ``timeout`` passes first. On one
    psycopg connection (``DirectDatabase``) it listens for the job moves'
    NOTIFY and looks again as soon as one comes."""
    from framework.store.jobs import channel

    notified = getattr(db, "notified", None)
    if notified is not None:
        notified(channel(db), 0)  # listening before the first read: nothing is missed
    every = WAIT_POLL_SECONDS if notified is None else WAIT_LISTENING_POLL_SECONDS
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        job = control.status(db, job_id, 1)[0]
        if is_terminal(job) or paused_on_failure(job):
            return job
        if deadline is not None and time.monotonic() >= deadline:
            return None
        if on_tick is not None:
            on_tick()
        pause = every if deadline is None else min(every, deadline - time.monotonic())
        if notified is not None:
            notified(channel(db), max(pause, 0.0))
        else:
            time.sleep(max(pause, 0.0))
