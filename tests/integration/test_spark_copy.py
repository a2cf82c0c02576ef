"""The ``copy`` job type on a real PostgreSQL and a real local SparkSession:
subtasks end to end against a SQL oracle, exact types, idempotent and fenced
batches (DESIGN 3), rollback (DESIGN 8), submit-time validation (DESIGN 11),
and a job through real in-process nodes."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from support import TERMINAL, make_items, rows, scalar, snapshot, table_rows, wait_history, wait_state
from support.spark import JobKind, check_input, make_context

from backfill.copy.batches import CopyConflict, CopyPipeline
from backfill.copy.job import CopyJobType, spec_of
from framework import control, faults
from framework.errors import LeaseLost, Stopped
from framework.submit import SubmitRequest, submit

pytestmark = pytest.mark.spark

JT = CopyJobType()
COPY = JobKind(JT, CopyPipeline, spec_of, {"target_batch_seconds": 0})
SELECTS = ["id", "CAST(a AS bigint) AS a", "upper(b) AS b_up", "concat(b, ':', a) AS bc",
           "a * 2.5 AS x", "c"]
# The same copy in PostgreSQL: what the target must equal.
ORACLE = "SELECT id, a::bigint, upper(b), b || ':' || a, a * 2.5, c FROM items"


def copy_params(**kw) -> dict:
    return {"table": "items", "target": "items_copy", "select": SELECTS, "create_target": True,
            **kw}


# --- end to end -----------------------------------------------------------------


def test_copy_into_a_created_target_equals_the_oracle(spark, target_db):
    make_items(target_db, 12_000, step=3)  # gappy keys 1, 4, 7, ...
    with target_db.begin() as conn:
        conn.execute(sa.text("UPDATE items SET c = 'c' || id WHERE id % 5 = 0"))
    job = COPY.submit(target_db, 201, copy_params(where="a < 80"))
    pipelines = COPY.run_all(target_db, job, 1 + 11_999 * 3)
    assert rows(target_db, "SELECT * FROM items_copy ORDER BY id") == rows(
        target_db, ORACLE + " WHERE a < 80 ORDER BY id")
    assert scalar(target_db, "SELECT count(*) FROM items_copy") > 9_000
    stats = [s for p in pipelines for s in p.stats]
    assert sum(s.scanned for s in stats) == 12_000  # progress counts every source row
    assert sum(s.result for s in stats) == scalar(target_db, "SELECT count(*) FROM items_copy")
    # Types: verbatim columns keep theirs, computed ones get Spark's, mapped.
    assert rows(target_db, """
        SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
        WHERE attrelid = 'items_copy'::regclass AND attnum > 0 ORDER BY attnum""") == [
        ("id", "bigint"), ("a", "bigint"), ("b_up", "text"), ("bc", "text"),
        ("x", "numeric(13,1)"), ("c", "text")]
    assert scalar(target_db, """
        SELECT a.attname FROM pg_index i JOIN pg_attribute a
          ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
        WHERE i.indrelid = 'items_copy'::regclass AND i.indisprimary""") == "id"
    with target_db.begin() as conn:
        JT.advance(conn, job)
    assert scalar(target_db, "SELECT obj_description('items_copy'::regclass, 'pg_class')") is None


def test_copy_into_an_existing_target_converts_types_and_keeps_its_rows(spark, target_db):
    make_items(target_db, 5_000)
    with target_db.begin() as conn:
        conn.execute(sa.text(
            "CREATE TABLE items_copy (id bigint PRIMARY KEY, a numeric(12,2), b_up varchar(40), "
            "note text NOT NULL DEFAULT 'copied', c text)"))
        conn.execute(sa.text("INSERT INTO items_copy VALUES (100001, 1, 'mine', 'app', 'x'), "
                             "(100002, 2, 'mine too', 'app', NULL)"))
    before = snapshot(target_db, "items_copy")
    job = COPY.submit(target_db, 202, {"table": "items", "target": "items_copy",
                                       "select": ["id", "a", "upper(b) AS b_up", "c"]})
    COPY.run_all(target_db, job, 5_000)
    assert rows(target_db, "SELECT * FROM items_copy WHERE id <= 5000 ORDER BY id") == rows(
        target_db, "SELECT id, a::numeric(12,2), upper(b), 'copied', c FROM items ORDER BY id")
    assert snapshot(target_db, "items_copy")[-2:] == before
    spec = spec_of(job)
    assert scalar(target_db, f"SELECT count(*) FROM {spec.keys}") == 5_000
    with target_db.begin() as conn:
        JT.advance(conn, job)
    assert scalar(target_db, "SELECT to_regclass(:t)", t=spec.keys) is None


TYPES = {
    "n": ("numeric", ["1.500", "-12345678901234567890.123456789012345678901", "'NaN'"]),
    "ts": ("timestamp", ["'2024-02-29 23:59:59.999999'"]),
    "tz": ("timestamptz", ["'2024-06-01 12:00:00.5+02'"]),
    "d": ("date", ["'0001-01-01'"]),
    "j": ("jsonb", ["'{\"a\": [1, {\"b\": null}]}'"]),
    "arr": ("int[]", ["'{1,NULL,3}'"]),
    "by": ("bytea", ["'\\x00ff0a'"]),
    "u": ("uuid", ["'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'"]),
    "t": ("text", ["''", "'a,\"b\"\nc'", "'\\N'", "'ünï ✓'"]),
    "f": ("double precision", ["0.1", "'-Infinity'", "5e-324"]),
    "iv": ("interval", ["'1 year 2 days 00:00:01.5'"]),
}


@pytest.mark.parametrize("create", [True, False], ids=["created", "existing"])
def test_verbatim_columns_copy_exactly_for_every_type(spark, target_db, create):
    cols = ", ".join(f"{name} {type_}" for name, (type_, _) in TYPES.items())
    width = max(len(values) for _, values in TYPES.values())
    with target_db.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE items (id int PRIMARY KEY, {cols})"))
        for i in range(width + 1):  # the last row is all NULL
            values = [values[i] if i < len(values) else "NULL" for _, values in TYPES.values()]
            conn.execute(sa.text(f"INSERT INTO items VALUES ({i + 1}, {', '.join(values)})"))
        if not create:
            conn.execute(sa.text(f"CREATE TABLE items_copy (id int PRIMARY KEY, {cols})"))
    job = COPY.submit(target_db, 203, {"table": "items", "target": "items_copy",
                                       "select": ["id", *TYPES], "create_target": create})
    assert all(c["source"] for c in job.params["columns"])
    COPY.run_range(target_db, job, 1, 1, width + 2)
    as_text = ", ".join(f"{name}::text" for name in TYPES)
    assert rows(target_db, f"SELECT id, {as_text} FROM items_copy ORDER BY id") == rows(
        target_db, f"SELECT id, {as_text} FROM items ORDER BY id")


# --- idempotent and fenced batches (DESIGN 3) --------------------------------------


@pytest.mark.parametrize("create", [True, False], ids=["created", "existing"])
def test_running_a_range_twice_is_idempotent(spark, target_db, create):
    make_items(target_db, 4_000)
    if not create:
        with target_db.begin() as conn:
            conn.execute(sa.text("CREATE TABLE items_copy (id bigint PRIMARY KEY, a bigint, "
                                 "b_up text, bc text, x numeric, c text)"))
    job = COPY.submit(target_db, 204, copy_params(create_target=create))
    COPY.run_range(target_db, job, 1, 1, 4_001)
    first = snapshot(target_db, "items_copy")
    with target_db.begin() as conn:  # the source changes; the range is copied again
        conn.execute(sa.text("UPDATE items SET b = b || '!' WHERE id % 3 = 0"))
    again = COPY.run_range(target_db, job, 1, 1, 4_001, epoch=2)
    assert sum(s.result for s in again.stats) == 4_000
    assert snapshot(target_db, "items_copy") == rows(target_db, ORACLE + " ORDER BY id")
    assert snapshot(target_db, "items_copy") != first
    if not create:
        assert scalar(target_db, f"SELECT count(*) FROM {spec_of(job).keys}") == 4_000


def test_lost_lease_mid_run_commits_nothing_more_and_resume_completes(spark, target_db):
    make_items(target_db, 6_000)
    job = COPY.submit(target_db, 205, copy_params(), batch_rows=500)
    # Another worker takes the subtask while the third batch is applying.
    ctx, lease = make_context(target_db, job, 1, 1, 6_001, revoke_at=3)
    with pytest.raises(LeaseLost):
        CopyPipeline(ctx, target_db, spec_of(job)).run()
    committed = lease.attempts[1]
    assert lease.row().curr_key == committed
    assert scalar(target_db, "SELECT max(id) FROM items_copy") == committed - 1
    assert rows(target_db, "SELECT * FROM items_copy ORDER BY id") == rows(
        target_db, ORACLE + " WHERE id < :k ORDER BY id", k=committed)
    # A new claim (epoch 2) resumes from the committed curr_key.
    COPY.run_range(target_db, job, 1, 1, 6_001, curr_key=committed, epoch=2)
    assert snapshot(target_db, "items_copy") == rows(target_db, ORACLE + " ORDER BY id")


def test_hard_stop_cancels_the_subtask_and_commits_nothing_more(spark, target_db):
    make_items(target_db, 40_000)
    job = COPY.submit(target_db, 206, copy_params(), batch_rows=500)
    outcome, lease = COPY.run_until_hard_stop(target_db, job, 1, 40_001)
    assert outcome and isinstance(outcome[0], Stopped | LeaseLost | Exception)
    done = lease.row().curr_key
    assert done < 40_001
    assert scalar(target_db, "SELECT count(*) FROM items_copy WHERE id >= :k", k=done) == 0
    assert scalar(target_db, "SELECT count(*) FROM items_copy") == done - 1


# --- rollback (DESIGN 8) --------------------------------------------------------------


def test_rollback_drops_a_created_target(spark, target_db):
    make_items(target_db, 3_000)
    before = snapshot(target_db)
    job = COPY.submit(target_db, 207, copy_params(), batch_rows=500)
    ctx, lease = make_context(target_db, job, 1, 1, 3_001, revoke_at=3)
    with pytest.raises(LeaseLost):
        CopyPipeline(ctx, target_db, spec_of(job)).run()
    assert scalar(target_db, "SELECT count(*) FROM items_copy") > 0
    COPY.rollback(target_db, job)
    assert scalar(target_db, "SELECT to_regclass('items_copy')") is None
    assert snapshot(target_db) == before  # the source is never written
    COPY.rollback(target_db, job)  # again (an owner retrying): still fine


def test_rollback_leaves_a_table_that_is_not_the_one_the_job_created(spark, target_db):
    make_items(target_db, 100)
    job = COPY.submit(target_db, 208, copy_params())
    with target_db.begin() as conn:  # someone replaced the table meanwhile
        conn.execute(sa.text("DROP TABLE items_copy"))
        conn.execute(sa.text("CREATE TABLE items_copy (id bigint PRIMARY KEY)"))
    COPY.rollback(target_db, job)
    assert scalar(target_db, "SELECT to_regclass('items_copy')") is not None


def test_rollback_of_an_existing_target_removes_exactly_the_copied_rows(spark, target_db):
    make_items(target_db, 5_000, step=2)  # odd keys
    with target_db.begin() as conn:
        conn.execute(sa.text("CREATE TABLE items_copy (id bigint PRIMARY KEY, a int, b text)"))
        # Rows of its own, between and around the keys the copy writes.
        conn.execute(sa.text("INSERT INTO items_copy SELECT g * 2, g, 'own' FROM "
                             "generate_series(0, 5001) g"))
    before = snapshot(target_db, "items_copy")
    job = COPY.submit(target_db, 209, {"table": "items", "target": "items_copy",
                                       "select": ["id", "a", "b"]})
    COPY.run_all(target_db, job, 9_999)
    assert scalar(target_db, "SELECT count(*) FROM items_copy") == len(before) + 5_000
    with target_db.begin() as conn:  # an application write to a row the job did not copy
        conn.execute(sa.text("UPDATE items_copy SET b = 'app' WHERE id = 10"))
    COPY.rollback(target_db, job)
    expected = [r if r[0] != 10 else (10, r[1], "app") for r in before]
    assert snapshot(target_db, "items_copy") == expected
    assert scalar(target_db, "SELECT to_regclass(:t)", t=spec_of(job).keys) is None


def test_a_row_inserted_into_the_target_during_the_copy_stops_it(spark, target_db):
    make_items(target_db, 3_000)
    with target_db.begin() as conn:
        conn.execute(sa.text("CREATE TABLE items_copy (id bigint PRIMARY KEY, a int, b text)"))
    job = COPY.submit(target_db, 210, {"table": "items", "target": "items_copy",
                                       "select": ["id", "a", "b"]}, batch_rows=500)
    with target_db.begin() as conn:  # after submit: an application writes a key the copy will
        conn.execute(sa.text("INSERT INTO items_copy VALUES (1800, -1, 'app')"))
    ctx, lease = make_context(target_db, job, 1, 1, 3_001)
    with pytest.raises(CopyConflict, match="key 1800 already exists"):
        CopyPipeline(ctx, target_db, spec_of(job)).run()
    done = lease.row().curr_key
    assert 1 < done <= 1800
    assert rows(target_db, "SELECT * FROM items_copy WHERE id = 1800") == [(1800, -1, "app")]
    COPY.rollback(target_db, job)
    assert snapshot(target_db, "items_copy") == [(1800, -1, "app")]


# --- validation (DESIGN 11) --------------------------------------------------------


def _existing(**kw) -> dict:
    return {"table": "items", "target": "dst", "select": ["id", "a", "b"], **kw}


@pytest.mark.parametrize(("params", "says"), [
    (copy_params(table="nope"), "does not exist"),
    (copy_params(table="nopk"), "primary key"),
    (copy_params(select=[]), "no --select"),
    (copy_params(target=""), "no --target"),
    (copy_params(select=["id", "upper(b"]), "not a Spark SQL expression"),
    (copy_params(select=["id", "upper(nosuch) AS x"]), "not a Spark SQL expression"),
    (copy_params(select=["a", "b"]), "must copy the key column id"),
    (copy_params(select=["id + 1 AS id", "a"]), "changes the key column"),
    (copy_params(select=["id", "upper(b)"]), "AS name"),
    (copy_params(select=["id", "a", "b AS a"]), "twice"),
    (copy_params(select=["id", "count(*) AS n"]), "per-row"),
    (copy_params(select=["id", "explode(array(a, a)) AS n"]), "per-row"),
    (copy_params(select=["id", "*"]), "gives 4 columns"),
    (copy_params(select=["id", "NULL AS z"]), "has no type"),
    (copy_params(select=["id", "array(a, a) AS arr"]), "cannot create a column"),
    (copy_params(select=["id", "CAST(b AS int) AS bi"]), "sample rows"),
    (copy_params(where="nosuch > 1"), "--where"),
    (copy_params(where="FALSE) OR (a = 1"), "--where 'FALSE) OR (a = 1' is not one SQL"),
    (copy_params(where="TRUE; DELETE FROM items"), "is not one SQL expression"),
    (copy_params(select=["id", "b) FROM items --"]), "is not a Spark SQL expression"),
    (copy_params(select=["id", "a, b"]), "is not a Spark SQL expression"),
    (copy_params(target="dst"), "already exists"),
    (copy_params(target="nosuchschema.t"), "schema nosuchschema does not exist"),
    (copy_params(target="a b"), "SCHEMA"),
    (_existing(target="items"), "is the source table"),
    (_existing(target="missing"), "--create-target"),
    (_existing(target="dst_otherkey"), "primary key (k)"),
    (_existing(select=["id", "a", "b", "c"]), "does not have"),
    (_existing(select=["id", "upper(b) AS a"]), "yields string but column a"),
    (_existing(select=["id", "a * 1.5 AS a", "b"]), "CAST"),
    (_existing(select=["id", "CAST(b AS int) AS a", "b"]), "sample rows"),
    (_existing(select=["id", "a", "concat(b, b, b) AS b"], target="dst_short"), "sample rows"),
    (_existing(target="dst_notnull"), "NOT NULL"),
    (_existing(target="dst_taken"), "already has rows"),
])
def test_bad_input_is_rejected_with_one_line_and_changes_nothing(spark, target_db, params, says):
    make_items(target_db, 200)
    with target_db.begin() as conn:
        conn.execute(sa.text("CREATE TABLE nopk (id int, c text)"))
        conn.execute(sa.text("CREATE TABLE dst (id bigint PRIMARY KEY, a int, b text)"))
        conn.execute(sa.text("CREATE TABLE dst_otherkey (k bigint PRIMARY KEY, id bigint)"))
        conn.execute(sa.text("CREATE TABLE dst_short (id bigint PRIMARY KEY, a int, b varchar(6))"))
        conn.execute(sa.text("CREATE TABLE dst_notnull (id bigint PRIMARY KEY, a int, b text, "
                             "must text NOT NULL)"))
        conn.execute(sa.text("CREATE TABLE dst_taken (id bigint PRIMARY KEY, a int, b text)"))
        conn.execute(sa.text("INSERT INTO dst_taken VALUES (150, 0, 'taken')"))
    COPY.assert_rejected(target_db, params, says)


def test_overlap_check_honours_where(spark, target_db):
    make_items(target_db, 200)
    with target_db.begin() as conn:
        conn.execute(sa.text("CREATE TABLE dst (id bigint PRIMARY KEY, a int, b text)"))
        conn.execute(sa.text("INSERT INTO dst VALUES (150, 0, 'taken')"))
    target = check_input(target_db, JT, _existing(where="id <> 150"))
    assert target.table == '"public"."items"' and target.key_column == '"id"'
    assert target.params["target_table"] == '"public"."dst"'
    assert [c["source"] for c in target.params["columns"]] == ["id", "a", "b"]


# --- through real in-process nodes ------------------------------------------------


@pytest.fixture
def _registered():
    from backfill.copy.job import register

    register()


def test_copy_job_succeeds_on_two_slots(spark, db, start_node, _registered):
    make_items(db, 20_000, step=3)
    job_id = submit(db, SubmitRequest("copy", copy_params(), rows_per_subtask=5_000,
                                      batch_rows=1_000)).job_id
    start_node("n1", slots=2)
    assert wait_state(db, job_id, TERMINAL)["state"] == "succeeded"
    assert table_rows(db, "items_copy") == rows(db, ORACLE + " ORDER BY id")
    wait_history(db, job_id)
    with db.begin() as conn:
        assert conn.execute(sa.text(
            "SELECT obj_description('items_copy'::regclass, 'pg_class')")).scalar() is None
        assert conn.execute(db.sql("SELECT sum(row_count) FROM {s}.background_subtask_history "
                                   "WHERE job_id = :j"), {"j": job_id}).scalar() == 20_000


def test_cancelled_copy_job_removes_exactly_what_it_copied(spark, db, start_node, _registered):
    make_items(db, 20_000)
    with db.begin() as conn:
        conn.execute(sa.text("CREATE TABLE items_copy (id bigint PRIMARY KEY, a int, b text)"))
        conn.execute(sa.text("INSERT INTO items_copy VALUES (30000, 1, 'own'), (0, 2, 'own')"))
    before = table_rows(db, "items_copy")
    job_id = submit(db, SubmitRequest(
        "copy", {"table": "items", "target": "items_copy", "select": ["id", "a", "b"]},
        rows_per_subtask=2_000, batch_rows=200, concurrency=2)).job_id
    faults.arm("worker.after_batch", "block")  # each slot stops after its first batch
    start_node("n1", slots=2)
    faults.wait_blocked("worker.after_batch", 60, count=2)
    assert len(table_rows(db, "items_copy")) > len(before)
    control.cancel(db, job_id)
    faults.release("worker.after_batch")
    done = wait_state(db, job_id, TERMINAL)
    assert done["state"] == "cancelled"
    assert table_rows(db, "items_copy") == before
    # The copied keys were deleted by revert subtasks, one per range that copied.
    assert done["revert_total"] >= 2 and done["revert_done"] == done["revert_total"]
    with db.begin() as conn:
        assert conn.execute(sa.text("SELECT to_regclass(:t)"),
                            {"t": f"reorg.copy_{job_id}_keys"}).scalar() is None


def test_a_copy_whose_source_is_dropped_still_removes_what_it_copied(spark, db, start_node,
                                                                     _registered):
    """Review finding: the revert was skipped when the job's table (the
    source) was gone, though a copy restores its target."""
    make_items(db, 4_000)
    with db.begin() as conn:
        conn.execute(sa.text("CREATE TABLE items_copy (id bigint PRIMARY KEY, a int, b text)"))
        conn.execute(sa.text("INSERT INTO items_copy VALUES (30000, 1, 'own')"))
    before = table_rows(db, "items_copy")
    job_id = submit(db, SubmitRequest(
        "copy", {"table": "items", "target": "items_copy", "select": ["id", "a", "b"]},
        rows_per_subtask=1_000, batch_rows=200, concurrency=1)).job_id
    faults.arm("worker.after_batch", "block")
    start_node("n1", slots=1)
    faults.wait_blocked("worker.after_batch", 60)
    assert len(table_rows(db, "items_copy")) > len(before)
    control.cancel(db, job_id)
    with db.begin() as conn:
        conn.execute(sa.text("DROP TABLE items"))
    faults.release("worker.after_batch")
    assert wait_state(db, job_id, TERMINAL)["state"] == "cancelled"
    assert table_rows(db, "items_copy") == before


def test_a_target_created_by_hand_after_submit_fails_the_job_and_stays(spark, db, start_node,
                                                                       _registered):
    make_items(db, 2_000)
    job_id = submit(db, SubmitRequest("copy", copy_params(), rows_per_subtask=500,
                                      batch_rows=100)).job_id
    with db.begin() as conn:  # someone creates the target, with rows, before the owner prepares
        conn.execute(sa.text("CREATE TABLE items_copy (id bigint PRIMARY KEY, note text)"))
        conn.execute(sa.text("INSERT INTO items_copy VALUES (1, 'theirs'), (5000, 'theirs')"))
    start_node("n1", slots=2)
    final = wait_state(db, job_id, TERMINAL)
    assert final["state"] in ("failed", "reverted"), final
    assert "items_copy already exists" in (final["error"] or ""), final
    assert "--create-target" in final["error"], final
    assert table_rows(db, "items_copy") == [(1, "theirs"), (5000, "theirs")]
    assert final["rows_done"] == 0
