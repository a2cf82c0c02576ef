"""The change log of a rewrite (``backfill.rewrite.capture``), on real
PostgreSQL with applications writing throughout: inserts, updates, key
updates, deletes and re-inserts of the same keys while the table's ranges
are copied into the shadow and replays run concurrently. After a final
replay under a lock, the shadow equals T exactly, row by row (oracle: T
itself, through the copy's column mapping), and T equals the applications'
own oracle."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa
from support.db import execute, wait_until
from support.rewrite import (
    BIGINT,
    COMPOSITE,
    KeyApp,
    build_all,
    copy_all,
    differences,
    engine,
    make_table,
    table_as_oracle,
)

from backfill.rewrite import shadow
from backfill.rewrite.capture import REPLAY_LOCK_BUCKETS, REPLAY_MAX_ROWS, Capture
from backfill.schema.sql import run

# Depends on the catalog or on lock levels: run on every supported major (README).
pytestmark = pytest.mark.catalog

JOB = 41


def prepare(eng: sa.Engine, request: shadow.Request) -> Capture:
    """The prepare state: the shadow and the capture in one transaction."""
    with eng.begin() as conn:
        run(conn, "CREATE SCHEMA IF NOT EXISTS reorg")
        plan = shadow.plan(conn, "items", JOB, request)
        capture = Capture(plan, "reorg")
        for statement in (*plan.create, *capture.install()):
            run(conn, statement)
    return capture


def replaying(eng: sa.Engine, capture: Capture, stop: threading.Event,
              errors: list[BaseException]) -> None:
    """A catch-up worker: replays 40 log rows at a time until told to stop."""
    try:
        while not stop.is_set():
            with eng.begin() as conn:
                if capture.replay(conn, 40) == 0:
                    stop.wait(0.01)
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        errors.append(exc)


@pytest.mark.parametrize(("key", "request_", "indexed"), [
    (BIGINT, shadow.Request(), True),
    (COMPOSITE, shadow.Request(alter="ADD COLUMN d text", sets=(("d", "upper(b)"),)), False),
], ids=["bigint-key-indexed-shadow", "composite-key-alter-no-index"])
def test_shadow_equals_table_after_concurrent_copy_and_replays(fresh_db, key, request_, indexed):
    make_table(fresh_db, key, 1500)
    eng = engine(fresh_db)
    capture = prepare(eng, request_)
    apps = [KeyApp(fresh_db, key, lane=lane, lanes=2, space=2400) for lane in (0, 1)]
    for app in apps:
        app.load()
        app.start()
    copy_all(eng, capture.plan, parts=4, threads=2, batch=60)
    if indexed:  # the build step: replays then delete and insert through a unique index
        build_all(eng, capture.plan)
    stop, errors = threading.Event(), []
    replayers = [threading.Thread(target=replaying, args=(eng, capture, stop, errors))
                 for _ in range(2)]
    for r in replayers:
        r.start()
    start_ops = sum(a.ops for a in apps)
    wait_until(lambda: sum(a.ops for a in apps) > start_ops + 400, 60, "the apps to write on")
    stop.set()
    for r in replayers:
        r.join(30)
    assert not errors, errors

    # The swap's last replay: under a lock that stops the writers, nothing is left.
    with eng.begin() as conn:
        conn.execute(sa.text("SET LOCAL lock_timeout = '10s'"))
        conn.execute(sa.text(f"LOCK TABLE {capture.plan.table} IN EXCLUSIVE MODE"))
        capture.replay_all(conn)
        assert capture.backlog(conn) == (0, None)
        assert differences(conn, capture.plan) == []
        locked_rows = conn.execute(sa.text(f"SELECT count(*) FROM {capture.plan.shadow}")).scalar()

    for app in apps:
        app.stop(at_least_ops=20)
        assert app.errors == [], app.errors[:3]
    counts = {k: sum(a.counts[k] for a in apps) for k in apps[0].counts}
    assert min(counts.values()) > 0, counts  # every kind of write happened
    oracle = {k: v for a in apps for k, v in a.oracle.items()}
    assert table_as_oracle(fresh_db, key[0]) == oracle
    with eng.begin() as conn:
        capture.replay_all(conn)
        assert differences(conn, capture.plan) == []
    assert locked_rows > 1000


def test_replay_rolled_back_leaves_its_log_rows(fresh_db):
    """A replay is part of its transaction: rolled back (a worker killed
    mid-replay), its log rows are still there and the shadow is unchanged;
    the next replay brings the shadow to T."""
    make_table(fresh_db, BIGINT, 50)
    eng = engine(fresh_db)
    capture = prepare(eng, shadow.Request())
    copy_all(eng, capture.plan, parts=1, threads=1)
    execute(fresh_db, "UPDATE items SET b = 'changed' WHERE id <= 10; DELETE FROM items "
                      "WHERE id = 20; UPDATE items SET id = 1000 WHERE id = 30")
    with eng.connect() as conn:
        with conn.begin() as tx:
            assert capture.replay(conn, 100) == 13  # 10 updates, a delete, a key update: 2
            assert differences(conn, capture.plan) == []
            tx.rollback()
        with conn.begin():
            assert capture.backlog(conn)[0] == 13
            # 10 rows changed (old out, new in), 20 deleted, 30 out and 1000 in
            assert len(differences(conn, capture.plan)) == 23
            assert capture.replay(conn, 5) == 5  # oldest first, in parts
            assert capture.replay_all(conn) == 8
            assert differences(conn, capture.plan) == []


def test_a_replay_of_many_keys_takes_a_bounded_number_of_locks(fresh_db):
    """PostgreSQL's lock table holds about 64 locks per connection in all: a
    lock per replayed key made a few replays of 10,000 keys at once fail
    with "out of shared memory". A replay locks buckets of keys, at most
    REPLAY_LOCK_BUCKETS."""
    make_table(fresh_db, BIGINT, 3 * REPLAY_LOCK_BUCKETS)
    eng = engine(fresh_db)
    capture = prepare(eng, shadow.Request())
    copy_all(eng, capture.plan, parts=1, threads=1)
    execute(fresh_db, "UPDATE items SET b = 'changed'")
    with eng.connect() as conn, conn.begin():
        pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar()
        assert capture.replay(conn, REPLAY_MAX_ROWS + 1) == 3 * REPLAY_LOCK_BUCKETS
        locks = execute(fresh_db, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                                  f"AND pid = {pid} AND objsubid = 2")[0][0]
        assert 0.9 * REPLAY_LOCK_BUCKETS <= locks <= REPLAY_LOCK_BUCKETS
        assert differences(conn, capture.plan) == []


def test_truncate_of_the_table_truncates_the_shadow(fresh_db):
    make_table(fresh_db, BIGINT, 50)
    eng = engine(fresh_db)
    capture = prepare(eng, shadow.Request())
    copy_all(eng, capture.plan, parts=1, threads=1)
    execute(fresh_db, "TRUNCATE items; INSERT INTO items (id, a, b) VALUES (7, 1, 'after')")
    with eng.begin() as conn:
        capture.replay_all(conn)
        assert differences(conn, capture.plan) == []
        assert run(conn, f"SELECT id, b, c FROM {capture.plan.shadow}") == [(7, "after", 5)]


def test_capture_logs_writes_under_replica_role_and_as_a_role_without_rights(fresh_db):
    """The capture trigger fires under session_replication_role = replica
    (a logical replication apply) and for a role with no right on reorg's
    schema (SECURITY DEFINER)."""
    make_table(fresh_db, BIGINT, 10)
    eng = engine(fresh_db)
    capture = prepare(eng, shadow.Request())
    execute(fresh_db, "CREATE ROLE app_only; GRANT ALL ON items TO app_only")
    execute(fresh_db, "SET session_replication_role = replica; UPDATE items SET b = 'r' "
                      "WHERE id = 1; RESET session_replication_role; SET ROLE app_only; "
                      "DELETE FROM items WHERE id = 2")
    with eng.begin() as conn:
        assert run(conn, f"SELECT k0 FROM {capture.log} ORDER BY seq") == [(1,), (2,)]
