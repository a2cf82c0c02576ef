"""The swap and the revert of a rewrite (``backfill.rewrite.swap``), on
real PostgreSQL with applications writing throughout: the swap in one
short transaction (the applications' longest statement bounded by about
the lock timeout, no write lost); a swap blocked by a long transaction
(times out, names it, T unchanged); and a revert after writes made after
the swap (--keep-old: the old table, T again, equals the oracle)."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
import sqlalchemy as sa
from support.db import execute, wait_until
from support.rewrite import BIGINT, KeyApp, build_all, copy_all, engine, make_table, table_as_oracle
from support.rewrite_catalog import snapshot

from backfill.rewrite import reverse, shadow, swap
from backfill.rewrite.capture import Capture
from backfill.schema.sql import run

# Depends on the catalog or on lock levels: run on every supported major (README).
pytestmark = pytest.mark.catalog

JOB = 12


def prepared(eng: sa.Engine, request: shadow.Request | None = None) -> swap.Swap:
    request = request or shadow.Request()
    with eng.begin() as conn:
        run(conn, "CREATE SCHEMA IF NOT EXISTS reorg")
        plan = shadow.plan(conn, "items", JOB, request)
        for statement in (*plan.create, *Capture(plan, "reorg").install()):
            run(conn, statement)
    return swap.Swap(plan, "reorg")


def caught_up(eng: sa.Engine, s: swap.Swap) -> None:
    """Copy, build, and replay until the log is nearly empty (catch-up)."""
    copy_all(eng, s.plan, parts=3, threads=2, batch=100)
    build_all(eng, s.plan)
    for _ in range(50):
        with eng.begin() as conn:
            s.capture.replay(conn, 500)
            if s.capture.backlog(conn)[0] < 20:
                return


def apps_running(url: str, count: int = 2) -> list[KeyApp]:
    apps = [KeyApp(url, BIGINT, lane=lane, lanes=count, space=3000) for lane in range(count)]
    for app in apps:
        app.load()
        app.start()
    return apps


def writes_on(apps: list[KeyApp], more: int) -> None:
    start = sum(a.ops for a in apps)
    wait_until(lambda: sum(a.ops for a in apps) >= start + more, 60, f"{more} more writes")


def stopped(apps: list[KeyApp]) -> dict:
    for app in apps:
        app.stop(at_least_ops=10)
        assert app.errors == [], app.errors[:3]
    return {k: v for a in apps for k, v in a.oracle.items()}


def oid(url: str, name: str = "items") -> int:
    return execute(url, f"SELECT to_regclass('{name}')::oid")[0][0]


def test_swap_with_applications_writing_throughout(fresh_db):
    make_table(fresh_db, BIGINT, 2000)
    eng = engine(fresh_db)
    before = oid(fresh_db)
    apps = apps_running(fresh_db)
    s = prepared(eng)
    caught_up(eng, s)
    writes_on(apps, 100)
    started = time.monotonic()
    with eng.begin() as conn:
        carried = swap.swap(conn, s, keep_old=False)
    took = time.monotonic() - started
    assert carried.after_commit == []
    writes_on(apps, 200)  # into the new table
    oracle = stopped(apps)
    assert oid(fresh_db) != before
    assert table_as_oracle(fresh_db, BIGINT[0]) == oracle
    # The user's trigger moved over (c is set by it); the capture did not.
    assert execute(fresh_db, "SELECT tgname FROM pg_trigger WHERE tgrelid = 'items'::regclass "
                             "AND NOT tgisinternal") == [("items_c",)]
    longest = max(a.longest for a in apps)
    assert longest < took + 1.0, (longest, took)
    assert took < 3.0, took


def test_a_swap_waiting_for_the_shadow_keeps_no_application_waiting(fresh_db):
    """Autovacuum takes a freshly filled shadow; a lock waiting for it waits
    until deadlock_timeout (1 s) cancels it. The swap locks the shadow
    before T: while it waits there, the applications write on."""
    make_table(fresh_db, BIGINT, 2000)
    eng = engine(fresh_db)
    apps = apps_running(fresh_db)
    s = prepared(eng)
    caught_up(eng, s)
    writes_on(apps, 50)
    with psycopg.connect(fresh_db) as vacuum:  # as autovacuum holds it
        vacuum.execute(f"LOCK TABLE {s.plan.shadow} IN SHARE UPDATE EXCLUSIVE MODE")
        for app in apps:
            app.longest = 0.0
        swapping = threading.Thread(target=lambda: _swap(eng, s))
        swapping.start()
        wait_until(lambda: execute(fresh_db, "SELECT count(*) FROM pg_locks WHERE NOT granted "
                                             f"AND relation = '{s.plan.shadow}'::regclass")[0][0],
                   10, "the swap waiting for the shadow")
        waiting = time.monotonic()
        writes_on(apps, 100)  # the applications go on meanwhile
        time.sleep(1.2)  # held longer than autovacuum would be
        held = time.monotonic() - waiting
    swapping.join(30)
    writes_on(apps, 50)
    oracle = stopped(apps)
    assert table_as_oracle(fresh_db, BIGINT[0]) == oracle
    longest = max(a.longest for a in apps)
    assert longest < held - 0.6, (longest, held)  # the swap's own short lock of T only


def _swap(eng: sa.Engine, s: swap.Swap) -> None:
    with eng.begin() as conn:
        swap.swap(conn, s, keep_old=False)


def test_swap_blocked_by_a_long_transaction_names_it_and_changes_nothing(fresh_db):
    make_table(fresh_db, BIGINT, 300)
    eng = engine(fresh_db)
    s = prepared(eng)
    caught_up(eng, s)
    with eng.begin() as conn:
        before = snapshot(conn)
    with psycopg.connect(fresh_db, application_name="long-report") as report:
        report.execute("SELECT count(*) FROM items")  # holds items until it ends
        pid = report.info.backend_pid
        with eng.connect() as conn, pytest.raises(swap.SwapBlocked) as blocked, conn.begin():
            swap.swap(conn, s, keep_old=False, lock_timeout="300ms")
    message = str(blocked.value)
    assert message.startswith('the swap of "public"."items" waited 300ms (lock_timeout) for its '
                              "lock and gave up; nothing changed. Holding what it locks")
    assert (f'pid {pid} (on items, user postgres, application long-report, idle in '
            "transaction") in message
    assert "SELECT count(*) FROM items" in message and "\n" not in message
    with eng.begin() as conn:
        assert snapshot(conn) == before  # the capture trigger still there, the shadow too
        assert run(conn, f"SELECT to_regclass('{s.plan.shadow}') IS NOT NULL") == [(True,)]
    # The transaction ended: the swap goes through.
    with eng.begin() as conn:
        swap.swap(conn, s, keep_old=False, lock_timeout="300ms")
    assert execute(fresh_db, f"SELECT to_regclass('{s.old}') IS NOT NULL") == [(True,)]


def test_revert_after_writes_made_after_the_swap_keeps_them(fresh_db):
    make_table(fresh_db, BIGINT, 1500)
    eng = engine(fresh_db)
    with eng.begin() as conn:
        before = snapshot(conn)
    original = oid(fresh_db)
    apps = apps_running(fresh_db)
    s = prepared(eng, shadow.Request(alter="ALTER COLUMN a TYPE bigint, ADD COLUMN d text",
                                     sets=(("d", "md5(b)"),)))
    assert reverse.refusals(s.plan, {"d"}, set()) == []
    caught_up(eng, s)
    with eng.begin() as conn:
        swap.swap(conn, s, keep_old=True)
    writes_on(apps, 300)  # into the new table, kept in the old one by the reverse capture
    assert execute(fresh_db, "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE "
                             "attrelid = 'items'::regclass AND attname = 'a'") == [("bigint",)]
    with eng.begin() as conn:
        swap.revert(conn, s)
    writes_on(apps, 100)  # into the old table, T again
    oracle = stopped(apps)
    assert oid(fresh_db) == original
    assert table_as_oracle(fresh_db, BIGINT[0]) == oracle
    with eng.begin() as conn:
        after = snapshot(conn)
    for part in ("table", "columns", "indexes", "constraints", "triggers", "sequences"):
        assert after[part] == before[part], part


def test_revert_refuses_once_the_old_table_is_out_of_step(fresh_db):
    """A value the old table cannot hold (a bigint past integer, written
    after a widening): the application's write succeeds, the old table
    stops following, and revert refuses, naming the key."""
    make_table(fresh_db, BIGINT, 20)
    eng = engine(fresh_db)
    s = prepared(eng, shadow.Request(alter="ALTER COLUMN a TYPE bigint"))
    caught_up(eng, s)
    with eng.begin() as conn:
        swap.swap(conn, s, keep_old=True)
    execute(fresh_db, "UPDATE items SET a = 5000000000 WHERE id = 3")
    assert execute(fresh_db, "SELECT a FROM items WHERE id = 3") == [(5000000000,)]
    with eng.connect() as conn, pytest.raises(swap.SwapRefused) as refused, conn.begin():
        swap.revert(conn, s)
    assert "the write of key 3 could not be put back (integer out of range)" in str(refused.value)


@pytest.mark.parametrize(("request_", "sets", "message"), [
    (shadow.Request(alter="DROP COLUMN b"), set(), "--keep-old: column b is not in the new shape"),
    (shadow.Request(alter="ALTER COLUMN id TYPE integer"), set(),
     "--keep-old: column id changes type bigint -> integer"),
    (shadow.Request(sets=(("b", "upper(b)"),)), {"b"},
     "--keep-old: column b gets a computed value (--set)"),
    (shadow.Request(alter="ALTER COLUMN a TYPE text"), set(),
     "--keep-old: column a changes type integer -> text"),
])
def test_keep_old_refuses_a_change_it_cannot_invert(fresh_db, request_, sets, message):
    make_table(fresh_db, BIGINT, 5)
    with engine(fresh_db).begin() as conn:
        plan = shadow.plan(conn, "items", JOB, request_)
    found = reverse.refusals(plan, sets, set())
    assert any(line.startswith(message) for line in found), found


def test_widening_types():
    for old, new in [("integer", "bigint"), ("smallint", "numeric"), ("character varying(5)",
                     "text"), ("character varying(5)", "character varying(9)"),
                     ("numeric(6,2)", "numeric(8,3)"), ("numeric(6,2)", "numeric"),
                     ("timestamp(3) without time zone", "timestamp without time zone")]:
        assert reverse.widens(old, new), (old, new)
    for old, new in [("bigint", "integer"), ("text", "character varying(5)"),
                     ("numeric(6,2)", "numeric(6,3)"), ("integer", "text"),
                     ("timestamp without time zone", "timestamp with time zone")]:
        assert not reverse.widens(old, new), (old, new)


def test_the_shadow_equals_t_at_the_swap(fresh_db):
    """Under the swap's lock, after its last replay, the new table is T."""
    make_table(fresh_db, BIGINT, 500)
    eng = engine(fresh_db)
    apps = apps_running(fresh_db, 1)
    s = prepared(eng)
    caught_up(eng, s)
    seen: list = []
    done = threading.Event()

    def check_at_swap() -> None:
        with eng.begin() as conn:
            swap.swap(conn, s, keep_old=True)
            # in the swap's transaction: the new table is T, the old one its copy
            seen.append(run(conn, f"SELECT count(*) FROM (SELECT * FROM items EXCEPT ALL "
                                  f"SELECT * FROM {s.old}) x"))
        done.set()

    threading.Thread(target=check_at_swap).start()
    assert done.wait(30)
    stopped(apps)
    assert seen == [[(0,)]]


def test_swap_blocked_on_a_referencing_table_names_it(fresh_db):
    """The swap re-makes the foreign keys of other tables on T: a
    transaction holding such a table blocks it, bounded, and is named."""
    make_table(fresh_db, BIGINT, 50)
    execute(fresh_db, "CREATE TABLE child (item_id bigint REFERENCES items (id))")
    eng = engine(fresh_db)
    s = prepared(eng)
    caught_up(eng, s)
    before = oid(fresh_db)
    with psycopg.connect(fresh_db, application_name="child-reader") as reader:
        reader.execute("SELECT count(*) FROM child")
        with eng.connect() as conn, pytest.raises(swap.SwapBlocked) as blocked, conn.begin():
            swap.swap(conn, s, keep_old=False, lock_timeout="200ms")
    assert "(on child, user postgres, application child-reader" in str(blocked.value)
    assert oid(fresh_db) == before


def test_swap_refuses_a_table_changed_since_the_job_began(fresh_db):
    make_table(fresh_db, BIGINT, 50)
    eng = engine(fresh_db)
    s = prepared(eng)
    caught_up(eng, s)
    execute(fresh_db, "ALTER TABLE items ADD COLUMN z int")
    with eng.connect() as conn, pytest.raises(swap.SwapRefused) as refused, conn.begin():
        swap.swap(conn, s, keep_old=False)
    assert str(refused.value) == (
        'table "public"."items" changed since the job began (column z was added); the new '
        "table would not have it: cancel the job and submit it again")


def leftovers(url: str) -> list[tuple]:
    """Anything of job JOB: relations, functions, triggers."""
    return execute(url, f"""
        SELECT relname FROM pg_class WHERE relname ~ '^(reorg|rewrite)_{JOB}_'
        UNION ALL SELECT proname FROM pg_proc WHERE proname ~ '^rewrite_{JOB}_'
        UNION ALL SELECT tgname FROM pg_trigger WHERE tgname ~ '^reorg_{JOB}_'""")


def test_rollback_before_the_swap_leaves_the_table_as_it_was(fresh_db):
    make_table(fresh_db, BIGINT, 100)
    eng = engine(fresh_db)
    with eng.begin() as conn:
        before, rows_before = snapshot(conn), run(conn, "SELECT * FROM items ORDER BY id")
    s = prepared(eng)
    caught_up(eng, s)
    with eng.begin() as conn:
        for statement in swap.rollback_statements(s):
            run(conn, statement)
        assert snapshot(conn) == before
        assert run(conn, "SELECT * FROM items ORDER BY id") == rows_before
    assert leftovers(fresh_db) == []


@pytest.mark.parametrize("reverted", [False, True], ids=["after-swap", "after-revert"])
def test_cleanup_leaves_nothing_of_the_job(fresh_db, reverted):
    make_table(fresh_db, BIGINT, 100)
    eng = engine(fresh_db)
    s = prepared(eng)
    caught_up(eng, s)
    with eng.begin() as conn:
        swap.swap(conn, s, keep_old=True)
    if reverted:
        with eng.begin() as conn:
            swap.revert(conn, s)
    execute(fresh_db, "INSERT INTO items (id, a, b) VALUES (5000, 1, 'after')")
    with eng.begin() as conn:
        for statement in swap.cleanup_statements(s):
            run(conn, statement)
    assert leftovers(fresh_db) == []
    assert execute(fresh_db, "SELECT count(*), max(id) FROM items") == [(101, 5000)]
