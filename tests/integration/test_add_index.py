"""``add-index`` on in-process nodes, with an application writing the whole
time (support.app_model): a unique index built online; duplicate keys, also ones
whose rows lie in different ranges, fail the job before any index exists;
a duplicate written during the build fails it cleanly; cancel in each state
leaves the table exactly as before; bad input is one line and changes nothing."""

from __future__ import annotations

import psycopg
import pytest
import sqlalchemy as sa
from support import catalogue, execute, job_of, make_items, rows, scalar, wait_state, wait_until
from support.app_model import Application, data, shape

from framework import control, faults, long_statements
from framework.errors import InvalidParams
from framework.submit import SubmitRequest, submit

# Depends on the catalog or on lock levels: run on every supported major (README).
pytestmark = pytest.mark.catalog


def add_index(columns: str = "b", **params) -> SubmitRequest:
    knobs = {k: params.pop(k) for k in ("concurrency", "batch_rows", "dry_run", "rows_per_subtask")
             if k in params}
    return SubmitRequest("add-index", {"table": "items", "columns": columns, **params}, **knobs)


def _index(db, name: str) -> tuple | None:
    found = rows(db, "SELECT indisvalid, indisunique, pg_get_indexdef(indexrelid) FROM pg_index "
                     "WHERE indexrelid = to_regclass(:n)", n=name)
    return found[0] if found else None


def _building(db, job_id: int):
    """The job's build session, once PostgreSQL reports its progress."""
    return scalar(db, "SELECT p.phase FROM pg_stat_progress_create_index p JOIN "
                      f"pg_stat_activity a USING (pid) WHERE {long_statements.tagged_sql(job_id)}")


def test_a_unique_index_is_built_online_while_the_application_writes(db, start_node):
    make_items(db, 3_000)
    with Application(db.engine) as app:
        job_id = submit(db, add_index("b", unique=True, name="items_b_key")).job_id
        start_node("n1", slots=2)
        done = wait_state(db, job_id)
        app.wait_writes(20)
    assert done["state"] == "succeeded", done["error"]
    assert done["schema_state"] == "public" and done["percent"] == 100.0
    assert _index(db, "items_b_key") == (
        True, True, "CREATE UNIQUE INDEX items_b_key ON public.items USING btree (b)")
    assert not app.errors
    assert data(db.engine) == app.expected()
    # Every row is in the index: an index-only count agrees with the table's.
    with db.engine.begin() as conn:
        conn.execute(sa.text("SET LOCAL enable_seqscan = off"))
        assert conn.execute(sa.text("SELECT count(b) FROM items WHERE b > ''")).scalar() == len(
            app.expected())
    steps = [e["detail"] for e in control.events(db, job_id) if "step" in (e["detail"] or "")]
    assert steps[0].startswith("step 1/2 check-duplicates")
    assert steps[1].startswith("step check-duplicates done; step 2/2 build: 1 subtask")


def test_a_partial_index_of_several_columns_skips_the_duplicate_check(db, start_node):
    make_items(db, 1_000)  # a repeats: fine for an index that is not unique
    job_id = submit(db, add_index("a,b", where="a > 10")).job_id
    start_node("n1", slots=2)
    done = wait_state(db, job_id)
    assert done["state"] == "succeeded", done["error"]
    assert _index(db, "items_a_b_idx") == (
        True, False, "CREATE INDEX items_a_b_idx ON public.items USING btree (a, b) WHERE (a > 10)")
    # The check step had no subtask: nothing to look for without --unique.
    assert scalar(db, "SELECT count(*) FROM (SELECT step FROM {s}.background_subtask WHERE "
                      "job_id = :j UNION ALL SELECT step FROM {s}.background_subtask_history "
                      "WHERE job_id = :j) s WHERE step = 1", j=job_id) == 0


def test_duplicates_in_different_ranges_fail_the_job_before_any_index_exists(db, start_node):
    make_items(db, 4_000)
    # Rows far apart in key order share a key; NULL keys never clash.
    execute(db.engine, "UPDATE items SET b = 'twin' WHERE id IN (7, 3907); "
                       "UPDATE items SET b = NULL WHERE id IN (100, 200); ANALYZE items")
    before, table = shape(db.engine), data(db.engine)
    # Four buckets of the key's hash, each checked by a subtask of its own.
    job_id = submit(db, add_index("b", unique=True, name="items_b_key",
                                  rows_per_subtask=1_000)).job_id
    start_node("n1", slots=2)
    done = wait_state(db, job_id)
    assert done["state"] == "reverted"
    assert scalar(db, "SELECT count(*) FROM (SELECT id FROM {s}.background_subtask WHERE "
                      "job_id = :j AND step = 1 UNION ALL SELECT id FROM "
                      "{s}.background_subtask_history WHERE job_id = :j AND step = 1) s",
                  j=job_id) == 4
    assert "duplicate keys" in done["error"] and "(b)=(twin) in 2 rows (keys 7, 3907)" in (
        done["error"])
    # The job never reached its build step: no index was ever made.
    assert scalar(db, "SELECT count(*) FROM {s}.background_subtask WHERE job_id = :j AND step = 2 "
                      "UNION ALL SELECT 0", j=job_id) == 0
    assert scalar(db, "SELECT max(step) FROM {s}.background_subtask_history WHERE job_id = :j",
                  j=job_id) in (1, -1, None)
    assert shape(db.engine) == before and data(db.engine) == table


def test_a_duplicate_written_during_the_build_fails_the_job_and_drops_the_index(
        db, start_node, migrated_db):
    make_items(db, 2_000)
    before, table = shape(db.engine), data(db.engine)
    job_id = submit(db, add_index("b", unique=True, name="items_b_key")).job_id
    # An open write transaction holds the build at its first wait for writers.
    with psycopg.connect(migrated_db) as writer:
        writer.execute("UPDATE items SET a = a WHERE id = 1")
        start_node("n1", slots=2)
        wait_until(lambda: _building(db, job_id), 60, "the build to start")
        execute(db.engine, "INSERT INTO items VALUES (5000, 1, 'v1', NULL)")  # 'v1' is id 1's
        writer.rollback()
    done = wait_state(db, job_id)
    assert done["state"] == "reverted"
    assert "could not create unique index" in done["error"]
    execute(db.engine, "DELETE FROM items WHERE id = 5000")
    assert shape(db.engine) == before and data(db.engine) == table


@pytest.mark.parametrize("state", ["none", "write-reorg"])
def test_cancel_in_each_state_leaves_the_table_exactly_as_before(db, start_node, migrated_db,
                                                                 state):
    make_items(db, 2_000)
    before = shape(db.engine)
    with Application(db.engine) as app, psycopg.connect(migrated_db) as writer:
        if state == "none":
            faults.arm("worker.before_checkpoint", "block")
        else:
            writer.execute("UPDATE items SET a = a WHERE id = 1")  # holds the build
        job_id = submit(db, add_index("b", unique=True, name="items_b_key")).job_id
        start_node("n1", slots=2)
        if state == "none":
            faults.wait_blocked("worker.before_checkpoint", 60)
        else:
            # (its progress row shows before the transaction that puts the index
            # in the catalogue commits)
            wait_until(lambda: _building(db, job_id) and _index(db, "items_b_key"), 60,
                       "the build to start, its index in the catalogue")
            assert _index(db, "items_b_key")[0] is False  # in the catalogue, not valid yet
            # The build's phase, from pg_stat_progress_create_index, is its
            # subtask's progress (waiting for writers: 1 of 100).
            wait_until(lambda: scalar(db, "SELECT curr_key FROM {s}.background_subtask "
                                          "WHERE job_id = :j AND step = 2", j=job_id) >= 1,
                       30, "the build's progress to be checkpointed")
        assert job_of(db, job_id)["schema_state"] == state
        control.cancel(db, job_id)
        faults.release("worker.before_checkpoint")
        writer.rollback()
        done = wait_state(db, job_id)
        app.wait_writes(10)
    assert done["state"] == "cancelled", done["error"]
    assert shape(db.engine) == before
    assert not app.errors and data(db.engine) == app.expected()


def test_dry_run_changes_nothing_and_describes_each_state(db):
    make_items(db, 100)
    before = shape(db.engine)
    result = submit(db, add_index("a,b", unique=True, where="a > 3", dry_run=True))
    # No step of add-index ranges over the key: a dry run lists no key ranges.
    assert result.job_id is None and result.dry_run and result.plan is None
    assert result.notes[0].startswith("check-duplicates (none)")
    assert result.notes[1] == ('build (write-reorg): CREATE UNIQUE INDEX CONCURRENTLY '
                             '"items_a_b_idx" ON "public"."items" ("a", "b") WHERE (a > 3 )')
    assert shape(db.engine) == before
    assert scalar(db, "SELECT count(*) FROM {s}.jobs") == 0


BAD = [
    ({"table": "nope"}, "table 'nope' does not exist"),
    ({"columns": "b,zz"}, "column zz does not exist in public.items"),
    ({"columns": ""}, "no --columns given"),
    ({"columns": "b,b"}, "names a column twice"),
    ({"name": "items_pkey"}, "--name items_pkey: a relation of that name already exists"),
    ({"name": "x; drop table items"}, "is not a plain column name"),
    ({"where": "a"}, "--where does not work on public.items"),
    ({"where": "true) ; DROP TABLE items; --"}, "is not one SQL expression"),
    ({"where": "a > 1) OR (a < 1"}, "is not one SQL expression"),
    ({"where": "now() > '2020-01-01'"}, "functions in index predicate must be marked IMMUTABLE"),
]


def test_bad_input_is_one_line_and_changes_nothing(db):
    make_items(db, 10)
    before = (catalogue(db.engine), shape(db.engine))
    for params, says in BAD:  # one database for every case: they change nothing
        with pytest.raises(InvalidParams) as raised:
            submit(db, SubmitRequest("add-index", {"table": "items", "columns": "b", **params}))
        message = str(raised.value)
        assert says in message and "\n" not in message, (params, message)
        assert (catalogue(db.engine), shape(db.engine)) == before, params
    assert scalar(db, "SELECT count(*) FROM {s}.jobs") == 0
