"""What the owner tells about its jobs, once a tick: their figures as
``reorg status`` shows them (``store.progress``) become its metrics
(``metrics.OwnerJobSeries``) and the progress samples status's recent rows/s
comes from, and every ``progress_seconds`` each running job gets one log
line, like gh-ost's status line::

    job 7 sql-update public.items running: rows 412,000/1,000,000 (41.2%), 13,520 rows/s, \
ETA 43s, elapsed 31s; throttled: replica lag 3.2s > 1s (standby1)

A job type's backlog (``JobType.backlog``: a rewrite's change log) is read
every ``BACKLOG_SECONDS`` at most, in a transaction of its own (one job
type's failing read costs no other figure).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from framework import control, jobtype, metrics
from framework.db import Database
from framework.durations import duration
from framework.errors import one_line
from framework.states import JOB_TERMINAL, JobState
from framework.store import jobs, progress
from framework.throttle import reason_kind

log = logging.getLogger("reorg.progress")

J = JobState
# How often the owner reads a job type's backlog (a bounded count).
BACKLOG_SECONDS = 5.0
# States a job's progress line is printed in: while batches run.
_PROGRESSING = frozenset({J.RUNNING, J.REVERTING})
# States a job has a backlog in (its type's log goes on filling while paused).
_WITH_BACKLOG = frozenset({J.RUNNING, J.PAUSING, J.PAUSED, J.RESUMING})
_ENDED = frozenset(str(s) for s in JOB_TERMINAL)


class JobReports:
    def __init__(self, db: Database, *, progress_seconds: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``progress_seconds``: between two progress lines of a job; 0: none."""
        self.db = db
        self.progress_seconds = progress_seconds
        self.clock = clock
        self.series = metrics.OwnerJobSeries()
        self._printed: dict[int, float] = {}  # job id -> monotonic time of its last line
        self._backlog: dict[int, tuple[int | None, float]] = {}  # job id -> (count, read at)

    def report(self, is_owner: bool) -> None:
        """One progress read of the live jobs (and of those live at the last
        report, for their final figures); a node that is not the owner shows
        none."""
        if not is_owner:
            self.series.clear()
            self._printed.clear()
            self._backlog.clear()
            return
        try:
            with self.db.begin() as conn:
                shown = progress.live_jobs_progress(self.db, conn, self.series.live())
                # The samples status's recent rows/s and ETA come from.
                progress.record_samples(self.db, conn, shown)
        except Exception as exc:  # only figures: the next tick tries again
            log.debug("job figures not read: %s", one_line(exc))
            return
        backlog = self._backlogs(shown)
        for job in shown:
            job["throttled"] = control.throttled_now(job)
            job["throttle_kind"] = reason_kind(job["throttled"]) if job["throttled"] else None
            job["failed_job"] = failed(job)
        self.series.show(shown, ended=_ENDED, backlog=backlog)
        self._print_lines(shown, backlog)

    def _backlogs(self, shown: list[dict[str, Any]]) -> dict[int, int]:
        now = self.clock()
        counts: dict[int, int] = {}
        for job in shown:
            job_id = job["id"]
            if J(job["state"]) not in _WITH_BACKLOG:
                self._backlog.pop(job_id, None)
                continue
            count, read_at = self._backlog.get(job_id, (None, float("-inf")))
            if now - read_at >= BACKLOG_SECONDS:
                count = self._read_backlog(job_id, job["type"])
                self._backlog[job_id] = (count, now)
            if count is not None:
                counts[job_id] = count
        return counts

    def _read_backlog(self, job_id: int, job_type: str) -> int | None:
        try:
            kind = jobtype.get(job_type)
            if not kind.has_backlog():
                return None
            with self.db.begin() as conn:
                job = jobs.get(self.db, conn, job_id)
                return kind.backlog(conn, job) if job is not None else None
        except Exception as exc:  # a figure: the job goes on without it
            log.debug("backlog of job %s not read: %s", job_id, one_line(exc))
            return None

    def _print_lines(self, shown: list[dict[str, Any]], backlog: dict[int, int]) -> None:
        if not self.progress_seconds:
            return
        now = self.clock()
        progressing = {job["id"] for job in shown if J(job["state"]) in _PROGRESSING}
        for job_id in set(self._printed) - progressing:
            del self._printed[job_id]
        for job in shown:
            job_id = job["id"]
            if job_id not in progressing:
                continue
            if now - self._printed.get(job_id, float("-inf")) < self.progress_seconds:
                continue
            self._printed[job_id] = now
            log.info("%s", progress_line(job, backlog.get(job_id)),
                     extra={"job_id": job_id, "job_type": job["type"], "state": job["state"],
                            "rows_done": job["rows_done"], "rows_total": job["rows_total"],
                            "percent": job["percent"], "rows_per_sec": job["rows_per_sec"],
                            "eta_seconds": job["eta_seconds"], "throttled": job["throttled"],
                            "backlog": backlog.get(job_id)})


def failed(job: dict[str, Any]) -> bool:
    """Whether the job failed: failed, rolling back or rolled back after a
    failure, or paused on one (``--on-failure pause``)."""
    state = J(job["state"])
    return (state in (J.FAILED, J.REVERTED) or job.get("revert_target") == J.REVERTED
            or state in (J.PAUSING, J.PAUSED) and job["failed"] > 0)


def progress_line(job: dict[str, Any], backlog: int | None = None) -> str:
    """A running job's status line (a row of ``store.progress`` with
    ``throttled``), e.g. ``job 7 sql-update public.items running: rows
    412,000/1,000,000 (41.2%), 13,520 rows/s, ETA 43s, elapsed 31s``."""
    table = job["target_table"].replace('"', "")
    head = f"job {job['id']} {job['type']} {table} {job['state']}"
    if J(job["state"]) is J.REVERTING:
        done, total = job["revert_done"] or 0, job["revert_total"] or 0
        shown = f" ({job['revert_percent']:.1f}%)" if job.get("revert_percent") is not None else ""
        parts = [f"{done:,}/{total:,} ranges restored{shown}"]
    else:
        rows = f"rows {job['rows_done']:,}/{job['rows_total']:,}" if job["rows_total"] else (
            f"rows {job['rows_done']:,}")
        parts = [f"{rows} ({job['percent']:.1f}%)", f"{job['rows_per_sec']:,.0f} rows/s"]
        if job["eta_seconds"] is not None:
            parts.append(f"ETA {duration(job['eta_seconds'])}")
    parts.append(f"elapsed {duration(job['elapsed_seconds'])}")
    if (job.get("step_count") or 0) > 1 and job.get("step_name"):
        step = f"step {job['step']}/{job['step_count']} {job['step_name']}"
        if job.get("step_percent") is not None:
            step += f" {job['step_percent']:.1f}%"
        parts.append(step)
    line = f"{head}: {', '.join(parts)}"
    if backlog is not None:
        line += f"; backlog {backlog:,}"
    if job.get("throttled"):
        line += f"; throttled: {job['throttled']}"
    return line
