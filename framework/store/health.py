"""The database's health as the throttles read it (``framework.throttle``):
one statement, run at most once per health interval per node.

Read on the primary: its WAL position, each standby's replay position and
the time of its last reply (``pg_stat_replication``), and the active
sessions of this database. Seeing the standbys' positions needs the
``pg_monitor`` (or ``pg_read_all_stats``) role; without it they read as
NULL, which the replica-lag throttle treats as "unknown", i.e. over the limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection


# Connections of reorg itself (framework.db names them reorg-worker,
# reorg-owner, reorg-cli): the load signal is the application's, so that a
# job's own batches never hold the job.
OWN_APPLICATION_NAMES = "reorg-%"


@dataclass(frozen=True)
class Standby:
    name: str  # application_name, else the client address, else the walsender pid
    replay_pos: int | None  # bytes since 0/0 the standby has replayed; None: not visible
    reply_at: float | None  # database epoch seconds of the standby's last reply
    replay_lag: float | None  # PostgreSQL's own replay_lag (NULL when idle, stale when stuck)


@dataclass(frozen=True)
class Reading:
    at: float  # database clock, epoch seconds
    wal_pos: int | None  # the primary's WAL insert position, bytes; None on a standby
    active_sessions: int  # active client backends of this database, not reorg's
    standbys: tuple[Standby, ...]


def read(conn: Connection) -> Reading:
    from sqlalchemy import text

    row = conn.execute(text("""
        SELECT extract(epoch FROM clock_timestamp())::float8 AS at,
               CASE WHEN pg_is_in_recovery() THEN NULL
                    ELSE pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint END AS wal_pos,
               (SELECT count(*) FROM pg_stat_activity
                WHERE datname = current_database() AND backend_type = 'client backend'
                  AND state = 'active' AND pid <> pg_backend_pid()
                  AND coalesce(application_name, '') NOT LIKE :own) AS active_sessions,
               (SELECT coalesce(json_agg(json_build_object(
                    'name', coalesce(nullif(application_name, ''), host(client_addr),
                                     'pid ' || pid),
                    'replay_pos', pg_wal_lsn_diff(replay_lsn, '0/0')::bigint,
                    'reply_at', extract(epoch FROM reply_time)::float8,
                    'replay_lag', extract(epoch FROM replay_lag)::float8) ORDER BY pid), '[]')
                FROM pg_stat_replication) AS standbys"""),
        {"own": OWN_APPLICATION_NAMES},
    ).mappings().one()
    standbys = tuple(Standby(**s) for s in row["standbys"])
    return Reading(at=row["at"], wal_pos=row["wal_pos"],
                   active_sessions=int(row["active_sessions"]), standbys=standbys)
