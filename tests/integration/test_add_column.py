"""``add-column`` on in-process nodes, with an application inserting,
updating and deleting rows the whole time (support.app_model): every row, old or
written during the job, gets --value; the default and NOT NULL arrive at
the cut-over without a scan under a long lock; cancel in each state, and a
--value that gives NULL under --not-null, leave the table exactly as
before; bad input is one line and changes nothing."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from support import catalogue, job_of, make_items, rows, scalar, wait_state, wait_until
from support.app_model import Application, data, shape

from framework import control, faults
from framework.errors import InvalidParams
from framework.submit import SubmitRequest, submit

# Depends on the catalog or on lock levels: run on every supported major (README).
pytestmark = pytest.mark.catalog

VALUE = "md5(b || '/' || a)"


def add_column(column: str = "d:text", value: str = VALUE, **params) -> SubmitRequest:
    knobs = {k: params.pop(k) for k in ("batch_rows", "rows_per_subtask", "dry_run",
                                        "max_rows_per_sec") if k in params}
    return SubmitRequest("add-column", {"table": "items", "column": column, "value": value,
                                        **params}, **knobs)


def _triggers_of(job_id: int) -> list[tuple[str]]:
    """The job's triggers, in the order they fire (backfill.add_column.ddl)."""
    return [(f"~reorg_{job_id}_add_column_{role}",) for role in (
        "1_written", "2_changed", "2_deleted", "2_given", "3_fill", "3_fill_new")]


def _wrong_rows(db) -> int:
    return scalar(db, f"SELECT count(*) FROM items WHERE d IS DISTINCT FROM {VALUE}")


def test_every_row_gets_the_value_then_the_default_and_not_null(db, start_node):
    make_items(db, 3_000)
    with Application(db.engine) as app:
        job_id = submit(db, add_column(default="'none'", not_null=True, rows_per_subtask=500,
                                       batch_rows=100, max_rows_per_sec=6_000)).job_id
        start_node("n1", slots=2)
        done = wait_state(db, job_id)
        app.wait_writes(40)  # after the cut-over: the default, no trigger
    assert done["state"] == "succeeded", done["error"]
    assert done["schema_state"] == "public" and done["percent"] == 100.0
    assert not app.errors
    assert data(db.engine) == app.expected()
    # Rows the application inserted or updated during the job (updates of `a`
    # or of `b`, each a column --value reads, and updates that change neither
    # column's value) hold the value, as do the rows the backfill filled.
    # After the cut-over there is no trigger: rows written since (stamped
    # later than the job's end) keep what they had, or the default if new.
    cut_over = "(SELECT finished_at FROM {s}.jobs WHERE id = :j)"
    assert scalar(db, f"SELECT count(*) FROM items WHERE d IS DISTINCT FROM {VALUE} "
                      f"AND (c IS NULL OR c::timestamptz < {cut_over})", j=job_id) == 0
    assert scalar(db, f"SELECT count(*) FROM items WHERE c::timestamptz > {cut_over} "
                      "AND d = 'none'", j=job_id) > 0
    after = shape(db.engine)
    assert ("d", "text", True, "'none'::text") in after["columns"]
    # PostgreSQL 18 lists NOT NULL among the constraints too (items_d_not_null,
    # as a plain SET NOT NULL names it); the columns above say it on every major.
    assert [c for c in after["constraints"] if not c[1].startswith("NOT NULL ")] == [
        ("items_pkey", "PRIMARY KEY (id)", True)]
    assert after["triggers"] == [] and after["functions"] == [] and after["work_tables"] == []
    steps = [e["detail"] for e in control.events(db, job_id) if "step" in (e["detail"] or "")]
    assert steps[0].startswith("step 1/2 backfill: ")
    assert steps[1].startswith("step backfill done")
    assert "step 2/2 not-null: 1 subtask" in steps[1]


def test_without_not_null_the_column_stays_nullable_and_the_not_null_step_is_empty(
        db, start_node):
    make_items(db, 500)
    job_id = submit(db, add_column(rows_per_subtask=100)).job_id
    start_node("n1", slots=2)
    done = wait_state(db, job_id)
    assert done["state"] == "succeeded", done["error"]
    assert _wrong_rows(db) == 0
    assert ("d", "text", False, None) in shape(db.engine)["columns"]
    assert shape(db.engine)["triggers"] == []


@pytest.mark.parametrize("step", ["backfill", "not-null"])
def test_cancel_in_each_state_leaves_the_table_exactly_as_before(db, start_node, step):
    make_items(db, 2_000)
    before = shape(db.engine)
    with Application(db.engine) as app:
        # Held at a batch of the backfill, or in the not-null step's VALIDATE
        # transaction, just before its checkpoint.
        point = "worker.after_batch" if step == "backfill" else "worker.before_checkpoint"
        if step == "not-null":
            faults.arm("owner.after_next_step", "block")
        else:
            faults.arm(point, "block")
        job_id = submit(db, add_column(default="'x'", not_null=True, rows_per_subtask=500,
                                       batch_rows=100)).job_id
        start_node("n1", slots=2)
        if step == "not-null":
            faults.wait_blocked("owner.after_next_step", 60)
            faults.arm(point, "block")
            faults.release("owner.after_next_step")
        faults.wait_blocked(point, 60)
        job = job_of(db, job_id)
        assert job["step_name"] == step and job["schema_state"] == "write-reorg"
        app.wait_writes(10)  # through the trigger, and the check in the not-null step
        control.cancel(db, job_id)
        faults.release(point)
        done = wait_state(db, job_id)
        app.wait_writes(10)
    assert done["state"] == "cancelled", done["error"]
    assert shape(db.engine) == before
    assert not app.errors and data(db.engine) == app.expected()


def test_a_value_that_is_null_somewhere_fails_the_not_null_step_and_rolls_back(
        db, start_node):
    make_items(db, 1_000)
    before, table = shape(db.engine), data(db.engine)
    job_id = submit(db, add_column(value="CASE WHEN id = 777 THEN NULL ELSE b END",
                                   not_null=True, rows_per_subtask=250)).job_id
    start_node("n1", slots=2)
    done = wait_state(db, job_id)
    assert done["state"] == "reverted"
    assert "column d is NULL in some rows (e.g. key 777)" in done["error"]
    assert shape(db.engine) == before and data(db.engine) == table


def test_a_value_that_fails_on_a_row_fails_the_backfill_and_rolls_back(db, start_node):
    make_items(db, 1_000)
    before, table = shape(db.engine), data(db.engine)
    job_id = submit(db, add_column(column="d:int", value="CASE WHEN id = 333 THEN b::int "
                                                         "ELSE id END",
                                   rows_per_subtask=250)).job_id
    start_node("n1", slots=2)
    done = wait_state(db, job_id)
    assert done["state"] == "reverted"
    assert 'invalid input syntax for type integer: "v333"' in done["error"]
    # It never left the backfill: no subtask of the not-null step was made.
    assert 2 not in {r[0] for r in rows(
        db, "SELECT step FROM {s}.background_subtask WHERE job_id = :j UNION ALL "
            "SELECT step FROM {s}.background_subtask_history WHERE job_id = :j", j=job_id)}
    assert shape(db.engine) == before and data(db.engine) == table


def test_dry_run_changes_nothing_and_describes_each_state(db):
    make_items(db, 100)
    before = shape(db.engine)
    result = submit(db, add_column(default="'x'", not_null=True, dry_run=True))
    assert result.job_id is None and result.plan is not None
    assert result.notes[0] == 'prepare (write-only): ALTER TABLE "public"."items" ADD COLUMN "d" text'
    assert any(line.startswith("not-null (write-reorg): ALTER TABLE") and "VALIDATE" in line
               for line in result.notes)
    assert 'cut-over (public): ALTER TABLE "public"."items" ALTER COLUMN "d" SET NOT NULL' in (
        result.notes)
    assert shape(db.engine) == before
    assert scalar(db, "SELECT count(*) FROM {s}.jobs") == 0


BAD = [
    ({"table": "nope"}, "table 'nope' does not exist"),
    ({"column": "d"}, "--column 'd' is not COLUMN:TYPE"),
    ({"column": "b:text"}, "column b already exists in public.items"),
    ({"column": "d:nosuchtype"}, "type 'nosuchtype' is not a PostgreSQL type"),
    ({"column": "d;drop table items:text"}, "is not a plain column name"),
    ({"value": "zz + 1"}, "--value 'zz + 1' does not work on public.items"),
    ({"value": "b", "column": "d:int"}, "--value 'b' does not work on public.items"),
    ({"value": "1); DROP TABLE items; --"}, "is not one SQL expression"),
    ({"value": "'$reorg_body$'"}, "--value must not contain $reorg_body$"),
    ({"default": "b"}, "--default 'b' does not work for d text"),
    ({"default": "(SELECT 1"}, "--default '(SELECT 1' is not one SQL expression"),
]


def test_bad_input_is_one_line_and_changes_nothing(db):
    make_items(db, 10)
    before = (catalogue(db.engine), shape(db.engine), rows(db, "SELECT * FROM items ORDER BY 1"))
    for params, says in BAD:  # one database for every case: they change nothing
        with pytest.raises(InvalidParams) as raised:
            submit(db, add_column(**params))
        message = str(raised.value)
        assert says in message and "\n" not in message, (params, message)
        assert (catalogue(db.engine), shape(db.engine),
                rows(db, "SELECT * FROM items ORDER BY 1")) == before, params
    assert scalar(db, "SELECT count(*) FROM {s}.jobs") == 0


def test_a_cut_over_that_meets_a_lock_is_retried_the_trigger_still_in_place(db, start_node):
    make_items(db, 300)
    faults.arm("owner.before_cutover", "block")
    job_id = submit(db, add_column(default="'x'", not_null=True, rows_per_subtask=100)).job_id
    start_node("n1", slots=2)
    faults.wait_blocked("owner.before_cutover", 60)
    with db.engine.connect() as app, app.begin():
        # An application transaction holding the table: the cut-over waits
        # its bounded lock_timeout, gives up, and is tried again later.
        app.execute(sa.text("LOCK TABLE items IN ACCESS SHARE MODE"))
        faults.release("owner.before_cutover")
        job = wait_until(lambda: "lock timeout" in ((j := job_of(db, job_id))["error"] or "")
                         and j, 60, "the cut-over to time out on the lock")
        assert job["state"] == "running" and job["step_name"] == "not-null"
        # Nothing of the cut-over applied: the trigger on, the column nullable.
        now = shape(db.engine)
        assert now["triggers"] == _triggers_of(job_id)
        assert ("d", "text", False, None) in now["columns"]
    done = wait_state(db, job_id)
    assert done["state"] == "succeeded" and done["error"] is None
    assert ("d", "text", True, "'x'::text") in shape(db.engine)["columns"]
    assert _wrong_rows(db) == 0
