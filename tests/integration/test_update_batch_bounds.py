"""Where an sql-update / add-column batch ends on a single integer key
(``backfill.update_batch``): ``[curr, curr + n)`` without a key scan while
the keys are dense, the bound found inside the batch's own statement where
they are sparse. Either way the batches tile each range exactly: every row
is written once, by one batch of at most ``--batch-rows`` rows, and no
separate key-scan statement runs."""

from __future__ import annotations

from collections import Counter

import pytest
import sqlalchemy as sa
from support import TERMINAL, rows, wait_state, wait_until

from framework import faults
from framework.store import subtasks
from framework.submit import SubmitRequest, submit

BATCH = 50


def run(db, sql, **params):
    with db.begin() as conn:
        return conn.execute(sa.text(sql), params)


def make_mixed(db) -> list[int]:
    """t(id, b, c): ids 1..700 dense, then every 37th id to ~40,000 (sparse),
    a gap, then 100,001..100,300 dense again. c holds old values. Every
    UPDATE of a row is logged with its transaction (a trigger), so a test
    sees each write and which batch made it."""
    ids = [*range(1, 701), *range(737, 40_000, 37), *range(100_001, 100_301)]
    run(db, "CREATE TABLE t (id bigint PRIMARY KEY, b text, c text)")
    run(db, "INSERT INTO t SELECT i, 'v' || i, 'old ' || i FROM unnest(CAST(:ids AS bigint[])) i",
        ids=ids)
    run(db, "CREATE TABLE writes (id bigint, xid xid8)")
    run(db, """CREATE FUNCTION log_write() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN INSERT INTO writes VALUES (NEW.id, pg_current_xact_id()); RETURN NEW; END $$""")
    run(db, "CREATE TRIGGER log_write AFTER UPDATE ON t FOR EACH ROW EXECUTE FUNCTION log_write()")
    run(db, "ANALYZE t")
    return ids


def capture(db, statements: list[str]):
    def on_execute(conn, cursor, statement, parameters, context, executemany):
        statements.append(statement)
    # Every engine's: the node's workers have their own.
    sa.event.listen(sa.engine.Engine, "before_cursor_execute", on_execute)
    return lambda: sa.event.remove(sa.engine.Engine, "before_cursor_execute", on_execute)


@pytest.mark.parametrize("mode", ["overwrite", "add-column", "where"])
def test_batches_tile_dense_and_sparse_keys_each_row_written_once(db, start_node, mode):
    ids = make_mixed(db)
    column, params = "c", {"set": "c=md5(b)"}
    if mode == "add-column":
        column, params = "d", {"set": "d=md5(b)", "add_column": "d:text"}
    elif mode == "where":
        params = {"set": "c=md5(b)", "where": "id % 2 = 0"}
    statements: list[str] = []
    stop = capture(db, statements)
    try:
        job_id = submit(db, SubmitRequest("sql-update", {"table": "t", **params},
                                          rows_per_subtask=600, batch_rows=BATCH)).job_id
        start_node("n1")
        assert wait_state(db, job_id, TERMINAL)["state"] == "succeeded"
    finally:
        stop()

    expected = [i for i in ids if mode != "where" or i % 2 == 0]
    written = rows(db.engine, "SELECT id, xid FROM writes ORDER BY id")
    assert Counter(i for i, _ in written) == Counter(expected)  # each row once, none else
    # Quick subtasks' first batches may share a transaction (WorkerPool.
    # _run_grouped): a batch is a transaction's rows within one subtask.
    ranges = rows(db.engine, f"""
        SELECT CAST(start_key AS bigint), CAST(end_key AS bigint) FROM (
            SELECT start_key, end_key FROM {db.schema}.background_subtask WHERE job_id = :j
            UNION ALL SELECT start_key, end_key FROM {db.schema}.background_subtask_history
            WHERE job_id = :j) r""", j=job_id)
    per_batch = Counter((xid, next(lo for lo, hi in ranges if lo <= i < hi))
                        for i, xid in written)
    assert max(per_batch.values()) <= BATCH  # no batch over --batch-rows
    # Sparse keys did not shrink batches to a few rows each: the rows of the
    # sparse stretch went in batches of about BATCH rows (a bound scanned).
    assert len(per_batch) <= len(expected) / BATCH * 1.6 + 30
    values = dict(rows(db.engine, f"SELECT id, {column} FROM t"))
    for i in ids:
        want = "old " + str(i) if mode == "where" and i % 2 else None
        assert values[i] == want if want else values[i] is not None

    updates = [s for s in statements if "UPDATE \"public\".\"t\"" in s]
    assert any("reorg_bound" in s for s in updates)  # the sparse stretch
    if mode != "where":  # dense stretches: no key scan at all
        assert any("reorg_bound" not in s for s in updates)
    assert not [s for s in statements if "SELECT max(k), count(*)" in s]  # no scan statement


def test_a_rollback_after_both_kinds_of_batch_restores_every_row(db, start_node):
    """The batch records of both kinds of bound tile what was written: the
    job fails after 30 batches, dense and sparse ones, and its rollback gives
    every row its old value back."""
    ids = make_mixed(db)
    faults.arm("worker.before_checkpoint", "raise@31")  # fails the job after batch 30
    job_id = submit(db, SubmitRequest("sql-update", {"table": "t", "set": "c=md5(b)"},
                                      rows_per_subtask=600, batch_rows=BATCH)).job_id
    start_node("n1")
    assert wait_state(db, job_id, TERMINAL)["state"] == "reverted"
    assert len({x for _, x in rows(db.engine, "SELECT id, xid FROM writes")}) >= 30
    assert rows(db.engine, "SELECT id, c FROM t ORDER BY id") == [(i, f"old {i}") for i in ids]


@pytest.mark.parametrize("mode", ["overwrite", "add-column"])
def test_a_batch_taken_over_before_its_checkpoint_commits_nothing(db, start_node, mode):
    """A worker whose subtask was taken over while its second batch ran finds
    that batch's checkpoint refused: the batch's rows (and, overwriting, its
    images) roll back with it, and the new holder's lease and progress stand
    (DESIGN 2, 3)."""
    run(db, "CREATE TABLE t (id bigint PRIMARY KEY, b text, c text)")
    run(db, "INSERT INTO t SELECT i, 'v' || i, 'old' FROM generate_series(1, 500) i")
    params = {"table": "t", "set": "c=md5(b)"}
    written = "c <> 'old'"
    if mode == "add-column":
        params, written = {"table": "t", "set": "d=md5(b)", "add_column": "d:text"}, "d IS NOT NULL"
    taken = _batch_two_fenced_out(db, start_node, params)
    assert rows(db.engine, f"SELECT min(id), max(id), count(*) FROM t WHERE {written}") == [
        (1, BATCH, BATCH)]  # batch 2 wrote its rows, then its checkpoint was refused
    assert rows(db.engine, f"""SELECT CAST(curr_key AS bigint), exec_id, row_count
                               FROM {db.schema}.background_subtask WHERE id = :i""",
                i=taken.id) == [(1 + BATCH, "w2", BATCH)]


def _batch_two_fenced_out(db, start_node, params: dict[str, str]):
    """A one-slot node runs the sql-update job of ``params``; before its
    second batch's checkpoint its lease runs out and another worker (``w2``)
    claims the subtask. Returns w2's claim, once the node has given the
    subtask up after one batch."""
    faults.arm("worker.before_checkpoint", "block@2")  # batch 2 written, not checkpointed
    try:
        job_id = submit(db, SubmitRequest("sql-update", params, rows_per_subtask=10_000,
                                          batch_rows=BATCH)).job_id
        node = start_node("n1", slots=1, lease_seconds=120)  # no renewal meanwhile
        faults.wait_blocked("worker.before_checkpoint", timeout=60)
        with db.begin() as conn:  # its lease runs out; another worker claims it
            conn.execute(db.sql("UPDATE {s}.background_subtask SET exec_expired = "
                                "clock_timestamp() - interval '1s' WHERE job_id = :j"),
                         {"j": job_id})
        with db.begin() as conn:
            taken = subtasks.claim(db, conn, "w2")
        assert len(taken) == 1 and taken[0].curr_key == 1 + BATCH
        faults.release("worker.before_checkpoint")
        wait_until(lambda: any(r.subtask_id == taken[0].id for r in node.pool.results),
                   timeout=60, message="the fenced-out batch to end")
    finally:
        faults.disarm_all()
    result = next(r for r in node.pool.results if r.subtask_id == taken[0].id)
    assert (result.outcome, result.batches) == ("lost", 1)
    return taken[0]
