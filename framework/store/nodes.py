"""The nodes table: one row per running worker process."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from framework.db import Database, SqlConnection, SqlDatabase

if TYPE_CHECKING:  # `reorg nodes` reads this table through psycopg alone
    from sqlalchemy.engine import Connection


def register(
    db: Database, conn: Connection, *, node_id: str, host: str, pid: int, version: str, slots: int
) -> None:
    conn.execute(
        db.sql("""
            INSERT INTO {s}.nodes (node_id, host, pid, version, slots, state, started_at,
                                   heartbeat_at)
            VALUES (:node_id, :host, :pid, :version, :slots, 'active', clock_timestamp(),
                    clock_timestamp())
            ON CONFLICT (node_id) DO UPDATE SET
                host = EXCLUDED.host, pid = EXCLUDED.pid, version = EXCLUDED.version,
                slots = EXCLUDED.slots, state = 'active', started_at = EXCLUDED.started_at,
                heartbeat_at = EXCLUDED.heartbeat_at"""),
        {"node_id": node_id, "host": host, "pid": pid, "version": version, "slots": slots},
    )


def heartbeat(db: Database, conn: Connection, node_id: str) -> bool:
    """Returns False if the row is gone (someone deregistered us)."""
    return conn.execute(
        db.sql("""
            UPDATE {s}.nodes SET heartbeat_at = clock_timestamp(),
                state = CASE WHEN state = 'dead' THEN 'active' ELSE state END
            WHERE node_id = :node_id"""),
        {"node_id": node_id},
    ).rowcount == 1


def heartbeat_of(db: SqlDatabase, conn: SqlConnection, node_id: str) -> dict[str, Any] | None:
    """The node's state and the age of its heartbeat (seconds, by the
    database clock); None when it is not registered."""
    rows = conn.execute(
        db.sql("""
            SELECT state, extract(epoch FROM clock_timestamp() - heartbeat_at)::float8
                       AS heartbeat_age
            FROM {s}.nodes WHERE node_id = :node_id"""),
        {"node_id": node_id},
    ).mappings()
    return next((dict(r) for r in rows), None)


def set_draining(db: Database, conn: Connection, node_id: str) -> None:
    conn.execute(
        db.sql("UPDATE {s}.nodes SET state = 'draining' WHERE node_id = :node_id"),
        {"node_id": node_id},
    )


def deregister(db: Database, conn: Connection, node_id: str) -> None:
    conn.execute(db.sql("DELETE FROM {s}.nodes WHERE node_id = :node_id"), {"node_id": node_id})


def mark_dead(db: Database, conn: Connection, older_than_seconds: float, *,
              actor: str) -> list[str]:
    """Declare dead the nodes silent for ``older_than_seconds``; each job
    whose subtasks one of them still held gets an event saying so (by
    ``actor``, the owner), in the same statement."""
    return list(conn.execute(
        db.sql("""
            WITH dead AS (
                UPDATE {s}.nodes SET state = 'dead'
                WHERE state <> 'dead'
                  AND heartbeat_at < clock_timestamp() - make_interval(secs => :secs)
                RETURNING node_id,
                          extract(epoch FROM clock_timestamp() - heartbeat_at) AS silent),
            held AS (
                SELECT st.job_id, d.node_id, d.silent, count(*) AS subtasks
                FROM dead d JOIN {s}.background_subtask st
                  ON st.state = 'running' AND st.exec_id = d.node_id
                GROUP BY st.job_id, d.node_id, d.silent),
            noted AS (
                INSERT INTO {s}.job_events (job_id, actor, from_state, to_state, detail)
                SELECT h.job_id, :actor, j.state, j.state,
                       'node ' || h.node_id || ' declared dead (no heartbeat for '
                       || round(h.silent) || ' s); it held ' || h.subtasks
                       || CASE WHEN h.subtasks = 1 THEN ' subtask' ELSE ' subtasks' END
                       || ' of this job, which other nodes take over once '
                       || CASE WHEN h.subtasks = 1 THEN 'its lease expires'
                               ELSE 'their leases expire' END
                FROM held h JOIN {s}.jobs j ON j.id = h.job_id)
            SELECT node_id FROM dead"""),
        {"secs": older_than_seconds, "actor": actor},
    ).scalars())


def list_all(db: SqlDatabase, conn: SqlConnection) -> list[dict[str, Any]]:
    rows = conn.execute(
        db.sql("""
            SELECT n.node_id, n.host, n.pid, n.version, n.slots, n.state, n.started_at,
                   n.heartbeat_at,
                   extract(epoch FROM clock_timestamp() - n.heartbeat_at) AS heartbeat_age,
                   (SELECT count(*) FROM {s}.background_subtask st
                    WHERE st.exec_id = n.node_id AND st.state = 'running'
                      AND st.exec_expired > clock_timestamp()) AS running,
                   (SELECT owner_id = n.node_id AND expires_at > clock_timestamp()
                    FROM {s}.owner_lease WHERE id = 1) AS is_owner
            FROM {s}.nodes n ORDER BY n.node_id""")
    ).mappings()
    return [dict(r) for r in rows]
