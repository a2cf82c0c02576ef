"""The big-table measures, each through the `reorg` command as a user runs it
and read back through reorg's own functions (bench/ has no SQL of its own
against reorg's system tables); the target table is read with plain SQL."""

from __future__ import annotations

import itertools
import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from bench.bigtable.build import original_c
from bench.dataplane.chunks import in_parallel
from bench.dataplane.errors import BenchError
from bench.dataplane.records import CHUNK_ROWS, SQL_CONNECTIONS, TABLE
from bench.dataplane.reorg_cli import reorg
from bench.dataplane.server import execute, query_one
from bench.dataplane.tracking import job_status, subtasks
from bench.dataplane.window_cpu import WindowCpu
from framework import control
from framework.db import Database
from framework.records import STEP_REVERT

POLL_SECONDS = 0.05
RANGES_COUNTED = 25  # ranges whose rows are counted for the evenness figure


@dataclass
class Start:
    job_id: int
    wall_seconds: float  # launching `reorg submit` -> status shows the job running
    db_seconds: float  # the job's created_at -> its running event (database clock)
    submit_seconds: float  # the `reorg submit` command alone
    detail: str  # the running event's detail: how many subtasks of how many rows


@dataclass
class Evenness:
    ranges: int
    rows_per_range: int  # the split's target
    counted: list[int]  # rows in each counted range

    def figures(self) -> tuple[int, float, int]:
        return min(self.counted), statistics.median(self.counted), max(self.counted)


@dataclass
class Rate:
    rows: int
    seconds: float
    # CPU seconds by who used them over the window (bench.dataplane.window_cpu)
    cpu: dict[str, float] = field(default_factory=dict)

    @property
    def per_second(self) -> float:
        return self.rows / self.seconds


@dataclass
class Cancel:
    seconds: float  # `reorg cancel` launched -> the job cancelled
    touched_rows: int  # rows of the ranges the job had written
    still_set: int  # of those, rows whose c is not as before the job afterwards (must be 0)
    revert_ranges: int
    # The longest transaction of the owner seen while the cancel ran (the
    # one that plans the revert, when that builds indexes over the images).
    owner_longest_transaction: float


def wait_for(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise BenchError(f"{what} did not happen within {timeout:.0f} s")
        time.sleep(POLL_SECONDS)


SQL_UPDATE = ("sql-update", "--table", TABLE, "--set", "c=md5(b)")


def start_job(url: str, db: Database, timeout: float,
              submitted: tuple[str, ...] = SQL_UPDATE) -> Start:
    """`reorg submit` of ``submitted`` (default: `sql-update --set c=md5(b)`)
    at default settings, until the job is running (the owner has split the
    key space and inserted the ranges)."""
    launched = time.perf_counter()
    done = reorg(url, "submit", *submitted, "--json")
    submit_seconds = time.perf_counter() - launched
    job_id = int(json.loads(done.stdout)["id"])

    def running() -> bool:
        state = job_status(db, job_id)["state"]
        if state in ("failed", "cancelled", "reverted", "reverting"):
            raise BenchError(f"job {job_id} is {state}: {job_status(db, job_id)['error']}")
        return bool(state in ("running", "succeeded"))

    wait_for(f"job {job_id} running", running, timeout)
    wall = time.perf_counter() - launched
    job = job_status(db, job_id)
    event = next(e for e in control.events(db, job_id) if e["to_state"] == "running")
    return Start(job_id, wall, (event["at"] - job["created_at"]).total_seconds(),
                 submit_seconds, str(event["detail"]))


def fresh_checkpoint(url: str) -> None:
    """A CHECKPOINT just before each contender's window, so both begin in the
    same state: every page's first change in the window writes a full-page
    image, and the next timed checkpoint (checkpoint_timeout, 5 min) falls
    at the same place in both. Else a window that began long after the last
    checkpoint wrote fewer images than one that began just after it (the
    build's own CHECKPOINT is reorg's, as reorg goes first): docs/benchmarks.md,
    "100M rows"."""
    execute(url, "CHECKPOINT")


def reorg_rate(url: str, db: Database, job_id: int, window: float, worker_pid: int) -> Rate:
    """Rows the job committed over ``window`` seconds from a fresh checkpoint,
    and the CPU the machine spent meanwhile (the worker's process tree as
    ``reorg worker``)."""
    cpu = WindowCpu(url, {"reorg worker": worker_pid})
    fresh_checkpoint(url)
    # Every step's rows (`rows_done` starts again with each range step).
    first = int(job_status(db, job_id)["rows_processed"])
    cpu.start()
    began = time.perf_counter()
    time.sleep(window)
    last = int(job_status(db, job_id)["rows_processed"])
    return Rate(last - first, time.perf_counter() - began, cpu.stop())


def cancel_job(url: str, db: Database, job_id: int, timeout: float,
               old_values: bool = False) -> Cancel:
    with OwnerTransactions(url) as owner:
        seconds = cancel_and_wait(url, db, job_id, timeout)
    rows = subtasks(db, job_id)
    forward = [s for s in rows if s["step"] != STEP_REVERT]
    touched = [(int(s["start_key"]), int(s["curr_key"])) for s in forward
               if s["curr_key"] > s["start_key"]]
    total = still = 0
    with psycopg.connect(url, autocommit=True) as conn:
        for lo, hi in touched:
            n, set_ = conn.execute(  # type: ignore[misc]
                f"SELECT count(*), count(*) FILTER (WHERE c IS DISTINCT FROM "  # type: ignore[arg-type]
                f"{original_c('id', old_values)}) FROM {TABLE} "
                "WHERE id >= %s AND id < %s", (lo, hi)).fetchone()
            total, still = total + n, still + set_
    return Cancel(seconds, total, still, sum(1 for s in rows if s["step"] == STEP_REVERT),
                  owner.longest)


def cancel_and_wait(url: str, db: Database, job_id: int, timeout: float) -> float:
    """Seconds from launching `reorg cancel` to the job `cancelled`; raises
    if it ends otherwise."""
    launched = time.perf_counter()
    reorg(url, "cancel", str(job_id))

    def ended() -> bool:
        state = job_status(db, job_id)["state"]
        if state in ("failed", "reverted", "succeeded"):
            raise BenchError(f"job {job_id} ended {state}, not cancelled")
        return bool(state == "cancelled")

    wait_for(f"job {job_id} cancelled", ended, timeout)
    return time.perf_counter() - launched


class OwnerTransactions:
    """The longest transaction of the owner's sessions, by PostgreSQL's own
    clock (``pg_stat_activity``), sampled every POLL_SECONDS on a thread while
    the block runs. Job events cannot tell: their time is their transaction's
    start."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.longest = 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="owner-transactions")
        self._error: list[BaseException] = []

    def __enter__(self) -> OwnerTransactions:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        if self._error:
            raise BenchError(f"sampling the owner's transactions failed: {self._error[0]}")

    def _sample(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                while not self._done.wait(POLL_SECONDS):
                    (age,) = conn.execute(  # type: ignore[misc]
                        "SELECT coalesce(max(extract(epoch FROM clock_timestamp() - xact_start)), 0)"
                        " FROM pg_stat_activity WHERE application_name = 'reorg-owner'"
                        " AND xact_start IS NOT NULL").fetchone()
                    self.longest = max(self.longest, float(age))
        except BaseException as exc:  # reported by the main thread
            self._error.append(exc)


def evenness(url: str, db: Database, job_id: int) -> Evenness:
    """Rows in RANGES_COUNTED of the job's ranges, spread over its key space
    (each one an index range count, not a scan of the table)."""
    forward = sorted((s for s in subtasks(db, job_id) if s["step"] != STEP_REVERT
                      and not (s["meta"] or {}).get("catch_up")), key=lambda s: s["ordinal"])
    step = max(len(forward) // RANGES_COUNTED, 1)
    picked = forward[::step][:RANGES_COUNTED]
    if forward[-1] not in picked:
        picked.append(forward[-1])
    counted = []
    with psycopg.connect(url, autocommit=True) as conn:
        for s in picked:
            (n,) = conn.execute(f"SELECT count(*) FROM {TABLE} WHERE id >= %s AND id < %s",
                                (s["start_key"], s["end_key"])).fetchone()  # type: ignore[misc]
            counted.append(int(n))
    target = job_status(db, job_id).get("row_estimate") or 0
    return Evenness(len(forward), int(target) // max(len(forward), 1), counted)


def chunked_sql_rate(url: str, window: float) -> tuple[Rate, tuple[int, int]]:
    """2-connection, 10k-key chunked ``UPDATE ... SET c = md5(b)`` for
    ``window`` seconds, from the middle of the key space up (keys reorg's
    window did not reach: both start on rows never updated). Returns the rate
    and the key range it covered, to be put back."""
    low, high = query_one(url, f"SELECT min(id), max(id) FROM {TABLE}")
    first = (int(low) + int(high)) // 2
    lock = threading.Lock()
    updated = [0]
    reached = [first]
    backends: set[int] = set()

    def update(conn: psycopg.Connection[Any], lo: int) -> None:
        cur = conn.execute(f"UPDATE {TABLE} SET c = md5(b) WHERE id >= %s AND id < %s",
                           (lo, lo + CHUNK_ROWS))
        with lock:
            backends.add(conn.info.backend_pid)
            updated[0] += cur.rowcount
            reached[0] = max(reached[0], lo + CHUNK_ROWS)

    cpu = WindowCpu(url, {"this benchmark": os.getpid()})
    fresh_checkpoint(url)
    cpu.start()
    began = time.perf_counter()
    # A chunk is taken only while the window lasts (timed from after the
    # CHECKPOINT, as reorg's window is).
    stop_at = began + window
    starts = itertools.takewhile(lambda _: time.perf_counter() < stop_at,
                                 range(first, int(high) + 1, CHUNK_ROWS))
    in_parallel(url, SQL_CONNECTIONS, starts, update, "chunked SQL")
    seconds = time.perf_counter() - began
    # Its backends end with its connections.
    return Rate(updated[0], seconds, cpu.stop(ended=backends)), (first, reached[0])


def put_back(url: str, keys: tuple[int, int], old_values: bool = False) -> None:
    """c as built again over the keys chunked SQL set, so the table can be reused."""
    was = original_c("id", old_values)
    with psycopg.connect(url, autocommit=True) as conn:
        for lo in range(keys[0], keys[1], 1_000_000):
            conn.execute(f"UPDATE {TABLE} SET c = {was} WHERE id >= %s AND id < %s "  # type: ignore[arg-type]
                         f"AND c IS DISTINCT FROM {was}", (lo, min(lo + 1_000_000, keys[1])))
        # ANALYZE too: a VACUUM that skips all-visible pages extrapolates
        # reltuples, and --reuse checks the row count by that estimate.
        conn.execute(f"VACUUM (ANALYZE) {TABLE}")

