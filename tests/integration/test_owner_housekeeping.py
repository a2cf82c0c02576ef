"""Owner housekeeping and wake-ups: history retention, dead nodes, NOTIFY."""

from __future__ import annotations

import time

import sqlalchemy as sa
from support import fill, job_of, make_items, wait_until

from framework import control
from framework import owner as owner_module
from framework.config import Settings
from framework.db import Database
from framework.owner import Owner
from framework.store import history, nodes, owner_lease
from framework.submit import submit
from framework.worker import WorkerPool


def test_history_older_than_retention_is_deleted_and_newer_kept(db):
    with db.begin() as conn:
        conn.execute(db.sql("""
            INSERT INTO {s}.jobs (id, type, params, target_table, key_column, state)
            OVERRIDING SYSTEM VALUE VALUES (900, 't', '{}', 'x', 'id', 'succeeded')"""))
        conn.execute(db.sql("""
            INSERT INTO {s}.background_subtask_history
                (id, job_id, step, ordinal, state, start_key, end_key, curr_key, moved_at)
            SELECT g, 900, 1, g, 'succeeded', to_jsonb(g * 10), to_jsonb(g * 10 + 10),
                   to_jsonb(g * 10 + 10),
                   clock_timestamp() - make_interval(days => CASE WHEN g <= 5 THEN 40 ELSE 1 END)
            FROM generate_series(1, 8) g"""))
    result = Owner(db, "o").tick()
    assert "deleted 5 history rows past retention" in result.actions
    with db.begin() as conn:
        left = conn.execute(db.sql("SELECT id FROM {s}.background_subtask_history ORDER BY id")).scalars()
        assert list(left) == [6, 7, 8]


def test_subtasks_of_job_reads_live_and_history_rows_together_in_range_order(db):
    with db.begin() as conn:
        conn.execute(db.sql("""
            INSERT INTO {s}.jobs (id, type, params, target_table, key_column, state)
            OVERRIDING SYSTEM VALUE VALUES (901, 't', '{}', 'x', 'id', 'running')"""))
        conn.execute(db.sql("""
            INSERT INTO {s}.background_subtask
                (id, job_id, step, ordinal, state, start_key, end_key, curr_key)
            VALUES (11, 901, 1, 2, 'running', '20', '30', '25'),
                   (12, 901, 2, 1, 'pending', '0', '30', '0')"""))
        conn.execute(db.sql("""
            INSERT INTO {s}.background_subtask_history
                (id, job_id, step, ordinal, state, start_key, end_key, curr_key, row_count)
            VALUES (10, 901, 1, 1, 'succeeded', '10', '20', '20', 7),
                   (13, 900, 1, 1, 'succeeded', '0', '10', '10', 3)"""))
        found = history.subtasks_of_job(db, conn, 901)
    assert [(r["id"], r["step"], r["ordinal"]) for r in found] == [(10, 1, 1), (11, 1, 2), (12, 2, 1)]
    assert [r["moved_at"] is None for r in found] == [False, True, True]
    assert found[0]["row_count"] == 7 and found[1]["curr_key"] == 25


def test_nodes_whose_heartbeat_stopped_are_marked_dead(settings):
    db = Database(Settings(**{**settings.__dict__, "node_dead_after_seconds": 1}))
    with db.begin() as conn:
        nodes.register(db, conn, node_id="gone", host="h", pid=1, version="v", slots=1)
        nodes.register(db, conn, node_id="alive", host="h", pid=2, version="v", slots=1)
        conn.execute(db.sql("UPDATE {s}.nodes SET heartbeat_at = clock_timestamp() - interval '5s' "
                            "WHERE node_id = 'gone'"))
    result = Owner(db, "o").tick()
    assert "node gone marked dead" in result.actions
    with db.begin() as conn:
        states = dict((n["node_id"], n["state"]) for n in nodes.list_all(db, conn))
    assert states == {"gone": "dead", "alive": "active"}
    db.dispose()


def test_idle_workers_wake_on_notify_long_before_their_poll_interval(db, start_node):
    make_items(db, 500)
    node = start_node("n1", poll_seconds=60)
    wait_until(lambda: node.owner.term is not None, 10, "n1 to be elected")
    submitted = time.monotonic()
    job_id = submit(db, fill("md5(b)")).job_id
    wait_until(lambda: control.status(db, job_id)[0]["state"] == "succeeded", 20,
               "job to succeed without waiting for a 60 s poll")
    assert time.monotonic() - submitted < 20



def test_only_the_owners_bookkeeping_commits_without_waiting_for_the_disk(db):
    """Claim marks, split chunks, history moves and retention commit with
    ``synchronous_commit`` off for their own transaction only; every job
    transition (a job event written) commits durably, and the setting does
    not outlive the transaction on the pooled connection."""
    make_items(db, 300)
    job_id = submit(db, fill("md5(b)", rows_per_subtask=100)).job_id
    transactions: dict[int, list[str]] = {}
    current: dict[int, int] = {}

    def begun(conn):
        current[id(conn)] = len(transactions)
        transactions[len(transactions)] = []

    def statement(conn, cursor, sql, parameters, context, executemany):
        if id(conn) in current:
            transactions[current[id(conn)]].append(sql)

    sa.event.listen(db.engine, "begin", begun)
    sa.event.listen(db.engine, "before_cursor_execute", statement)
    owner, pool = Owner(db, "o1"), WorkerPool(db, "w", 1)
    try:
        for _ in range(10):
            owner.tick()
            while pool.run_one():
                pass
            if job_of(db, job_id)["history_done"]:
                break
    finally:
        sa.event.remove(db.engine, "begin", begun)
        sa.event.remove(db.engine, "before_cursor_execute", statement)
    assert job_of(db, job_id)["history_done"]
    relaxed = [t for t in transactions.values()
               if any("'synchronous_commit', 'off'" in s for s in t)]
    transitions = [t for t in transactions.values() if any("job_events" in s for s in t)]
    assert relaxed and transitions
    assert not [t for t in relaxed if t in transitions]
    assert any("background_subtask_history" in s for t in relaxed for s in t)  # a move
    term = owner.term
    assert term is not None
    with db.connect() as conn:  # the setting ends with the transaction
        conn.execute(sa.text("SET synchronous_commit = on"))
        conn.commit()
        for durable, inside in ((False, "off"), (True, "on")):
            with conn.begin():
                assert owner_lease.hold(db, conn, term, durable=durable)
                assert conn.execute(sa.text("SHOW synchronous_commit")).scalar() == inside
            assert conn.execute(sa.text("SHOW synchronous_commit")).scalar() == "on"
            conn.commit()


def test_retention_and_dead_nodes_run_once_per_housekeeping_interval_not_every_tick(
        settings):
    db = Database(Settings(**{**settings.__dict__, "node_dead_after_seconds": 1}))
    now = [1000.0]
    owner = Owner(db, "o", clock=lambda: now[0])

    def stop_heartbeat(node_id: str) -> None:
        with db.begin() as conn:
            nodes.register(db, conn, node_id=node_id, host="h", pid=1, version="v", slots=1)
            conn.execute(db.sql("UPDATE {s}.nodes SET heartbeat_at = clock_timestamp() "
                                "- interval '5s' WHERE node_id = :n"), {"n": node_id})

    stop_heartbeat("first")
    assert "node first marked dead" in owner.tick().actions
    stop_heartbeat("second")
    now[0] += owner_module.HOUSEKEEPING_SECONDS / 2
    assert "node second marked dead" not in owner.tick().actions  # not due yet
    now[0] += owner_module.HOUSEKEEPING_SECONDS
    assert "node second marked dead" in owner.tick().actions
    db.dispose()


def test_a_tick_right_after_a_renewal_does_not_renew_the_owner_lease_again(db):
    """The lease is renewed at most every third of its length (a durable
    commit per tick cost up to 220 ms under load); later ticks renew it."""
    now = [1000.0]
    owner = Owner(db, "o", clock=lambda: now[0])

    def expires_at():
        with db.begin() as conn:
            return owner_lease.current(db, conn)["expires_at"]

    assert owner.tick().is_owner
    first = expires_at()
    now[0] += 0.1
    assert owner.tick().is_owner and owner.trusted()
    assert expires_at() == first  # not written
    now[0] += db.settings.owner_lease_seconds / 3
    assert owner.tick().is_owner
    assert expires_at() > first
