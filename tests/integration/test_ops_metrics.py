"""A node's metrics and progress lines as an SRE alerts on them (issue 26),
read from this process's Prometheus registry (in-process nodes set it):

- a batch is timed by its own transaction: a rate-limited job's batches land
  in the low buckets, its pacing waits count in none;
- the owner shows each job's state, why a health limit holds it
  (``reorg_job_throttled{reason}``), that it failed, and a rewrite's backlog;
  it logs a progress line per running job every ``progress_seconds``;
- a job's series, the owner's and the workers', go once it ended (after
  ``metrics.KEEP_ENDED_SECONDS``), so a long-lived worker keeps none."""

from __future__ import annotations

import itertools
import logging
import re
import time

import pytest
from prometheus_client import REGISTRY
from support import busy_sessions, execute, fill, make_items, wait_state, wait_until
from support.rewrite import BIGINT, make_table

from backfill.rewrite.job import register as register_rewrite
from framework import control, faults, metrics
from framework.job_reports import progress_line
from framework.submit import SubmitRequest, submit

_first_job_ids = itertools.count(1_000_000, 1_000)


@pytest.fixture(autouse=True)
def _no_series_of_earlier_tests(db) -> None:
    """Every test's database numbers its jobs from 1: series an earlier
    test's node left in this process (for KEEP_ENDED_SECONDS, or a drain
    that timed out under load) would count in this one's. Its jobs get ids
    no other test in this process has."""
    metrics.forget_worker_jobs(metrics.worker_jobs())
    with db.begin() as conn:
        conn.execute(db.sql("SELECT setval(pg_get_serial_sequence('{s}.jobs', 'id'), :n)"),
                     {"n": next(_first_job_ids)})


def sample(name: str, **labels: object) -> float | None:
    return REGISTRY.get_sample_value(name, {k: str(v) for k, v in labels.items()})


def series_of(job_id: int) -> list[str]:
    """Every sample of this process labelled with the job."""
    return sorted(f"{s.name}{s.labels}" for family in REGISTRY.collect()
                  for s in family.samples if s.labels.get("job_id") == str(job_id))


def progress_lines(caplog: pytest.LogCaptureFixture, job_id: int) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "reorg.progress" and r.getMessage().startswith(f"job {job_id} ")]


def test_a_rate_limited_jobs_batches_are_timed_by_their_own_transaction_not_their_waits(
        db, start_node) -> None:
    make_items(db, 1_000)
    kind = {"job_type": "test-fill"}
    count0 = sample("reorg_batch_duration_seconds_count", **kind) or 0
    fast0 = sample("reorg_batch_duration_seconds_bucket", le="0.25", **kind) or 0
    sum0 = sample("reorg_batch_duration_seconds_sum", **kind) or 0
    # 200 rows a batch at 400 rows/s: each batch then waits about 0.5 s.
    job = submit(db, fill("md5(b)", rows_per_subtask=1_000, batch_rows=200,
                          max_rows_per_sec=400)).job_id
    started = time.monotonic()
    start_node("n1", slots=1)
    assert wait_state(db, job)["state"] == "succeeded"
    elapsed = time.monotonic() - started
    batches = sample("reorg_batch_duration_seconds_count", **kind) - count0
    fast = sample("reorg_batch_duration_seconds_bucket", le="0.25", **kind) - fast0
    busy = sample("reorg_batch_duration_seconds_sum", **kind) - sum0
    assert batches == 5 == sample("reorg_batches_total", job_id=job, outcome="committed",
                                  **kind)
    assert elapsed >= 2.0, "the rate limit paced the batches"
    # Every batch in the low buckets: none carries its half second of waiting.
    assert fast == batches, (fast, batches)
    assert busy < elapsed / 4, (busy, elapsed)


def test_the_owner_shows_why_a_health_limit_holds_a_job_logs_its_progress_and_forgets_it(
        db, settings, start_node, caplog, monkeypatch) -> None:
    monkeypatch.setattr(metrics, "KEEP_ENDED_SECONDS", 1.0)
    caplog.set_level(logging.INFO, logger="reorg.progress")
    make_items(db, 2_000)
    job = submit(db, fill("md5(b)", rows_per_subtask=1_000, batch_rows=200,
                          max_active_sessions=1)).job_id
    with busy_sessions(settings.database_url, 2):
        start_node("n1", slots=2, progress_seconds=0.3)
        wait_until(lambda: sample("reorg_job_throttled", job_id=job,
                                  reason="active_sessions") == 1, 30, "the job throttled")
        assert sample("reorg_job_state", job_id=job, state="running") == 1
        assert sample("reorg_job_failed", job_id=job) == 0
        assert sample("reorg_job_rows_done", job_id=job) == 0
        assert sample("reorg_is_owner") == 1
        assert sample("reorg_build_info", version=metrics_version(), python=python()) == 1
        lines = wait_until(lambda: [li for li in progress_lines(caplog, job)
                                    if "throttled" in li], 10, "a throttled progress line")
        assert re.fullmatch(rf"job {job} test-fill public\.items running: rows 0/2,000 "
                            r"\(0\.0%\), 0 rows/s, elapsed \d+s; "
                            r"throttled: active sessions \d+ > 1", lines[-1]), lines[-1]
        # One line per job every progress_seconds, not one per tick.
        time.sleep(1.0)
        assert 2 <= len(progress_lines(caplog, job)) <= 6, progress_lines(caplog, job)
    assert wait_state(db, job)["state"] == "succeeded"
    assert sample("reorg_rows_processed_total", job_id=job, job_type="test-fill") == 2_000
    # The owner's last figures, then nothing of the job: owner's nor worker's.
    wait_until(lambda: sample("reorg_job_state", job_id=job, state="succeeded") == 1, 10,
               "the job's final state")
    assert sample("reorg_job_state", job_id=job, state="running") is None  # one state at a time
    assert sample("reorg_job_throttled", job_id=job, reason="active_sessions") is None
    assert sample("reorg_job_rows_done", job_id=job) == 2_000
    wait_until(lambda: series_of(job) == [], 10, "the job's series gone")


def test_a_failed_job_shows_failed_until_its_series_go(db, start_node, monkeypatch) -> None:
    monkeypatch.setattr(metrics, "KEEP_ENDED_SECONDS", 2.0)
    make_items(db, 1_000)
    job = submit(db, fill("CASE WHEN id = 700 THEN (1 / 0)::text ELSE md5(b) END",
                          rows_per_subtask=500, batch_rows=100)).job_id
    start_node("n1", slots=1)
    wait_until(lambda: sample("reorg_job_failed", job_id=job) == 1, 30, "the job failed")
    assert wait_state(db, job)["state"] == "reverted"
    wait_until(lambda: sample("reorg_job_state", job_id=job, state="reverted") == 1, 10,
               "the job's final state")
    assert sample("reorg_job_failed", job_id=job) == 1
    assert sample("reorg_batches_total", job_id=job, job_type="test-fill",
                  outcome="rolled_back") >= 1  # the batch that hit the division by zero
    wait_until(lambda: series_of(job) == [], 10, "the job's series gone")


def test_a_rewrites_backlog_is_its_change_log_in_metrics_and_progress_line(
        db, settings, start_node, caplog) -> None:
    register_rewrite()
    caplog.set_level(logging.INFO, logger="reorg.progress")
    url = settings.database_url
    make_table(url, BIGINT, 1_000)
    faults.arm("worker.after_batch", "block")  # the copy held after its first batches
    job = submit(db, SubmitRequest("rewrite", {"table": "items"}, batch_rows=100,
                                   rows_per_subtask=500)).job_id
    start_node("n1", slots=2, progress_seconds=0.3)
    faults.wait_blocked("worker.after_batch")
    execute(url, "UPDATE items SET a = a + 1 WHERE id <= 300")  # 300 keys to replay
    wait_until(lambda: sample("reorg_job_backlog", job_id=job) == 300, 15, "the backlog shown")
    wait_until(lambda: any(li.endswith("; backlog 300") for li in progress_lines(caplog, job)),
               10, "the backlog in the progress line")
    control.cancel(db, job)
    faults.release("worker.after_batch")
    assert wait_state(db, job)["state"] == "cancelled"


def test_progress_lines_read_like_gh_osts_status_line() -> None:
    job = {"id": 7, "type": "sql-update", "target_table": '"public"."items"', "state": "running",
           "rows_done": 412_000, "rows_total": 1_000_000, "percent": 41.2,
           "rows_per_sec": 13_520.4, "eta_seconds": 43.4, "elapsed_seconds": 31.0, "step": 1,
           "step_count": 1, "step_name": "update", "step_percent": 41.2,
           "throttled": "replica lag 3.2s > 1s (standby1)"}
    assert progress_line(job) == (
        "job 7 sql-update public.items running: rows 412,000/1,000,000 (41.2%), "
        "13,520 rows/s, ETA 43s, elapsed 31s; throttled: replica lag 3.2s > 1s (standby1)")
    steps = {**job, "type": "rewrite", "step": 3, "step_count": 5, "step_name": "catch-up",
             "step_percent": 20.0, "percent": 44.0, "eta_seconds": None, "throttled": None,
             "elapsed_seconds": 754}
    assert progress_line(steps, backlog=1_203) == (
        "job 7 rewrite public.items running: rows 412,000/1,000,000 (44.0%), 13,520 rows/s, "
        "elapsed 12m34s, step 3/5 catch-up 20.0%; backlog 1,203")
    reverting = {**job, "state": "reverting", "revert_done": 3, "revert_total": 12,
                 "revert_percent": 25.0, "throttled": None}
    assert progress_line(reverting) == (
        "job 7 sql-update public.items reverting: 3/12 ranges restored (25.0%), elapsed 31s")


def metrics_version() -> str:
    from framework.version import reorg_version

    return reorg_version()


def python() -> str:
    import platform

    return platform.python_version()
