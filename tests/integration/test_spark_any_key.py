"""The Spark job types (``backfill``, ``copy``, ``checksum``, and ``rewrite
--engine spark``) on tables keyed
by anything but one integer column (framework.keys): text, uuid, numeric, a
timestamp, several columns, a unique NOT NULL index. Batches are keyset pages
read by Spark in explicit predicates (backfill.spark.keyset_read); each test
runs the real framework (submit, an in-process node, a real SparkSession) and
asserts the tables' contents. One composite and one text kind per type run in
CI; the other kinds are ``matrix`` entries."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from support import TERMINAL, wait_state
from test_any_key import KINDS, make_table, run

from backfill.checksum.cli import describe
from backfill.checksum.job import register as register_checksum
from backfill.checksum.report import report
from backfill.copy.job import register as register_copy
from backfill.rewrite.job import register as register_rewrite
from backfill.spark_backfill.job import register as register_backfill
from framework import control, faults
from framework.errors import InvalidParams
from framework.keys import decode, shown
from framework.records import Job
from framework.store import history, jobs
from framework.submit import SubmitRequest, submit

pytestmark = pytest.mark.spark

CI_KINDS = ("composite", "text")
ALL_KINDS = [k if k in CI_KINDS else pytest.param(k, marks=pytest.mark.matrix) for k in KINDS]


@pytest.fixture(autouse=True)
def _registered():
    register_backfill()
    register_copy()
    register_checksum()
    register_rewrite()


def rows_of(db, table: str) -> list[tuple]:
    return sorted(map(tuple, run(db, f"SELECT * FROM {table}").all()), key=repr)


def assert_every_range_done_once(db, job_id: int, rows: int) -> None:
    with db.begin() as conn:
        subtasks = history.subtasks_of_job(db, conn, job_id)
    assert sum(s["row_count"] for s in subtasks) == rows  # no batch applied twice
    assert all(s["curr_key"] == s["end_key"] for s in subtasks)


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_backfill_sets_every_row_once_on_any_key(spark, db, start_node, kind):
    make_table(db, kind, 3_000)
    run(db, "ALTER TABLE t ADD COLUMN c text")
    run(db, "UPDATE t SET c = 'old' WHERE v % 4 = 0")
    job_id = submit(db, SubmitRequest("backfill", {"table": "t", "set": "c=concat('v', v)"},
                                      rows_per_subtask=1_000, batch_rows=300)).job_id
    start_node("n1", slots=2)
    job = wait_state(db, job_id, TERMINAL, 180)
    assert job["state"] == "succeeded", job
    assert run(db, "SELECT count(*) FROM t WHERE c IS DISTINCT FROM 'v' || v").scalar_one() == 0
    assert_every_range_done_once(db, job_id, 3_000)
    assert run(db, "SELECT to_regclass(:t)", t=f"reorg.backfill_{job_id}_images").scalar() is None


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_a_rewrite_on_spark_computes_its_column_for_every_row_on_any_key(spark, db, start_node,
                                                                         kind):
    """Rows written during the copy are replayed on Spark by the catch-up,
    rows written just before the swap by its last replay: each row's c is
    its own v's."""
    make_table(db, kind, 3_000)
    faults.arm("worker.after_batch", "block")
    faults.arm("rewrite.before_swap", "block")
    job_id = submit(db, SubmitRequest("rewrite", {
        "table": "t", "alter": "ADD COLUMN c text", "sets": ["c=concat('v', v)"],
        "engine": "spark"}, rows_per_subtask=1_500, batch_rows=750)).job_id
    start_node("n1", slots=2)
    faults.wait_blocked("worker.after_batch", 90)
    run(db, "UPDATE t SET v = v + 100000 WHERE v % 10 = 0")
    faults.release("worker.after_batch")
    faults.wait_blocked("rewrite.before_swap", 120)
    run(db, "UPDATE t SET v = v + 100000 WHERE v % 10 = 5")
    faults.release("rewrite.before_swap")
    job = wait_state(db, job_id, TERMINAL, 180)
    assert job["state"] == "succeeded", job
    assert run(db, "SELECT count(*), count(*) FILTER (WHERE c IS DISTINCT FROM 'v' || v), "
                   "count(*) FILTER (WHERE v > 100000) FROM t").one() == (3_000, 0, 600)


def test_a_retried_backfill_subtask_on_a_text_key_resumes_at_its_checkpoint(spark, db,
                                                                             start_node):
    """A batch that fails retryably (its transaction rolled back) is redone
    by the retried subtask from ``curr_key``, a tuple here: every row is
    right and counted once, none written twice."""
    make_table(db, "text", 3_000)
    run(db, "ALTER TABLE t ADD COLUMN c text")
    faults.arm("spark.before_apply", "retryable@3")  # the third batch fails once
    job_id = submit(db, SubmitRequest("backfill", {"table": "t", "set": "c=concat('v', v)"},
                                      rows_per_subtask=3_000, batch_rows=400)).job_id
    start_node("n1", slots=1, retry_backoff_seconds=0.2)
    assert wait_state(db, job_id, TERMINAL, 180)["state"] == "succeeded"
    assert run(db, "SELECT count(*) FROM t WHERE c IS DISTINCT FROM 'v' || v").scalar_one() == 0
    assert_every_range_done_once(db, job_id, 3_000)
    with db.begin() as conn:
        (subtask,) = history.subtasks_of_job(db, conn, job_id)
    assert subtask["attempts"] >= 2  # it was retried, not run once


@pytest.mark.parametrize("kind", ["composite"])
def test_a_failed_backfill_on_a_composite_key_is_rolled_back_exactly(spark, db, start_node,
                                                                     kind):
    make_table(db, kind, 3_000)
    run(db, "UPDATE t SET v = NULL WHERE n % 10 = 0")  # NULL old values come back too
    before = rows_of(db, "t")
    faults.arm("worker.before_checkpoint", "raise@5")  # fails the job after 4 batches
    job_id = submit(db, SubmitRequest("backfill", {"table": "t", "set": "v=coalesce(v, 0)-1"},
                                      rows_per_subtask=1_000, batch_rows=200)).job_id
    start_node("n1", slots=1, max_attempts=1)
    assert wait_state(db, job_id, TERMINAL, 180)["state"] == "reverted"
    assert rows_of(db, "t") == before


def test_a_cancelled_backfill_on_a_composite_key_restores_the_table(spark, db, start_node):
    make_table(db, "composite", 4_000)
    run(db, "UPDATE t SET v = NULL WHERE n % 7 = 0")
    before = rows_of(db, "t")
    faults.arm("worker.after_batch", "block")  # each slot stops after its first batch
    job_id = submit(db, SubmitRequest("backfill", {"table": "t", "set": "v=v*10"},
                                      rows_per_subtask=1_000, batch_rows=250,
                                      concurrency=2)).job_id
    start_node("n1", slots=2)
    faults.wait_blocked("worker.after_batch", 90, count=2)
    assert rows_of(db, "t") != before  # two batches committed
    control.cancel(db, job_id)
    faults.release("worker.after_batch")
    assert wait_state(db, job_id, TERMINAL, 180)["state"] == "cancelled"
    assert rows_of(db, "t") == before


def test_rows_written_under_a_backfill_batch_on_a_composite_key_are_recomputed(spark, db,
                                                                                start_node):
    """DESIGN 9 on keys of any type: rows the application changes after Spark
    read them are found on every key column, read again by their keys and
    computed from their new values."""
    make_table(db, "composite", 1_000)
    run(db, "ALTER TABLE t ADD COLUMN c text")
    faults.arm("spark.before_apply", "block")
    job_id = submit(db, SubmitRequest("backfill", {"table": "t", "set": "c=concat('v', v)"},
                                      rows_per_subtask=2_000, batch_rows=400)).job_id
    start_node("n1", slots=1)
    faults.wait_blocked("spark.before_apply", 90)
    # The first batch is read (the smallest keys), not yet merged: change some of its rows.
    changed = run(db, "UPDATE t SET v = v + 100000 WHERE (region, n) IN (SELECT region, n "
                      "FROM t ORDER BY region, n LIMIT 50) AND n % 2 = 0").rowcount
    assert changed > 0
    faults.release("spark.before_apply")
    assert wait_state(db, job_id, TERMINAL, 180)["state"] == "succeeded"
    assert run(db, "SELECT count(*) FROM t WHERE c IS DISTINCT FROM 'v' || v").scalar_one() == 0
    assert run(db, "SELECT count(*) FROM t WHERE v > 100000").scalar_one() == changed


def key_columns(kind: str) -> list[str]:
    return list(KINDS[kind][1])


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_copy_into_a_created_target_copies_every_row_on_any_key(spark, db, start_node, kind):
    make_table(db, kind, 3_000)
    keys = key_columns(kind)
    job_id = submit(db, SubmitRequest("copy", {
        "table": "t", "target": "t_copy", "create_target": True,
        "select": [*keys, "v * 2 AS w", "v"]}, rows_per_subtask=1_000, batch_rows=300)).job_id
    start_node("n1", slots=2)
    job = wait_state(db, job_id, TERMINAL, 180)
    assert job["state"] == "succeeded", job
    cols = ", ".join(keys)
    assert rows_of(db, "t_copy") == sorted(
        map(tuple, run(db, f"SELECT {cols}, v * 2, v FROM t").all()), key=repr)
    # The key carried over exactly: the same key, the same primary key columns.
    assert run(db, f"SELECT count(*) FROM t JOIN t_copy USING ({cols})").scalar_one() == 3_000
    assert_every_range_done_once(db, job_id, 3_000)


@pytest.mark.parametrize("kind", ["composite", "text"])
def test_a_cancelled_copy_on_any_key_removes_exactly_what_it_copied(spark, db, start_node,
                                                                     kind):
    make_table(db, kind, 3_000)
    keys = key_columns(kind)
    columns, *_ = KINDS[kind]
    run(db, f"CREATE TABLE t_copy ({columns}, v bigint)")
    # Rows of the target's own, outside the source's keys: they stay.
    run(db, f"INSERT INTO t_copy SELECT {KINDS[kind][3]}, -i FROM generate_series(5001, 5010) i")
    before = rows_of(db, "t_copy")
    faults.arm("worker.after_batch", "block")  # each slot stops after its first batch
    job_id = submit(db, SubmitRequest("copy", {"table": "t", "target": "t_copy",
                                               "select": [*keys, "v"]},
                                      rows_per_subtask=1_000, batch_rows=200,
                                      concurrency=2)).job_id
    start_node("n1", slots=2)
    faults.wait_blocked("worker.after_batch", 90, count=2)
    assert len(rows_of(db, "t_copy")) > len(before)
    control.cancel(db, job_id)
    faults.release("worker.after_batch")
    done = wait_state(db, job_id, TERMINAL, 180)
    assert done["state"] == "cancelled"
    assert rows_of(db, "t_copy") == before
    assert done["revert_total"] >= 2 and done["revert_done"] == done["revert_total"]
    assert run(db, "SELECT to_regclass(:t)", t=f"reorg.copy_{job_id}_keys").scalar() is None


# A key below every key make_table writes, per kind.
BELOW = {"text": "''", "uuid": "'00000000-0000-0000-0000-000000000000'", "numeric": "-99999",
         "timestamptz": "'2000-01-01 00:00:00+00'", "composite": "'', 0",
         "unique-not-null": "''"}


def checksum_report(db, job_id: int) -> dict:
    with db.begin() as conn:
        job = jobs.get(db, conn, job_id)
        assert isinstance(job, Job)
        return report(job, history.subtasks_of_job(db, conn, job_id))


@pytest.mark.parametrize("mode", ["postgres", pytest.param("spark", marks=pytest.mark.matrix)])
@pytest.mark.parametrize("kind", ALL_KINDS)
def test_checksum_finds_exactly_the_differences_on_any_key(spark, db, start_node, kind, mode):
    make_table(db, kind, 3_000)
    keys = key_columns(kind)
    cols = ", ".join(keys)
    columns, *_ = KINDS[kind]
    run(db, f"CREATE TABLE t_copy ({columns}, v bigint)")
    run(db, "INSERT INTO t_copy SELECT * FROM t")
    first, middle, last = (run(db, f"SELECT {cols} FROM t ORDER BY {order} LIMIT 1 OFFSET {at}"
                               ).one() for order, at in
                           ((cols, 0), (cols, 1_500), (", ".join(f"{c} DESC" for c in keys), 0)))
    match = " AND ".join(f"{c} = :{c}" for c in keys)
    run(db, f"UPDATE t_copy SET v = -1 WHERE {match}", **first._asdict())
    run(db, f"DELETE FROM t_copy WHERE {match}", **middle._asdict())  # missing in the target
    run(db, f"DELETE FROM t WHERE {match}", **last._asdict())  # missing in the source
    # Missing in the source, below its smallest key: the first range looks there too.
    run(db, f"INSERT INTO t_copy ({cols}, v) VALUES ({BELOW[kind]}, 0)")
    below = run(db, f"SELECT jsonb_build_array({cols}) FROM t_copy ORDER BY {cols} LIMIT 1"
                ).scalar()
    before = rows_of(db, "t"), rows_of(db, "t_copy")
    job_id = submit(db, SubmitRequest("checksum", {"table": "t", "target": "t_copy",
                                                   "compare_in": mode},
                                      rows_per_subtask=1_000, batch_rows=300)).job_id
    start_node("n1", slots=2)
    assert wait_state(db, job_id, TERMINAL, 180)["state"] == "succeeded"
    assert (rows_of(db, "t"), rows_of(db, "t_copy")) == before  # read-only
    found = checksum_report(db, job_id)
    assert found["complete"] and found["rows_compared"] == 2_999
    assert found["by_kind"] == {"missing_in_target": 1, "missing_in_source": 2, "different": 1}
    # Each finding names its row by the whole key, in the key's stored form.
    with db.begin() as conn:
        stored = {kind_: conn.execute(sa.text(
            f"SELECT jsonb_build_array({cols}) FROM (SELECT {', '.join(f':{c} AS {c}' for c in keys)}"
            ") k"), {c: row._asdict()[c] for c in keys}).scalar() for kind_, row in
            (("different", first), ("missing_in_target", middle),
             ("missing_in_source", last))}
    expected = sorted([*((k, v) for k, v in stored.items()), ("missing_in_source", below)],
                      key=repr)
    assert sorted(((k["kind"], k["key"]) for k in found["keys"]), key=repr) == expected
    # `reorg checksum-report` shows them as keys, not JSON.
    lines = describe(found)
    for kind_, key in expected:
        assert any(line.strip() == f"{shown(decode(key))}  {kind_}" for line in lines), lines


def test_a_batch_of_a_composite_key_is_read_in_keyset_partitions(spark, target_db):
    """The explicit predicates of a batch (keyset_read): every row of
    ``[lo, hi)`` once, in as many JDBC partitions as asked, cut at every
    (rows / parts)-th key, in PostgreSQL's order of the key."""
    from backfill.spark.jdbc import jdbc_target, read_query
    from backfill.spark.keyset_read import partition_cuts, read_batch, text_columns
    from framework.keys import KeySpec

    make_table(target_db, "composite", 3_000)
    key = KeySpec.of(["region", "n"], ["text", "integer"])
    ordered = [tuple(r) for r in run(target_db, "SELECT region, n FROM t ORDER BY region, n")]
    lo, hi = ordered[100], ordered[2_100]  # the batch: 2,000 keys
    with target_db.connect() as conn:
        cuts = partition_cuts(conn, '"public"."t"', key, lo, hi, 2_000, 4)
    assert cuts == [ordered[600], ordered[1_100], ordered[1_600]]
    df = read_batch(spark, jdbc_target(target_db.url), read_query(
        '"public"."t"', None, columns=text_columns(key)), key, lo, hi, cuts)
    assert df.rdd.getNumPartitions() == 4
    assert df.rdd.glom().map(len).collect() == [500, 500, 500, 500]
    read = sorted((r["region"], r["n"]) for r in df.select("region", "n").collect())
    assert read == sorted(ordered[100:2_100])
    # The text of each key column, as staged, parses back to the very key.
    texts = {(r["__reorg_key_0"], r["__reorg_key_1"]) for r in df.collect()}
    assert texts == {(a, str(b)) for a, b in ordered[100:2_100]}


@pytest.mark.parametrize("job_type, params, says", [
    ("copy", {"table": "t", "target": "t_other", "select": ["region", "n", "v"]},
     "target public.t_other is keyed by (region text, n bigint) but public.t by "
     "(region text, n integer); the target needs the same key columns of the same types"),
    ("checksum", {"table": "t", "target": "t_other"},
     "target public.t_other is keyed by (region text, n bigint) but public.t by "
     "(region text, n integer); checksum matches rows on the key, so both need the same "
     "key columns of the same types"),
    ("copy", {"table": "t", "target": "t_copy", "create_target": True,
              "select": ["region", "v"]},
     "--select must copy the key column n unchanged; add --select n"),
    ("backfill", {"table": "t", "set": "n=1"},
     "column n is part of the key (region text, n integer); reorg never rewrites keys"),
])
def test_a_target_keyed_otherwise_is_refused_in_one_line(spark, db, job_type, params, says):
    make_table(db, "composite", 100)
    run(db, "CREATE TABLE t_other (region text, n bigint, v bigint, PRIMARY KEY (region, n))")
    before = rows_of(db, "t"), rows_of(db, "t_other")
    with pytest.raises(InvalidParams) as refused:
        submit(db, SubmitRequest(job_type, params))
    assert str(refused.value) == says
    assert run(db, "SELECT count(*) FROM reorg.jobs").scalar_one() == 0
    assert (rows_of(db, "t"), rows_of(db, "t_other")) == before
    assert run(db, "SELECT to_regclass('t_copy')").scalar() is None


def test_a_row_an_application_writes_into_the_target_stops_a_composite_copy(spark, db,
                                                                             start_node):
    """A key the copy is about to write appears in the existing target (an
    application's row): the copy stops rather than overwrite it, names the
    key, and its rollback leaves that row alone."""
    make_table(db, "composite", 2_000)
    run(db, "CREATE TABLE t_copy (region text, n integer, v bigint, PRIMARY KEY (region, n))")
    job_id = submit(db, SubmitRequest("copy", {"table": "t", "target": "t_copy",
                                               "select": ["region", "n", "v"]},
                                      rows_per_subtask=5_000, batch_rows=200)).job_id
    region, n = run(db, "SELECT region, n FROM t ORDER BY region, n OFFSET 1000 LIMIT 1").one()
    run(db, "INSERT INTO t_copy VALUES (:r, :n, -1)", r=region, n=n)  # after submit
    start_node("n1", slots=1, max_attempts=1)
    job = wait_state(db, job_id, TERMINAL, 180)
    assert job["state"] == "reverted"
    with db.begin() as conn:
        errors = [s["error"] or "" for s in history.subtasks_of_job(db, conn, job_id)]
    assert any(f"key ({region!r}, {n}) already exists in" in e for e in errors), errors
    assert rows_of(db, "t_copy") == [(region, n, -1)]
