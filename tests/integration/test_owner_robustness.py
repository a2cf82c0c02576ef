"""The owner keeps every job moving: steps longer than its lease, a job it
cannot drive, a busy table in prepare, rows that arrive after the split
(issue 11, defects 1, 7, 8 and 10), on a real PostgreSQL with in-process nodes."""

from __future__ import annotations

import threading

import sqlalchemy as sa
from support import TERMINAL, fill, job_of, make_items, scalar, wait_state, wait_until
from support.fill import WarmsOnCue

from framework import control, faults, jobtype
from framework.states import JobState
from framework.store import jobs, owner_lease
from framework.submit import SubmitRequest, submit


def owner_revision(db) -> int:
    with db.begin() as conn:
        return int(owner_lease.current(db, conn)["revision"])


def test_a_split_longer_than_the_owner_lease_still_starts_the_job(db, start_node):
    """Defect 1: the lease was renewed only at the start of a tick, so a split
    outlasting it lost the term every time and the job stayed queued."""
    make_items(db, 2_000)
    job_id = submit(db, fill("md5(b)", rows_per_subtask=500)).job_id
    faults.arm("owner.before_split", "sleep:2.5")  # every split outlasts the 1 s lease
    start_node("n1", owner_lease_seconds=1)
    assert wait_state(db, job_id, TERMINAL, 60)["state"] == "succeeded"
    assert scalar(db, "SELECT count(*) FROM items WHERE d IS DISTINCT FROM md5(b)") == 0
    assert owner_revision(db) == 1, "the owner lost its term during the long split"


def test_a_rollback_longer_than_the_owner_lease_finishes(db, start_node):
    """Defect 1: a rollback step outlasting the lease made the fenced
    transition after it find the term expired, undoing the rollback; the job
    stayed reverting for ever. The restore itself now runs in revert subtasks
    (workers); the owner's steps of it, planning the revert and its final DDL,
    are each made longer than the owner lease here."""
    make_items(db, 400)
    with db.begin() as conn:
        conn.execute(sa.text("UPDATE items SET c = 'old-' || id"))
    faults.arm("worker.after_batch", "block")
    job_id = submit(db, SubmitRequest("sql-update", {"table": "items", "set": "c=md5(b)"},
                                      rows_per_subtask=100, batch_rows=50)).job_id
    node = start_node("n1", owner_lease_seconds=1)
    faults.wait_blocked("worker.after_batch", 30)  # running, far from done
    # Every DDL statement from now on takes 2.5 s: the revert plan's (indexes on
    # the images) and the final revert's (drop them), each past the 1 s lease.
    with db.begin() as conn:
        conn.execute(sa.text("""
            CREATE FUNCTION slow() RETURNS event_trigger LANGUAGE plpgsql AS
            $$ BEGIN PERFORM pg_sleep(2.5); END $$;
            CREATE EVENT TRIGGER slow ON ddl_command_start EXECUTE FUNCTION slow();
        """))
    control.cancel(db, job_id)
    faults.release("worker.after_batch")
    assert wait_state(db, job_id, TERMINAL, 60)["state"] == "cancelled"
    assert scalar(db, "SELECT count(*) FROM items WHERE c IS DISTINCT FROM 'old-' || id") == 0
    assert node.owner.term is not None and owner_revision(db) == 1
    details = [e["detail"] or "" for e in control.events(db, job_id)]
    assert any(d.startswith("revert step: ") for d in details), details


def test_a_job_whose_table_is_gone_fails_alone_and_other_jobs_run(db, start_node):
    """Defect 7: one poison job raised on every tick, and no later job, history
    move or node marking ever ran."""
    make_items(db, 300, table="doomed")
    make_items(db, 300, table="healthy")
    doomed = submit(db, fill("md5(b)", table="doomed")).job_id
    healthy = submit(db, fill("md5(b)", table="healthy")).job_id
    with db.begin() as conn:
        conn.execute(sa.text("DROP TABLE doomed"))
    start_node("n1")
    assert wait_state(db, healthy, TERMINAL)["state"] == "succeeded"
    gone = wait_state(db, doomed, TERMINAL)
    assert gone["state"] == "reverted" and "doomed" in gone["error"]


def test_a_job_of_a_type_not_installed_here_fails_alone(db, start_node):
    make_items(db, 300)
    with db.begin() as conn:
        stranger, _ = jobs.insert(
            db, conn, type="not-installed", params={}, target_table='"public"."items"',
            key_column='"id"', job_key=None, priority=10, concurrency=1, batch_rows=100,
            max_rows_per_sec=None, actor="test")
    make_items(db, 300, table="other")
    other = submit(db, fill("md5(b)", table="other")).job_id
    start_node("n1")
    assert wait_state(db, other, TERMINAL)["state"] == "succeeded"
    failed = wait_state(db, stranger, TERMINAL)
    assert failed["state"] == "reverted" and "not-installed" in failed["error"]


def test_a_table_dropped_mid_job_ends_reverted_without_stalling_the_owner(db, start_node):
    make_items(db, 2_000)
    job_id = submit(db, fill("md5(b)", rows_per_subtask=500, batch_rows=100)).job_id
    start_node("n1", slots=0)  # owner only: the job is split, nothing runs it
    wait_state(db, job_id, {"running"})
    with db.begin() as conn:
        conn.execute(sa.text("DROP TABLE items"))
    start_node("n2")
    done = wait_state(db, job_id, TERMINAL)
    assert done["state"] == "reverted"
    events = control.events(db, job_id)
    assert "no longer exists" in (events[-1]["detail"] or "")


def test_a_table_dropped_mid_job_still_has_its_work_tables_dropped(db, start_node):
    """Review finding: with the table gone, the revert skipped the job type's
    final DDL too, and an overwriting job's before-image tables stayed."""
    make_items(db, 2_000)
    job_id = submit(db, SubmitRequest("sql-update", {"table": "items", "set": "c = md5(b)"},
                                      rows_per_subtask=500, batch_rows=100)).job_id
    start_node("n1", slots=0)  # owner only: prepared (image tables made), nothing runs
    wait_state(db, job_id, {"running"})
    work_tables = ("SELECT count(*) FROM pg_tables WHERE schemaname = :s "
                   "AND tablename LIKE '%' || :j || '%'")
    assert scalar(db, work_tables, s=db.schema, j=str(job_id)) > 0
    with db.begin() as conn:
        conn.execute(sa.text("DROP TABLE items"))
    control.cancel(db, job_id)
    done = wait_state(db, job_id, TERMINAL)
    assert done["state"] == "cancelled"
    assert "no longer exists" in (control.events(db, job_id)[-1]["detail"] or "")
    assert scalar(db, work_tables, s=db.schema, j=str(job_id)) == 0


def test_rows_inserted_after_the_split_are_covered_before_the_job_succeeds(db, start_node):
    """Defect 8: ranges tiled [min, max + 1) as of the split; rows inserted past
    max kept their old value and the job said it succeeded."""
    make_items(db, 1_000)
    job_id = submit(db, fill("md5(b)", rows_per_subtask=250)).job_id
    start_node("owner", slots=0)  # splits and prepares; no slot runs the ranges yet
    wait_state(db, job_id, {"running"})
    with db.begin() as conn:  # the application keeps inserting (a serial key grows)
        conn.execute(sa.text(
            "INSERT INTO items SELECT g, g % 97, 'v' || g, NULL FROM generate_series(1001, 1700) g"))
    start_node("worker")
    assert wait_state(db, job_id, TERMINAL)["state"] == "succeeded"
    assert scalar(db, "SELECT count(*) FROM items WHERE d IS DISTINCT FROM md5(b)") == 0
    job = job_of(db, job_id)
    assert job["rows_done"] == 1_700 and job["percent"] == 100.0
    # The tail got ranges of its own (in either table: a finished job's
    # subtasks move to the history on a later tick).
    assert scalar(db, "SELECT count(*) FROM (SELECT meta FROM {s}.background_subtask "
                      "WHERE job_id = :j UNION ALL SELECT meta FROM {s}.background_subtask_history "
                      "WHERE job_id = :j) m WHERE meta ? 'catch_up'", j=job_id) > 0


def test_a_prepare_blocked_by_a_busy_table_waits_instead_of_failing(db, start_node, settings):
    """Defect 10: the DDL lock timeout in prepare failed the job for good."""
    make_items(db, 300)
    job_id = submit(db, fill("md5(b)")).job_id
    reader = sa.create_engine(db.engine.url)
    with reader.connect() as conn:
        tx = conn.begin()
        conn.execute(sa.text("SELECT count(*) FROM items"))  # holds ACCESS SHARE until rollback
        start_node("n1")
        waiting = wait_until(
            lambda: (j := job_of(db, job_id))["error"] and "lock" in j["error"] and j, 30,
            "the owner to report the lock timeout")
        assert waiting["state"] == "queued"
        tx.rollback()
    reader.dispose()
    assert wait_state(db, job_id, TERMINAL)["state"] == "succeeded"
    assert scalar(db, "SELECT count(*) FROM items WHERE d IS DISTINCT FROM md5(b)") == 0
    assert job_of(db, job_id)["error"] is None


def test_resume_while_pausing_keeps_a_small_job_on_its_node(db):
    """Defect 10: resume from pausing cleared run_on_node, so a job meant for
    the owner's node alone was claimed by every node."""
    make_items(db, 30)
    job_id = submit(db, fill("md5(b)")).job_id
    with db.begin() as conn:
        term = owner_lease.campaign(db, conn, "n1")
        jobs.start(db, conn, term, job_id, actor="t", step=1, row_estimate=30,
                   run_on_node="n1", detail="local")
    control.pause(db, job_id)
    assert control.resume(db, job_id) is JobState.RUNNING
    assert scalar(db, "SELECT run_on_node FROM {s}.jobs WHERE id = :j", j=job_id) == "n1"


def test_concurrent_fenced_step_blocks_a_new_term_but_not_its_own_renewal(db):
    """The fence's KEY SHARE lock lets the owner renew during a long step, and
    still keeps any other node from taking over while the step is in flight."""
    with db.begin() as conn:
        term = owner_lease.campaign(db, conn, "a")
    step_started, step_may_end = threading.Event(), threading.Event()

    def long_step():
        with db.begin() as conn:
            assert owner_lease.hold(db, conn, term)
            step_started.set()
            step_may_end.wait(10)

    t = threading.Thread(target=long_step)
    t.start()
    step_started.wait(10)
    try:
        with db.begin() as conn:
            assert owner_lease.renew(db, conn, term)
        with db.begin() as conn:  # expire it: a rival would now campaign
            conn.execute(db.sql("UPDATE {s}.owner_lease SET expires_at = clock_timestamp()"))
        with db.begin() as conn:
            assert owner_lease.campaign(db, conn, "b") is None, "took over mid-step"
    finally:
        step_may_end.set()
        t.join()
    with db.begin() as conn:
        assert owner_lease.campaign(db, conn, "b") is not None


def test_succeeded_subtasks_move_to_history_while_the_job_runs_and_are_counted_once(
        db, monkeypatch):
    from framework import owner as owner_module
    from framework.owner import Owner
    from framework.worker import WorkerPool

    monkeypatch.setattr(owner_module, "LIVE_SUCCEEDED_KEPT", 2)
    make_items(db, 4_000)
    job_id = submit(db, fill("md5(b)", rows_per_subtask=100, batch_rows=50)).job_id
    owner, pool = Owner(db, "o"), WorkerPool(db, "w", 1)
    owner.tick()  # split: 40 subtasks
    for _ in range(10):
        assert pool.run_one()
    owner.tick()  # 10 succeeded: more than 2 wait in the live table, so they move
    running = job_of(db, job_id)
    assert running["state"] == "running"
    assert scalar(db, "SELECT count(*) FROM {s}.background_subtask_history WHERE job_id = :j",
                  j=job_id) == 10
    assert (running["succeeded"], running["pending"], running["rows_done"]) == (10, 30, 1_000)
    while pool.run_one():
        pass
    owner.tick()  # advance
    owner.tick()  # move the rest
    done = job_of(db, job_id)
    assert done["state"] == "succeeded" and done["history_done"]
    assert (done["succeeded"], done["pending"], done["rows_done"]) == (40, 0, 4_000)
    assert scalar(db, "SELECT count(*) FROM {s}.background_subtask_history WHERE job_id = :j",
                  j=job_id) == 40
    assert scalar(db, "SELECT count(*) FROM items WHERE d IS DISTINCT FROM md5(b)") == 0


def test_a_warm_up_on_the_owner_does_not_stall_other_jobs(db, start_node):
    """Review finding: the owner started Spark inside its tick on the first
    Spark job's analysis, and every other job waited those seconds."""
    slow = WarmsOnCue()
    jobtype.register(slow)
    make_items(db, 1_000)
    make_items(db, 1_000, table="other")
    start_node("n1")
    with db.begin() as conn:  # as a submit leaves it for the owner to analyse
        waiting, _ = jobs.insert(
            db, conn, type=slow.name, params=fill("md5(b)").params,
            target_table='"public"."items"', key_column='"id"', job_key=None, priority=10,
            concurrency=1, batch_rows=100, max_rows_per_sec=None, actor="test")
    other = submit(db, fill("md5(b)", table="other")).job_id
    assert wait_state(db, other, TERMINAL)["state"] == "succeeded"
    assert job_of(db, waiting)["state"] == "queued"  # still warming up
    slow.go.set()
    assert wait_state(db, waiting, TERMINAL)["state"] == "succeeded"
