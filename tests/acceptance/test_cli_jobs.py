"""Jobs end to end through the ``reorg`` command with real ``reorg worker``
processes: run, wait, inspect, pause/resume/alter, cancel, drain, demo."""

from __future__ import annotations

import re
import signal
import subprocess

import pytest
from cli_support import (
    assert_one_error_line,
    dump,
    job_status,
    ok,
    reorg,
    reorg_json,
    submit,
)
from support import TERMINAL, Workers, execute, make_items, wait_until
from support.processes import REORG, clean_env


def wrong_rows(url: str, expression: str = "md5(b)") -> int:
    return execute(url, f"SELECT count(*) FROM items WHERE c IS DISTINCT FROM {expression}")[0][0]


def live_subtasks(url: str, job_id: int) -> int:
    return execute(url, "SELECT count(*) FROM reorg.background_subtask WHERE job_id = %(j)s",
                   {"j": job_id})[0][0]


def test_end_to_end_with_one_worker(migrated_db: str, workers: Workers) -> None:
    url = migrated_db
    make_items(url, 5_000)
    worker = workers.start_cli("w1")
    job_id = submit(url, "--table", "items", "--set", "c=md5(b)", "--rows-per-subtask", "1000",
                    "--batch-rows", "400")

    waited = reorg(url, "wait", str(job_id), "--timeout", "60")
    assert waited.returncode == 0, waited.stderr + worker.log()
    assert f"job {job_id} succeeded: 5,000 rows" in waited.stdout
    assert wrong_rows(url) == 0

    job = job_status(url, job_id)
    assert (job["state"], job["percent"], job["rows_done"], job["succeeded"]) == (
        "succeeded", 100.0, 5_000, 5)
    assert "100.0%" in ok(reorg(url, "status", str(job_id), "--watch"))  # ends at once

    wait_until(lambda: live_subtasks(url, job_id) == 0, 30, "subtasks moved to history")
    history = reorg_json(url, "history", "--job", str(job_id))
    assert [(h["ordinal"], h["state"], h["row_count"]) for h in history] == [
        (i, "succeeded", 1_000) for i in range(5)]
    assert [h["start_key"] for h in history] == [1, 1001, 2001, 3001, 4001]
    assert "succeeded" in ok(reorg(url, "history"))
    events = reorg_json(url, "events", str(job_id))
    assert [(e["from_state"], e["to_state"]) for e in events] == [
        (None, "queued"), ("queued", "running"), ("running", "succeeded")]

    (node,) = reorg_json(url, "nodes")
    assert (node["node_id"], node["slots"], node["state"], node["is_owner"]) == (
        "w1", 2, "active", True)

    # Cancel of a finished job: refused, and nothing moves (the worker's own
    # rows, heartbeat and owner lease, are left out of the comparison).
    before = dump(url, skip=("nodes", "owner_lease"))
    line = assert_one_error_line(reorg(url, "cancel", str(job_id)), 2)
    assert f"job {job_id} already succeeded" in line
    assert dump(url, skip=("nodes", "owner_lease")) == before


def test_worker_sigterm_drains_exits_0_and_deregisters(migrated_db: str,
                                                      workers: Workers) -> None:
    worker = workers.start_cli("w-term", "--slots", "3")
    wait_until(lambda: [n["node_id"] for n in reorg_json(migrated_db, "nodes")] == ["w-term"],
               30, "worker registered")
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(timeout=30) == 0, worker.log()
    assert reorg_json(migrated_db, "nodes") == []
    assert "draining" in worker.log() and "Traceback" not in worker.log()


def test_pause_alter_resume_then_finish(migrated_db: str, workers: Workers) -> None:
    url = migrated_db
    make_items(url, 20_000)
    # One subtask at 1,000 rows/s: slow enough to pause mid-run, with room to spare.
    job_id = submit(url, "--table", "items", "--set", "c=md5(b)", "--batch-rows", "100",
                    "--concurrency", "1", "--max-rows-per-sec", "1000")
    workers.start_cli("w1")
    wait_until(lambda: job_status(url, job_id)["rows_done"] > 0, 30, "job making progress")
    assert ok(reorg(url, "pause", str(job_id))).strip() == "pausing"
    paused = wait_until(lambda: (j := job_status(url, job_id))["state"] == "paused" and j,
                        30, "job paused")
    assert 0 < paused["rows_done"] < 20_000 and paused["running"] == 0

    assert "max_rows_per_sec=0" in ok(reorg(url, "alter", str(job_id), "--max-rows-per-sec", "0"))
    assert job_status(url, job_id)["max_rows_per_sec"] is None
    assert ok(reorg(url, "resume", str(job_id))).strip() == "resuming"
    assert ok(reorg(url, "wait", str(job_id), "--timeout", "60")).startswith(
        f"job {job_id} succeeded")
    assert wrong_rows(url) == 0


def test_cancelled_job_is_rolled_back_and_wait_exits_1(migrated_db: str,
                                                      workers: Workers) -> None:
    url = migrated_db
    make_items(url, 10_000)
    before = dump(url, schemas=("public",))
    job_id = submit(url, "--table", "items", "--set", "d=md5(b)", "--add-column", "d:text",
                    "--batch-rows", "100", "--concurrency", "1", "--max-rows-per-sec", "500")
    workers.start_cli("w1")
    # Mid-run: the column exists and some rows hold the new value.
    wait_until(lambda: job_status(url, job_id)["rows_done"] > 0, 30, "job making progress")
    assert ok(reorg(url, "cancel", str(job_id))).strip() == "cancelling"
    line = assert_one_error_line(reorg(url, "wait", str(job_id), "--timeout", "60"), 1)
    assert f"job {job_id} cancelled" in line
    assert job_status(url, job_id)["state"] in TERMINAL
    assert dump(url, schemas=("public",)) == before


def test_submit_wait_stays_until_the_job_ends_and_exits_as_wait_does(
        migrated_db: str, workers: Workers) -> None:
    url = migrated_db
    make_items(url, 5_000)
    worker = workers.start_cli("w1", "--no-spark-warmup")
    done = reorg(url, "submit", "sql-update", "--table", "items", "--set", "c=md5(b)",
                 "--batch-rows", "500", "--wait")
    assert done.returncode == 0, done.stderr + worker.log()
    job_id = int(done.stdout)  # the id alone on stdout, as without --wait
    assert re.fullmatch(rf"job {job_id} succeeded: 5,000 rows in \S+", done.stderr.strip()), \
        done.stderr
    assert job_status(url, job_id)["state"] == "succeeded" and wrong_rows(url) == 0

    # A job that does not succeed: exit 1 and one error line, as `reorg wait`.
    before = dump(url, schemas=("public",))
    waiting = subprocess.Popen(
        [REORG, "--db", url, "submit", "sql-update", "--table", "items", "--set", "d=md5(b)",
         "--add-column", "d:text", "--batch-rows", "100", "--concurrency", "1",
         "--max-rows-per-sec", "500", "--wait"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
    try:
        job_id = int(waiting.stdout.readline())  # printed before the wait begins
        wait_until(lambda: job_status(url, job_id)["rows_done"] > 0, 30, "job making progress")
        assert ok(reorg(url, "cancel", str(job_id))).strip() == "cancelling"
        stdout, stderr = waiting.communicate(timeout=60)
    finally:
        waiting.kill()
    assert waiting.returncode == 1 and stdout == "", stderr
    assert stderr.splitlines() == [stderr.strip()] and "Traceback" not in stderr
    assert stderr.startswith(f"error: job {job_id} cancelled"), stderr
    assert dump(url, schemas=("public",)) == before


@pytest.mark.spark
def test_demo_on_a_configured_database(migrated_db: str) -> None:
    # The default job type, as the README's first command runs it: backfill on Spark.
    result = reorg(migrated_db, "demo", "--rows", "20000", "--workers", "1", timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "submitted backfill job" in result.stdout
    assert "demo passed" in result.stdout and "20,000 rows" in result.stdout
    assert execute(migrated_db, "SELECT count(*) FROM reorg_demo.items "
                                "WHERE c IS DISTINCT FROM md5(b)") == [(0,)]
    # Its workers drained and deregistered on the way out.
    assert reorg_json(migrated_db, "nodes") == []
