"""``rewrite`` end to end on in-process nodes, with applications writing
throughout (support.rewrite.KeyApp: inserts, updates, key updates, deletes
and re-inserts of deleted keys) and their oracle: the four forms (repack,
--order-by, --alter with --set, --like partitioned) on an integer key and
a composite text key; a cancel in every state leaves T exactly as before
(the same table, its catalogue, the oracle's rows) with nothing of the job
left; a swap held up by a long transaction waits, says who holds T, and
goes on once it ends (or ends it, --kill-blockers); ``reorg revert`` after
writes made after the swap keeps them."""

from __future__ import annotations

import psycopg
import pytest
from support import execute, job_of, rows, scalar, wait_state, wait_until
from support.rewrite import BIGINT, COMPOSITE, KeyApp, engine, make_table, table_as_oracle
from support.rewrite_catalog import snapshot

from backfill.rewrite.cli import revert_job, status_line
from backfill.rewrite.job import register
from framework import control, faults
from framework.errors import InvalidParams
from framework.submit import SubmitRequest, submit

# Depends on the catalog or on lock levels: run on every supported major (README).
pytestmark = pytest.mark.catalog

ROWS = 1_500
KEYS = {"integer": BIGINT, "composite": COMPOSITE}


@pytest.fixture(autouse=True, scope="module")
def _registered() -> None:
    register()


def rewrite(**params) -> SubmitRequest:
    return SubmitRequest("rewrite", {"table": "items", **params}, batch_rows=100,
                         rows_per_subtask=400)


def started_app(url: str, key) -> KeyApp:
    app = KeyApp(url, key, space=2 * ROWS)
    app.load()
    app.start()
    return app


def catalogue(url: str) -> dict:
    eng = engine(url)
    try:
        with eng.begin() as conn:
            return snapshot(conn)
    finally:
        eng.dispose()


def oid(url: str) -> int:
    return execute(url, "SELECT 'items'::regclass::oid")[0][0]


def leftovers(url: str) -> list[tuple]:
    """Whatever a rewrite job makes, by its names: tables, functions, triggers."""
    return execute(url, r"""
        SELECT 'relation', relname FROM pg_class WHERE relname ~ '^(reorg_\d+_|rewrite_\d+_)'
        UNION ALL SELECT 'function', proname FROM pg_proc WHERE proname ~ '^rewrite_\d+_'
        UNION ALL SELECT 'trigger', tgname FROM pg_trigger WHERE tgname ~ '^reorg_\d+_'""")


def more_writes(app: KeyApp, count: int) -> None:
    start = app.ops
    wait_until(lambda: app.ops >= start + count, 30, f"{count} more application writes")


def step_rows(db, job_id: int, step: int) -> int:
    return scalar(db, """SELECT coalesce(sum(row_count), 0) FROM (
        SELECT row_count FROM {s}.background_subtask WHERE job_id = :j AND step = :st
        UNION ALL SELECT row_count FROM {s}.background_subtask_history
        WHERE job_id = :j AND step = :st) x""", j=job_id, st=step)


# --- the four forms ------------------------------------------------------------------


def _repack(url, key):
    return {}, None


def _order_by(url, key):
    # a in an order of its own, unlike the rows' physical order
    execute(url, "UPDATE items SET a = (id * 7919) % 2003; ALTER TABLE items ALTER a SET NOT NULL; "
                 "CREATE INDEX items_a ON items (a); ANALYZE items")
    return {"order_by": "a"}, None


def _alter(url, key):
    return ({"alter": "ALTER COLUMN a TYPE bigint, ADD COLUMN d text", "sets": ["d=md5(b)"]},
            "ALTER")


LIKE = {
    "integer": """
        CREATE TABLE items (id bigint NOT NULL, a int, b text, c int, PRIMARY KEY (id))
            PARTITION BY RANGE (id);
        CREATE TABLE items_low PARTITION OF items FOR VALUES FROM (MINVALUE) TO (1000);
        CREATE TABLE items_high PARTITION OF items FOR VALUES FROM (1000) TO (MAXVALUE);""",
    "composite": """
        CREATE TABLE items (region text, id int, a int, b text, c int, PRIMARY KEY (region, id))
            PARTITION BY LIST (region);
        CREATE TABLE items_r0 PARTITION OF items FOR VALUES IN ('r0');
        CREATE TABLE items_rest PARTITION OF items DEFAULT;""",
}


def _like(url, key):
    return {"like": LIKE["integer" if key is BIGINT else "composite"]}, "LIKE"


FORMS = {"repack": _repack, "order-by": _order_by, "alter-set": _alter, "like": _like}
# Each form on one key kind in the default run, on the other in the matrix.
DEFAULT = [("repack", "integer"), ("order-by", "composite"), ("alter-set", "integer"),
           ("like", "composite")]
CASES = [pytest.param(f, k, id=f"{f}-{k}", marks=() if (f, k) in DEFAULT else pytest.mark.matrix)
         for f in FORMS for k in KEYS]


@pytest.mark.parametrize(("form", "key_kind"), CASES)
def test_each_form_keeps_every_write_of_the_applications(db, settings, start_node, form,
                                                         key_kind):
    url, key = settings.database_url, KEYS[key_kind]
    make_table(url, key, ROWS)
    params, changes = FORMS[form](url, key)
    before, table = catalogue(url), oid(url)
    app = started_app(url, key)
    faults.enable_signals()
    faults.arm("worker.after_batch", "block")  # the copy held a moment: a backlog to catch up
    job_id = submit(db, rewrite(**params)).job_id
    start_node("n1", slots=2)
    faults.wait_blocked("worker.after_batch")
    more_writes(app, 200)
    line = status_line(db, job_of(db, job_id))  # `reorg status JOB` shows the log's backlog
    assert line.startswith("change log: ") and "keys to replay into the shadow" in line, line
    if changes == "ALTER":  # --set's d is md5(b) as the copy and the replay made it
        faults.arm("rewrite.before_verify", "block")
    faults.release("worker.after_batch")
    if changes == "ALTER":
        faults.wait_blocked("rewrite.before_verify")
        app.stop(at_least_ops=20)  # the rest without writes: every d checked below
        faults.release("rewrite.before_verify")
    done = wait_state(db, job_id, timeout=90)
    app.stop(at_least_ops=50)  # writes into the new table too
    assert done["state"] == "succeeded", done["error"]
    assert app.errors == []
    assert table_as_oracle(url, key[0]) == app.oracle
    assert oid(url) != table
    assert leftovers(url) == []
    assert step_rows(db, job_id, 3) > 0  # the catch-up replayed the writes made meanwhile
    after = catalogue(url)
    if changes is None:
        assert after == before
    elif changes == "ALTER":
        assert [c[:2] for c in after["columns"]] == sorted(
            [("a", "bigint"), *[c[:2] for c in before["columns"] if c[0] != "a"],
             ("d", "text")])
        assert scalar(db, "SELECT count(*) FROM items WHERE d IS DISTINCT FROM md5(b)") == 0
        assert {k: v for k, v in after.items() if k != "columns"} == {
            k: v for k, v in before.items() if k != "columns"}
    else:  # --like: partitioned, its partitions holding the rows
        assert scalar(db, "SELECT relkind FROM pg_class WHERE oid = 'items'::regclass") == "p"
        assert scalar(db, "SELECT count(*) FROM pg_inherits WHERE inhparent = "
                          "'items'::regclass") == 2
        assert after["triggers"] == before["triggers"]  # the user's trigger carried over
    if form == "order-by":
        # The copy wrote the rows in the order of a: the new table's order
        # follows a (PostgreSQL's correlation of a), the old one's did not.
        before_order = _correlation(url, "a")
        execute(url, "ANALYZE items")
        assert _correlation(url, "a") > 0.5, before_order


def _correlation(url: str, column: str) -> float:
    return execute(url, f"SELECT correlation FROM pg_stats WHERE tablename = 'items' "
                        f"AND attname = '{column}'")[0][0]


# --- cancel in each state ----------------------------------------------------------------

HOLD = {"copy": "worker.after_batch", "build": "rewrite.before_build",
        "catch-up": "rewrite.before_replay", "verify": "rewrite.before_verify"}


# build and catch-up in the matrix: between copy and verify, T is as untouched.
@pytest.mark.parametrize("state", [
    pytest.param(s, marks=pytest.mark.matrix) if s in ("build", "catch-up") else s
    for s in [*HOLD, "swapped"]])
def test_a_cancel_in_each_state_leaves_the_table_as_it_was(db, settings, start_node, state):
    cancelled_in(db, settings.database_url, start_node, state, rewrite(keep_old="1h"))


def cancelled_in(db, url: str, start_node, state: str, request: SubmitRequest,
                 timeout: float = 60) -> None:
    """The job of ``request`` (with --keep-old) on T under an application,
    cancelled in ``state`` (held at its point in HOLD, or after the swap
    with writes into the new table): it ends cancelled with T exactly as
    before (the same table, its catalogue, the oracle's rows) and nothing
    of the job left."""
    make_table(url, BIGINT, ROWS)
    before, table = catalogue(url), oid(url)
    app = started_app(url, BIGINT)
    if state in HOLD:
        faults.arm(HOLD[state], "block")
    job_id = submit(db, request).job_id
    start_node("n1", slots=2)
    if state in HOLD:
        faults.wait_blocked(HOLD[state], timeout=timeout)
    else:
        wait_until(lambda: job_of(db, job_id)["step"] == 5, timeout, "the swap")
        more_writes(app, 200)  # into the new table, kept in the old one
    control.cancel(db, job_id)
    if state in HOLD:
        faults.release(HOLD[state])
    done = wait_state(db, job_id, timeout=timeout)
    app.stop(at_least_ops=50)
    assert done["state"] == "cancelled", done["error"]
    assert app.errors == []
    assert table_as_oracle(url, BIGINT[0]) == app.oracle
    assert oid(url) == table  # T itself, never replaced (or swapped back)
    assert catalogue(url) == before
    assert leftovers(url) == []


def test_a_copy_batch_held_up_by_a_lock_on_t_is_retried_not_failed(db, settings, start_node):
    """A copy batch's INSERT (run on the driver's connection, whose errors
    are psycopg's own) waits out the worker's lock_timeout behind a session
    holding T: the subtask is retried from its checkpoint, and the job
    succeeds once T is free. (It failed the job before is_retryable judged
    psycopg's own errors.)"""
    url = settings.database_url
    make_table(url, BIGINT, ROWS)
    faults.arm("worker.after_batch", "block")
    job_id = submit(db, rewrite()).job_id
    start_node("n1", slots=2, retry_backoff_seconds=0.2)
    faults.wait_blocked("worker.after_batch")
    with psycopg.connect(url, application_name="holding-t") as holder:
        holder.execute("LOCK TABLE items IN ACCESS EXCLUSIVE MODE")
        faults.release("worker.after_batch")
        retried = wait_until(lambda: scalar(
            db, "SELECT error FROM {s}.background_subtask WHERE job_id = :j AND step = 1 "
                "AND error LIKE '%lock timeout%' LIMIT 1", j=job_id), 60, "a batch retried")
        assert "canceling statement due to lock timeout" in retried, retried
        assert job_of(db, job_id)["state"] == "running"
    done = wait_state(db, job_id, timeout=60)
    assert done["state"] == "succeeded", done["error"]
    assert scalar(db, "SELECT count(*) FROM items") == ROWS
    assert leftovers(url) == []


# --- the swap --------------------------------------------------------------------------


def test_a_long_transaction_holds_the_swap_up_until_it_ends_and_status_names_it(
        db, settings, start_node):
    url = settings.database_url
    make_table(url, BIGINT, ROWS)
    app = started_app(url, BIGINT)
    faults.arm("rewrite.before_verify", "block")
    job_id = submit(db, rewrite()).job_id
    start_node("n1", slots=2)
    faults.wait_blocked("rewrite.before_verify")
    with psycopg.connect(url, application_name="long-report") as report:
        report.execute("SELECT count(*) FROM items")  # holds items until it ends
        pid = report.info.backend_pid
        faults.release("rewrite.before_verify")
        named_as_blocker(db, job_id, pid, "long-report")
        more_writes(app, 50)  # the applications go on meanwhile
        assert job_of(db, job_id)["step"] == 4
    done = wait_state(db, job_id, timeout=90)
    app.stop(at_least_ops=50)
    assert done["state"] == "succeeded", done["error"]
    assert done["error"] is None  # the note of the wait went with the success
    assert app.errors == []
    assert table_as_oracle(url, BIGINT[0]) == app.oracle


def named_as_blocker(db, job_id: int, pid: int, application: str) -> None:
    """The swap waits for session ``pid``: the job, still running its
    verify step, has a note naming it."""
    noted = wait_until(lambda: (job := job_of(db, job_id))["error"] and
                       f"pid {pid}" in job["error"] and job, 60, "the blocker named")
    assert noted["state"] == "running" and noted["step"] == 4, noted
    assert f"application {application}" in noted["error"], noted["error"]
    assert "waited 2s (lock_timeout)" in noted["error"], noted["error"]


def test_kill_blockers_ends_the_session_holding_the_swap_up(db, settings, start_node):
    url = settings.database_url
    make_table(url, BIGINT, 300)
    faults.arm("rewrite.before_verify", "block")
    job_id = submit(db, rewrite(kill_blockers=True)).job_id
    start_node("n1", slots=2)
    faults.wait_blocked("rewrite.before_verify")
    report = psycopg.connect(url, application_name="forgotten")
    report.execute("SELECT count(*) FROM items")
    faults.release("rewrite.before_verify")
    done = wait_state(db, job_id, timeout=60)
    assert done["state"] == "succeeded", done["error"]
    with pytest.raises(psycopg.OperationalError):
        report.execute("SELECT 1")
    report.close()


def test_revert_after_the_swap_keeps_the_writes_made_since(db, settings, start_node):
    url = settings.database_url
    make_table(url, BIGINT, ROWS)
    before, table = catalogue(url), oid(url)
    app = started_app(url, BIGINT)
    job_id = submit(db, rewrite(alter="ALTER COLUMN a TYPE bigint", keep_old="1h")).job_id
    with pytest.raises(InvalidParams, match="has not swapped yet"):
        revert_job(db, job_id)
    start_node("n1", slots=2)
    wait_until(lambda: job_of(db, job_id)["step"] == 5, 60, "the swap")
    assert scalar(db, "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE "
                      "attrelid = 'items'::regclass AND attname = 'a'") == "bigint"
    assert "reorg revert" in status_line(db, job_of(db, job_id))
    more_writes(app, 300)  # into the new table
    assert revert_job(db, job_id) == "cancelling"
    done = wait_state(db, job_id, timeout=60)
    more_writes(app, 100)  # into the old table, T again
    app.stop()
    assert done["state"] == "cancelled", done["error"]
    assert app.errors == []
    assert table_as_oracle(url, BIGINT[0]) == app.oracle
    assert oid(url) == table
    assert catalogue(url) == before
    assert leftovers(url) == []


# --- what submit refuses, what a dry run shows ---------------------------------------------


@pytest.mark.parametrize(("params", "says"), [
    ({"order_by": "b"}, "--order-by: column b may be NULL"),
    ({"alter": "DROP COLUMN c", "keep_old": "10m"}, "--keep-old: column c is not in the new shape"),
    ({"sets": ["zz=1"]}, "--set zz: the new shape has no column zz"),
    ({"keep_old": "soon"}, "--keep-old 'soon' is not a duration"),
    ({"verify": "sometimes"}, "--verify 'sometimes': give one of full, off"),
    ({"alter": "ALTER COLUMN id TYPE text"}, ""),
])
def test_bad_input_is_refused_in_one_line_and_changes_nothing(db, settings, params, says):
    url = settings.database_url
    make_table(url, BIGINT, 50)
    before = catalogue(url)
    with pytest.raises(InvalidParams) as refused:
        submit(db, rewrite(**params))
    assert says in str(refused.value) and "\n" not in str(refused.value)
    assert catalogue(url) == before and leftovers(url) == []
    assert rows(db, "SELECT id FROM {s}.jobs") == []


def test_a_dry_run_prints_every_state_and_submits_nothing(db, settings):
    url = settings.database_url
    make_table(url, BIGINT, 50)
    result = submit(db, SubmitRequest("rewrite", {"table": "items", "order_by": None,
                                                  "alter": "ADD COLUMN d text",
                                                  "sets": ["d=upper(b)"]}, dry_run=True))
    text = "\n".join(result.notes)
    for state in ("prepare", "copy", "build", "catch-up", "verify", "swap", "swapped",
                  "cleanup", "rollback before the swap"):
        assert f"\n{state} (" in f"\n{text}", state
    assert 'INSERT INTO "public"."reorg_0_items" ("id", "a", "b", "c", "d")' in text
    assert "(upper(b)" in text and "CREATE TRIGGER" in text
    assert rows(db, "SELECT id FROM {s}.jobs") == [] and leftovers(url) == []


def test_a_rewrite_takes_batches_of_50000_rows_unless_told(db, settings):
    """A rewrite's batch reads T and writes only the shadow: its type's
    default is a range's 50,000 rows; --batch-rows still wins, and other
    types keep 10,000."""
    for table in ("items", "told", "other"):
        make_table(settings.database_url, BIGINT, 50, table=table)

    def batch_rows(request: SubmitRequest) -> int:
        return job_of(db, submit(db, request).job_id)["batch_rows"]

    params = {"order_by": None, "alter": None, "sets": []}
    assert batch_rows(SubmitRequest("rewrite", {"table": "items", **params})) == 50_000
    assert batch_rows(SubmitRequest("rewrite", {"table": "told", **params}, batch_rows=700)) == 700
    assert batch_rows(SubmitRequest("sql-update", {"table": "other", "set": "a=a"})) == 10_000


# --- verify -------------------------------------------------------------------------------


def test_verify_copies_a_differing_range_again_and_keeps_a_ledger(db, settings, start_node):
    url = settings.database_url
    make_table(url, BIGINT, ROWS)
    faults.arm("rewrite.before_verify", "block")
    job_id = submit(db, rewrite()).job_id
    start_node("n1", slots=2)
    faults.wait_blocked("rewrite.before_verify")
    # Rows of the shadow gone wrong, each batch in its own way: a text changed
    # and a row lost; an integer changed (hashed by value, not by its text);
    # two rows' values of one column swapped (the same values, summed apart).
    execute(url, f"UPDATE reorg_{job_id}_items SET b = 'wrong' WHERE id = 10; "
                 f"DELETE FROM reorg_{job_id}_items WHERE id = 11; "
                 f"UPDATE reorg_{job_id}_items SET a = -a WHERE id = 150; "
                 f"UPDATE reorg_{job_id}_items SET a = 251 + 252 - a WHERE id IN (251, 252)")
    faults.release("rewrite.before_verify")
    done = wait_state(db, job_id, timeout=60)
    assert done["state"] == "succeeded", done["error"]
    assert execute(url, "SELECT id, a, b FROM items WHERE id IN (10, 11, 150, 251, 252) "
                        "ORDER BY id") == [(10, 10, "v10"), (11, 11, "v11"), (150, 150, "v150"),
                                           (251, 251, "v251"), (252, 252, "v252")]
    ledgers = [m for (m,) in rows(db, """
        SELECT meta FROM {s}.background_subtask WHERE job_id = :j AND step = 4 UNION ALL
        SELECT meta FROM {s}.background_subtask_history WHERE job_id = :j AND step = 4""",
        j=job_id)]
    assert sum(m.get("compared", 0) for m in ledgers) == ROWS
    assert sum(m.get("recopied", 0) for m in ledgers) == 3
    shown = sorted((r for m in ledgers for r in m.get("recopied_ranges", [])),
                   key=lambda r: int(r[1:r.index(",")]))
    assert [r.split(":")[0] for r in shown] == ["[1, 101)", "[101, 201)", "[201, 301)"]
    assert shown[0].endswith("100 rows in T, 99 in the shadow"), shown
    assert shown[1].endswith("100 rows in T, 100 in the shadow, their contents differ"), shown
    assert all(len(m["checksum"]) == 32 for m in ledgers)


@pytest.mark.parametrize("verify", ["full", "off"])
def test_the_new_table_has_its_statistics_taken_once_in_the_verify_step(db, settings, start_node,
                                                                        verify):
    """One verify subtask ANALYZEs the shadow while the others verify their
    ranges (several ranges, two slots): the new table has statistics from
    its first statement after the swap, taken once, by hand (not autovacuum)."""
    url = settings.database_url
    make_table(url, BIGINT, ROWS)
    # The shadow carries T's reloptions: with autovacuum off on both, an
    # autovacuum worker that happens by on a loaded machine cannot analyze
    # the shadow first, and the counts below are reorg's alone.
    execute(url, "ALTER TABLE items SET (autovacuum_enabled = off)")
    job_id = submit(db, rewrite(verify=verify)).job_id
    start_node("n1", slots=2)
    done = wait_state(db, job_id, timeout=60)
    assert done["state"] == "succeeded", done["error"]
    verify_ranges = rows(db, """
        SELECT count(*) FROM (SELECT id FROM {s}.background_subtask WHERE job_id = :j
            AND step = 4 UNION ALL SELECT id FROM {s}.background_subtask_history
            WHERE job_id = :j AND step = 4) x""", j=job_id)[0][0]
    assert verify_ranges > 2
    catch_up = rows(db, """
        SELECT meta FROM {s}.background_subtask WHERE job_id = :j AND step = 3 UNION ALL
        SELECT meta FROM {s}.background_subtask_history WHERE job_id = :j AND step = 3""",
        j=job_id)
    assert catch_up and all(set(m) <= {"round", "backlog", "backlog_at_start"}
                            for (m,) in catch_up), catch_up  # replay rounds only
    assert execute(url, "SELECT pg_stat_get_analyze_count('items'::regclass), "
                        "pg_stat_get_autoanalyze_count('items'::regclass), "
                        "(SELECT count(*) > 0 FROM pg_stats WHERE tablename = 'items')") == [
        (1, 0, True)]


def test_verify_off_compares_nothing_and_keeps_every_write(db, settings, start_node):
    """--verify off (as pg_repack): each verify range replays the log and
    compares nothing, not even a shadow gone wrong; the applications'
    writes all reach the new table through the log."""
    url = settings.database_url
    make_table(url, BIGINT, ROWS)
    app = started_app(url, BIGINT)
    faults.arm("rewrite.before_verify", "block")
    job_id = submit(db, rewrite(verify="off")).job_id
    start_node("n1", slots=2)
    faults.wait_blocked("rewrite.before_verify")
    more_writes(app, 100)
    app.stop()
    # A row of the shadow gone wrong behind the job's back, not in the log.
    (key, a), = execute(url, f"SELECT id, a FROM reorg_{job_id}_items WHERE id NOT IN "
                             f"(SELECT k0 FROM reorg.rewrite_{job_id}_log) ORDER BY id LIMIT 1")
    execute(url, f"UPDATE reorg_{job_id}_items SET b = 'wrong', c = 5 WHERE id = {key}")
    faults.release("rewrite.before_verify")
    done = wait_state(db, job_id, timeout=60)
    assert done["state"] == "succeeded", done["error"]
    ledgers = [m for (m,) in rows(db, """
        SELECT meta FROM {s}.background_subtask WHERE job_id = :j AND step = 4 UNION ALL
        SELECT meta FROM {s}.background_subtask_history WHERE job_id = :j AND step = 4""",
        j=job_id)]
    assert ledgers and all(m == {"verify": "off"} for m in ledgers)
    # Not compared, so not mended; every other row is the applications'.
    assert table_as_oracle(url, BIGINT[0]) == {**app.oracle, (key,): (a, "wrong")}
    assert leftovers(url) == []


def test_everything_the_table_has_is_carried_through_a_job(db, settings, start_node):
    """support.rewrite_catalog's table of every property DESIGN 15 names, and
    foreign keys of other tables on it, validated after the swap."""
    from support.rewrite_catalog import make_everything

    url = settings.database_url
    make_everything(url)
    before, table = catalogue(url), oid(url)
    job_id = submit(db, rewrite(keep_old="1s")).job_id
    start_node("n1", slots=2)
    done = wait_state(db, job_id, timeout=60)
    assert done["state"] == "succeeded", done["error"]
    assert oid(url) != table
    assert catalogue(url) == before
    assert leftovers(url) == []


def test_a_job_submitted_by_the_tables_owner_runs_its_sql_as_them(db, settings, start_node):
    """The workers connect as a superuser; the copy and the replays (they
    carry --set) run as the submitter, who owns T and holds nothing else:
    granted on the shadow by prepare, and those grants gone with the swap."""
    from sqlalchemy.engine import make_url

    from framework.config import Settings
    from framework.db import Database
    from framework.grants import GrantPlan, grant_script, statements

    url = settings.database_url
    make_table(url, BIGINT, 400)
    execute(url, "DO $$ BEGIN CREATE ROLE rw_owner LOGIN; EXCEPTION WHEN duplicate_object "
                 "THEN NULL; END $$; ALTER TABLE items OWNER TO rw_owner; "
                 # submit checks the plan by making it, in a transaction rolled back
                 "GRANT CREATE ON SCHEMA public TO rw_owner")
    for statement in statements(grant_script(GrantPlan("reorg", "postgres", "postgres",
                                                        ("rw_owner",)))):
        execute(url, statement)
    before = catalogue(url)
    app = started_app(url, BIGINT)
    as_owner = Database(Settings(make_url(url).set(username="rw_owner").render_as_string(
        hide_password=False)))
    try:
        job_id = submit(as_owner, rewrite(alter="ADD COLUMN d text",
                                          sets=["d=md5(b)"])).job_id
    finally:
        as_owner.dispose()
    start_node("n1", slots=2)
    done = wait_state(db, job_id, timeout=60)
    app.stop(at_least_ops=50)
    assert done["state"] == "succeeded", done["error"]
    assert table_as_oracle(url, BIGINT[0]) == app.oracle
    after = catalogue(url)
    assert after["table"] == before["table"]  # owner rw_owner, no grant left on it
    assert leftovers(url) == []


# --- the build step's order -----------------------------------------------------------


def test_a_foreign_key_of_t_to_itself_is_built_after_the_shadows_key(db, settings):
    """Issue 24. The build step's subtasks run at once on several workers;
    on the shadow a foreign key of T to T references the shadow's own key,
    which another build subtask makes. Owner and workers driven by hand: the
    key's build is held before its statement while a second worker takes
    the foreign key's: that one is handed back (its attempt given back, to
    be claimed again after a back-off), never failed, and once the key is
    built it is built too."""
    import threading

    from framework.owner import Owner
    from framework.worker import WorkerPool

    url = settings.database_url
    make_table(url, BIGINT, 400)
    execute(url, "ALTER TABLE items ADD COLUMN up bigint REFERENCES items (id); "
                 "UPDATE items SET up = id - 1 WHERE id > 1")
    before = catalogue(url)
    job_id = submit(db, rewrite()).job_id
    owner, first, second = Owner(db, "o"), WorkerPool(db, "w1", 1), WorkerPool(db, "w2", 1)

    def build_subtask(name: str) -> tuple:
        return rows(db, "SELECT state, attempts, not_before > clock_timestamp(), exec_id "
                        "FROM {s}.background_subtask WHERE job_id = :j AND step = 2 "
                        "AND meta->'build'->>'final' = :n", j=job_id, n=name)[0]

    def at_build() -> bool:  # prepare, then the copy, up to the build step
        owner.tick()
        while job_of(db, job_id)["step"] == 1 and first.run_one():
            pass
        return job_of(db, job_id)["step"] == 2

    wait_until(at_build, 60, "the job at its build step")
    faults.arm("rewrite.before_build", "block@1")  # the first build claimed: the key's
    holder = threading.Thread(target=first.run_one, daemon=True)
    try:
        holder.start()
        faults.wait_blocked("rewrite.before_build")
        assert build_subtask("items_pkey")[::3] == ("running", "w1")
        assert second.run_one()  # the foreign key's build, before the key is there
        fk = second.results[-1]
        assert fk.outcome == "waiting", fk.error
        assert "items_pkey" in (fk.error or "")  # what it waits for
        assert build_subtask("items_up_fkey")[:3] == ("pending", 0, True)
        faults.release("rewrite.before_build")
        holder.join(30)
        assert first.results[-1].outcome == "succeeded"
    finally:
        faults.disarm_all()
    wait_until(lambda: second.run_one() and second.results[-1].outcome == "succeeded", 30,
               "the foreign key's build, claimed again after its back-off")

    def done() -> bool:
        owner.tick()
        while first.run_one():
            pass
        return job_of(db, job_id)["state"] in ("succeeded", "failed", "reverted")

    wait_until(done, 60, "the job's end")
    job = job_of(db, job_id)
    assert job["state"] == "succeeded", job["error"]
    assert catalogue(url) == before  # the foreign key of the new T is to itself, validated
    assert scalar(db, "SELECT count(*) FROM items WHERE up = id - 1") == 399
    assert leftovers(url) == []


# The file's foreign key to itself before its key: the submit's trial builds
# in dependency order too.
LIKE_SELF = """CREATE TABLE items (id bigint NOT NULL, a int, b text, c int,
                                   up bigint REFERENCES items (id), PRIMARY KEY (id));"""


@pytest.mark.parametrize("params", [
    {"alter": "ADD COLUMN up bigint, ADD CONSTRAINT items_up FOREIGN KEY (up) REFERENCES items"},
    {"like": LIKE_SELF}], ids=["alter", "like"])
def test_a_foreign_key_to_itself_in_the_new_shape_is_of_the_new_table_to_itself(
        db, settings, start_node, params):
    """One an --alter or the --like file adds: made on the shadow to the
    shadow, not to T (whose swap then failed on it, and the job reverted)."""
    url = settings.database_url
    make_table(url, BIGINT, 400)
    job_id = submit(db, rewrite(**params)).job_id
    start_node("n1", slots=2)
    done = wait_state(db, job_id, timeout=60)
    assert done["state"] == "succeeded", done["error"]
    assert execute(url, "SELECT confrelid::regclass::text, convalidated FROM pg_constraint "
                        "WHERE conrelid = 'items'::regclass AND contype = 'f'") == [("items", True)]
    execute(url, "UPDATE items SET up = id - 1 WHERE id > 1")
    with pytest.raises(psycopg.errors.ForeignKeyViolation):
        execute(url, "UPDATE items SET up = 100000 WHERE id = 1")
    assert leftovers(url) == []
