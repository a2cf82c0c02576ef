"""Bad input through the ``reorg`` command (DESIGN 11): one ``error:`` line,
a non-zero exit code, no traceback, and every table exactly as it was.
Also the submit paths that must not create a job twice, or at all."""

from __future__ import annotations

import re

import psycopg
import pytest
from alembic.script import ScriptDirectory
from cli_support import (
    assert_one_error_line,
    dump,
    job_status,
    ok,
    reorg,
    reorg_json,
    submit,
)
from support import execute, make_items

from framework import migrate
from framework.config import Settings
from framework.db import Database
from framework.revisions import head_revision

BAD_INPUT, OPERATIONAL = 2, 5
UNREACHABLE = "postgresql://x@127.0.0.1:1/x"


ITEMS_ROWS = 1_000  # rows of ``items`` in the ``items_db`` fixture


BAD_SUBMITS = {
    "unknown table": ["--table", "public.nope", "--set", "c=md5(b)"],
    "unknown column": ["--table", "items", "--set", "nope=md5(b)"],
    "bad expression": ["--table", "items", "--set", "c=md5(nope)"],
    "syntax error": ["--table", "items", "--set", "c=md5("],
    "second statement": ["--table", "items", "--set", "c=b; DROP TABLE items"],
    "malformed --set": ["--table", "items", "--set", "c"],
    "empty expression": ["--table", "items", "--set", "c="],
    "bad --where": ["--table", "items", "--set", "c=b", "--where", "nope > 1"],
    "--where ends its parenthesis": ["--table", "items", "--set", "a=a*2",
                                     "--where", "FALSE) OR (a = 1"],
    "aggregate --set": ["--table", "items", "--set", "a=count(*)"],
    "set-returning --set": ["--table", "items", "--set", "d=generate_series(1, 2)",
                            "--add-column", "d:int"],
    "key column": ["--table", "items", "--set", "id=1"],
    "bad --add-column type": ["--table", "items", "--set", "d=1", "--add-column", "d:notatype"],
    "malformed --add-column": ["--table", "items", "--set", "d=1", "--add-column", "d"],
    "--add-column exists": ["--table", "items", "--set", "c=b", "--add-column", "c:text"],
    "--batch-rows 0": ["--table", "items", "--set", "c=b", "--batch-rows", "0"],
    "--concurrency -1": ["--table", "items", "--set", "c=b", "--concurrency", "-1"],
    "not a number": ["--table", "items", "--set", "c=b", "--batch-rows", "many"],
    "missing --set": ["--table", "items"],
    "unknown option": ["--table", "items", "--set", "c=b", "--colour", "red"],
}


@pytest.mark.parametrize("args", BAD_SUBMITS.values(), ids=BAD_SUBMITS.keys())
def test_bad_submit_is_one_line_and_changes_nothing(items_db: str, args: list[str]) -> None:
    before = dump(items_db)
    assert_one_error_line(reorg(items_db, "submit", "sql-update", *args), BAD_INPUT)
    assert dump(items_db) == before


def test_submit_of_unknown_or_uninstalled_job_type_is_refused(items_db: str) -> None:
    before = dump(items_db)
    line = assert_one_error_line(reorg(items_db, "submit", "frobnicate"), BAD_INPUT)
    assert "frobnicate" in line
    # Not installed yet (or, once it is, the target does not exist): refused either way.
    assert_one_error_line(
        reorg(items_db, "submit", "checksum", "--table", "items", "--target", "public.nope"),
        BAD_INPUT)
    assert dump(items_db) == before


UNKNOWN_JOB = [["status", "999"], ["cancel", "999"], ["pause", "999"], ["resume", "999"],
               ["wait", "999"], ["events", "999"], ["alter", "999", "--batch-rows", "5"],
               ["history", "--job", "999"]]


@pytest.mark.parametrize("args", UNKNOWN_JOB, ids=[a[0] for a in UNKNOWN_JOB])
def test_unknown_job_id_is_one_line_and_changes_nothing(items_db: str, args: list[str]) -> None:
    before = dump(items_db)
    line = assert_one_error_line(reorg(items_db, *args), BAD_INPUT)
    assert "job 999 does not exist" in line
    assert dump(items_db) == before


def test_refused_control_of_a_queued_job_changes_nothing(items_db: str) -> None:
    job = job_status(items_db, 1)
    assert job["state"] == "queued"
    before = dump(items_db)
    assert_one_error_line(reorg(items_db, "pause", "1"), BAD_INPUT)  # only running jobs pause
    assert_one_error_line(reorg(items_db, "resume", "1"), BAD_INPUT)
    assert_one_error_line(reorg(items_db, "alter", "1"), BAD_INPUT)  # nothing to change
    assert_one_error_line(reorg(items_db, "alter", "1", "--batch-rows", "0"), BAD_INPUT)
    assert dump(items_db) == before


@pytest.mark.parametrize("args", [
    ["status"], ["nodes"], ["history"], ["db", "upgrade"], ["worker"],
    ["submit", "sql-update", "--table", "items", "--set", "c=b"],
])
def test_unreachable_database_is_one_operational_line(args: list[str]) -> None:
    line = assert_one_error_line(reorg(UNREACHABLE, *args), OPERATIONAL)
    assert "cannot reach PostgreSQL at 127.0.0.1:1/x" in line


@pytest.mark.parametrize("options", [
    ["--db", "mysql://u@h/db"], ["--schema", "Bad-Name"], ["--lease-seconds", "0"],
    ["--max-attempts", "0"], ["--lease-seconds", "soon"],
])
def test_bad_global_option_is_one_line(items_db: str, options: list[str]) -> None:
    before = dump(items_db)
    # --db given twice: the later one wins, so the bad URL reaches the check.
    assert_one_error_line(reorg(items_db, *options, "status"), BAD_INPUT)
    assert dump(items_db) == before


def test_schema_not_upgraded_names_the_command_then_upgrade_fixes_it(fresh_db: str) -> None:
    make_items(fresh_db, 100)
    before = dump(fresh_db)
    for args in (["status"], ["worker"], ["submit", "sql-update", "--table", "items",
                                          "--set", "c=b"]):
        line = assert_one_error_line(reorg(fresh_db, *args), OPERATIONAL)
        assert "run `reorg db upgrade`" in line
    assert dump(fresh_db) == before
    assert execute(fresh_db, "SELECT 1 FROM pg_namespace WHERE nspname = 'reorg'") == []

    assert head_revision() in ok(reorg(fresh_db, "db", "upgrade"))
    assert head_revision() in ok(reorg(fresh_db, "db", "upgrade"))  # repeatable
    assert reorg_json(fresh_db, "status") == []


def test_an_upgrade_blocked_by_an_open_transaction_names_it_and_changes_nothing(
        fresh_db: str) -> None:
    """A transaction left open on reorg's tables: the upgrade waits out its
    lock timeout instead of queueing every worker behind it for as long as
    that transaction lasts, then names the session and changes nothing."""
    script = ScriptDirectory.from_config(migrate.alembic_config("reorg"))
    below = script.get_revision(head_revision()).down_revision
    assert isinstance(below, str)
    db = Database(Settings(fresh_db))
    migrate.upgrade(db, below)
    db.dispose()
    with psycopg.connect(fresh_db, application_name="analyst") as blocker:
        # Every migration writes alembic_version; an EXCLUSIVE lock lets reads through.
        blocker.execute("LOCK TABLE reorg.alembic_version IN EXCLUSIVE MODE")
        before = dump(fresh_db)
        line = assert_one_error_line(reorg(fresh_db, "db", "upgrade"), OPERATIONAL)
        assert "nothing changed" in line
        assert (f"pid {blocker.info.backend_pid} (user " in line and "application analyst" in line
                and "on alembic_version" in line), line
        assert f"pg_terminate_backend({blocker.info.backend_pid})" in line
        assert dump(fresh_db) == before
        assert execute(fresh_db, "SELECT version_num FROM reorg.alembic_version") == [(below,)]
    assert head_revision() in ok(reorg(fresh_db, "db", "upgrade"))


def test_submit_prints_the_id_alone_and_status_json_shows_the_job(items_db: str) -> None:
    result = reorg(items_db, "submit", "sql-update", "--table", "items", "--set", "c=md5(b)",
                   "--batch-rows", "500", "--priority", "3")
    job_id = int(ok(result).strip())
    assert result.stdout == f"{job_id}\n" and result.stderr == ""
    job = job_status(items_db, job_id)
    assert {"id", "type", "state", "percent", "rows_done", "rows_total", "rows_per_sec",
            "eta_seconds", "pending", "running", "succeeded", "failed", "nodes"} <= job.keys()
    assert (job["id"], job["type"], job["state"], job["table"]) == (
        job_id, "sql-update", "queued", "public.items")
    assert (job["batch_rows"], job["priority"], job["percent"], job["rows_done"]) == (500, 3, 0, 0)
    assert job["created_at"].startswith("20")  # ISO datetime
    listed = reorg_json(items_db, "status")
    assert [j["id"] for j in listed] == [job_id, 1]
    assert f"{job_id}  sql-update" in ok(reorg(items_db, "status"))


def test_job_key_returns_the_same_job_twice(items_db: str) -> None:
    args = ["--table", "items", "--set", "c=md5(b)", "--job-key", "nightly-1"]
    first = submit(items_db, *args)
    before = dump(items_db)
    again = reorg(items_db, "submit", "sql-update", *args)
    assert int(ok(again).strip()) == first
    assert "already names job" in again.stderr
    assert dump(items_db) == before


def test_dry_run_prints_the_plan_and_inserts_no_job(items_db: str) -> None:
    before = dump(items_db)
    out = ok(reorg(items_db, "submit", "sql-update", "--table", "items", "--set", "c=md5(b)",
                   "--add-column", "d:text", "--set", "d=md5(b)", "--rows-per-subtask", "100",
                   "--dry-run"))
    assert "nothing submitted" in out and "1,000" in out and "10 of up to 100 rows" in out
    assert "[1, 101)" in out and "[901, 1001)" in out
    # The UPDATE each batch runs, as the submitter, on the keys [:lo, :hi) (issue 26).
    assert re.search(r'^each batch as \w+, keys \[:lo, :hi\): UPDATE "public"\."items" AS '
                     r'"items" SET "d" = \(md5\(b\) \) WHERE "items"\."id" >= :lo AND '
                     r'"items"\."id" < :hi AND \(TRUE \)$', out, re.M), out
    assert 'prepare: ALTER TABLE "public"."items" ADD COLUMN "d" text' in out
    plan = reorg_json(items_db, "submit", "sql-update", "--table", "items", "--set", "c=b",
                      "--rows-per-subtask", "300", "--dry-run")
    assert plan["ranges"] == 4 and plan["estimated_rows"] == 1_000
    # Overwriting c keeps its old values: the batch's statements say how. Old
    # values all NULL need no image: the bare UPDATE of the NULL rows (on an
    # integer key's dense ranges, no probe first).
    batch = [line for line in plan["plan"] if line.startswith("each batch as ")]
    assert len(batch) == 2, plan["plan"]
    assert batch[0].split(": ", 1)[1].startswith('UPDATE "public"."items" AS "items" SET "c"') \
        and 'num_nulls("items"."c") = 1' in batch[0] and "reorg_probe" not in batch[0], batch[0]
    assert 'UPDATE "public"."items" AS "items" SET "c" = (b ) FROM reorg_read' in batch[1] \
        and '"reorg"."sql_update_0_images"' in batch[1], batch[1]
    assert plan["key_ranges"] == [[1, 301], [301, 601], [601, 901], [901, 1001]]
    assert dump(items_db) == before


def test_second_active_job_on_a_table_is_refused(items_db: str) -> None:
    first = submit(items_db, "--table", "items", "--set", "c=md5(b)")
    before = dump(items_db)
    line = assert_one_error_line(
        reorg(items_db, "submit", "sql-update", "--table", "public.items", "--set", "a=1"),
        BAD_INPUT)
    assert f"active job {first}" in line and f"reorg cancel {first}" in line
    assert dump(items_db) == before


def test_wait_times_out_with_exit_3(items_db: str) -> None:
    line = assert_one_error_line(reorg(items_db, "wait", "1", "--timeout", "0.5"), 3)
    assert "job 1 has not finished" in line


def test_help_and_missing_command_never_touch_the_database() -> None:
    # No --db reachable and none needed: help is static.
    assert "submit" in ok(reorg(UNREACHABLE, "--help"))
    assert "--add-column" in ok(reorg(UNREACHABLE, "submit", "sql-update", "--help"))
    assert "Missing command" in assert_one_error_line(reorg(UNREACHABLE), BAD_INPUT)
