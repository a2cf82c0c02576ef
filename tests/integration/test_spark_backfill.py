"""The ``backfill`` job type on a real PostgreSQL and a real local SparkSession:
subtasks end to end, fencing (DESIGN 3), concurrent writers (DESIGN 9),
rollback (DESIGN 8) and submit-time validation (DESIGN 11)."""

from __future__ import annotations

import random
import threading

import pytest
import sqlalchemy as sa
from support import make_items, scalar, snapshot
from support.spark import JobKind, check_input, make_context

from backfill.spark_backfill.batches import SubtaskRunner
from backfill.spark_backfill.job import BackfillJobType, merge_sql, spec_of
from framework.errors import LeaseLost, Stopped

pytestmark = pytest.mark.spark

JT = BackfillJobType()
BACKFILL = JobKind(JT, SubtaskRunner, spec_of)


# --- one subtask end to end ---------------------------------------------------


def test_subtasks_end_to_end_equal_the_oracle(spark, target_db):
    make_items(target_db, 12_000, step=3)  # gappy keys 1, 4, 7, ...
    with target_db.begin() as conn:  # some old values to keep as before-images
        conn.execute(sa.text("UPDATE items SET c = 'orig' || id WHERE id % 5 = 0"))
    # Fixed 1,000-row batches (no adaptive sizing), so each subtask has six.
    job = BACKFILL.submit(target_db, 101, {"table": "items", "set": "c=concat(md5(b), ':', a)",
                                           "target_batch_seconds": 0})
    runners = BACKFILL.run_all(target_db, job, 1 + 11_999 * 3)
    assert scalar(target_db, "SELECT count(*) FROM items WHERE c IS DISTINCT FROM md5(b) || ':' || a") == 0
    stats = [s for r in runners for s in r.stats]
    assert len(stats) == 12
    assert sum(s.rows for s in stats) == 12_000
    with target_db.connect() as conn:
        leases = conn.execute(sa.text("SELECT curr_key, row_count FROM fake_lease ORDER BY 1")).all()
    assert [r.curr_key for r in leases] == [r.ctx.end_key for r in runners]
    assert sum(r.row_count for r in leases) == 12_000
    # Before-images only for non-NULL old values; one batch row per committed batch.
    m = merge_sql(job)
    assert scalar(target_db, f"SELECT count(*) FROM {m.images}") == 12_000 // 5
    assert scalar(target_db, f"SELECT count(*) FROM {m.batches}") == len(stats)


def test_where_and_add_column(spark, target_db):
    make_items(target_db, 3_000)
    job = BACKFILL.submit(target_db, 102, {"table": "items", "set": "d=upper(b)", "where": "a < 50",
                                           "add_column": "d:varchar(40)"})
    BACKFILL.run_all(target_db, job, 3_000)
    assert scalar(target_db, "SELECT count(*) FROM items WHERE a < 50 AND d IS DISTINCT FROM upper(b)") == 0
    assert scalar(target_db, "SELECT count(*) FROM items WHERE a >= 50 AND d IS NOT NULL") == 0


def test_python_udf(spark, target_db):
    make_items(target_db, 2_000)
    job = BACKFILL.submit(target_db, 103, {"table": "items", "set": "c=reverse_text(b)",
                                           "udf": "support.spark:reverse_text"})
    BACKFILL.run_all(target_db, job, 2_000, parts=1)
    assert scalar(target_db, "SELECT count(*) FROM items WHERE c IS DISTINCT FROM reverse(b)") == 0


def test_one_spark_read_of_five_batches_commits_each_batch_with_its_checkpoint(
        spark, target_db, monkeypatch):
    """A read covers ``batches_per_read`` batches; each merges and checkpoints
    alone, at the edges ``bounds`` gives one batch at a time (gappy keys, the
    last remainder under half a batch joining the last batch)."""
    make_items(target_db, 6_300, step=3)  # keys 1, 4, ..., 18,898
    job = BACKFILL.submit(target_db, 109, {"table": "items", "set": "c=md5(b)",
                                           "target_batch_seconds": 0})
    monkeypatch.setattr(SubtaskRunner, "batches_per_read", 5)
    reads: list[int] = []
    real_read = SubtaskRunner._read

    def counted(self, lo, rows):
        batches = real_read(self, lo, rows)
        reads.append(len(batches))
        return batches

    monkeypatch.setattr(SubtaskRunner, "_read", counted)
    ctx, lease = make_context(target_db, job, 1, 1, 18_899)
    runner = SubtaskRunner(ctx, target_db, spec_of(job))
    one_at_a_time, lo = [], 1
    while lo != 18_899:
        lo, n = runner.bounds(lo, 1_000)
        one_at_a_time.append((lo, n))
    runner.run()
    assert reads == [5, 1]  # 6,300 rows: five batches, then the last with its remainder
    assert [(s.hi, s.scanned) for s in runner.stats] == one_at_a_time
    assert one_at_a_time[-1] == (18_899, 1_300)
    assert lease.attempts == [hi for hi, _ in one_at_a_time]  # a checkpoint per batch
    assert lease.row().checkpoints == 6
    assert [s.rows for s in runner.stats] == [n for _, n in one_at_a_time]
    assert scalar(target_db, "SELECT count(*) FROM items WHERE c IS DISTINCT FROM md5(b)") == 0


# --- fencing (DESIGN 3) -------------------------------------------------------


def test_lost_lease_mid_run_leaves_the_batch_uncommitted(spark, target_db):
    make_items(target_db, 8_000)
    job = BACKFILL.submit(target_db, 104, {"table": "items", "set": "c=md5(b)", "target_batch_seconds": 0},
                          batch_rows=500)
    # Another worker takes the subtask while the third batch is merging.
    ctx, lease = make_context(target_db, job, 1, 1, 8_001, revoke_at=3)
    with pytest.raises(LeaseLost):
        SubtaskRunner(ctx, target_db, spec_of(job)).run()
    committed = lease.attempts[1]  # the second batch's upper key: the last committed checkpoint
    assert lease.row().curr_key == committed
    assert scalar(target_db, "SELECT count(*) FROM items WHERE id < :k AND c IS DISTINCT FROM md5(b)",
                  k=committed) == 0
    assert scalar(target_db, "SELECT count(*) FROM items WHERE id >= :k AND c IS NOT NULL",
                  k=committed) == 0
    assert scalar(target_db, f"SELECT count(*) FROM {merge_sql(job).batches}") == 2


def test_resumed_subtask_applies_no_batch_twice(spark, target_db):
    make_items(target_db, 6_000)
    job = BACKFILL.submit(target_db, 105, {"table": "items", "set": "c=concat(coalesce(c, ''), 'x')",
                                           "target_batch_seconds": 0}, batch_rows=500)
    ctx, lease = make_context(target_db, job, 1, 1, 6_001, revoke_at=4)
    with pytest.raises(LeaseLost):
        SubtaskRunner(ctx, target_db, spec_of(job)).run()
    # A new claim (epoch 2) resumes from the committed curr_key.
    resume_at = lease.row().curr_key
    BACKFILL.run_range(target_db, job, 1, 1, 6_001, curr_key=resume_at, epoch=2)
    # Each row gets one 'x'; a batch applied twice would show 'xx'.
    assert scalar(target_db, "SELECT count(*) FROM items WHERE c IS DISTINCT FROM 'x'") == 0


def test_hard_stop_cancels_the_spark_job_and_commits_nothing_more(spark, target_db):
    make_items(target_db, 40_000)
    job = BACKFILL.submit(target_db, 106, {"table": "items", "set": "c=md5(b)"}, batch_rows=500)
    outcome, lease = BACKFILL.run_until_hard_stop(target_db, job, 1, 40_001)
    assert outcome and isinstance(outcome[0], Stopped | LeaseLost | Exception)
    done = lease.row().curr_key
    assert done < 40_001
    assert scalar(target_db, "SELECT count(*) FROM items WHERE id >= :k AND c IS NOT NULL", k=done) == 0
    assert scalar(target_db, "SELECT count(*) FROM items WHERE id < :k AND c IS DISTINCT FROM md5(b)",
                  k=done) == 0


# --- concurrent writers (DESIGN 9) --------------------------------------------


def test_rows_changed_between_read_and_merge_are_recomputed(spark, target_db, monkeypatch):
    """Deterministic: after Spark reads each batch, a writer changes some of its
    rows; twice more during the optimistic rounds; the locked round must win."""
    make_items(target_db, 3_000)
    job = BACKFILL.submit(target_db, 107, {"table": "items", "set": "c=md5(b)"}, batch_rows=1_000)
    writer = sa.create_engine(target_db.url, connect_args={"options": "-c lock_timeout=200"})
    blocked = []

    def write(lo: int, hi: int) -> None:
        try:
            with writer.begin() as conn:
                conn.execute(sa.text(
                    "UPDATE items SET b = b || '+', c = md5(b || '+') "
                    "WHERE id >= :lo AND id < :hi AND id % 7 = 0"), {"lo": lo, "hi": hi})
        except sa.exc.OperationalError:
            blocked.append((lo, hi))  # the locked round holds these rows

    real_read, real_recompute = SubtaskRunner._read, SubtaskRunner._recompute

    def read_then_write(self, lo, rows):
        batches = real_read(self, lo, rows)  # one Spark read: a batch or several
        write(batches[0].lo, batches[-1].hi)
        return batches

    def recompute_then_write(self, conn, round_no):
        staged = real_recompute(self, conn, round_no)
        write(self.ctx.curr_key, self.ctx.end_key)
        return staged

    monkeypatch.setattr(SubtaskRunner, "_read", read_then_write)
    monkeypatch.setattr(SubtaskRunner, "_recompute", recompute_then_write)
    runner = BACKFILL.run_range(target_db, job, 1, 1, 3_001)
    writer.dispose()
    assert scalar(target_db, "SELECT count(*) FROM items WHERE c IS DISTINCT FROM md5(b)") == 0
    assert any(s.rounds >= 3 for s in runner.stats), [s.rounds for s in runner.stats]
    assert blocked, "the locked round should have blocked the writer"


def test_concurrent_writer_never_loses_to_a_stale_read(spark, target_db):
    make_items(target_db, 20_000)
    job = BACKFILL.submit(target_db, 108, {"table": "items", "set": "c=md5(b)"}, batch_rows=1_000)
    stop = threading.Event()
    writes = [0]

    def writer(seed: int) -> None:
        # One row per transaction, as an application would: it can wait for the
        # job's merge but never deadlock with it.
        rng = random.Random(seed)
        eng = sa.create_engine(target_db.url, isolation_level="AUTOCOMMIT")
        with eng.connect() as conn:
            while not stop.is_set():
                k, v = rng.randint(1, 20_000), f"w{rng.random()}"
                conn.execute(sa.text("UPDATE items SET b = :v, c = md5(:v) WHERE id = :k"),
                             {"k": k, "v": v})
                writes[0] += 1
        eng.dispose()

    threads = [threading.Thread(target=writer, args=(seed,)) for seed in range(2)]
    for t in threads:
        t.start()
    try:
        runners = BACKFILL.run_all(target_db, job, 20_000)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert writes[0] > 100
    assert scalar(target_db, "SELECT count(*) FROM items WHERE c IS DISTINCT FROM md5(b)") == 0
    print("recomputed rows:", sum(s.recomputed for r in runners for s in r.stats))


# --- rollback (DESIGN 8) ------------------------------------------------------


def test_rollback_restores_overwritten_values_and_later_writes_win(spark, target_db):
    make_items(target_db, 5_000)
    with target_db.begin() as conn:
        conn.execute(sa.text("UPDATE items SET c = CASE WHEN id % 3 = 0 THEN NULL "
                             "WHEN id % 3 = 1 THEN '' ELSE 'orig ' || id END"))
    before = snapshot(target_db)
    job = BACKFILL.submit(target_db, 109, {"table": "items", "set": "c=md5(b)"})
    BACKFILL.run_all(target_db, job, 5_000)
    with target_db.begin() as conn:  # application writes after the job wrote
        conn.execute(sa.text("UPDATE items SET c = 'app' WHERE id IN (10, 11, 12)"))
    BACKFILL.rollback(target_db, job)
    after = snapshot(target_db)
    expected = [row[:3] + (("app",) if row[0] in (10, 11, 12) else row[3:]) for row in before]
    assert after == expected
    m = merge_sql(job)
    assert scalar(target_db, "SELECT to_regclass(:t)", t=m.images) is None


def test_rollback_mid_run_restores_the_exact_pre_job_contents(spark, target_db):
    make_items(target_db, 6_000)
    with target_db.begin() as conn:
        conn.execute(sa.text("UPDATE items SET c = 'orig ' || id WHERE id % 2 = 0"))
    before = snapshot(target_db)
    job = BACKFILL.submit(target_db, 110, {"table": "items", "set": "c=md5(b)", "target_batch_seconds": 0},
                          batch_rows=500)
    ctx, lease = make_context(target_db, job, 1, 1, 6_001, revoke_at=4)
    with pytest.raises(LeaseLost):
        SubtaskRunner(ctx, target_db, spec_of(job)).run()
    assert snapshot(target_db) != before
    BACKFILL.rollback(target_db, job)
    assert snapshot(target_db) == before


def test_rollback_drops_the_added_column(spark, target_db):
    make_items(target_db, 2_000)
    before = snapshot(target_db)
    job = BACKFILL.submit(target_db, 111, {"table": "items", "set": "d=a * 2", "add_column": "d:bigint"})
    BACKFILL.run_all(target_db, job, 2_000)
    assert scalar(target_db, "SELECT count(*) FROM items WHERE d IS DISTINCT FROM a * 2") == 0
    BACKFILL.rollback(target_db, job)
    assert snapshot(target_db) == before


# --- validation (DESIGN 11) ---------------------------------------------------


@pytest.mark.parametrize(("params", "says"), [
    ({"table": "nope", "set": "c=md5(b)"}, "does not exist"),
    ({"table": "nopk", "set": "c=md5(b)"}, "primary key"),
    ({"table": "items", "set": "zz=md5(b)"}, "zz does not exist"),
    ({"table": "items", "set": "c=md5(b"}, "not a Spark SQL expression"),
    ({"table": "items", "set": "c=md5(nosuch)"}, "not a Spark SQL expression"),
    ({"table": "items", "set": "c=b", "add_column": "c:text"}, "already exists"),
    ({"table": "items", "set": "a=md5(b)"}, "yields string but a is integer"),
    ({"table": "items", "set": "a=a * 2.5"}, "CAST"),
    ({"table": "items", "set": "c=md5(b)", "where": "nosuch > 1"}, "--where"),
    ({"table": "items", "set": "id=id + 1"}, "primary key"),
    ({"table": "items", "set": "d=cast(b AS int)", "add_column": "d:int"}, "sample rows"),
    ({"table": "items", "set": "c=f(b)", "udf": "no_such_module:f"}, "cannot import"),
    ({"table": "items", "set": "c=nosuch_fn(b)"}, "--set c=nosuch_fn(b) is not a Spark SQL"),
    ({"table": "items", "set": "c=b; DROP TABLE items"}, "is not a Spark SQL"),
    ({"table": "items", "set": "d=b", "add_column": "d:int"}, "--set d=b yields string but d is int"),
    ({"table": "items", "set": "c=raise_error('boom')"}, "boom"),
    ({"table": "items", "set": "c=b", "where": "nope >"}, "--where"),
    # User text cannot leave its place (issue 11): a PostgreSQL predicate is
    # one expression; Spark parses --set as one expression of its own.
    ({"table": "items", "set": "c=b", "where": "FALSE) OR (a = 1"},
     "--where 'FALSE) OR (a = 1' is not one SQL expression"),
    ({"table": "items", "set": "c=b", "where": "TRUE; DELETE FROM items"},
     "is not one SQL expression"),
    ({"table": "items", "set": "c=b", "where": "a = 1 OR $$"}, "is not one SQL expression"),
    ({"table": "items", "set": "c=1) FROM items --"}, "is not a Spark SQL expression"),
    ({"table": "items", "set": "c=b, a"}, "is not a Spark SQL expression"),
])
def test_bad_input_is_rejected_with_one_line_and_changes_nothing(spark, target_db, params, says):
    make_items(target_db, 200)
    with target_db.begin() as conn:
        conn.execute(sa.text("CREATE TABLE nopk (id int, c text)"))
    BACKFILL.assert_rejected(target_db, params, says)


def test_validate_normalises_params(spark, target_db):
    make_items(target_db, 10)
    target = check_input(target_db, JT, {"table": "items", "set": "c = md5(b)", "where": " a > 1 "})
    assert target.table == '"public"."items"' and target.key_column == '"id"'
    assert target.params["column"] == "c" and target.params["expr"] == "md5(b)"
    assert target.params["where"] == "a > 1" and target.params["overwrite"] is True


# Validates in a fresh process (Spark not started yet) and records whether the
# validation connection had a transaction open while Spark started.
_VALIDATE_COLD = """
import sys
import psycopg
import sqlalchemy as sa
from backfill.spark_backfill.job import BackfillJobType
from backfill.spark import session
from framework.db import sqlalchemy_url
from framework.records import Job

engine = sa.create_engine(sqlalchemy_url(sys.argv[1]))
jt = BackfillJobType()
with engine.connect() as conn, conn.begin() as tx:
    target = jt.validate(conn, {"table": "items", "set": "c=md5(b)"})
    tx.rollback()
job = Job(id=0, type="backfill", state="queued", step=0, params=target.params,
          target_table=target.table, key_column=target.key_column, batch_rows=1000,
          max_rows_per_sec=None, row_estimate=None)
# The analysis (Spark) runs in a transaction of its own, as reorg submit runs it.
with engine.connect() as conn, conn.begin() as tx:
    start = session.get_validation_spark
    def watched():
        if not session.started():
            status = conn.connection.driver_connection.info.transaction_status
            print("transaction open while Spark started:",
                  status != psycopg.pq.TransactionStatus.IDLE)
        return start()
    session.get_validation_spark = watched
    params = jt.analyse(conn, job)
    tx.rollback()
print("valid:", params["column"])
"""


@pytest.mark.matrix  # a cold Python and JVM of its own
def test_spark_starts_before_the_validation_transaction_opens(target_db, fresh_db):
    """Starting Spark takes seconds (a minute when the JDBC driver is
    downloaded); inside the validation transaction it would leave that
    transaction idle until idle_in_transaction_session_timeout ends the
    session, and a good expression would be rejected."""
    import subprocess
    import sys
    from pathlib import Path

    make_items(target_db, 100)
    done = subprocess.run([sys.executable, "-c", _VALIDATE_COLD, fresh_db],
                          cwd=Path(__file__).resolve().parents[2], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["transaction open while Spark started: False",
                                           "valid: c"], done.stdout
