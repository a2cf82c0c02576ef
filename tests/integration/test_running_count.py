"""The running count of every claim and lease renewal (``subtasks.running_of``,
the job's subtasks under a live lease, which its ``concurrency`` caps) reads
the job's running subtasks only, also before the live table has statistics:
a 100,000-subtask job runs its first minute on those of an empty table, and
the count then walked every pending subtask of the job through the partial
``subtask_exhausted`` index, 26 ms a claim half way through (issue 9;
migration ``0016_scale4``)."""

from __future__ import annotations

import json

from support import statements_sent

from framework.store import subtasks

JOB = 7
PENDING = 100_000
RUNNING = 16


def _rows_read(plan: dict, relation: str) -> int:
    """Rows the plan's scans of ``relation`` read: returned, and filtered out."""
    here = 0
    if plan.get("Relation Name") == relation:
        here = (plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)
                + plan.get("Rows Removed by Index Recheck", 0)) * plan.get("Actual Loops", 1)
    return here + sum(_rows_read(child, relation) for child in plan.get("Plans", []))


def _explain_analyze(db, statement: str, parameters) -> dict:
    with db.connect() as conn:
        raw = conn.connection.driver_connection
        with raw.cursor() as cur:
            cur.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", parameters)
            (document,) = cur.fetchone()
        raw.rollback()  # the claim and the renewal write: leave the rows as they were
    return (json.loads(document) if isinstance(document, str) else document)[0]["Plan"]


def _insert_job(db, conn) -> None:
    """Job ``JOB``, running its first step, as many slots at once as it likes."""
    conn.execute(db.sql(f"""
        INSERT INTO {{s}}.jobs (id, type, params, target_table, key_column, state, step,
                                concurrency)
        OVERRIDING SYSTEM VALUE VALUES ({JOB}, 't', '{{}}', 'x', 'id', 'running', 1, 10000)"""))


def test_claims_and_renewals_count_running_subtasks_without_reading_pending_ones(db):
    with db.begin() as conn:
        _insert_job(db, conn)
        # As the owner's split leaves them: all pending, the table never analysed
        # (nor by an autovacuum worker passing by before the claim).
        conn.execute(db.sql("ALTER TABLE {s}.background_subtask "
                            "SET (autovacuum_enabled = off)"))
        conn.execute(db.sql(f"""
            INSERT INTO {{s}}.background_subtask
                (job_id, step, ordinal, state, start_key, end_key, curr_key)
            SELECT {JOB}, 1, g, 'pending', to_jsonb(g * 10), to_jsonb(g * 10 + 10),
                   to_jsonb(g * 10)
            FROM generate_series(1, {PENDING}) g"""))
    with db.connect(isolation_level="AUTOCOMMIT") as conn:
        held = subtasks.claim(db, conn, "w1", limit=RUNNING)
    assert len(held) == RUNNING
    statistics = db.engine.connect()
    try:
        analysed = statistics.execute(db.sql(
            "SELECT last_analyze, last_autoanalyze FROM pg_stat_user_tables "
            "WHERE schemaname = :schema AND relname = 'background_subtask'"),
            {"schema": db.schema}).one()
    finally:
        statistics.close()
    assert analysed == (None, None)  # what the planner sees: no statistics yet

    def claim_and_renew(conn) -> None:
        subtasks.claim(db, conn, "w2", limit=4)
        subtasks.renew(db, conn, held)

    seen = statements_sent(db, claim_and_renew)
    assert len(seen) == 2
    for statement, parameters in seen:
        plan = _explain_analyze(db, statement, parameters)
        read = _rows_read(plan, "background_subtask")
        # The claim reads its 4 candidates and the 16 running rows before
        # them, each statement counts the 16; never the 99,984 pending rows.
        assert read < 200, (f"{read} rows of background_subtask read by\n{statement}\n"
                            + json.dumps(plan, indent=1))


def test_the_count_is_of_live_leases_only(db):
    """What the count means did not change: running subtasks whose lease is
    live, not those whose lease expired."""
    with db.begin() as conn:
        _insert_job(db, conn)
        conn.execute(db.sql(f"""
            INSERT INTO {{s}}.background_subtask
                (job_id, step, ordinal, state, start_key, end_key, curr_key, exec_id,
                 exec_expired, epoch, attempts)
            SELECT {JOB}, 1, g, CASE WHEN g <= 5 THEN 'running' ELSE 'pending' END,
                   to_jsonb(g * 10), to_jsonb(g * 10 + 10), to_jsonb(g * 10),
                   CASE WHEN g <= 5 THEN 'w' END,
                   CASE WHEN g <= 3 THEN clock_timestamp() + interval '30 s'
                        WHEN g <= 5 THEN clock_timestamp() - interval '1 s' END,
                   CASE WHEN g <= 5 THEN 1 ELSE 0 END, CASE WHEN g <= 5 THEN 1 ELSE 0 END
            FROM generate_series(1, 100) g"""))
        running = conn.execute(db.sql("SELECT " + subtasks.running_of(":job_id")),
                               {"job_id": JOB}).scalar()
    assert running == 3
