"""How the ``reorg`` commands that wait end (issue 22, item 13), run as a
user runs them: a job paused on a failure (``--on-failure pause``) ends both
``reorg submit --wait`` and ``reorg wait`` with its own exit code and one line
naming the failure and the way out; ``submit --wait`` takes ``--timeout`` as
``wait`` does; Ctrl-C (SIGINT) of ``submit --wait`` says the job goes on and
how to cancel it, of ``status --watch`` exits 130 quietly; ``reorg db
current`` exits non-zero when the schema is not at the head."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import time

from cli_support import assert_one_error_line, dump, job_status, reorg, reorg_json
from support import execute, make_items
from support.processes import REORG, Workers, clean_env

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


def _sigint_after(proc: subprocess.Popen, ready: str, read) -> str:
    """Send SIGINT once ``read()`` (the command's output so far) shows
    ``ready``; returns that output."""
    seen = ""
    deadline = time.monotonic() + 30
    while ready not in seen:
        assert proc.poll() is None and time.monotonic() < deadline, seen
        seen += read()
    proc.send_signal(signal.SIGINT)
    return seen


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

    assert REORG
    waiting = subprocess.Popen([REORG, "--db", url, *args[:2], "--table", "other", *args[4:]],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=clean_env(), stdin=subprocess.DEVNULL)
    try:
        assert waiting.stdout is not None
        job = int(_sigint_after(waiting, "\n", waiting.stdout.readline))
        stdout, stderr = waiting.communicate(timeout=30)
    finally:
        waiting.kill()
    assert (waiting.returncode, stdout) == (INTERRUPTED, ""), stderr
    assert stderr.splitlines() == [
        f"error: interrupted; job {job} goes on: `reorg cancel {job}` cancels it, "
        f"`reorg wait {job}` waits for it again"], stderr
    assert job_status(url, job)["state"] == "queued"

    # `status --watch` on a terminal, until Ctrl-C: exit 130, nothing on stderr.
    main, terminal = pty.openpty()
    watching = subprocess.Popen([REORG, "--db", url, "status", str(job), "--watch"],
                                stdout=terminal, stderr=subprocess.PIPE, text=True,
                                env=clean_env(), stdin=subprocess.DEVNULL)
    os.close(terminal)

    def read_terminal() -> str:
        if select.select([main], [], [], 0.2)[0]:
            return os.read(main, 4096).decode(errors="replace")
        return ""

    try:
        _sigint_after(watching, f"job {job}", read_terminal)
        _, stderr = watching.communicate(timeout=30)
    finally:
        watching.kill()
        os.close(main)
    assert (watching.returncode, stderr) == (INTERRUPTED, "")


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
