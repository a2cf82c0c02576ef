"""Jobs of several forward steps, on in-process nodes, with the worked example
``test-fill-verify`` (fill → verify → index → cut-over, tests/support/fill.py):
the owner moves a job step by step, only when every subtask of the step
succeeded (DESIGN 7); a failed subtask never lets the job leave its step; a
cancel in a later step restores what every earlier step wrote; a cut-over
that meets a lock is retried, the job staying running; status names the step."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from support import fill, job_of, make_items, scalar, table_rows, wait_state, wait_until

from cli.progress import status_table
from framework import control, faults
from framework import owner as owner_module
from framework.records import STEP_REVERT
from framework.submit import submit

SUBTASK_ROWS = """
    SELECT step, ordinal, state, start_key, end_key, curr_key, row_count, started_at,
           finished_at, meta
    FROM {s}.%s WHERE job_id = :j"""


def _subtasks(db, job_id: int) -> list[dict]:
    """Every subtask of the job, live and moved, in step and range order."""
    # One statement, one snapshot: a history move meanwhile cannot show a row twice.
    statement = (SUBTASK_ROWS % "background_subtask" + " UNION ALL "
                 + SUBTASK_ROWS % "background_subtask_history" + " ORDER BY step, ordinal")
    with db.begin() as conn:
        return [dict(r) for r in conn.execute(db.sql(statement), {"j": job_id}).mappings()]


def _column_comment(db, column: str = "d") -> str | None:
    return scalar(db, "SELECT col_description('items'::regclass, attnum) FROM pg_attribute "
                      "WHERE attrelid = 'items'::regclass AND attname = :c", c=column)


def _index_valid(db, name: str) -> bool | None:
    return scalar(db, "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:n)",
                  n=name)


def _index(job_id: int) -> str:
    return f"reorg_{job_id}_d_idx"  # support.fill.index_name


def _counting_ticks(node) -> list[object]:
    """The owner's ticks as they end (a test waits for N more ticks, not for time)."""
    ticks: list[object] = []
    tick = node.owner.tick

    def counted():
        result = tick()
        ticks.append(result)
        return result

    node.owner.tick = counted
    return ticks


def _hold_the_verify_step(start_node, count: int = 1) -> None:
    """Run the fill step, then hold ``count`` verify subtasks at their first
    batch. The hold is armed while the owner's transaction that enters the
    verify step is still open, so no verify batch can have run before it."""
    faults.arm("owner.after_next_step", "block")
    start_node("n1", slots=2)
    faults.wait_blocked("owner.after_next_step", 60)
    faults.arm("worker.after_batch", "block")
    faults.release("owner.after_next_step")
    faults.wait_blocked("worker.after_batch", 30, count=count)


# The owner's chunk of ranges a tick: all at once, and 3 a tick (a step's
# split and the revert's ranges then span several ticks).
CHUNKS = pytest.mark.parametrize("chunk", [owner_module.SPLIT_CHUNK, 3])


@CHUNKS
def test_a_job_of_several_steps_runs_them_in_order_each_after_the_last_completed(
        db, start_node, monkeypatch, chunk):
    monkeypatch.setattr(owner_module, "SPLIT_CHUNK", chunk)
    make_items(db, 1_000)
    job_id = submit(db, fill("md5(b)", steps=True, rows_per_subtask=100, batch_rows=50)).job_id
    start_node("n1", slots=2)
    done = wait_state(db, job_id)
    assert done["state"] == "succeeded", done["error"]
    assert done["step"] == 4 and done["step_name"] is None and done["step_count"] == 3
    assert done["percent"] == 100.0 and done["schema_state"] == "public"
    assert done["error"] is None
    # Every step did its work: the column filled and checked, the index built
    # (valid), the cut-over's DDL ran (after enter_step's of steps 2 and 3).
    assert scalar(db, "SELECT count(*) FROM items WHERE d IS DISTINCT FROM md5(b)") == 0
    assert _index_valid(db, _index(job_id)) is True
    assert _column_comment(db) == "public"
    subtasks = _subtasks(db, job_id)
    by_step = {s: [r for r in subtasks if r["step"] == s] for s in (1, 2, 3)}
    assert [len(by_step[s]) for s in (1, 2, 3)] == [10, 10, 1]
    assert all(r["state"] == "succeeded" for r in subtasks)
    # Each range step covers the key space (DESIGN 5) and counts each row once.
    for step in (1, 2):
        ranges = [(r["start_key"], r["end_key"]) for r in by_step[step]]
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
        assert ranges[0][0] <= 1 and ranges[-1][1] > 1_000
        assert sum(r["row_count"] for r in by_step[step]) == 1_000
    assert by_step[3][0]["meta"] == {"index": _index(job_id)}
    # DESIGN 7: no subtask of a step started before every subtask of the step
    # before it had finished (database clock, one snapshot each).
    for step in (2, 3):
        assert (min(r["started_at"] for r in by_step[step])
                >= max(r["finished_at"] for r in by_step[step - 1]))
    entered = [e["detail"] for e in control.events(db, job_id) if "step" in (e["detail"] or "")]
    assert entered[0].startswith("step 1/3 fill: 10 subtasks")
    assert entered[1].startswith("step fill done; step 2/3 verify: 10 subtasks")
    assert entered[2].startswith("step verify done; step 3/3 index: 1 subtask")
    # The events say what changed: the state, or (state kept) the step.
    assert [(e["from_state"], e["to_state"]) for e in control.events(db, job_id)] == [
        (None, "queued"), ("queued", "running"), ("step fill", "step verify"),
        ("step verify", "step index"), ("running", "succeeded")]


def test_a_failed_subtask_keeps_the_job_in_its_step_and_the_rollback_restores_the_table(
        db, start_node):
    make_items(db, 600)
    before = table_rows(db)
    # One row fails the fill for good (division by zero is not retryable).
    bad = "CASE WHEN id = 333 THEN (1 / (id - 333))::text ELSE md5(b) END"
    job_id = submit(db, fill(bad, steps=True, revert_ranges=True, rows_per_subtask=100,
                             batch_rows=50)).job_id
    start_node("n1", slots=2)
    done = wait_state(db, job_id)
    assert done["state"] == "reverted"
    assert "division by zero" in done["error"]
    subtasks = _subtasks(db, job_id)
    # The job never left step 1: no subtask of step 2 or 3 was ever inserted.
    assert {r["step"] for r in subtasks} == {1, STEP_REVERT}
    assert any(r["state"] == "failed" for r in subtasks if r["step"] == 1)
    assert table_rows(db) == before  # column dropped, nothing else changed
    assert done["schema_state"] is None


def test_the_owner_never_advances_a_step_while_one_of_its_subtasks_is_unfinished(
        db, start_node):
    make_items(db, 1_000)
    # One slot's subtask holds at its first batch; the other slot does the rest.
    faults.arm("worker.after_batch", "block@1")
    job_id = submit(db, fill("md5(b)", steps=True, rows_per_subtask=100, batch_rows=50)).job_id
    node = start_node("n1", slots=2)
    ticks = _counting_ticks(node)
    faults.wait_blocked("worker.after_batch", 30)
    wait_until(lambda: job_of(db, job_id)["succeeded"] == 9, 60, "9 of 10 subtasks to succeed")
    seen = len(ticks)
    wait_until(lambda: len(ticks) >= seen + 5, 30, "five more owner ticks")
    job = job_of(db, job_id)
    assert job["state"] == "running" and job["step"] == 1 and job["step_name"] == "fill"
    assert {r["step"] for r in _subtasks(db, job_id)} == {1}
    faults.release("worker.after_batch")
    assert wait_state(db, job_id)["state"] == "succeeded"


@CHUNKS
def test_cancel_in_a_later_step_restores_the_ranges_of_the_step_that_wrote(
        db, start_node, monkeypatch, chunk):
    monkeypatch.setattr(owner_module, "SPLIT_CHUNK", chunk)
    # Revert ranges of at most 100 rows: one per range of the fill here, so
    # the revert step's ranges go in chunks (chunk 3) as a big one's do.
    monkeypatch.setattr(owner_module, "REVERT_ROWS_PER_RANGE", 100)
    make_items(db, 1_000)
    before = table_rows(db)
    job_id = submit(db, fill("md5(b)", steps=True, revert_ranges=True, rows_per_subtask=100,
                             batch_rows=20)).job_id
    _hold_the_verify_step(start_node)
    job = job_of(db, job_id)
    assert job["step_name"] == "verify" and job["schema_state"] == "write-reorg"
    assert _column_comment(db) == "entered step 2"
    control.cancel(db, job_id)
    faults.release("worker.after_batch")
    done = wait_state(db, job_id)
    assert done["state"] == "cancelled"
    assert table_rows(db) == before
    assert _index_valid(db, _index(job_id)) is None
    reverts = [r for r in _subtasks(db, job_id) if r["step"] == STEP_REVERT]
    # One revert subtask per 100 rows the fill wrote (every range made
    # progress); none of verify, which wrote nothing (restore=False).
    assert len(reverts) == 10 and all(r["state"] == "succeeded" for r in reverts)
    assert {r["meta"]["revert_of_step"] for r in reverts} == {1}
    # Its rows stay those of the step it stopped in, against that step's
    # estimate (not the fill's added in, nor the revert's).
    verified = sum(r["row_count"] for r in _subtasks(db, job_id) if r["step"] == 2)
    assert (done["rows_done"], done["rows_total"]) == (verified, 1_000)
    assert verified > 0
    # Where the revert step began: from the step the job was cancelled in.
    assert [(e["from_state"], e["to_state"]) for e in control.events(db, job_id)][-3:] == [
        ("cancelling", "reverting"), ("step verify", "step revert"), ("reverting", "cancelled")]


def test_a_cut_over_that_meets_a_lock_is_retried_and_the_job_stays_running(db, start_node):
    make_items(db, 300)
    faults.arm("owner.before_cutover", "block")
    job_id = submit(db, fill("md5(b)", steps=True, rows_per_subtask=100, batch_rows=100)).job_id
    start_node("n1", slots=2)
    faults.wait_blocked("owner.before_cutover", 60)
    with db.engine.connect() as app, app.begin():
        # An application transaction holding the table: the cut-over's DDL
        # waits the owner's lock_timeout (a third of its lease), then gives up.
        app.execute(sa.text("LOCK TABLE items IN ACCESS EXCLUSIVE MODE"))
        faults.release("owner.before_cutover")
        job = wait_until(lambda: "lock timeout" in ((j := job_of(db, job_id))["error"] or "")
                         and j, 60, "the cut-over to time out on the lock")
        assert job["state"] == "running" and job["step"] == 3
    done = wait_state(db, job_id)
    assert done["state"] == "succeeded" and done["error"] is None
    assert _column_comment(db) == "public"


def test_status_shows_the_step_by_name_with_its_percent_and_the_schema_state(db, start_node):
    make_items(db, 1_000)
    job_id = submit(db, fill("md5(b)", steps=True, rows_per_subtask=100, batch_rows=50)).job_id
    _hold_the_verify_step(start_node)
    job = job_of(db, job_id)
    assert job["step_name"] == "verify" and job["step_count"] == 3
    # Percent of the step by its rows; of the job, the share of its steps.
    assert 0 < job["step_percent"] < 100
    assert job["percent"] == round(100 * (1 + job["step_percent"] / 100) / 3, 1)
    shown = status_table([job])
    assert f"verify 2/3 ({job['step_percent']:.1f}%)" in shown
    assert "write-reorg" in shown
    faults.release("worker.after_batch")
    assert wait_state(db, job_id)["state"] == "succeeded"


def test_each_owner_tick_moves_the_job_only_past_complete_steps_and_status_follows(
        db, monkeypatch):
    """Owner and worker driven by hand, one tick and one subtask at a time: the
    step's percent and the job's grow as subtasks finish (their counters kept
    through history moves), and the step moves only once all succeeded."""
    from framework import owner as owner_module
    from framework.owner import Owner
    from framework.worker import WorkerPool

    monkeypatch.setattr(owner_module, "LIVE_SUCCEEDED_KEPT", 2)  # move to history early
    make_items(db, 1_000)
    job_id = submit(db, fill("md5(b)", steps=True, rows_per_subtask=100, batch_rows=100)).job_id
    owner, pool = Owner(db, "o"), WorkerPool(db, "w", 1)

    def run(n: int) -> None:
        for _ in range(n):
            assert pool.run_one()

    def looks() -> tuple:
        job = job_of(db, job_id)
        return job["step"], job["step_name"], job["step_percent"], job["percent"]

    owner.tick()  # prepare, split: step 1, 10 ranges
    assert looks() == (1, "fill", 0.0, 0.0)
    run(9)
    owner.tick()  # one range left: no advance; 9 succeeded move to history
    assert looks() == (1, "fill", 90.0, 30.0)
    assert scalar(db, "SELECT count(*) FROM {s}.background_subtask_history WHERE job_id = :j",
                  j=job_id) == 9
    assert {r["step"] for r in _subtasks(db, job_id)} == {1}
    run(1)
    owner.tick()  # step 1 complete: verify's 10 ranges in, the job at step 2
    assert looks() == (2, "verify", 0.0, 33.3)
    run(5)
    owner.tick()
    assert looks() == (2, "verify", 50.0, 50.0)
    run(5)
    owner.tick()  # step 3: one fixed subtask
    assert looks() == (3, "index", 0.0, 66.7)
    run(1)  # CREATE INDEX CONCURRENTLY
    assert looks() == (3, "index", 99.9, 99.9)  # until the owner sees it done
    assert _index_valid(db, _index(job_id)) is True
    owner.tick()  # the cut-over
    done = job_of(db, job_id)
    assert (done["state"], done["step"], done["percent"]) == ("succeeded", 4, 100.0)
    assert not pool.run_one()
