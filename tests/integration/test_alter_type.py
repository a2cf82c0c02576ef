"""``alter-type`` on in-process nodes, with an application inserting,
updating and deleting rows the whole time (support.app) and the oracle of
what the table must hold: the table afterwards equals the oracle (nothing
written during the job is lost, DESIGN 12), the catalogue facts of the
column (NOT NULL, default, indexes, constraints, comments, sequence) are the
same before and after except its type, and a failed or cancelled job leaves
the table exactly as before, with no trigger, shadow column or index."""

from __future__ import annotations

import pytest
from support import job_of, scalar, wait_state, wait_until
from support.app import App, column_catalog, table_as_oracle

from framework import control, faults
from framework.submit import SubmitRequest, submit

# Depends on the catalog or on lock levels: run on every supported major (README).
pytestmark = pytest.mark.catalog

ROWS = 3_000


def _make_table(url: str, a_type: str = "int", a_default: str = "7") -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"""
            DROP TABLE IF EXISTS items;
            CREATE TABLE items (id serial PRIMARY KEY, a {a_type} NOT NULL DEFAULT {a_default},
                                b text, c text);
            CREATE INDEX items_a_b ON items (a, b);
            COMMENT ON COLUMN items.a IS 'the a: 100%';
            COMMENT ON COLUMN items.id IS 'row id';
            COMMENT ON INDEX items_a_b IS 'by a';
            DO $$ BEGIN CREATE ROLE app_reader; EXCEPTION WHEN duplicate_object THEN
                  NULL; END $$;
            GRANT SELECT (id, a), UPDATE (a) ON items TO app_reader;
            GRANT INSERT (a) ON items TO app_reader WITH GRANT OPTION;
            GRANT SELECT (a) ON items TO PUBLIC;
            ALTER TABLE items ALTER COLUMN a SET STATISTICS 500,
                              ALTER COLUMN a SET (n_distinct = 97),
                              ALTER COLUMN id SET STATISTICS 50;
            INSERT INTO items (a, b) SELECT g % 97, 'v' || g FROM generate_series(1, {ROWS}) g;
            ANALYZE items""")


def _alter(column: str, type_: str, using: str | None = None, **knobs) -> SubmitRequest:
    params = {"table": "items", "column": column, "type": type_}
    if using:
        params["using"] = using
    knobs = {"rows_per_subtask": 500, "batch_rows": 200, **knobs}
    return SubmitRequest("alter-type", params, **knobs)


def _with_type(facts: dict, column: str, type_: str) -> dict:
    """``facts`` with the column's type changed (what the job must change, and only that)."""
    columns = [(c[0], type_, *c[2:]) if c[0] == column else c for c in facts["columns"]]
    return {**facts, "columns": sorted(columns)}


def _nothing_left(facts: dict) -> None:
    assert not any("reorg" in str(row) for rows in facts.values() for row in rows), facts


def test_int_to_bigint_on_the_primary_key_keeps_every_write_and_every_catalogue_fact(
        db, settings, start_node):
    url = settings.database_url
    _make_table(url)
    before = column_catalog(url)
    app = App(url)
    app.load()
    app.start()
    job_id = submit(db, _alter("id", "bigint")).job_id
    start_node("n1", slots=2)
    done = wait_state(db, job_id, timeout=120)
    app.stop(at_least_ops=50)  # writes after the cut-over too, through the new column
    assert done["state"] == "succeeded", done
    assert app.errors == []
    assert table_as_oracle(url) == app.oracle
    after = column_catalog(url)
    assert after == _with_type(before, "id", "bigint")
    _nothing_left(after)
    # The column moved to the end of SELECT *.
    assert scalar(db, "SELECT attname FROM pg_attribute WHERE attrelid = 'items'::regclass "
                      "AND attnum > 0 AND NOT attisdropped ORDER BY attnum DESC LIMIT 1") == "id"
    assert done["schema_state"] == "public"


def test_text_to_int_with_using_keeps_not_null_default_index_and_comment(
        db, settings, start_node):
    url = settings.database_url
    _make_table(url, a_type="text", a_default="'7'")
    before = column_catalog(url)
    app = App(url, value=str)
    app.load()
    app.start()
    job_id = submit(db, _alter("a", "int", using="a::int + 0")).job_id
    start_node("n1", slots=2)
    done = wait_state(db, job_id, timeout=120)
    app.stop(at_least_ops=50)
    assert done["state"] == "succeeded", done
    assert app.errors == []
    assert table_as_oracle(url) == {k: (int(a), b) for k, (a, b) in app.oracle.items()}
    after = column_catalog(url)
    # The default '7'::text does not coerce to integer implicitly: it is cast.
    expected = _with_type(before, "a", "integer")
    expected["columns"] = sorted((c[0], c[1], c[2], "('7'::text)::integer", c[4])
                                 if c[0] == "a" else c for c in expected["columns"])
    assert after == expected
    _nothing_left(after)


def test_a_value_that_does_not_convert_fails_the_job_and_leaves_the_table_as_before(
        db, settings, start_node):
    url = settings.database_url
    _make_table(url, a_type="text", a_default="'7'")
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE items SET a = 'seven' WHERE id = 2500")
    before, rows = column_catalog(url), table_as_oracle(url)
    job_id = submit(db, _alter("a", "int")).job_id
    start_node("n1", slots=2)
    done = wait_state(db, job_id, timeout=120)
    assert done["state"] == "reverted", done
    # The row that fails, not its batch's 10,000 keys (issue 26).
    assert 'does not convert to int in the row of key 2500:' in done["error"], done["error"]
    assert '"seven"' in done["error"]
    assert column_catalog(url) == before
    assert table_as_oracle(url) == rows
    _nothing_left(before)


@pytest.mark.parametrize("step", [
    pytest.param("backfill", marks=pytest.mark.matrix),
    pytest.param("verify", marks=pytest.mark.matrix),
    "build-indexes",  # the last state: every earlier one's objects exist
])
def test_cancel_in_each_state_leaves_the_table_as_before_with_nothing_behind(
        db, settings, start_node, step):
    url = settings.database_url
    _make_table(url)
    before = column_catalog(url)
    app = App(url)
    app.load()
    app.start()
    point = "alter_type.before_build" if step == "build-indexes" else "worker.after_batch"
    if step == "verify":
        faults.arm("alter_type.before_verify", "block")
    else:
        faults.arm(point, "block")
    job_id = submit(db, _alter("a", "bigint")).job_id
    start_node("n1", slots=2)
    faults.wait_blocked("alter_type.before_verify" if step == "verify" else point, 60)
    job = job_of(db, job_id)
    assert job["step_name"] == step and job["schema_state"] == "write-reorg", job
    assert scalar(db, "SELECT count(*) FROM pg_trigger WHERE tgname LIKE '~reorg_%'") == 1
    control.cancel(db, job_id)
    faults.disarm_all()
    done = wait_state(db, job_id, timeout=120)
    app.stop(at_least_ops=20)
    assert done["state"] == "cancelled", done
    assert app.errors == []
    after = column_catalog(url)
    assert after == before
    assert table_as_oracle(url) == app.oracle
    wait_until(lambda: scalar(db, "SELECT count(*) FROM pg_proc WHERE proname LIKE "
                                  "'alter_type_%'") == 0, 5, "the trigger function dropped")


def test_an_invalid_index_left_by_an_interrupted_build_is_dropped_and_built_again(
        db, settings, start_node):
    import hashlib

    import psycopg

    url = settings.database_url
    _make_table(url)
    before = column_catalog(url)
    faults.arm("alter_type.before_build", "block")
    job_id = submit(db, _alter("a", "bigint")).job_id
    start_node("n1", slots=2)
    faults.wait_blocked("alter_type.before_build", 60)
    # What a build killed part-way leaves: an invalid index of the build's name.
    leftover = f"reorg_{job_id}_i_{hashlib.md5(b'items_a_b').hexdigest()[:12]}"
    with psycopg.connect(url, autocommit=True) as conn, pytest.raises(psycopg.Error):
        conn.execute(f"CREATE UNIQUE INDEX CONCURRENTLY {leftover} ON items ((1))")
    assert scalar(db, "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:n)",
                  n=leftover) is False
    faults.release("alter_type.before_build")
    done = wait_state(db, job_id, timeout=120)
    assert done["state"] == "succeeded", done
    # items_a_b is the rebuilt index (on a, b; not the leftover's (1)), valid.
    assert column_catalog(url) == _with_type(before, "a", "bigint")


def test_a_cut_over_that_meets_a_lock_is_retried_and_the_job_stays_running(
        db, settings, start_node):
    import psycopg

    url = settings.database_url
    _make_table(url)
    faults.arm("owner.before_cutover", "block")
    job_id = submit(db, _alter("id", "bigint")).job_id
    start_node("n1", slots=2)
    faults.wait_blocked("owner.before_cutover", 60)
    with psycopg.connect(url) as reader:
        # A long application read holds ACCESS SHARE: the cut-over waits its
        # bounded lock_timeout, gives up, and is tried again later.
        reader.execute("SELECT count(*) FROM items")
        faults.release("owner.before_cutover")
        job = wait_until(lambda: "lock timeout" in ((j := job_of(db, job_id))["error"] or "")
                         and j, 60, "the cut-over to time out on the lock")
        assert job["state"] == "running" and job["step_name"] == "build-indexes"
        assert scalar(db, "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE "
                          "attrelid = 'items'::regclass AND attname = 'id'") == "integer"
    done = wait_state(db, job_id, timeout=120)
    assert done["state"] == "succeeded" and done["error"] is None, done
    assert scalar(db, "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE "
                      "attrelid = 'items'::regclass AND attname = 'id'") == "bigint"


def test_a_column_of_the_shadow_columns_name_made_after_the_submit_is_never_dropped(
        db, settings, start_node):
    url = settings.database_url
    _make_table(url)
    job_id = submit(db, _alter("a", "bigint")).job_id  # checked: no a_reorg_new yet
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE items ADD COLUMN a_reorg_new text DEFAULT 'mine'")
    before, rows = column_catalog(url), table_as_oracle(url)
    start_node("n1", slots=2)
    done = wait_state(db, job_id, timeout=60)
    assert done["state"] == "reverted" and "already has a column a_reorg_new" in done["error"]
    assert column_catalog(url) == before  # the user's column kept by the rollback
    assert table_as_oracle(url) == rows
    assert scalar(db, "SELECT count(*) FROM items WHERE a_reorg_new = 'mine'") == 3_000


def test_checks_unique_and_foreign_key_constraints_and_expression_indexes_are_carried_over(
        db, settings, start_node):
    import psycopg

    url = settings.database_url
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"""
            CREATE TABLE ref (id bigint PRIMARY KEY);
            INSERT INTO ref SELECT generate_series(0, 96);
            CREATE TABLE items (
                id serial PRIMARY KEY,
                a int NOT NULL DEFAULT 7 CHECK (a >= 0) REFERENCES ref (id),
                b text, c text,
                CONSTRAINT items_a_b_key UNIQUE (a, b) DEFERRABLE,
                CONSTRAINT items_a_or_b CHECK (a < 1000 OR b IS NULL));
            ALTER TABLE items ADD CONSTRAINT items_a_small CHECK (a < 100000) NOT VALID;
            CREATE INDEX items_lower ON items (lower(b), (a + 1)) WHERE a > 10;
            COMMENT ON INDEX items_lower IS 'by lower b';
            COMMENT ON CONSTRAINT items_a_b_key ON items IS 'one b per a';
            COMMENT ON CONSTRAINT items_a_check ON items IS 'never negative';
            INSERT INTO items (a, b) SELECT g % 97, 'v' || g FROM generate_series(1, {ROWS}) g;
            ANALYZE items""")
    before = column_catalog(url)
    app = App(url, value=lambda n: n % 97)
    app.load()
    app.start()
    job_id = submit(db, _alter("a", "bigint")).job_id
    start_node("n1", slots=2)
    done = wait_state(db, job_id, timeout=120)
    app.stop(at_least_ops=30)
    assert done["state"] == "succeeded", done
    assert app.errors == []
    assert table_as_oracle(url) == app.oracle
    after = column_catalog(url)
    assert after == _with_type(before, "a", "bigint")
    _nothing_left(after)


def test_text_to_json_a_type_without_equality_is_verified_by_its_text(db, settings, start_node):
    import psycopg

    url = settings.database_url
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("""
            CREATE TABLE items (id serial PRIMARY KEY, a text NOT NULL DEFAULT '7', b text);
            INSERT INTO items (a, b)
            SELECT '{"n": ' || g || '}', 'v' || g FROM generate_series(1, 1000) g""")
    app = App(url, value=lambda n: f'{{"n": {n}}}')
    app.load()
    app.start()
    job_id = submit(db, _alter("a", "json")).job_id
    start_node("n1", slots=2)
    done = wait_state(db, job_id, timeout=120)
    app.stop(at_least_ops=30)
    assert done["state"] == "succeeded", done
    assert app.errors == []
    with psycopg.connect(url) as conn:
        table = dict(conn.execute("SELECT id, a::text FROM items").fetchall())
    assert table == {k: a for k, (a, _) in app.oracle.items()}
    assert scalar(db, "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE "
                      "attrelid = 'items'::regclass AND attname = 'a'") == "json"


@pytest.mark.matrix
def test_a_bigger_table_on_two_nodes_keeps_every_write(db, settings, start_node):
    """The long variant: 60,000 rows, two nodes, many ranges, the application
    writing throughout."""
    import psycopg

    url = settings.database_url
    _make_table(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO items (a, b) SELECT g % 97, 'w' || g "
                     "FROM generate_series(1, 57000) g; ANALYZE items")
    before = column_catalog(url)
    app = App(url)
    app.load()
    app.start()
    job_id = submit(db, _alter("id", "bigint", rows_per_subtask=5_000, batch_rows=1_000)).job_id
    start_node("n1", slots=2)
    start_node("n2", slots=2)
    done = wait_state(db, job_id, timeout=300)
    app.stop(at_least_ops=100)
    assert done["state"] == "succeeded", done
    assert app.errors == []
    assert table_as_oracle(url) == app.oracle
    assert column_catalog(url) == _with_type(before, "id", "bigint")
