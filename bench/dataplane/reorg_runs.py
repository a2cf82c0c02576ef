"""Contender (1): reorg's job on a running worker, timed from `reorg submit
--wait` to its exit 0, with where the time went."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

from bench.dataplane import workerlog
from bench.dataplane.proctree import Neighbours
from bench.dataplane.records import WORKER_SLOTS, ReorgRun, WorkerStartup
from bench.dataplane.reorg_cli import ADD_D, SET_C, WaitingSubmit
from bench.dataplane.server import verify
from bench.dataplane.timing import contend
from bench.dataplane.tracking import ProgressSampler, job_timeline, system_tables
from bench.dataplane.workers import Worker, running_worker, wait_spark_ready

SPARK_JOB_TYPES = {"backfill", "copy", "checksum"}


def run_reorg(url: str, rows: int, job_type: str, worker: Worker, label: str,
              args: tuple[str, ...] = SET_C, column: str = "c") -> ReorgRun:
    """One job on ``worker``: `reorg submit JOB_TYPE --table bench.items ARGS`
    (which set ``column``) with ``--wait``, timed to its exit 0."""
    with system_tables(url) as db:
        began = time.time()
        clock = time.perf_counter()
        job = WaitingSubmit(url, job_type, args)
        job_id, submit_seconds = job.job_id, job.submit_seconds
        progress = ProgressSampler(db, job_id)
        progress.start()
        try:
            job.wait()
        finally:
            progress.stop()
        total = time.perf_counter() - clock
        ended = time.time()
        print(f"    reorg {job_type} ({label}): submit --wait -> exit 0 in {total:.2f} s",
              flush=True)
        verify(url, rows, f"reorg {job_type}", column)
        timeline = job_timeline(db, job_id)
    subtasks = timeline.subtasks
    first_start = min(s.started for s in subtasks)
    last_finish = max(s.finished for s in subtasks)
    first_commit = progress.first_time_above(0)
    lines = workerlog.stamped_lines(worker.log_path, began - 1, ended + 1)
    spark = [worker.spark_start_seconds(ready) for ready in workerlog.spark_ready_times(lines)
             if ready >= began]  # not the warm-up's, just before the clock
    peak, split = worker.sampler.peak(began, ended)
    return ReorgRun(
        job_type=job_type, label=label, total=total, submit=submit_seconds,
        created=timeline.created - began,
        queued=timeline.started - timeline.created,
        first_commit=(first_commit - began) if first_commit else float("nan"),
        processing=last_finish - first_start, finish=ended - last_finish,
        subtasks=len(subtasks), peak_rss=peak, peak_split=split,
        batches=workerlog.batch_stats(lines, {s.id for s in subtasks}),
        spark_start=spark[0] if spark else None)


# sql-update's further runs on the same worker, after its first and second
# job (c NULL before, so no image rows): label, submit arguments, the column
# they set, whether c holds a value in every row before (images kept).
SQL_UPDATE_VARIANTS = [("overwrite", SET_C, "c", True), ("add-column", ADD_D, "d", False)]


def run_reorg_contender(url: str, rows: int, job_type: str, log_dir: Path,
                        neighbours: Neighbours, retries: int) -> tuple[WorkerStartup, list[ReorgRun]]:
    """A fresh worker, registered and (for Spark job types) with Spark started
    before the clock; its first job, then a second one on the same worker, as
    a long-running worker sees jobs. Only the later ones are repeated when
    disturbed: a repeat of the first would not be a first job. `sql-update`
    then overwrites c holding old values (a before-image per row) and adds a
    column d (no images)."""
    print(f"  `reorg worker --slots {WORKER_SLOTS}` for {job_type}", flush=True)
    spark = job_type in SPARK_JOB_TYPES
    with running_worker(url, f"bench-{job_type}", log_dir, spark_warmup=spark) as worker:
        if spark:
            wait_spark_ready(worker)
        runs = []
        plan: list[tuple[str, tuple[str, ...], str, bool]] = [
            ("first", SET_C, "c", False), ("second", SET_C, "c", False)]
        if job_type == "sql-update":
            plan += SQL_UPDATE_VARIANTS
        for label, args, column, old_values in plan:
            run, others_cpu = contend(
                url, neighbours, 0 if label == "first" else retries,
                partial(run_reorg, url, rows, job_type, worker, label, args, column),
                old_values=old_values)
            run.others_cpu = others_cpu
            runs.append(run)
    startup = WorkerStartup(worker.registered_after, worker.spark_ready_after, worker.spark_seconds)
    return startup, runs
