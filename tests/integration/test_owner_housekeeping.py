"""Owner housekeeping and wake-ups: history retention, dead nodes, NOTIFY."""

from __future__ import annotations

import time

from support import fill, make_items, wait_until

from framework import control
from framework.config import Settings
from framework.db import Database
from framework.owner import Owner
from framework.store import history, nodes
from framework.submit import submit


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

