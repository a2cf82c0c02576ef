"""``reorg submit add-index`` and ``reorg submit add-column`` as a user runs
them: bad input is one ``error:`` line, exit 2, every table as it was (a
table whose row triggers a backfill would fire too, for ``alter-type`` as
well, unless ``--allow-user-triggers``); a dry run prints the DDL of each
state and the ranges and changes nothing; a job run by a ``reorg worker``
shows its schema state in ``reorg status``."""

from __future__ import annotations

import pytest
from cli_support import assert_one_error_line, dump, job_status, ok, reorg, reorg_json
from support import execute, wait_until

ITEMS_ROWS = 2_000

# One case per type as the user sees it; every case: tests/integration/test_add_*.py.
BAD = [
    (["add-index", "--table", "items", "--columns", "b,zz"],
     "column zz does not exist in public.items"),
    (["add-column", "--table", "items", "--column", "d:text", "--value", "zz"],
     "--value 'zz' does not work on public.items"),
]


def test_bad_input_is_one_line_exit_2_and_changes_nothing(items_db):
    before = dump(items_db)
    for args, says in BAD:  # one database for every case: they change nothing
        line = assert_one_error_line(reorg(items_db, "submit", *args), 2)
        assert says in line, line
        assert dump(items_db) == before, args


def test_dry_runs_print_the_ddl_of_each_state_and_change_nothing(items_db):
    before = dump(items_db)
    index = ok(reorg(items_db, "submit", "add-index", "--table", "items", "--columns", "b",
                     "--unique", "--dry-run"))
    # Neither of its steps ranges over the key: no key ranges listed (issue 26).
    assert "ranges" not in index and "estimated rows" not in index
    assert "key_ranges" not in reorg_json(items_db, "submit", "add-index", "--table", "items",
                                          "--columns", "b", "--dry-run")
    assert ('build (write-reorg): CREATE UNIQUE INDEX CONCURRENTLY "items_b_idx" ON '
            '"public"."items" ("b")') in index
    column = ok(reorg(items_db, "submit", "add-column", "--table", "items", "--column", "d:text",
                      "--value", "md5(b)", "--not-null", "--dry-run"))
    assert 'prepare (write-only): ALTER TABLE "public"."items" ADD COLUMN "d" text' in column
    assert "VALIDATE CONSTRAINT" in column and "SET NOT NULL" in column
    assert dump(items_db) == before


def test_a_table_whose_row_triggers_the_backfill_would_fire_is_refused_unless_accepted(
        items_db):
    execute(items_db, """
        CREATE FUNCTION stamp() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN NEW.c := clock_timestamp()::text; RETURN NEW; END $$;
        CREATE TRIGGER items_stamp BEFORE UPDATE ON items FOR EACH ROW EXECUTE FUNCTION stamp()""")
    before = dump(items_db)
    for args in (["add-column", "--table", "items", "--column", "d:text", "--value", "md5(b)"],
                 ["alter-type", "--table", "items", "--column", "a", "--type", "bigint"]):
        line = assert_one_error_line(reorg(items_db, "submit", *args), 2)
        assert "row trigger an UPDATE fires: items_stamp" in line, line
        assert "--allow-user-triggers" in line, line
        assert dump(items_db) == before, args
        ok(reorg(items_db, "submit", *args, "--allow-user-triggers", "--dry-run"))
        assert dump(items_db) == before, args


@pytest.mark.matrix  # a worker process: long; status of the state also in test_steps
def test_a_job_shows_its_schema_state_in_status(items_db, workers, gates):
    job_id = int(ok(reorg(items_db, "submit", "add-column", "--table", "items", "--column",
                          "d:text", "--value", "md5(b)", "--batch-rows", "100")).strip())
    workers.start("w1", slots=2, faults="worker.after_batch=block")
    gates.wait_blocked("worker.after_batch", 60)  # held in the backfill
    assert job_status(items_db, job_id)["schema_state"] == "write-reorg"
    assert "write-reorg" in ok(reorg(items_db, "status", str(job_id)))
    gates.release("worker.after_batch")
    done = wait_until(lambda: (j := job_status(items_db, job_id))["state"] == "succeeded" and j,
                      90, "the job to succeed")
    assert done["schema_state"] == "public"
