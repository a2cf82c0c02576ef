"""The kill -9 run: a worker SIGKILLed with its JVM mid-job, another one
resuming after the leases expire, and what was processed twice."""

from __future__ import annotations

import time
from pathlib import Path

from bench.dataplane.errors import BenchError
from bench.dataplane.records import KILL_AT, PROGRESS_SECONDS, KillRun
from bench.dataplane.reorg_cli import submit, wait_job
from bench.dataplane.reorg_runs import SPARK_JOB_TYPES
from bench.dataplane.server import Server, reset_table, rows_updated, verify
from bench.dataplane.serverlog import range_reads, statement_log
from bench.dataplane.tracking import (
    ProgressSampler,
    committed_rows,
    in_flight_subtasks,
    job_timeline,
    system_tables,
    wait_reclaimed,
)
from bench.dataplane.workers import kill_tree, running_worker, wait_spark_ready


def run_reorg_killed(server: Server, rows: int, job_type: str, log_dir: Path) -> KillRun:
    url, log_file = server.url, server.log_file
    reset_table(url)
    time.sleep(1.0)  # let the reset's statistics reach the cumulative stats
    updated_before = rows_updated(url)
    print(f"  kill -9 run ({job_type}): worker A runs the job until {KILL_AT:.0%} is committed",
          flush=True)
    with system_tables(url) as db, statement_log(server) as log_start:
        spark = job_type in SPARK_JOB_TYPES
        with running_worker(url, "bench-kill-a", log_dir, spark_warmup=spark) as first:
            if spark:
                wait_spark_ready(first)
            began = time.perf_counter()
            job_id, _ = submit(url, job_type)
            progress = ProgressSampler(db, job_id)
            progress.start()
            try:
                while progress.latest() < KILL_AT * rows:
                    if first.proc.poll() is not None:
                        raise BenchError(f"worker A exited early; see {first.log_path}")
                    time.sleep(PROGRESS_SECONDS / 2)
                kill_tree(first)
            finally:
                progress.stop()
        killed = time.perf_counter()
        log_at_kill = log_file.stat().st_size if log_file else None
        in_flight, epochs = in_flight_subtasks(db, job_id)
        at_kill = committed_rows(db, job_id)
        print(f"    SIGKILLed worker A and its JVM with {at_kill:,} rows committed, "
              f"{len(in_flight)} subtasks in flight", flush=True)
        # Stopping B ends its server sessions, which flush their statistics.
        with running_worker(url, "bench-kill-b", log_dir):
            wait_reclaimed(db, job_id, epochs)
            reclaimed = time.perf_counter() - killed
            print(f"    in-flight subtasks claimed again {reclaimed:.1f} s after the kill", flush=True)
            wait_job(url, job_id)
            total = time.perf_counter() - began
        time.sleep(1.0)
        timeline = job_timeline(db, job_id)
    print(f"    job {job_id} finished {total:.1f} s after submit", flush=True)
    verify(url, rows, f"reorg {job_type} after kill -9")
    rows_read = None
    if log_file is not None and log_start is not None and log_at_kill is not None:
        with open(log_file, "rb") as log:
            log.seek(log_start)
            raw = log.read()
        (log_dir / "postgres-kill-run.log").write_bytes(raw)
        rows_read = sum(r.hi - r.lo for r in range_reads(raw.decode(errors="replace"), rows))
        before_kill = range_reads(raw[:log_at_kill - log_start].decode(errors="replace"), rows)
        for sub in in_flight:
            sub.lost_reads = [r for r in before_kill if sub.committed_to <= r.lo < sub.end_key]
    subtasks = timeline.subtasks
    return KillRun(
        job_type=job_type, killed_at_rows=at_kill, in_flight=in_flight,
        reclaimed_after=reclaimed, total=total,
        committed_sum=sum(s.row_count for s in subtasks),
        rows_updated=rows_updated(url) - updated_before,
        rows_read=rows_read or None,  # no range reads at all: sql-update
        attempts=sum(s.attempts for s in subtasks), batch_rows=timeline.batch_rows)
