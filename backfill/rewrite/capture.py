"""The change log of a rewrite: which keys of T changed since the copy
began, so the shadow can be brought to T's current rows (DESIGN 14).

- The log: ``<work schema>.rewrite_<job>_log (seq bigserial, k0, k1, ...)``,
  one row per changed key (the key's columns, of its types).
- The capture: an AFTER ROW INSERT / UPDATE / DELETE trigger on T logging
  the row's key, the old and the new one when an UPDATE changes the key.
  AFTER, so a write is logged as the user's own triggers left it (and not
  at all when one of them cancelled it); ``ENABLE ALWAYS``, so it also logs
  what a logical replication apply (``session_replication_role = replica``)
  writes. It logs keys, never values: a replay reads T's row itself. A
  TRUNCATE of T (no row triggers fire) truncates the shadow too, from an
  AFTER TRUNCATE trigger: the rows written after it are logged as usual.
  The functions run as their owner (SECURITY DEFINER, a fixed search_path):
  the application's roles need no privilege on reorg's schema.
- The replay: log rows are taken (deleted) in seq order, and for each
  distinct key the shadow's row is deleted and T's current row, if there
  is one, inserted through the copy's column mapping, all in the caller's
  transaction: a replay that fails leaves its log rows for the next one,
  and one that commits can never apply a change twice. Delete-then-insert
  works with and without the shadow's indexes. Replays may run
  concurrently: each takes other log rows (SKIP LOCKED), and a transaction
  lock per bucket of keys (``pg_advisory_xact_lock(job, hashtext(key) %
  REPLAY_LOCK_BUCKETS)``, taken in order) orders two replays of the same
  key, the second reading T after the first committed. Buckets, not keys:
  PostgreSQL's lock table holds about 64 locks per connection in all, and
  a replay of 10,000 keys took 10,000 (four at once on a server of 100
  connections: "out of shared memory"); two replays of many keys each now
  take turns. A replay takes at most ``REPLAY_MAX_ROWS`` log rows.
  Each replay also holds the job's replay lock shared (``names.replay_lock``):
  a verify that copies a range again holds it exclusive, so no replay
  interleaves with that copy.
- The rows a replay writes into the shadow are computed by the copy's
  column mapping, which may hold the user's SQL (``--set``): that statement
  runs as ``user_role`` (the job's submitter, ``framework.privileges``).
  With ``--engine spark`` its column comes from Spark (``insert_rows``,
  ``spark_rows``), and a replay takes ``REPLAY_MAX_ROWS`` log rows.
  A replay must not overlap the copy of its keys' range: the copy step ends
  before catch-up begins (a key replayed before its range is copied would be
  copied again).
- A row whose transaction commits after a replay took later seqs is taken
  by the next replay: the log is consumed, not walked by a cursor. The last
  replay runs under the swap's lock, when no write is in flight."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import text
from sqlalchemy.engine import Connection

from backfill.rewrite import names, triggers
from backfill.rewrite.shadow import Plan
from backfill.schema.sql import run
from framework.keys import KeySpec, decode
from framework.privileges import as_role

if TYPE_CHECKING:
    from backfill.rewrite.spark_rows import SparkSet

# Locks a replay takes at most, and log rows (see the module): the keys go
# into the replay's statements as literals.
REPLAY_LOCK_BUCKETS = 256
REPLAY_MAX_ROWS = 10_000


@dataclass(frozen=True)
class Capture:
    plan: Plan
    work_schema: str
    user_role: str | None = None  # who the replay's copy of a row runs as; None: the session
    spark: SparkSet | None = None  # --engine spark: the column Spark computes (``spark_rows``)

    @property
    def log(self) -> str:
        return names.log_table(self.work_schema, self.plan.job_id)

    @property
    def log_key(self) -> KeySpec:
        """The key as the log holds it: columns k0, k1, ... of the key's types."""
        key = self.plan.key
        return KeySpec.of([f"k{i}" for i in range(len(key.columns))], key.types)

    def install(self) -> list[str]:
        """The log, the capture and the truncate triggers: in the prepare
        transaction that also creates the shadow, so no write falls between."""
        p, key, log_key = self.plan, self.plan.key, self.log_key
        function = names.capture_function(self.work_schema, p.job_id)
        truncate = names.truncate_function(self.work_schema, p.job_id)
        log_columns = ", ".join(f"{c} {t}" for c, t in zip(log_key.names(), key.types,
                                                           strict=True))
        into = f"INSERT INTO {self.log} ({log_key.order_by()})"
        old, new = key.order_by("OLD"), key.order_by("NEW")
        changed = (f"({new}) IS DISTINCT FROM ({old})" if len(key.columns) > 1
                   else f"{new} IS DISTINCT FROM {old}")
        body = f"""  IF TG_OP <> 'INSERT' THEN
    {into} VALUES ({old});
  END IF;
  IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE' AND {changed}) THEN
    {into} VALUES ({new});
  END IF;
  RETURN NULL;"""
        return [
            f"CREATE TABLE {self.log} (seq bigserial PRIMARY KEY, {log_columns})",
            *triggers.on_rows(p.table, names.capture_trigger(p.job_id), function, body),
            *triggers.on_truncate(p.table, names.truncate_trigger(p.job_id), truncate, p.shadow),
        ]

    def remove(self, table: str | None = None) -> list[str]:
        """The triggers and functions (on ``table``, by default T; the swap
        drops them from T renamed away); the log stays for cleanup."""
        t, job = table or self.plan.table, self.plan.job_id
        return triggers.remove(
            t, (names.capture_trigger(job), names.truncate_trigger(job)),
            (names.capture_function(self.work_schema, job),
             names.truncate_function(self.work_schema, job)))

    def drop_log(self) -> str:
        return f"DROP TABLE IF EXISTS {self.log}"

    # -- replay -------------------------------------------------------------------

    def replay(self, conn: Connection, limit: int, lo: int | None = None,
               hi: int | None = None, lock_timeout: str | None = None) -> int:
        """Take up to ``limit`` log rows (at most ``REPLAY_MAX_ROWS``; seq in
        ``[lo, hi)`` when given), oldest first, and bring the shadow's rows
        of their keys to T's; in the caller's transaction. Returns the log
        rows taken."""
        bounds = " AND ".join(filter(None, ["seq >= :lo" if lo is not None else "",
                                            "seq < :hi" if hi is not None else ""])) or "true"
        taken = conn.execute(text(f"""
            WITH taken AS (
                DELETE FROM {self.log} WHERE seq IN (
                    SELECT seq FROM {self.log} WHERE {bounds} ORDER BY seq LIMIT :n
                    FOR UPDATE SKIP LOCKED)
                RETURNING {self.log_key.order_by()})
            SELECT count(*) OVER (), {self.log_key.read()} FROM taken"""),
            {"lo": lo, "hi": hi, "n": self.replay_rows(limit)}).all()
        if not taken:
            return 0
        keys = sorted({row[1] for row in taken})
        conn.execute(text("SELECT pg_advisory_xact_lock_shared(:k)"),
                     {"k": names.replay_lock(self.plan.job_id)})
        conn.execute(text("""
            SELECT pg_advisory_xact_lock(:job, b) FROM (
                SELECT DISTINCT abs(hashtext(k) % :buckets) AS b
                FROM unnest(CAST(:keys AS text[])) k ORDER BY 1) ordered"""),
            {"job": self.plan.job_id, "keys": keys, "buckets": REPLAY_LOCK_BUCKETS})
        self._rewrite(conn, keys, lock_timeout)
        return int(taken[0][0])

    def replay_rows(self, limit: int) -> int:
        """Log rows one replay takes: ``limit``, at most ``REPLAY_MAX_ROWS``.
        On Spark, always that many: a replay there costs a Spark job and a
        JDBC read whatever its rows (~0.3 s), and rounds of a batch (100 in
        the tests) fell behind an application writing in one session."""
        return REPLAY_MAX_ROWS if self.spark is not None else min(limit, REPLAY_MAX_ROWS)

    def replay_all(self, conn: Connection, limit: int = 10_000,
                   lock_timeout: str | None = None) -> int:
        """Replay until the log is empty (under the swap's lock: nothing is
        written meanwhile). Returns the log rows taken."""
        total = 0
        while done := self.replay(conn, limit, lock_timeout=lock_timeout):
            total += done
        return total

    def _rewrite(self, conn: Connection, stored: list[str], lock_timeout: str | None) -> None:
        """The shadow's rows of these keys (stored jsonb texts) made T's."""
        p = self.plan
        match = p.key.among_literal([decode(k) for k in stored])
        with as_role(conn, self.user_role):
            run(conn, f"DELETE FROM {p.shadow} WHERE {match}")
            self.insert_rows(conn, match, lock_timeout=lock_timeout)

    def insert_rows(self, conn: Connection, where: str, order_by: str = "",
                    lock_timeout: str | None = None) -> int:
        """T's rows matching ``where`` (SQL over T's columns) written into the
        shadow through the copy's column mapping, in the caller's transaction
        and role; the rows written. With ``--engine spark`` its column is
        computed by Spark (``spark_rows``; ``lock_timeout`` bounds its reads'
        lock waits)."""
        if self.spark is not None:
            from backfill.rewrite import spark_rows  # pulls in Spark's data plane

            return spark_rows.fill(conn, self.plan, self.spark, self.user_role, where, order_by,
                                   lock_timeout)
        p = self.plan
        statement = p.insert_into(p.shadow, p.select(where) + order_by)
        return int(conn.connection.driver_connection.execute(statement).rowcount)  # type: ignore[union-attr]

    def backlog(self, conn: Connection) -> tuple[int, int | None]:
        """(log rows, oldest seq): what catch-up has left to replay."""
        rows, oldest = conn.execute(text(f"SELECT count(*), min(seq) FROM {self.log}")).one()
        return int(rows), oldest

