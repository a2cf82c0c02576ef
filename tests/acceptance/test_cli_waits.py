"""How the ``reorg`` commands that wait end (issue 22, item 13), run as a
user runs them: a job paused on a failure (``--on-failure pause``) ends both
``reorg submit --wait`` and ``reorg wait`` with its own exit code and one line
naming the failure and the way out; ``submit --wait`` takes ``--timeout`` as
``wait`` does; Ctrl-C (SIGINT) of ``submit --wait`` says the job goes on and
how to cancel it (before the id is out too: or that nothing was submitted),
of ``status --watch`` exits 130 quietly; ``reorg db
current`` exits non-zero when the schema is not at the head."""

from __future__ import annotations

import json
import signal
import time

import pytest
from cli_support import Running, assert_one_error_line, dump, job_status, reorg, reorg_json
from support import execute, make_items, wait_until
from support.processes import Workers

from framework.faults import Gates
from framework.revisions import head_revision, known_revisions

# The documented exit codes (README, "Exit codes").
BAD_INPUT, TIMEOUT, PAUSED_ON_FAILURE, OPERATIONAL, INTERRUPTED = 2, 3, 4, 5, 130
POISON = 1_500  # the one row the expression fails on


def test_a_job_paused_on_a_failure_ends_submit_wait_and_wait_with_the_way_out(
        migrated_db: str, workers: Workers) -> None:
    url = migrated_db
    make_items(url, 2_000)
    execute(url, f"UPDATE items SET a = 1; UPDATE items SET a = 0 WHERE id = {POISON}")
    worker = workers.start_cli("w1", "--slots", "1", "--no-spark-warmup")
    submitted = reorg(url, "submit", "sql-update", "--table", "items",
                      "--set", "c=md5(b) || repeat('x', 1 / a - 1)", "--rows-per-subtask", "1000",
                      "--batch-rows", "100", "--on-failure", "pause", "--wait", "--timeout", "60",
                      timeout=90)
    line = assert_one_error_line(submitted, PAUSED_ON_FAILURE)
    job = int(submitted.stdout)  # the id alone on stdout, before the wait
    assert line.startswith(f"error: job {job} paused on a failure: "), line
    assert "division by zero" in line, line
    assert f"`reorg retry {job}`" in line and f"`reorg cancel {job}`" in line, line
    assert job_status(url, job)["state"] == "paused", worker.log()

    # `reorg wait` on it ends at once the same way, not at its timeout.
    started = time.monotonic()
    assert assert_one_error_line(reorg(url, "wait", str(job), "--timeout", "20"),
                                 PAUSED_ON_FAILURE) == line
    assert time.monotonic() - started < 15


def test_ctrl_c_of_submit_wait_says_the_job_goes_on_and_of_status_watch_exits_130(
        migrated_db: str) -> None:
    url = migrated_db
    make_items(url, 1_000)  # no worker: a job stays queued
    make_items(url, 1_000, table="other")
    args = ["submit", "sql-update", "--table", "items", "--set", "c=md5(b)", "--wait"]
    line = assert_one_error_line(reorg(url, *args, "--timeout", "0.5"), TIMEOUT)
    timed_out = int(line.split()[2])
    assert line == (f"error: job {timed_out} has not finished after 0.5s; "
                    "`reorg status` shows where it is")
    assert job_status(url, timed_out)["state"] == "queued"
    before = dump(url)
    line = assert_one_error_line(reorg(url, *args[:-1], "--timeout", "5"), BAD_INPUT)
    assert line == "error: --timeout applies to --wait; add --wait, or drop --timeout"
    assert dump(url) == before

    # Ctrl-C once the id is out, while it waits: the wait stops, the job goes on.
    waiting = Running(url, *args[:2], "--table", "other", *args[4:])
    try:
        waiting.wait_for("\n")
        job = int(waiting.stdout())
        assert waiting.interrupt() == INTERRUPTED, waiting.stderr()
    finally:
        waiting.kill()
    assert waiting.stdout() == f"{job}\n"
    assert waiting.stderr().splitlines() == [_goes_on(job, waited=True)], waiting.stderr()
    assert job_status(url, job)["state"] == "queued"

    # `status --watch` on a terminal, until Ctrl-C: exit 130, nothing on stderr.
    watching = Running(url, "status", str(job), "--watch", terminal=True)
    try:
        watching.wait_for(f"job {job}")
        assert watching.interrupt() == INTERRUPTED, watching.stderr()
    finally:
        watching.kill()
    assert watching.stderr() == ""


@pytest.mark.parametrize("point", ["submit.before_insert", "submit.in_insert",
                                   "submit.after_insert"])
def test_ctrl_c_while_submitting_says_whether_a_job_was_submitted(
        migrated_db: str, gates: Gates, point: str) -> None:
    """Before the id is out: held at each stage of the submit, a Ctrl-C ends
    it with the one line that says whether a job now exists. One during the
    insert's commit waits for the commit: never a job nobody was told of."""
    url = migrated_db
    make_items(url, 100)
    before = dump(url)
    submitting = Running(url, "submit", "sql-update", "--table", "items", "--set", "c=md5(b)",
                         "--wait", REORG_FAULTS=f"{point}=block", **gates.env())
    try:
        wait_until(lambda: gates.blocked(point) or submitting.proc.poll() is not None, 60,
                   f"the submit held at {point}")
        assert gates.blocked(point), submitting.stderr()
        submitting.proc.send_signal(signal.SIGINT)
        if point == "submit.in_insert":
            gates.release(point)  # the commit goes on, then the Ctrl-C is taken
        code = submitting.end()
    finally:
        submitting.kill()
    assert code == INTERRUPTED, submitting.stderr()
    if point == "submit.before_insert":
        assert submitting.stderr() == "error: interrupted; nothing was submitted\n"
        assert submitting.stdout() == ""
        assert dump(url) == before
        return
    job = int(submitting.stdout())  # the id on stdout, as a submit prints it
    assert submitting.stderr().splitlines() == [_goes_on(job, waited=False)]
    assert job_status(url, job)["state"] == "queued"


def _goes_on(job: int, *, waited: bool) -> str:
    again = " again" if waited else ""
    return (f"error: interrupted; job {job} goes on: `reorg cancel {job}` cancels it, "
            f"`reorg wait {job}` waits for it{again}")


def test_db_current_exits_non_zero_when_the_schema_is_not_at_the_head(
        migrated_db: str, fresh_db: str) -> None:
    head = head_revision()
    older = sorted(known_revisions() - {head})[-1]
    execute(migrated_db, f"UPDATE reorg.alembic_version SET version_num = '{older}'")
    line = assert_one_error_line(reorg(migrated_db, "db", "current"), OPERATIONAL)
    assert line == (f"error: schema reorg at revision {older}, not the head {head}: "
                    "run `reorg db upgrade`")
    scripted = reorg(migrated_db, "db", "current", "--json")
    assert scripted.returncode == OPERATIONAL, scripted.stderr
    assert scripted.stderr.strip() == line
    assert json.loads(scripted.stdout)["is_head"] is False

    line = assert_one_error_line(reorg(fresh_db, "db", "current"), OPERATIONAL)
    assert line == (f"error: schema reorg: not installed; this version needs {head}: "
                    "run `reorg db upgrade`")
    # Reading the revision changes nothing.
    assert execute(fresh_db, "SELECT 1 FROM pg_namespace WHERE nspname = 'reorg'") == []
    # At the head: exit 0, as before.
    execute(migrated_db, f"UPDATE reorg.alembic_version SET version_num = '{head}'")
    assert reorg_json(migrated_db, "db", "current")["is_head"] is True
