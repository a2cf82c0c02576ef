"""What an application changes in a table's shape while ``alter-type`` or
``add-column`` runs (DESIGN 15): the cut-over checks again, under its lock,
everything the submit refuses, and refuses what it cannot carry: the job
fails with one line naming the object and the way out, and its rollback
leaves the table (and the new object, and every row of both) exactly as
the application left them.

Each change is made while the job is held at ``owner.before_cutover``
(after prepare, backfill and verify), with an application writing the
table the whole time, and a second one writing a child table once there is
one; both oracles must match afterwards."""

from __future__ import annotations

import psycopg
import pytest
from support import scalar, wait_state
from support.app import App, column_catalog, table_as_oracle

from framework import faults
from framework.errors import InvalidParams
from framework.submit import SubmitRequest, submit

# Depends on the catalog or on lock levels: run on every supported major (README).
pytestmark = pytest.mark.catalog

ROWS = 1_000
VALUE = "md5(b || '/' || a)"


def _make_table(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"""
            CREATE TABLE items (id serial PRIMARY KEY, a int NOT NULL DEFAULT 7, b text,
                                c text);
            CREATE INDEX items_a_b ON items (a, b);
            INSERT INTO items (a, b) SELECT g % 97, 'v' || g FROM generate_series(1, {ROWS}) g;
            ANALYZE items""")


def _execute(url: str, statement: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(statement)


def _alter_a() -> SubmitRequest:
    return SubmitRequest("alter-type", {"table": "items", "column": "a", "type": "bigint"},
                         rows_per_subtask=250, batch_rows=100)


def _add_d() -> SubmitRequest:
    return SubmitRequest("add-column", {"table": "items", "column": "d:text", "value": VALUE},
                         rows_per_subtask=250, batch_rows=100)


def _held_at_cut_over(db, start_node, request: SubmitRequest) -> int:
    faults.arm("owner.before_cutover", "block")
    job_id = submit(db, request).job_id
    start_node("n1", slots=2)
    faults.wait_blocked("owner.before_cutover", 60)
    return job_id


@pytest.mark.parametrize("request_of", [_alter_a, _add_d], ids=["alter-type", "add-column"])
def test_a_child_table_created_during_the_job_fails_it_and_keeps_every_row_of_both(
        db, settings, start_node, request_of):
    url = settings.database_url
    _make_table(url)
    before = column_catalog(url)
    app = App(url, table="items")
    app.load()
    app.start()
    job_id = _held_at_cut_over(db, start_node, request_of())
    _execute(url, "CREATE TABLE kid () INHERITS (items)")
    kid_app = App(url, table="kid", seed=11)  # its rows skip the job's trigger
    kid_app.start()
    kid_app.stop_event.wait(0.3)
    faults.release("owner.before_cutover")
    done = wait_state(db, job_id, timeout=60)
    app.stop(at_least_ops=20)
    kid_app.stop(at_least_ops=20)
    assert app.errors == [] and kid_app.errors == []
    # Nothing the child's application wrote is lost or changed (the old
    # cut-over's DROP/RENAME recursed into it and left NULL in its rows).
    assert table_as_oracle(url, "kid") == kid_app.oracle
    assert table_as_oracle(url, "ONLY items") == app.oracle
    assert done["state"] == "reverted", done
    assert "kid" in done["error"] and "\n" not in done["error"], done["error"]
    assert "inheritance" in done["error"], done["error"]
    assert column_catalog(url) == before
    assert column_catalog(url, "kid")["columns"] == [
        ("a", "integer", True, "7", None), ("b", "text", False, None, None),
        ("c", "text", False, None, None),
        ("id", "integer", True, "nextval('items_id_seq'::regclass)", None)]


# What the application makes during an alter-type that depends on the
# column: the column altered, the statement, what the refusal names, and
# the statement that drops it (an error if the job had dropped it).
NEW_DEPENDENTS = [
    pytest.param("a", "CREATE VIEW items_a AS SELECT id, a FROM items", "view items_a",
                 "DROP VIEW items_a", id="view"),
    # The old cut-over dropped it silently (statistics on one column remain).
    pytest.param("a", "CREATE STATISTICS items_ab (dependencies) ON a, b FROM items",
                 "statistics object items_ab", "DROP STATISTICS items_ab",
                 id="extended statistics"),
    pytest.param("a", "ALTER TABLE items ADD CONSTRAINT items_a_pos CHECK (a >= 0)",
                 "constraint items_a_pos", "ALTER TABLE items DROP CONSTRAINT items_a_pos",
                 id="check constraint"),
    # Refused before as now (its build is missing), with the same line now.
    pytest.param("a", "CREATE INDEX items_a ON items (a)", "index items_a",
                 "DROP INDEX items_a", id="index", marks=pytest.mark.matrix),
    pytest.param("id", "CREATE TABLE orders (id int PRIMARY KEY, item int REFERENCES items (id))",
                 "orders_item_fkey on orders", "DROP TABLE orders", id="referencing foreign key"),
    # Found as the view is (pg_depend):
    pytest.param("a", "CREATE FUNCTION keep() RETURNS trigger LANGUAGE plpgsql AS "
                      "'BEGIN RETURN NEW; END'; CREATE TRIGGER items_keep BEFORE UPDATE OF a "
                      "ON items FOR EACH ROW EXECUTE FUNCTION keep()",
                 "trigger items_keep", "DROP TRIGGER items_keep ON items",
                 id="trigger on UPDATE OF a", marks=pytest.mark.matrix),
    pytest.param("a", "CREATE POLICY items_pos ON items USING (a >= 0)", "policy items_pos",
                 "DROP POLICY items_pos ON items", id="policy", marks=pytest.mark.matrix),
]


@pytest.mark.parametrize(("column", "statement", "named", "drop"), NEW_DEPENDENTS)
def test_an_object_made_on_the_column_during_an_alter_type_fails_it_by_name(
        db, settings, start_node, column, statement, named, drop):
    url = settings.database_url
    _make_table(url)
    before = column_catalog(url)
    app = App(url)
    app.load()
    app.start()
    job_id = _held_at_cut_over(db, start_node, SubmitRequest(
        "alter-type", {"table": "items", "column": column, "type": "bigint"},
        rows_per_subtask=250, batch_rows=100))
    _execute(url, statement)
    faults.release("owner.before_cutover")
    done = wait_state(db, job_id, timeout=60)
    app.stop(at_least_ops=20)
    assert app.errors == []
    assert table_as_oracle(url) == app.oracle
    assert done["state"] == "reverted", done
    error = done["error"]
    assert named in error and "\n" not in error, error
    assert "changed during the job" in error and "submit" in error, error
    # The object is the application's: kept, and the table otherwise as before.
    _execute(url, drop)
    assert column_catalog(url) == before


def test_add_column_refuses_a_table_with_inheritance_children_at_submit(db, settings):
    url = settings.database_url
    _make_table(url)
    _execute(url, "CREATE TABLE kid () INHERITS (items)")
    before = (column_catalog(url), column_catalog(url, "kid"))
    with pytest.raises(InvalidParams) as refused:
        submit(db, _add_d())
    message = str(refused.value)
    assert "inheritance children (kid)" in message and "\n" not in message, message
    assert "ALTER TABLE ... ADD COLUMN" in message
    assert (column_catalog(url), column_catalog(url, "kid")) == before
    assert scalar(db, "SELECT count(*) FROM {s}.jobs") == 0


def test_add_column_fills_a_partition_attached_during_the_job(db, settings, start_node):
    """A partition attached while the job runs brings rows that never met
    the job's trigger, in ranges the backfill has passed: the cut-over fills
    them, keeping a NULL the application wrote there after the attach."""
    url = settings.database_url
    _execute(url, f"""
        CREATE TABLE items (id int PRIMARY KEY, a int, b text) PARTITION BY RANGE (id);
        CREATE TABLE items_1 PARTITION OF items FOR VALUES FROM (0) TO ({ROWS + 1});
        INSERT INTO items SELECT g, g % 97, 'v' || g FROM generate_series(1, {ROWS}) g;
        ANALYZE items""")
    job_id = _held_at_cut_over(db, start_node, _add_d())
    # Made with the job's new column (ATTACH needs every column of the
    # table), its rows written before the attach: no trigger, d NULL; the
    # backfill and its catch-up ranges are over.
    _execute(url, f"""
        CREATE TABLE items_2 (id int NOT NULL, a int, b text, d text);
        INSERT INTO items_2 SELECT g, g % 97, 'w' || g
            FROM generate_series({ROWS + 1}, {ROWS + 100}) g;
        ALTER TABLE items_2 ADD PRIMARY KEY (id);
        ALTER TABLE items ATTACH PARTITION items_2 FOR VALUES FROM ({ROWS + 1}) TO (MAXVALUE);
        UPDATE items SET d = NULL WHERE id = {ROWS + 7};
        INSERT INTO items VALUES ({ROWS + 500}, 1, 'after')""")
    faults.release("owner.before_cutover")
    done = wait_state(db, job_id, timeout=60)
    assert done["state"] == "succeeded", done
    assert scalar(db, "SELECT count(*) FROM items_2") == 101
    assert scalar(db, f"SELECT count(*) FROM items WHERE d IS DISTINCT FROM {VALUE} "
                      f"AND id <> {ROWS + 7}") == 0
    assert scalar(db, f"SELECT d FROM items WHERE id = {ROWS + 7}") is None


def test_add_column_carries_a_partition_created_during_the_job(db, settings, start_node):
    """PostgreSQL clones the trigger of a partitioned table to every partition,
    one created while the job runs too: its rows get --value."""
    url = settings.database_url
    _execute(url, f"""
        CREATE TABLE items (id int PRIMARY KEY, a int, b text) PARTITION BY RANGE (id);
        CREATE TABLE items_1 PARTITION OF items FOR VALUES FROM (0) TO ({ROWS + 1});
        INSERT INTO items SELECT g, g % 97, 'v' || g FROM generate_series(1, {ROWS}) g;
        ANALYZE items""")
    job_id = _held_at_cut_over(db, start_node, _add_d())
    _execute(url, f"CREATE TABLE items_2 PARTITION OF items FOR VALUES FROM ({ROWS + 1}) TO "
                  f"(MAXVALUE); INSERT INTO items SELECT g, g % 97, 'w' || g "
                  f"FROM generate_series({ROWS + 1}, {ROWS + 100}) g")
    faults.release("owner.before_cutover")
    done = wait_state(db, job_id, timeout=60)
    assert done["state"] == "succeeded", done
    assert scalar(db, "SELECT count(*) FROM items_2") == 100
    assert scalar(db, f"SELECT count(*) FROM items WHERE d IS DISTINCT FROM {VALUE}") == 0
