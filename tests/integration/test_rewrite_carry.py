"""What the swap carries (``backfill.rewrite.carry``) and what it refuses
(``backfill.rewrite.uncarried``), on real PostgreSQL: a table with all of
DESIGN 15 (owner, grants on the table and its columns, comments, triggers
in every enabled state, rules, RLS policies and flags, reloptions, replica
identity, publications with column lists and row filters, statistics
targets, attribute options, defaults, owned and identity sequences,
foreign keys both ways, views with options, CLUSTER ON, extended
statistics) is rewritten (copy, build, swap) and a catalogue snapshot of
all of it, by name, is the same before and after; then each refusal."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from support.db import execute
from support.rewrite import build_all, copy_all, differences, engine
from support.rewrite_catalog import make_everything, snapshot

from backfill.rewrite import shadow, swap, uncarried
from backfill.rewrite.capture import Capture
from backfill.schema.sql import run

# Depends on the catalog or on lock levels: run on every supported major (README).
pytestmark = pytest.mark.catalog

JOB = 9


def prepared(eng: sa.Engine, request: shadow.Request) -> swap.Swap:
    with eng.begin() as conn:
        run(conn, "CREATE SCHEMA IF NOT EXISTS reorg")
        plan = shadow.plan(conn, "items", JOB, request)
        assert uncarried.of_plan(conn, plan) == []
        for statement in (*plan.create, *Capture(plan, "reorg").install()):
            run(conn, statement)
    return swap.Swap(plan, "reorg")


def rewritten(eng: sa.Engine, s: swap.Swap, *, keep_old: bool = False) -> None:
    copy_all(eng, s.plan, parts=2, threads=1, batch=150)
    build_all(eng, s.plan)
    with eng.begin() as conn:
        carried = swap.swap(conn, s, keep_old=keep_old)
    with eng.begin() as conn:
        for statement in carried.after_commit:
            run(conn, statement)


def test_the_swap_carries_everything_the_table_had(fresh_db):
    make_everything(fresh_db)
    eng = engine(fresh_db)
    with eng.begin() as conn:
        before = snapshot(conn)
        rows_before = run(conn, "SELECT * FROM items ORDER BY id")
    s = prepared(eng, shadow.Request())
    rewritten(eng, s)
    with eng.begin() as conn:
        after = snapshot(conn)
        assert run(conn, "SELECT * FROM items ORDER BY id") == rows_before
        old = run(conn, f"SELECT to_regclass('{s.old}')::oid, (SELECT oid FROM pg_class WHERE "
                        "relname = 'items')")
        assert old[0][0] is not None and old[0][0] != old[0][1]
        # Moved, not copied: the old table keeps no trigger, rule or policy of the user's.
        assert run(conn, f"""
            SELECT (SELECT count(*) FROM pg_trigger WHERE tgrelid = '{s.old}'::regclass
                    AND NOT tgisinternal),
                   (SELECT count(*) FROM pg_rewrite WHERE ev_class = '{s.old}'::regclass),
                   (SELECT count(*) FROM pg_policy WHERE polrelid = '{s.old}'::regclass),
                   (SELECT count(*) FROM pg_publication_rel
                    WHERE prrelid = '{s.old}'::regclass)""") == [(0, 0, 0, 0)]
    for part in before:
        assert after[part] == before[part], part
    # The application's next writes: the sequences go on from where they were.
    execute(fresh_db, "INSERT INTO items (a, b) VALUES (7, 'x')")
    assert execute(fresh_db, "SELECT id, n, e FROM items ORDER BY id DESC LIMIT 1") == [
        (401, 900, "touched")]


def test_the_swap_carries_over_an_alter(fresh_db):
    """With the shape changed (a type, a column added and one dropped), what
    remains is carried: the views are made again on the new column type."""
    make_everything(fresh_db)
    eng = engine(fresh_db)
    with eng.begin() as conn:
        before = snapshot(conn)
    s = prepared(eng, shadow.Request(alter="ALTER COLUMN id TYPE bigint, ADD COLUMN d text, "
                                           "DROP COLUMN c", sets=(("d", "upper(b)"),)))
    rewritten(eng, s)
    with eng.begin() as conn:
        after = snapshot(conn)
        assert run(conn, "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE "
                         "attrelid = 'v_plain'::regclass AND attname = 'id'") == [("bigint",)]
    for part in ("triggers", "policies", "rules", "publications", "statistics", "referencing"):
        assert after[part] == before[part], part
    assert after["table"] == before["table"]
    assert [v[:1] + v[2:] for v in after["views"]] == [v[:1] + v[2:] for v in before["views"]]


@pytest.mark.parametrize(("setup", "request_", "message"), [
    ("CREATE MATERIALIZED VIEW mv AS SELECT id FROM items", shadow.Request(),
     "materialized view mv depends on table \"public\".\"items\", and the swap cannot carry "
     "it over; drop it before the rewrite and create it again after"),
    ("CREATE FUNCTION f() RETURNS bigint LANGUAGE sql BEGIN ATOMIC SELECT count(*) FROM items; "
     "END", shadow.Request(), "function f() depends on table"),
    ("CREATE FUNCTION g(items) RETURNS int LANGUAGE sql AS 'SELECT 1'", shadow.Request(),
     "function g(items) uses the row type of table"),
    ("CREATE TABLE other (x int); ALTER TABLE other ENABLE ROW LEVEL SECURITY; CREATE POLICY "
     "o ON other USING (EXISTS (SELECT 1 FROM items))", shadow.Request(),
     "policy o on table other depends on table"),
    ("", shadow.Request(alter="DROP COLUMN b"),
     "view v_plain uses column b of table \"public\".\"items\", which the new shape does not "
     "have"),
    ("CREATE TRIGGER t_e AFTER UPDATE OF e ON items FOR EACH ROW EXECUTE FUNCTION noop()",
     shadow.Request(alter="DROP COLUMN e"),
     "trigger t_e on table items uses column e of table"),
    ("CREATE TABLE pchild (item_id int REFERENCES items (id)) PARTITION BY RANGE (item_id)",
     shadow.Request(), "foreign key pchild_item_id_fkey on pchild (partitioned) references"),
    ("ALTER TABLE items ADD CONSTRAINT items_e_key UNIQUE (e); CREATE TABLE ec (e text "
     "REFERENCES items (e))", shadow.Request(alter="DROP COLUMN e"),
     "foreign key ec_e_fkey on ec references column e of table"),
    ("ALTER TABLE items ADD COLUMM_PLACEHOLDER", shadow.Request(), ""),
], ids=["matview", "sql-body", "row-type", "other-policy", "view-column", "trigger-column",
        "partitioned-fk", "fk-column", "replica-index"])
def test_what_cannot_be_carried_is_refused_in_one_line(fresh_db, setup, request_, message,
                                                       pg_major):
    if "PARTITION BY" in setup and pg_major >= 18:
        pytest.skip("PostgreSQL 18 adds it NOT VALID: carried (test_..._carried_on_18)")
    make_everything(fresh_db)
    if "PLACEHOLDER" in setup:  # the replica identity's index dropped by the new shape
        setup, request_ = "", shadow.Request(alter="DROP CONSTRAINT items_n_key")
        message = ("table \"public\".\"items\" has REPLICA IDENTITY USING INDEX items_n_key, "
                   "which the new shape does not build")
    if setup:
        execute(fresh_db, setup)
    with engine(fresh_db).begin() as conn:
        plan = shadow.plan(conn, "items", JOB, request_)
        found = uncarried.of_plan(conn, plan)
    assert any(message in line for line in found), found
    assert all("\n" not in line for line in found)


def test_a_partitioned_tables_foreign_key_on_t_is_carried_on_18(fresh_db, pg_major):
    """PostgreSQL 18 adds a foreign key NOT VALID on a partitioned table: the
    swap re-makes it on the new T so, and validates it after its commit."""
    if pg_major < 18:
        pytest.skip("before PostgreSQL 18 it is refused (test_what_cannot_be_carried_...)")
    make_everything(fresh_db)
    execute(fresh_db, """
        CREATE TABLE pchild (item_id int REFERENCES items (id)) PARTITION BY RANGE (item_id);
        CREATE TABLE pchild_1 PARTITION OF pchild FOR VALUES FROM (0) TO (1000);
        INSERT INTO pchild SELECT g FROM generate_series(1, 50) g""")
    eng = engine(fresh_db)
    s = prepared(eng, shadow.Request())  # (nothing refused)
    rewritten(eng, s)
    assert execute(fresh_db, """
        SELECT c.conrelid::regclass::text, c.confrelid = 'items'::regclass, c.convalidated
        FROM pg_constraint c WHERE c.conname = 'pchild_item_id_fkey' ORDER BY 1""") == [
        ("pchild", True, True), ("pchild_1", True, True)]
    with pytest.raises(Exception, match="violates foreign key constraint"):
        execute(fresh_db, "INSERT INTO pchild VALUES (999)")


def test_a_not_null_constraint_not_valid_is_refused_on_postgresql_18(fresh_db, pg_major):
    """PostgreSQL 18's NOT NULL ... NOT VALID: the shadow's LIKE copies it
    valid, so the copy of its NULL would fail; the plan refuses it by name."""
    if pg_major < 18:
        pytest.skip("NOT NULL constraints NOT VALID came with PostgreSQL 18")
    make_everything(fresh_db)
    execute(fresh_db, "UPDATE items SET b = NULL WHERE id = 3;"
                      "ALTER TABLE items ADD CONSTRAINT items_b_set NOT NULL b NOT VALID")
    with engine(fresh_db).begin() as conn:
        found = uncarried.of_plan(conn, shadow.plan(conn, "items", JOB, shadow.Request()))
    assert found == ['NOT NULL constraint items_b_set of table "public"."items" is NOT VALID, '
                     "which the new table would have valid; validate it first (ALTER TABLE ... "
                     "VALIDATE CONSTRAINT items_b_set) or drop it"], found


def test_the_swap_checks_again_and_refuses_what_came_since(fresh_db):
    """A materialized view made on T after the submit: the swap refuses it
    by name, and T is as it was."""
    make_everything(fresh_db)
    eng = engine(fresh_db)
    s = prepared(eng, shadow.Request())
    copy_all(eng, s.plan, parts=1, threads=1)
    build_all(eng, s.plan)
    execute(fresh_db, "CREATE MATERIALIZED VIEW mv AS SELECT id FROM items")
    with eng.begin() as conn:
        before = snapshot(conn)
    with eng.connect() as conn, pytest.raises(
            swap.SwapRefused, match="materialized view mv depends on table"), conn.begin():
        swap.swap(conn, s, keep_old=False)
    with eng.begin() as conn:
        assert snapshot(conn) == before
        assert differences(conn, s.plan) == []
