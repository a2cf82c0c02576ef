"""``rewrite --engine spark``: the --set column computed by Spark (here a
Python function, which PostgreSQL could not run) for every row the copy,
the catch-up's replays and the swap's last replay write, with an
application writing throughout and its oracle, on an integer key and a
composite text key (matrix); a cancel leaves T as it was; the swap's waits
for its locks are bounded on Spark's path too (a lock queued behind the
swap's, which Spark's reads would wait for; a writer's open transaction);
bad input refused in one line; the dry run shows Spark's part."""

from __future__ import annotations

import threading

import psycopg
import pytest
from support import execute, job_of, rows, scalar, wait_history, wait_state, wait_until
from support.rewrite import BIGINT, COMPOSITE, KeyApp, make_table, table_as_oracle
from test_rewrite_job import cancelled_in, catalogue, leftovers, more_writes, named_as_blocker, step_rows

from backfill.rewrite.job import register
from backfill.spark.jdbc import SPARK_APPLICATION_NAME
from framework import faults
from framework.errors import InvalidParams
from framework.submit import SubmitRequest, submit

pytestmark = pytest.mark.spark

ROWS = 1_500
KEYS = {"integer": BIGINT, "composite": COMPOSITE}
ON_SPARK = {"alter": "ALTER COLUMN a TYPE bigint, ADD COLUMN d text",
            "sets": ["d=reverse_text(b)"], "engine": "spark", "udf": "support.spark:reverse_text"}


@pytest.fixture(autouse=True, scope="module")
def _registered() -> None:
    register()


def rewrite(**params) -> SubmitRequest:
    # Batches of 500: each is a Spark job (~0.3 s whatever its rows).
    return SubmitRequest("rewrite", {"table": "items", **params}, batch_rows=500,
                         rows_per_subtask=750)


def not_reversed(url: str) -> int:
    """Rows whose d is not their b reversed (PostgreSQL's reverse: the oracle
    of the Python function's)."""
    return execute(url, "SELECT count(*) FROM items WHERE d IS DISTINCT FROM reverse(b)")[0][0]


# In the matrix (~30 s under CI's load): CI's short form is test_spark_any_key's,
# rows written during the copy and before the swap, without an application.
@pytest.mark.matrix
@pytest.mark.parametrize("key_kind", list(KEYS))
def test_spark_computes_the_set_of_every_row_copied_and_replayed(spark, db, settings, start_node,
                                                                 key_kind):
    url, key = settings.database_url, KEYS[key_kind]
    make_table(url, key, ROWS)
    app = KeyApp(url, key, space=10 * ROWS)  # free keys for every insert until the swap
    app.load()
    app.start()
    faults.enable_signals()
    faults.arm("worker.after_batch", "block")  # the copy held a moment: a backlog to replay
    faults.arm("rewrite.before_swap", "block")
    job_id = submit(db, rewrite(**ON_SPARK)).job_id
    start_node("n1", slots=2)
    faults.wait_blocked("worker.after_batch")
    more_writes(app, 200)
    faults.release("worker.after_batch")
    faults.wait_blocked("rewrite.before_swap", timeout=120)
    app.stop(at_least_ops=20)
    # Writes the swap's last replay takes (the owner waits before its locks).
    touched = execute(url, "UPDATE items SET b = b || '-last' WHERE id % 97 = 0 "
                           "RETURNING id")
    faults.release("rewrite.before_swap")
    done = wait_state(db, job_id, timeout=120)
    assert done["state"] == "succeeded", done["error"]
    assert app.errors == []
    oracle = {k: (a, f"{b}-last" if k[-1] % 97 == 0 else b) for k, (a, b) in app.oracle.items()}
    assert table_as_oracle(url, key[0]) == oracle
    assert touched and not_reversed(url) == 0
    assert scalar(db, "SELECT count(*) FROM items WHERE d LIKE 'tsal-%'") == len(touched)
    assert step_rows(db, job_id, 3) > 0  # the catch-up replayed on Spark
    assert execute(url, "SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
                        "WHERE attrelid = 'items'::regclass AND attname = 'a'") == [("bigint",)]
    assert leftovers(url) == []


# Copy in CI (a Spark batch committed, the next held); verify (a copy again
# on Spark may run) and after the swap (the revert) in the matrix.
@pytest.mark.parametrize("state", [
    "copy", *(pytest.param(s, marks=pytest.mark.matrix) for s in ("verify", "swapped"))])
def test_a_cancel_of_a_rewrite_on_spark_leaves_the_table_as_it_was(spark, db, settings,
                                                                     start_node, state):
    cancelled_in(db, settings.database_url, start_node, state,
                 rewrite(**ON_SPARK, keep_old="1h"), timeout=120)


def _held_by_a_writer(db, url: str, job_id: int) -> None:
    """A writer's open transaction: the swap's lock against writes waits for
    it, gives up after its lock_timeout and names it; committed, its write
    goes to the new table by the swap's replay on Spark."""
    with psycopg.connect(url, application_name="open-writer") as writer:
        writer.execute("UPDATE items SET b = b || '-w' WHERE id = 7")
        pid = writer.info.backend_pid
        faults.release("rewrite.before_swap")
        named_as_blocker(db, job_id, pid, "open-writer")


def _held_by_a_queued_lock(db, url: str, job_id: int) -> None:
    """A lock queued on T behind the swap's (a DDL's): Spark's reads, the
    driver's schema query too, would wait behind it for ever (the owner
    waits for Spark, Spark for the queued lock, the queued lock for the
    owner: no deadlock PostgreSQL sees); they give up after the swap's
    lock_timeout, the swap's try rolls back, the DDL has its lock."""
    execute(url, "UPDATE items SET b = b || '-w' WHERE id = 7")  # for the last replay
    faults.arm("rewrite.swap_spark_locked", "block")
    faults.release("rewrite.before_swap")
    faults.wait_blocked("rewrite.swap_spark_locked", timeout=60)
    ddl = psycopg.connect(url, application_name="queued-ddl")
    try:
        locking = threading.Thread(target=ddl.execute, daemon=True,
                                   args=("LOCK TABLE items IN ACCESS EXCLUSIVE MODE",))
        locking.start()
        wait_until(lambda: execute(url, "SELECT count(*) FROM pg_locks WHERE NOT granted AND "
                                        "relation = 'items'::regclass AND mode = "
                                        "'AccessExclusiveLock'")[0][0] == 1, 30, "the DDL queued")
        faults.release("rewrite.swap_spark_locked")
        noted = wait_until(lambda: (job := job_of(db, job_id))["error"] and
                           "last replay on Spark failed" in job["error"] and job, 60,
                           "Spark's read given up")
        assert noted["state"] == "running" and noted["step"] == 4, noted
        assert "canceling statement due to lock timeout" in noted["error"], noted["error"]
        locking.join(30)  # the swap's try rolled back: the DDL has its lock
        assert not locking.is_alive()
    finally:
        ddl.close()  # its transaction ends: the swap goes on


# The queued lock in CI (the wait only Spark's path has); the writer, whose
# wait is the SQL engine's too (test_rewrite_job), in the matrix.
@pytest.mark.parametrize("blocker", [
    "queued-lock", pytest.param("open-writer", marks=pytest.mark.matrix)])
def test_the_swap_on_spark_waits_bounded_for_its_locks_and_goes_on(spark, db, settings,
                                                                    start_node, blocker):
    """The swap on Spark locks T against writes, replays on Spark, then
    takes its own locks: each wait is bounded, retried, and ends in the swap."""
    url = settings.database_url
    make_table(url, BIGINT, 300)
    faults.arm("rewrite.before_swap", "block")
    job_id = submit(db, rewrite(**ON_SPARK)).job_id
    start_node("n1", slots=2)
    faults.wait_blocked("rewrite.before_swap", timeout=120)
    if blocker == "open-writer":
        _held_by_a_writer(db, url, job_id)
    else:
        _held_by_a_queued_lock(db, url, job_id)
    done = wait_state(db, job_id, timeout=120)
    assert done["state"] == "succeeded", done["error"]
    assert done["error"] is None  # the note of the wait went with the success
    assert scalar(db, "SELECT b FROM items WHERE id = 7").endswith("-w")  # replayed on Spark
    assert not_reversed(url) == 0 and scalar(db, "SELECT count(*) FROM items") == 300
    assert leftovers(url) == []


def test_a_spark_read_held_up_by_a_lock_on_t_gives_up_and_is_retried(spark, db, settings,
                                                                      start_node):
    """A copy batch's Spark read of T waits no longer than the worker's
    lock_timeout (a third of its lease): with a lock queued behind one the
    batch's transaction holds, no bound would be a wait for ever that
    PostgreSQL cannot see. Here a session holds T: the read gives up, the
    subtask is retried from its checkpoint (not failed), and once T is free
    the job succeeds."""
    url = settings.database_url
    make_table(url, BIGINT, ROWS)
    faults.arm("worker.after_batch", "block")
    job_id = submit(db, rewrite(**ON_SPARK)).job_id
    start_node("n1", slots=2, retry_backoff_seconds=0.2)
    faults.wait_blocked("worker.after_batch", timeout=120)
    with psycopg.connect(url, application_name="holding-t") as holder:
        holder.execute("LOCK TABLE items IN ACCESS EXCLUSIVE MODE")
        faults.release("worker.after_batch")
        retried = wait_until(lambda: scalar(
            db, "SELECT error FROM {s}.background_subtask WHERE job_id = :j AND "
                "error LIKE '%Spark''s read failed, tried again%' LIMIT 1", j=job_id),
            60, "a Spark read given up and retried")
        assert "canceling statement due to lock timeout" in retried, retried
        assert job_of(db, job_id)["state"] == "running"
    done = wait_state(db, job_id, timeout=120)
    assert done["state"] == "succeeded", done["error"]
    assert not_reversed(url) == 0 and scalar(db, "SELECT count(*) FROM items") == ROWS
    assert leftovers(url) == []


# In the matrix: batches of a fetch and more, each read by a slow function (~10 s).
@pytest.mark.matrix
def test_a_spark_read_whose_connection_drops_is_retried_from_the_checkpoint(spark, db, settings,
                                                                           start_node):
    """The database drops Spark's connections between the fetches of a
    batch's read (as a restart or a failover would): the subtask is retried
    from its checkpoint, not failed; every row computed once."""
    url = settings.database_url
    make_table(url, BIGINT, 20_000)
    job_id = submit(db, SubmitRequest(
        "rewrite", {"table": "items", **ON_SPARK, "sets": ["d=slow_reverse_text(b)"],
                    "udf": "support.spark:slow_reverse_text"},
        batch_rows=15_000, rows_per_subtask=10_000)).job_id  # a read of two fetches
    start_node("n1", slots=2, retry_backoff_seconds=0.2)
    dropped = 0

    def drop_spark_reads() -> bool:
        nonlocal dropped
        dropped += scalar(db, """
            SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
            WHERE pid <> pg_backend_pid() AND datname = current_database()
              AND application_name = :spark AND state = 'idle in transaction'
              AND query LIKE '%__reorg_ver%'""", spark=SPARK_APPLICATION_NAME)
        return dropped >= 2

    wait_until(drop_spark_reads, 60, "two Spark reads caught between fetches", interval=0.05)
    done = wait_state(db, job_id, timeout=120)
    assert done["state"] == "succeeded", done["error"]
    assert not_reversed(url) == 0 and scalar(db, "SELECT count(*) FROM items") == 20_000
    wait_history(db, job_id)
    assert scalar(db, "SELECT max(attempts) FROM {s}.background_subtask_history "
                      "WHERE job_id = :j", j=job_id) >= 2
    assert leftovers(url) == []


@pytest.mark.parametrize(("params", "says"), [
    ({"sets": ["b=upper(b)", "a=a+1"], "engine": "spark"},
     "--engine spark computes one column on Spark: give exactly one --set"),
    ({"sets": ["b=upper(b)"], "udf": "support.spark:reverse_text"}, "--udf is for --engine spark"),
    ({"sets": ["b=upper(b)"], "engine": "spark", "udf": "os:system"}, "not allowed for UDFs"),
    ({"sets": ["b=no_such_function(b)"], "engine": "spark"},
     "--set b=no_such_function(b) is not a Spark SQL expression over public.items"),
    ({"sets": ["a=b"], "engine": "spark"}, "yields string but a is integer"),
    ({"sets": ["b=upper(b)"], "engine": "duckdb"}, "--engine 'duckdb': give sql"),
])
def test_bad_input_is_refused_in_one_line_and_changes_nothing(spark, db, settings, params, says):
    url = settings.database_url
    make_table(url, BIGINT, 50)
    before = catalogue(url)
    with pytest.raises(InvalidParams) as refused:
        submit(db, rewrite(**params))
    assert says in str(refused.value) and "\n" not in str(refused.value), str(refused.value)
    assert catalogue(url) == before and leftovers(url) == []
    assert rows(db, "SELECT id FROM {s}.jobs") == []


def test_a_dry_run_shows_what_spark_computes(spark, db, settings):
    url = settings.database_url
    make_table(url, BIGINT, 50)
    result = submit(db, SubmitRequest("rewrite", {"table": "items", **ON_SPARK}, dry_run=True))
    text = "\n".join(result.notes)
    assert ("Spark reads SELECT *, xmin FROM \"public\".\"items\" WHERE \"id\" >= lo AND \"id\" < hi "
            "and computes d = reverse_text(b) (--udf support.spark:reverse_text)") in text, text
    assert 'AND "public"."items".xmin = s."__reorg_s_ver"' in text
    assert rows(db, "SELECT id FROM {s}.jobs") == [] and leftovers(url) == []

