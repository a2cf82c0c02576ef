"""``--on-failure pause`` through the ``reorg`` command with a real worker: a
subtask failing for good pauses the job with the error in ``reorg status``
and every committed batch kept; once the cause is fixed, ``reorg retry``
re-queues the failed subtask (attempts reset), which resumes from its
checkpoint, and the job succeeds without redoing anything."""

from __future__ import annotations

import getpass
import socket

from cli_support import assert_one_error_line, dump, job_status, ok, reorg, reorg_json, submit
from support import Workers, execute, make_items, wait_until

BAD_INPUT = 2
ACTOR = f"{getpass.getuser()}@{socket.gethostname()}"
# What a live worker rewrites on its own (heartbeats, the owner lease, rate samples).
LIVE_NODE_TABLES = ("nodes", "owner_lease", "job_progress_sample")
POISON = 4_500  # the one row the expression fails on until the test fixes it


def filled(url: str) -> list[tuple[int, int]]:
    """(smallest, largest) key of each run of rows the job has written."""
    return execute(url, """
        SELECT min(id), max(id) FROM (
            SELECT id, id - row_number() OVER (ORDER BY id) AS run FROM items
            WHERE c IS NOT NULL) r GROUP BY run ORDER BY 1""")


def test_a_failing_subtask_pauses_the_job_and_retry_finishes_it(
        migrated_db: str, workers: Workers) -> None:
    url = migrated_db
    make_items(url, 5_000)
    # 1 / a fails (division by zero) on the poison row only.
    execute(url, f"UPDATE items SET a = 1; UPDATE items SET a = 0 WHERE id = {POISON}")
    worker = workers.start_cli("w1", "--slots", "1", "--no-spark-warmup")
    job = submit(url, "--table", "items", "--set", "c=md5(b) || repeat('x', 1 / a - 1)",
                 "--rows-per-subtask", "1000", "--batch-rows", "100", "--concurrency", "1",
                 "--on-failure", "pause")

    status = wait_until(lambda: (s := job_status(url, job))["state"] == "paused" and s, 60,
                        f"job {job} paused on the failure")
    assert "division by zero" in status["error"], status
    assert (status["failed"], status["on_failure"]) == (1, "pause")
    text = ok(reorg(url, "status", str(job)))
    assert "paused" in text and "division by zero" in text, text
    # Every batch committed before the failure is kept: the four ranges before
    # the poison row's, and its range up to the poison row's batch.
    assert filled(url) == [(1, 4_400)], worker.log()

    # Resumed as it is, it would only fail again: refused, nothing changes.
    before = dump(url, skip=LIVE_NODE_TABLES)
    line = assert_one_error_line(reorg(url, "resume", str(job)), BAD_INPUT)
    assert f"reorg retry {job}" in line
    assert dump(url, skip=LIVE_NODE_TABLES) == before

    execute(url, f"UPDATE items SET a = 1 WHERE id = {POISON}")  # the cause, fixed
    assert ok(reorg(url, "retry", str(job))).strip() == (
        f"job {job}: 1 failed subtasks re-queued; resuming")
    waited = reorg(url, "wait", str(job), "--timeout", "60")
    assert waited.returncode == 0, waited.stderr + worker.log()
    assert execute(url, "SELECT count(*) FROM items WHERE c IS DISTINCT FROM md5(b)") == [(0,)]
    # Nothing was done twice: the retried subtask resumed from its checkpoint.
    # Its subtasks live or moved: the owner moves them to the history on a
    # tick after the job ended, which `reorg wait` does not wait for.
    assert execute(url, "SELECT sum(row_count), count(*) FILTER (WHERE state <> 'succeeded') "
                        "FROM (SELECT row_count, state, job_id FROM reorg.background_subtask "
                        "UNION ALL SELECT row_count, state, job_id "
                        "FROM reorg.background_subtask_history) s WHERE job_id = %(j)s",
                   {"j": job}) == [(5_000, 0)]
    assert job_status(url, job)["error"] is None

    events = [(e["actor"], e["from_state"], e["to_state"], e["detail"])
              for e in reorg_json(url, "events", str(job))]
    after_start = [e for e in events if e[1] not in (None, "queued")]
    assert [e[1:3] for e in after_start] == [
        ("running", "pausing"), ("pausing", "paused"), ("paused", "resuming"),
        ("resuming", "running"), ("running", "succeeded")], events
    assert after_start[0][3].startswith("a subtask failed; pausing (--on-failure pause)")
    assert after_start[2][0] == ACTOR
    assert after_start[2][3] == "retry requested: 1 failed subtasks re-queued"


def test_retry_refuses_a_job_with_nothing_to_retry(migrated_db: str) -> None:
    url = migrated_db
    make_items(url, 1_000)
    job = submit(url, "--table", "items", "--set", "c=md5(b)", "--on-failure", "pause")
    before = dump(url)
    line = assert_one_error_line(reorg(url, "retry", str(job)), BAD_INPUT)
    assert line == f"error: job {job} is queued; only a paused job can be retried"
    line = assert_one_error_line(
        reorg(url, "submit", "sql-update", "--table", "items", "--set", "c=md5(b)",
              "--on-failure", "ignore"), BAD_INPUT)
    assert "--on-failure must be one of rollback, pause" in line
    assert dump(url) == before
