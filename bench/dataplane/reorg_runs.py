"""Contender (1): reorg's job on a running worker, timed from `reorg submit`
to `reorg wait` exit 0, with where the time went."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

from bench.dataplane import workerlog
from bench.dataplane.proctree import Neighbours
from bench.dataplane.records import WORKER_SLOTS, ReorgRun, WorkerStartup
from bench.dataplane.reorg_cli import submit, wait_job
from bench.dataplane.server import verify
from bench.dataplane.timing import contend
from bench.dataplane.tracking import ProgressSampler, job_timeline, system_tables
from bench.dataplane.workers import Worker, running_worker, wait_spark_ready

SPARK_JOB_TYPES = {"backfill", "copy", "checksum"}


def run_reorg(url: str, rows: int, job_type: str, worker: Worker, label: str) -> ReorgRun:
    with system_tables(url) as db:
        began = time.time()
        clock = time.perf_counter()
        job_id, submit_seconds = submit(url, job_type)
        progress = ProgressSampler(db, job_id)
        progress.start()
        try:
            wait_job(url, job_id)
        finally:
            progress.stop()
        total = time.perf_counter() - clock
        ended = time.time()
        print(f"    reorg {job_type} ({label}): submit -> wait exit 0 in {total:.2f} s", flush=True)
        verify(url, rows, f"reorg {job_type}")
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


def run_reorg_contender(url: str, rows: int, job_type: str, log_dir: Path,
                        neighbours: Neighbours, retries: int) -> tuple[WorkerStartup, list[ReorgRun]]:
    """A fresh worker, registered and (for Spark job types) with Spark started
    before the clock; its first job, then a second one on the same worker, as
    a long-running worker sees jobs. Only the second is repeated when
    disturbed: a repeat of the first would not be a first job."""
    print(f"  `reorg worker --slots {WORKER_SLOTS}` for {job_type}", flush=True)
    spark = job_type in SPARK_JOB_TYPES
    with running_worker(url, f"bench-{job_type}", log_dir, spark_warmup=spark) as worker:
        if spark:
            wait_spark_ready(worker)
        runs = []
        for label, tries in (("first", 0), ("second", retries)):
            run, others_cpu = contend(url, neighbours, tries,
                                      partial(run_reorg, url, rows, job_type, worker, label))
            run.others_cpu = others_cpu
            runs.append(run)
    startup = WorkerStartup(worker.registered_after, worker.spark_ready_after, worker.spark_seconds)
    return startup, runs
