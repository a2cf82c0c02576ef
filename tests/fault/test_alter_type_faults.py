"""``alter-type`` under faults, with real ``reorg worker`` processes and an
application writing the whole time (support.app): a kill -9 of a worker
mid-backfill resumes from ``curr_key``; an owner killed (as kill -9) inside
the cut-over's transaction, after the columns were swapped, leaves the table
as it was before the cut-over (one transaction: it happened or not) and its
heir cuts over once. Either way the table ends equal to the application's
oracle, with every catalogue fact of the column kept but its type."""

from __future__ import annotations

import signal

import pytest
from support import held_by, job_of, rows, scalar, wait_state, wait_until
from support.app import App, AppKeys, column_catalog, table_as_oracle

from framework import control
from framework.submit import SubmitRequest, submit

pytestmark = pytest.mark.fault

ROWS = 4_000


def _make_table(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"""
            CREATE TABLE items (id serial PRIMARY KEY, a int NOT NULL DEFAULT 7, b text);
            CREATE INDEX items_a_b ON items (a, b);
            COMMENT ON COLUMN items.id IS 'row id';
            INSERT INTO items (a, b) SELECT g % 97, 'v' || g FROM generate_series(1, {ROWS}) g;
            ANALYZE items""")


def _with_type(facts: dict, column: str, type_: str) -> dict:
    columns = [(c[0], type_, *c[2:]) if c[0] == column else c for c in facts["columns"]]
    return {**facts, "columns": sorted(columns)}


def _alter_id(**knobs) -> SubmitRequest:
    return SubmitRequest("alter-type", {"table": "items", "column": "id", "type": "bigint"},
                         **{"rows_per_subtask": 1_000, "batch_rows": 100, **knobs})


@pytest.mark.matrix
def test_kill_9_of_a_worker_mid_backfill_resumes_from_curr_key(db, settings, workers):
    """Long form (matrix), as test_schema_change_faults.py's. Short forms in
    CI: a worker killed part-way through a later step of a throttled job
    resumes from ``curr_key``,
    test_step_faults.py::test_kill_9_of_a_worker_in_step_2_resumes_from_curr_key;
    the application's oracle and the catalogue through an ``alter-type`` job,
    tests/integration/test_alter_type.py; an ``alter-type`` job under a
    fault, ::test_an_owner_killed_during_the_cut_over_leaves_it_undone_and_its_heir_cuts_over
    below."""
    url = settings.database_url
    _make_table(url)
    before = column_catalog(url)
    app = App(url)
    app.load()
    app.start()
    # Throttled, so the backfill lasts seconds: long enough to be caught in.
    job_id = submit(db, _alter_id(max_rows_per_sec=1_500)).job_id
    victim = workers.start("victim", slots=2)

    def backfilling():
        if job_of(db, job_id)["step"] != 1:
            return None
        return [r for r in held_by(db, "victim") if r.curr_key > r.start_key] or None

    caught = wait_until(backfilling, 90, "the victim part-way through a backfill subtask")
    victim.signal(signal.SIGKILL)
    victim.proc.wait(10)
    sub_id, checkpointed = caught[0].id, caught[0].curr_key
    control.alter(db, job_id, max_rows_per_sec=0)  # caught: the rest may run at full speed
    workers.start("heir", slots=2)
    done = wait_state(db, job_id, timeout=180)
    app.stop(at_least_ops=50)
    assert done["state"] == "succeeded", done["error"]
    assert app.errors == []
    assert table_as_oracle(url) == app.oracle
    assert column_catalog(url) == _with_type(before, "id", "bigint")
    (curr_key, attempts, exec_id), = rows(
        db, "SELECT curr_key, attempts, exec_id FROM {s}.background_subtask WHERE id = :i "
            "UNION ALL SELECT curr_key, attempts, exec_id FROM {s}.background_subtask_history "
            "WHERE id = :i", i=sub_id)
    assert attempts == 2 and exec_id == "heir" and curr_key > checkpointed


def test_an_owner_killed_during_the_cut_over_leaves_it_undone_and_its_heir_cuts_over(
        db, settings, workers):
    url = settings.database_url
    _make_table(url)
    before = column_catalog(url)
    app = App(url)
    app.load()
    app.start()
    job_id = submit(db, _alter_id()).job_id
    # The victim dies (as kill -9) in the cut-over's transaction, the columns
    # already swapped: all of it rolls back with the connection.
    victim = workers.start("victim", slots=2, faults="alter_type.in_cutover=exit")
    victim.proc.wait(120)
    assert victim.proc.returncode == 137
    job = job_of(db, job_id)
    assert job["state"] == "running" and job["step"] == 3, job
    assert scalar(db, "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE "
                      "attrelid = 'items'::regclass AND attname = 'id'") == "integer"
    assert scalar(db, "SELECT count(*) FROM pg_attribute WHERE attrelid = 'items'::regclass "
                      "AND attname = 'id_reorg_new'") == 1
    workers.start("heir", slots=2)
    done = wait_state(db, job_id, timeout=120)
    app.stop(at_least_ops=50)
    assert done["state"] == "succeeded", done["error"]
    assert app.errors == []
    assert table_as_oracle(url) == app.oracle
    assert column_catalog(url) == _with_type(before, "id", "bigint")


# A composite primary key, and the job alters one of its own columns (n).
COMPOSITE_KEYS = AppKeys(("region", "n"), lambda n: ("app", n))  # between 'ap' and 'eu'


def _make_composite_table(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"""
            CREATE TABLE items (region text, n integer, a int NOT NULL DEFAULT 7, b text,
                                PRIMARY KEY (region, n));
            CREATE INDEX items_a_b ON items (a, b);
            INSERT INTO items (region, n, a, b)
            SELECT (ARRAY['eu', 'us', 'ap'])[g % 3 + 1], g / 3, g % 97, 'v' || g
            FROM generate_series(1, {ROWS}) g;
            ANALYZE items""")


def test_kill_9_of_a_worker_mid_backfill_on_a_composite_key_resumes_from_curr_key(
        db, settings, workers):
    url = settings.database_url
    _make_composite_table(url)
    before = column_catalog(url)
    app = App(url, keys=COMPOSITE_KEYS)
    app.load()
    app.start()
    job_id = submit(db, SubmitRequest(
        "alter-type", {"table": "items", "column": "n", "type": "bigint"},
        rows_per_subtask=1_000, batch_rows=100, max_rows_per_sec=1_500)).job_id
    victim = workers.start("victim", slots=2)

    def backfilling():
        if job_of(db, job_id)["step"] != 1:
            return None
        return [r for r in held_by(db, "victim") if r.curr_key != r.start_key] or None

    caught = wait_until(backfilling, 90, "the victim part-way through a backfill subtask")
    victim.signal(signal.SIGKILL)
    victim.proc.wait(10)
    sub_id, checkpointed = caught[0].id, caught[0].curr_key
    assert isinstance(checkpointed, list) and len(checkpointed) == 2  # (region, n) as jsonb
    control.alter(db, job_id, max_rows_per_sec=0)
    workers.start("heir", slots=2)
    done = wait_state(db, job_id, timeout=180)
    app.stop(at_least_ops=50)
    assert done["state"] == "succeeded", done["error"]
    assert app.errors == []
    assert table_as_oracle(url, keys=COMPOSITE_KEYS) == app.oracle
    assert column_catalog(url) == _with_type(before, "n", "bigint")
    (curr_key, end_key, attempts, exec_id), = rows(
        db, "SELECT curr_key, end_key, attempts, exec_id FROM {s}.background_subtask "
            "WHERE id = :i UNION ALL SELECT curr_key, end_key, attempts, exec_id "
            "FROM {s}.background_subtask_history WHERE id = :i", i=sub_id)
    assert attempts == 2 and exec_id == "heir" and curr_key == end_key != checkpointed


def test_an_owner_killed_during_the_cut_over_of_a_composite_key_column_leaves_it_undone(
        db, settings, workers):
    url = settings.database_url
    _make_composite_table(url)
    before = column_catalog(url)
    app = App(url, keys=COMPOSITE_KEYS)
    app.load()
    app.start()
    job_id = submit(db, SubmitRequest(
        "alter-type", {"table": "items", "column": "n", "type": "bigint"},
        rows_per_subtask=1_000, batch_rows=200)).job_id
    victim = workers.start("victim", slots=2, faults="alter_type.in_cutover=exit")
    victim.proc.wait(120)
    assert victim.proc.returncode == 137
    job = job_of(db, job_id)
    assert job["state"] == "running" and job["step"] == 3, job
    # Nothing of the swap stayed: the old key column, its primary key, the shadow.
    assert scalar(db, "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE "
                      "attrelid = 'items'::regclass AND attname = 'n'") == "integer"
    assert scalar(db, "SELECT count(*) FROM pg_attribute WHERE attrelid = 'items'::regclass "
                      "AND attname = 'n_reorg_new'") == 1
    assert scalar(db, "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE "
                      "conrelid = 'items'::regclass AND contype = 'p'") == "PRIMARY KEY (region, n)"
    workers.start("heir", slots=2)
    done = wait_state(db, job_id, timeout=120)
    app.stop(at_least_ops=50)
    assert done["state"] == "succeeded", done["error"]
    assert app.errors == []
    assert table_as_oracle(url, keys=COMPOSITE_KEYS) == app.oracle
    assert column_catalog(url) == _with_type(before, "n", "bigint")
