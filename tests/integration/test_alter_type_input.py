"""Every input ``alter-type`` refuses at submit (DESIGN 11): one line saying
what is wrong and what to do instead, no job, and no table, trigger or
function changed. (tests/acceptance/test_alter_type_cli.py runs two of them
through the ``reorg`` command: exit code 2, the one ``error:`` line.)"""

from __future__ import annotations

import pytest
from support import catalogue, execute, make_items, rows, scalar

from framework.errors import InvalidParams
from framework.submit import SubmitRequest, submit

# Depends on the catalog or on lock levels: run on every supported major (README).
pytestmark = pytest.mark.catalog

SCHEMA = """
    CREATE VIEW items_b AS SELECT id, b FROM items;
    CREATE MATERIALIZED VIEW items_c AS SELECT c FROM items;
    CREATE TABLE orders (id bigint PRIMARY KEY, item_id bigint REFERENCES items (id));
    CREATE TABLE nokey (a int, b text);
    CREATE TABLE parts (id int PRIMARY KEY, a int) PARTITION BY RANGE (id);
    CREATE TABLE parts_1 PARTITION OF parts FOR VALUES FROM (0) TO (100);
    CREATE TABLE ident (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, a int);
    CREATE TABLE gen (id int PRIMARY KEY, a int, g int GENERATED ALWAYS AS (a * 2) STORED);
    CREATE TABLE trig (id int PRIMARY KEY, a int);
    CREATE FUNCTION trig_f() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END';
    CREATE TRIGGER trig_a BEFORE UPDATE OF a ON trig FOR EACH ROW EXECUTE FUNCTION trig_f();
    CREATE TABLE pol (id int PRIMARY KEY, a int);
    CREATE POLICY pol_a ON pol USING (a > 0);
    CREATE TABLE excl (id int PRIMARY KEY, a int, EXCLUDE USING btree (a WITH =));
"""

BAD = {
    "unknown table": ({"table": "nope", "column": "a", "type": "bigint"}, "does not exist"),
    "unknown column": ({"table": "items", "column": "nope", "type": "bigint"},
                       "column nope does not exist in public.items"),
    "unknown type": ({"table": "items", "column": "a", "type": "notatype"},
                     "'notatype' is not a PostgreSQL type"),
    "same type": ({"table": "items", "column": "a", "type": "int"}, "already integer"),
    "no cast": ({"table": "items", "column": "a", "type": "uuid"}, "--type does not work"),
    "bad --using": ({"table": "items", "column": "a", "type": "bigint", "using": "a +"},
                    "not one SQL expression"),
    "--using of no column": ({"table": "items", "column": "a", "type": "bigint",
                              "using": "nope * 2"}, "--using does not work"),
    "second statement in --using": ({"table": "items", "column": "a", "type": "bigint",
                                     "using": "a); DROP TABLE items; SELECT (1"},
                                    "not one SQL expression"),
    "dependent view": ({"table": "items", "column": "b", "type": "varchar(20)"},
                       "used by view items_b"),
    "dependent materialized view": ({"table": "items", "column": "c", "type": "varchar(20)"},
                                    "materialized view items_c"),
    "referencing foreign key": ({"table": "items", "column": "id", "type": "numeric"},
                                "referenced by foreign key orders_item_id_fkey on orders"),
    "no usable key": ({"table": "nokey", "column": "a", "type": "bigint"}, "no primary key"),
    "partitioned table": ({"table": "parts", "column": "a", "type": "bigint"}, "partitioned"),
    "partition": ({"table": "parts_1", "column": "a", "type": "bigint"}, "inheritance tree"),
    "identity column narrowed": ({"table": "ident", "column": "id", "type": "smallint"},
                                 "identity column of type integer; alter-type keeps its "
                                 "identity on a wider integer type only"),
    "identity column to a non-integer": ({"table": "ident", "column": "id", "type": "numeric"},
                                         "identity column of type integer"),
    "generated column depends": ({"table": "gen", "column": "a", "type": "bigint"},
                                 "used by generated column g"),
    "trigger depends": ({"table": "trig", "column": "a", "type": "bigint"}, "trigger trig_a"),
    "policy depends": ({"table": "pol", "column": "a", "type": "bigint"}, "policy pol_a"),
    "exclusion constraint": ({"table": "excl", "column": "a", "type": "bigint"},
                             "used by constraint excl_a_excl"),
}


def _state(db) -> tuple:
    return (catalogue(db), rows(db, "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal"),
            rows(db, "SELECT proname FROM pg_proc WHERE proname LIKE 'alter_type%'"),
            scalar(db, "SELECT count(*) FROM {s}.jobs"))


def test_every_bad_alter_type_input_is_one_line_and_changes_nothing(db):
    # One database for every case (a case per test would spend its time on setup).
    make_items(db, 100)
    execute(db, SCHEMA)
    before = _state(db)
    for case, (params, says) in BAD.items():
        with pytest.raises(InvalidParams) as refused:
            submit(db, SubmitRequest("alter-type", params))
        message = str(refused.value)
        assert says in message and "\n" not in message, (case, message)
        assert _state(db) == before, case


def test_a_not_null_constraint_not_valid_is_refused_on_postgresql_18(db, pg_major):
    """PostgreSQL 18's NOT NULL ... NOT VALID: the swap's SET NOT NULL would
    make it valid (and fail on the NULL it lets be), so the submit refuses it."""
    if pg_major < 18:
        pytest.skip("NOT NULL constraints NOT VALID came with PostgreSQL 18")
    make_items(db, 100)
    execute(db, "UPDATE items SET a = NULL WHERE id = 7;"
                "ALTER TABLE items ADD CONSTRAINT items_a_set NOT NULL a NOT VALID")
    before = _state(db)
    with pytest.raises(InvalidParams) as refused:
        submit(db, SubmitRequest("alter-type", {"table": "items", "column": "a",
                                                "type": "bigint"}))
    message = str(refused.value)
    assert "column a of public.items has NOT NULL constraint items_a_set NOT VALID" in message, (
        message)
    assert "VALIDATE CONSTRAINT items_a_set" in message and "\n" not in message
    assert _state(db) == before
