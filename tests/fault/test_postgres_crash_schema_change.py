"""PostgreSQL crashed (``pg_ctl -m immediate``) and restarted under the
schema-change job types, with their ``reorg worker`` on a host of its own and
an application writing the whole time (support.app_model, told to survive
the crash: a write whose connection the crash cut is read back, so the oracle
stays exact).

Mid-cut-over: the owner is held (a ``block`` fault point) inside the
cut-over's transaction, its DDL part or all run, the table locked, the
application waiting on that lock; then the server dies. The open transaction
is lost with it (crash recovery never replays an uncommitted transaction), so
the job is still running in its last step; after the restart the owner's
dead connection fails its next statement, and the cut-over runs again, once
(DESIGN 12). Mid-backfill (alter-type): every slot has just committed a
batch, the batches go on, the server dies; the subtasks resume from
``curr_key``.

Afterwards the table holds exactly the final shape, once: the type, NOT NULL
or valid index; no trigger, function, shadow column, check or invalid index
of the job left; every application write present (rows equal to the
oracle's). docs/reliability.md lists the figures (``RELIABILITY`` lines)."""

from __future__ import annotations

import signal
import time

import psycopg
import pytest
from support import execute, job_of, make_items, rows, scalar, wait_history, wait_state, wait_until
from support.app_model import Application, data, shape
from support.oracle import report

from framework import long_statements
from framework.submit import SubmitRequest, submit

pytestmark = pytest.mark.fault

ROWS = 8_000
VALUE = "md5(b || '/' || a)"  # add-column's --value, as in test_schema_change_faults


def _make_table(db) -> None:
    make_items(db, ROWS)
    execute(db, "CREATE INDEX items_a ON items (a)")  # alter-type of a rebuilds it


def _request(job_type: str) -> SubmitRequest:
    knobs = {"rows_per_subtask": 1_000, "batch_rows": 250}
    if job_type == "alter-type":
        return SubmitRequest(job_type, {"table": "items", "column": "a", "type": "bigint"},
                             **knobs)
    if job_type == "add-column":
        return SubmitRequest(job_type, {"table": "items", "column": "d:text", "value": VALUE,
                                        "default": "'x'", "not_null": True}, **knobs)
    return SubmitRequest(job_type, {"table": "items", "columns": "b", "unique": True,
                                    "name": "items_b_key"}, **knobs)


def _final_shape(job_type: str, before: dict[str, list[tuple]]) -> dict[str, list[tuple]]:
    """``before`` with the job's one change made."""
    columns = before["columns"]
    if job_type == "alter-type":  # the shadow took a's place, at the end of SELECT *
        columns = [c for c in columns if c[0] != "a"] + [("a", "bigint", False, None)]
        return {**before, "columns": columns}
    if job_type == "add-column":
        return {**before, "columns": [*columns, ("d", "text", True, "'x'::text")]}
    index = ("items_b_key", True, "CREATE UNIQUE INDEX items_b_key ON public.items "
                                  "USING btree (b)")
    return {**before, "indexes": sorted([*before["indexes"], index])}


def _nothing_of_the_job_left(db) -> None:
    """No shadow column, trigger function or invalid index anywhere."""
    assert scalar(db, "SELECT count(*) FROM pg_attribute WHERE attrelid = 'items'::regclass "
                      "AND attname LIKE '%reorg%' AND NOT attisdropped") == 0
    assert rows(db, "SELECT proname FROM pg_proc WHERE proname LIKE 'alter\\_type\\_%' "
                    "OR proname LIKE 'add\\_column\\_%'") == []
    assert scalar(db, "SELECT count(*) FROM pg_index WHERE NOT indisvalid") == 0


def _waiting_on_the_table(db) -> bool:
    """Some session (the application's write) waits for a lock on items."""
    return bool(scalar(db, "SELECT count(*) FROM pg_locks WHERE NOT granted "
                           "AND relation = to_regclass('items')"))


def _crash_and_restart(cluster) -> float:
    """pg_ctl -m immediate, then start on the same port; the monotonic time of the crash."""
    cluster.net.crash_postgres()
    crashed = time.monotonic()
    cluster.net.start_postgres()
    cluster.db.engine.dispose()  # the test's pool holds connections of the dead server
    return crashed


def _succeeded_once(db, job_id: int) -> None:
    assert scalar(db, "SELECT count(*) FROM {s}.job_events WHERE job_id = :j "
                      "AND to_state = 'succeeded'", j=job_id) == 1


# Where the owner is held: inside the cut-over's fenced transaction, after
# (some of) its DDL. alter-type: columns swapped, the rest of its DDL to come;
# add-column: all of its DDL done; add-index: the index checked valid. Then
# the job's move to succeeded, and COMMIT.
CUT_OVER_POINT = {"alter-type": "alter_type.in_cutover",
                  "add-column": "owner.after_advance_step",
                  "add-index": "owner.after_advance_step"}
# The types whose cut-over locks the table: the application waits on it.
LOCKS_THE_TABLE = {"alter-type", "add-column"}


@pytest.mark.parametrize("job_type", [
    "alter-type",  # the short form, in CI
    pytest.param("add-column", marks=pytest.mark.matrix),
    pytest.param("add-index", marks=pytest.mark.matrix),
])
def test_postgres_crash_and_restart_mid_cut_over(cluster, job_type):
    db = cluster.db
    _make_table(db)
    before, point = shape(db.engine), CUT_OVER_POINT[job_type]
    with Application(db.engine, survives_crashes=True) as app:
        job_id = submit(db, _request(job_type)).job_id
        worker = cluster.start("a", faults=f"{point}=block")
        cluster.workers.gates.wait_blocked(point, 180)
        if job_type in LOCKS_THE_TABLE:
            wait_until(lambda: _waiting_on_the_table(db), 30,
                       "the application to wait on the cut-over's lock")
        writes, held = app.writes, job_of(db, job_id)
        crashed = _crash_and_restart(cluster)
        # Recovered without the cut-over's open transaction: the job still in
        # its last step, the table as the step left it (the trigger in place).
        after = job_of(db, job_id)
        assert (after["state"], after["step"]) == ("running", held["step"]), after
        if job_type in LOCKS_THE_TABLE:
            assert len(shape(db.engine)["triggers"]) == (6 if job_type == "add-column" else 1)
        cluster.workers.gates.release(point)  # the owner goes on, on a dead connection
        done = wait_state(db, job_id, timeout=120)
        job_done = round(time.monotonic() - crashed, 2)
        app.wait_writes(20, timeout=60)  # the application goes on after the restart
    assert done["state"] == "succeeded", job_of(db, job_id)
    assert app.writes > writes and not app.errors, app.errors
    if job_type in LOCKS_THE_TABLE:
        assert app.lost_connections >= 1  # its write waiting on the lock died with the server
    _succeeded_once(db, job_id)
    assert shape(db.engine) == _final_shape(job_type, before)
    _nothing_of_the_job_left(db)
    assert data(db.engine) == app.expected()
    if job_type == "add-column":  # every row the job (not the default) filled holds --value
        assert scalar(db, f"SELECT count(*) FROM items WHERE d IS DISTINCT FROM {VALUE} AND "
                          "(c IS NULL OR c::timestamptz < (SELECT finished_at FROM {s}.jobs "
                          "WHERE id = :j))", j=job_id) == 0
    assert worker.alive()
    worker.signal(signal.SIGTERM)
    report("PostgreSQL crash (immediate) and restart mid-cut-over", job=job_type,
           job_done_s=job_done, rows_redone=0, app_writes=app.writes,
           app_writes_cut=app.lost_connections)


@pytest.mark.matrix
def test_postgres_crash_and_restart_mid_alter_type_backfill(cluster):
    db = cluster.db
    _make_table(db)
    before = shape(db.engine)
    hold = "worker.after_batch"
    with Application(db.engine, survives_crashes=True) as app:
        job_id = submit(db, _request("alter-type")).job_id
        cluster.start("a", faults=f"{hold}=block")
        cluster.start("b", faults=f"{hold}=block")
        cluster.workers.gates.wait_blocked(hold, 120, count=4)  # each slot committed a batch
        assert job_of(db, job_id)["step"] == 1  # backfill
        cluster.workers.gates.release(hold)
        crashed = _crash_and_restart(cluster)
        done = wait_state(db, job_id, timeout=180)
        job_done = round(time.monotonic() - crashed, 2)
        app.wait_writes(20, timeout=60)
    assert done["state"] == "succeeded", job_of(db, job_id)
    assert not app.errors, app.errors
    _succeeded_once(db, job_id)
    assert shape(db.engine) == _final_shape("alter-type", before)
    _nothing_of_the_job_left(db)
    assert data(db.engine) == app.expected()
    wait_history(db, job_id)
    resumed = scalar(db, "SELECT count(*) FROM {s}.background_subtask_history "
                         "WHERE job_id = :j AND step = 1 AND attempts > 1", j=job_id)
    for worker in cluster.workers:
        assert worker.alive()
        worker.signal(signal.SIGTERM)
    report("PostgreSQL crash (immediate) and restart mid-backfill", job="alter-type",
           job_done_s=job_done, backfill_subtasks_retried=resumed, app_writes=app.writes,
           app_writes_cut=app.lost_connections)


@pytest.mark.matrix
def test_postgres_crash_and_restart_mid_add_index_build(cluster):
    """The build (CREATE INDEX CONCURRENTLY, on the worker) is held at its wait
    for writers by an open write transaction: its INVALID index is in the
    catalogue when the server dies. The retried build drops it and builds
    again; one valid index is left."""
    db = cluster.db
    _make_table(db)
    before = shape(db.engine)
    writer = psycopg.connect(cluster.net.admin_url(cluster.dbname))
    try:
        with Application(db.engine, survives_crashes=True) as app:
            writer.execute("UPDATE items SET a = a WHERE id = 1")  # holds the build
            job_id = submit(db, _request("add-index")).job_id
            worker = cluster.start("a")
            wait_until(lambda: scalar(
                db, "SELECT count(*) FROM pg_stat_progress_create_index JOIN pg_stat_activity "
                    f"USING (pid) WHERE {long_statements.tagged_sql(job_id)}"),
                120, "the build to start")
            assert scalar(db, "SELECT indisvalid FROM pg_index "
                              "WHERE indexrelid = to_regclass('items_b_key')") is False
            crashed = _crash_and_restart(cluster)  # the writer's transaction dies with it
            done = wait_state(db, job_id, timeout=120)
            job_done = round(time.monotonic() - crashed, 2)
            app.wait_writes(20, timeout=60)
    finally:
        writer.close()
    assert done["state"] == "succeeded", job_of(db, job_id)
    assert not app.errors, app.errors
    _succeeded_once(db, job_id)
    assert shape(db.engine) == _final_shape("add-index", before)
    _nothing_of_the_job_left(db)
    assert data(db.engine) == app.expected()
    wait_history(db, job_id)
    (attempts,), = rows(db, "SELECT attempts FROM {s}.background_subtask_history "
                            "WHERE job_id = :j AND step = 2", j=job_id)
    assert attempts >= 2  # the build ran again after the crash
    assert worker.alive()
    worker.signal(signal.SIGTERM)
    report("PostgreSQL crash (immediate) and restart mid-build (INVALID index)",
           job="add-index", job_done_s=job_done, build_attempts=attempts,
           app_writes=app.writes, app_writes_cut=app.lost_connections)
