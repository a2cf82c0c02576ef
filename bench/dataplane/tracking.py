"""A job as reorg's own functions report it (``framework.control.status`` and
``framework.store.history.subtasks_of_job``): the benchmark never reads the
system tables with SQL of its own. And a job run to its end on a node in
the benchmark's own process."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from bench.dataplane.errors import BenchError
from bench.dataplane.records import PROGRESS_SECONDS, InFlight
from framework import control
from framework.config import Settings
from framework.db import Database
from framework.store import history
from framework.submit import SubmitRequest, submit


@contextlib.contextmanager
def system_tables(url: str) -> Iterator[Database]:
    """reorg's system tables in the benchmark's database, in the schema the
    ``reorg`` commands it runs use (``REORG_SCHEMA``, passed on to them)."""
    schema = os.environ.get("REORG_SCHEMA") or Settings.schema
    db = Database(Settings(database_url=url, schema=schema), role="cli", pool_size=2)
    try:
        yield db
    finally:
        db.dispose()


def job_status(db: Database, job_id: int) -> dict[str, Any]:
    """The job as `reorg status JOB --json` shows it."""
    return control.status(db, job_id)[0]


def committed_rows(db: Database, job_id: int) -> int:
    """The job's checkpointed rows: live and finished subtasks of every step
    (`rows_processed`; `rows_done` is the current range step's)."""
    return int(job_status(db, job_id)["rows_processed"])


def subtasks(db: Database, job_id: int) -> list[dict[str, Any]]:
    """Every subtask of the job, live and moved to history, in range order."""
    with db.begin() as conn:
        return history.subtasks_of_job(db, conn, job_id)


class ProgressSampler(threading.Thread):
    """Polls a job's committed rows every PROGRESS_SECONDS: (epoch time, rows)."""

    def __init__(self, db: Database, job_id: int) -> None:
        super().__init__(daemon=True)
        self.db, self.job_id = db, job_id
        self.samples: list[tuple[float, int]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.samples.append((time.time(), committed_rows(self.db, self.job_id)))
            self._stop_event.wait(PROGRESS_SECONDS)

    def latest(self) -> int:
        return self.samples[-1][1] if self.samples else 0

    def first_time_above(self, rows: int, after: float = 0.0) -> float | None:
        return next((t for t, r in self.samples if t >= after and r > rows), None)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


@dataclass(frozen=True)
class SubtaskRow:
    id: int
    started: float  # epoch seconds, database clock
    finished: float
    row_count: int
    attempts: int


@dataclass
class Timeline:
    """A finished job as the system tables record it."""

    created: float  # epoch seconds, database clock
    started: float
    batch_rows: int  # the job's batch_rows setting
    subtasks: list[SubtaskRow]


def job_timeline(db: Database, job_id: int) -> Timeline:
    job = job_status(db, job_id)
    # The owner moves finished subtasks to history after the job ends: both count.
    rows = [SubtaskRow(int(s["id"]), s["started_at"].timestamp(), s["finished_at"].timestamp(),
                       int(s["row_count"]), int(s["attempts"])) for s in subtasks(db, job_id)]
    return Timeline(job["created_at"].timestamp(), job["started_at"].timestamp(),
                    int(job["batch_rows"]), rows)


def in_flight_subtasks(db: Database, job_id: int) -> tuple[list[InFlight], dict[int, int]]:
    """Subtasks running at the kill (all held by the killed worker) and their lease epochs."""
    held = sorted((s for s in subtasks(db, job_id)
                   if s["moved_at"] is None and s["state"] == "running"), key=lambda s: s["id"])
    return ([InFlight(int(s["id"]), int(s["curr_key"]), int(s["end_key"])) for s in held],
            {int(s["id"]): int(s["epoch"]) for s in held})


def wait_reclaimed(db: Database, job_id: int, epochs: dict[int, int],
                   timeout: float = 600.0) -> None:
    """Until every subtask in ``epochs`` was claimed again (its lease epoch
    grew) or has left the live table."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        live = {int(s["id"]): int(s["epoch"]) for s in subtasks(db, job_id)
                if s["moved_at"] is None}
        if all(live.get(i, e + 1) > e for i, e in epochs.items()):
            return
        time.sleep(PROGRESS_SECONDS)
    raise BenchError(f"subtasks {sorted(epochs)} were not claimed again within {timeout:.0f}s")


def wait_ended(db: Database, job_id: int | None) -> str:
    """Poll (every 50 ms: a benchmark's wall time ends there) until the job
    ended, or failed (a benchmark need not wait for its rollback); its state.
    ``job_id``: a submit's (None: it wrote no job)."""
    if job_id is None:
        raise BenchError("the submit wrote no job")
    while True:
        state = str(control.status(db, job_id)[0]["state"])
        if state in ("succeeded", "failed", "reverted", "cancelled"):
            return state
        time.sleep(0.05)


def run_to_success(db: Database, request: SubmitRequest) -> float:
    """Submit ``request`` and wait for its job to end (``wait_ended``); its
    seconds from submit to the end. Stops the benchmark with the job's error
    unless it succeeded."""
    began = time.perf_counter()
    job_id = submit(db, request).job_id
    state = wait_ended(db, job_id)
    took = time.perf_counter() - began
    if state != "succeeded":
        raise SystemExit(f"error: {request.type} job {job_id} ended {state}: "
                         f"{job_status(db, job_id or 0)['error']}")
    return took


@contextlib.contextmanager
def node_in_process(url: str, *, slots: int = 2) -> Iterator[Database]:
    """A reorg node (owner and workers) in this process on ``url``'s system
    tables, quick to notice work (0.2 s polls and owner ticks), drained
    after; yields a Database to submit with."""
    from framework.node import Node

    settings = Settings(url, poll_seconds=0.2)
    db = Database(settings)
    node = Node(settings, node_id="bench", slots=slots, owner_tick_seconds=0.2)
    node.start()
    try:
        yield db
    finally:
        node.drain(60)
        db.dispose()
