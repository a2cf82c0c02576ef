"""sql-update and user SQL text (issue 11): a ``--set``/``--where``/column spec
is validated as the exact statement the batch runs, stays inside its range,
and rollback restores overwritten values of any type by row version."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa
from support import TERMINAL, table_rows, wait_state, wait_until

from framework import control, faults
from framework.errors import InvalidParams
from framework.submit import SubmitRequest, submit


def run(db, sql, **params):
    with db.begin() as conn:
        return conn.execute(sa.text(sql), params)


def make_g(db, rows):
    """g(id bigint pk, g int, v bigint): g cycles 0..9, v = id."""
    run(db, "CREATE TABLE g (id bigint PRIMARY KEY, g int, v bigint)")
    run(db, "INSERT INTO g SELECT i, i % 10, i FROM generate_series(1, :n) i", n=rows)


def job_count(db):
    return run(db, f"SELECT count(*) FROM {db.schema}.jobs").scalar()


def rejected(db, params, table="g"):
    """Submit must refuse ``params`` with one line and change nothing."""
    before, jobs = table_rows(db, table), job_count(db)
    with pytest.raises(InvalidParams) as exc:
        submit(db, SubmitRequest("sql-update", {"table": table, **params}))
    message = str(exc.value)
    assert "\n" not in message
    assert table_rows(db, table) == before and job_count(db) == jobs
    return message


# --- defect 3: --where must not escape its parenthesis -------------------------


def test_where_closing_its_parenthesis_is_rejected_at_submit(db):
    make_g(db, 2_000)
    message = rejected(db, {"set": "v=v*2", "where": "FALSE) OR (g = 1"})
    assert message.startswith("--where 'FALSE) OR (g = 1' is not one SQL expression")


def test_parenthesised_or_predicate_stays_inside_each_range(db, start_node):
    """The same predicate written as one expression: each g = 1 row doubled once."""
    make_g(db, 20_000)
    job_id = submit(db, SubmitRequest(
        "sql-update", {"table": "g", "set": "v=v*2", "where": "(FALSE) OR (g = 1)"},
        rows_per_subtask=2_000, batch_rows=500)).job_id
    start_node("n1")
    assert wait_state(db, job_id, TERMINAL)["state"] == "succeeded"
    wrong = run(db, "SELECT count(*) FROM g WHERE v <> CASE WHEN g = 1 THEN id * 2 ELSE id END")
    assert wrong.scalar() == 0


@pytest.mark.parametrize("add", [False, True], ids=["overwrite", "add-column"])
def test_trailing_comments_cannot_swallow_the_rest_of_the_statement(db, start_node, add):
    """One expression may end in a ``--`` comment; the batch still keeps to
    its range and predicate."""
    make_g(db, 3_000)
    col = "w" if add else "v"
    params = {"table": "g", "set": f"{col}=v*2 -- double", "where": "g = 1 -- only ones"}
    job_id = submit(db, SubmitRequest("sql-update", params | (
        {"add_column": "w:bigint"} if add else {}), rows_per_subtask=1_000, batch_rows=300)).job_id
    start_node("n1")
    assert wait_state(db, job_id, TERMINAL)["state"] == "succeeded"
    expected = "CASE WHEN g = 1 THEN id * 2 END" if add else \
        "CASE WHEN g = 1 THEN id * 2 ELSE id END"
    wrong = run(db, f"SELECT count(*) FROM g WHERE {col} IS DISTINCT FROM {expected}")
    assert wrong.scalar() == 0


TRICKS = {
    "--where ends its parenthesis": {"set": "v=v*2", "where": "TRUE) OR (g = 1"},
    "--where block comment": {"set": "v=v*2", "where": "g = 1 /*"},
    "--where second statement": {"set": "v=v*2", "where": "TRUE; DELETE FROM g"},
    "--where dollar quote": {"set": "v=v*2", "where": "g = 1 OR $x$"},
    "--set ends its parenthesis": {"set": "v=1) , g = (2"},
    "--set second statement": {"set": "v=1; DELETE FROM g"},
    "--set dollar quote": {"set": "v=$$1"},
    "--set alias": {"set": "v=1 AS x"},
    "--set with FROM": {"set": "v=g FROM g"},
    "--add-column smuggles DDL": {"set": "w=1", "add_column": "w:int; DROP TABLE g"},
    "--add-column comment": {"set": "w=1", "add_column": "w:int --"},
    "--add-column constraint": {"set": "w=1", "add_column": "w:int primary key"},
    "--add-column default": {"set": "w=1", "add_column": "w:int default 1"},
}


@pytest.mark.parametrize("params", TRICKS.values(), ids=TRICKS.keys())
def test_user_sql_cannot_leave_its_place(db, params):
    make_g(db, 100)
    rejected(db, params)


# --- defect 9: validate the statement the batch runs -----------------------------

NOT_PER_ROW = {
    "aggregate": "count(*)",
    "window": "row_number() over ()",
    "set-returning": "generate_series(1, 2)",
}


@pytest.mark.parametrize("expr", NOT_PER_ROW.values(), ids=NOT_PER_ROW.keys())
@pytest.mark.parametrize("add", [False, True], ids=["overwrite", "add-column"])
def test_set_that_is_not_per_row_is_rejected_at_submit(db, expr, add):
    make_g(db, 100)
    params = {"set": f"w={expr}", "add_column": "w:bigint"} if add else {"set": f"v={expr}"}
    message = rejected(db, params)
    assert message.startswith("--set ") and "not allowed in UPDATE" in message, message


@pytest.mark.parametrize("where", ["count(*) > 1", "generate_series(1, 2) > 1"])
def test_where_that_is_not_per_row_is_rejected_at_submit(db, where):
    make_g(db, 100)
    message = rejected(db, {"set": "v=v*2", "where": where})
    assert message.startswith("--where "), message


def test_set_type_is_checked_as_the_assignment_runs(db):
    """CAST accepts text -> bigint; the UPDATE's assignment does not."""
    make_g(db, 100)
    message = rejected(db, {"set": "v='12'::text"})
    assert message.startswith("--set "), message


def test_add_column_submit_takes_no_lock_beyond_access_share(db):
    """Validation while another session holds EXCLUSIVE (which admits only
    ACCESS SHARE): submit neither waits nor queues a lock on the table."""
    make_g(db, 100)
    holder = db.engine.connect()
    tx = holder.begin()
    holder.execute(sa.text("LOCK TABLE g IN EXCLUSIVE MODE"))
    result: list = []
    thread = threading.Thread(target=lambda: result.append(submit(db, SubmitRequest(
        "sql-update", {"table": "g", "set": "w=v + g", "add_column": "w:bigint"},
        dry_run=True))), daemon=True)
    try:
        thread.start()
        wait_until(lambda: result, 20, "submit to return while the table is locked")
        result.clear()
        thread = threading.Thread(target=lambda: result.append(submit(db, SubmitRequest(
            "sql-update", {"table": "g", "set": "v=v + g", "where": "g = 1"},
            dry_run=True))), daemon=True)
        thread.start()
        wait_until(lambda: result, 20, "overwrite submit to return while the table is locked")
    finally:
        tx.rollback()
        holder.close()
        thread.join(10)


# --- defect 5: rollback by row version, for types without '=' --------------------


def make_odd(db, rows):
    """odd(id, j json, p point, x xml): every 7th row NULL in all three."""
    run(db, "CREATE TABLE odd (id bigint PRIMARY KEY, j json, p point, x xml)")
    run(db, """INSERT INTO odd SELECT i,
                   CASE WHEN i % 7 <> 0 THEN json_build_object('old', i, 'pad', ' x ') END,
                   CASE WHEN i % 7 <> 0 THEN point(i, -i) END,
                   CASE WHEN i % 7 <> 0 THEN xmlelement(name old, i) END
               FROM generate_series(1, :n) i""", n=rows)


def odd_rows(db):
    return {r[0]: tuple(r[1:]) for r in run(
        db, "SELECT id, j::text, p::text, x::text FROM odd ORDER BY id")}


@pytest.mark.parametrize(("column", "expr", "app_value"), [
    ("j", "json_build_object('new', id)", "'{\"app\": 1}'"),
    ("p", "point(id * 10, 0)", "point(-1, -1)"),
    ("x", "xmlelement(name new, id)", "'<app/>'"),
])
def test_cancel_restores_values_without_equality_and_later_app_writes_win(
        db, start_node, column, expr, app_value):
    make_odd(db, 6_000)
    before = odd_rows(db)
    col = {"j": 0, "p": 1, "x": 2}[column]
    job_id = submit(db, SubmitRequest(
        "sql-update", {"table": "odd", "set": f"{column}={expr}"},
        rows_per_subtask=1_000, batch_rows=100, concurrency=2)).job_id
    faults.arm("worker.after_batch", "block")  # each slot stops after its first batch
    start_node("n1")
    faults.wait_blocked("worker.after_batch", 30, count=2)  # subtasks 1 and 2: keys 1-100 written
    # Rows the job already wrote (one whose old value was NULL among them),
    # then rows it has not reached: the application's values must survive.
    done = run(db, f"SELECT id FROM odd WHERE {column}::text LIKE '%new%' "
                   f"OR {column}::text LIKE '(%0,0)' ORDER BY id LIMIT 20").scalars().all()
    app_rows = [done[0], 7, 5_999]
    assert 7 in done
    run(db, f"UPDATE odd SET {column} = {app_value} WHERE id = ANY(:ids)", ids=app_rows)
    app_text = run(db, f"SELECT {column}::text FROM odd WHERE id = 7").scalar()
    control.cancel(db, job_id)
    faults.release("worker.after_batch")
    assert wait_state(db, job_id, TERMINAL, 30)["state"] == "cancelled"
    after = odd_rows(db)
    for k in app_rows:
        assert after[k][col] == app_text, k  # DESIGN 9
        before[k] = after[k]
    assert after == before  # DESIGN 8, compared as text
    assert not run(db, "SELECT count(*) FROM pg_tables WHERE schemaname = :s "
                       "AND tablename LIKE '%' || :j || '%'",
                   s=db.schema, j=str(job_id)).scalar()


def test_failed_job_restores_old_values_including_nulls(db, start_node):
    make_odd(db, 3_000)
    before = odd_rows(db)
    faults.arm("worker.before_checkpoint", "raise@4")
    job_id = submit(db, SubmitRequest("sql-update", {"table": "odd", "set": "j=NULL::json"},
                                      rows_per_subtask=1_000, batch_rows=200)).job_id
    start_node("n1", slots=1)
    job = wait_state(db, job_id, TERMINAL, 30)
    assert job["state"] == "reverted"
    assert odd_rows(db) == before


def test_composite_old_values_with_null_fields_are_restored(db, start_node):
    """``(1,)`` and ``(,)`` are not NULL values, though ``IS NULL`` may say so."""
    run(db, "CREATE TYPE pair AS (a int, b int)")
    run(db, "CREATE TABLE cp (id bigint PRIMARY KEY, p pair)")
    run(db, """INSERT INTO cp SELECT i, CASE i % 4 WHEN 0 THEN NULL WHEN 1 THEN ROW(i, NULL)::pair
                                                WHEN 2 THEN ROW(NULL, NULL)::pair ELSE ROW(i, i)::pair END
               FROM generate_series(1, 2000) i""")
    before = run(db, "SELECT id, p::text, p IS NULL FROM cp ORDER BY id").all()
    faults.arm("worker.before_checkpoint", "raise@4")
    job_id = submit(db, SubmitRequest("sql-update", {"table": "cp", "set": "p=ROW(0, 0)::pair"},
                                      rows_per_subtask=1_000, batch_rows=200)).job_id
    start_node("n1", slots=1)
    assert wait_state(db, job_id, TERMINAL, 30)["state"] == "reverted"
    assert run(db, "SELECT id, p::text, p IS NULL FROM cp ORDER BY id").all() == before
