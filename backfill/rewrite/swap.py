"""The swap of a rewrite, and its revert: each one transaction of the
owner's, under a bounded ``lock_timeout`` (DESIGN 12, 15).

``swap``: lock T and the shadow (ACCESS EXCLUSIVE; a timeout raises
``SwapBlocked`` naming who holds T, and nothing changed), replay the last
log rows (with ``--engine spark`` first, under a lock on T that lets
Spark's reads in: ``spark_rows``), check again what ``uncarried`` refuses and that every build is
there, drop the capture triggers, rename T's indexes away (recorded, for a
revert), T to ``reorg_<job>_old_<T>`` and the shadow to T, its indexes to
their final names, carry everything over (``carry``), and with
``--keep-old`` install the reverse capture (``reverse``). Without it, the
old table's own foreign keys go (its rows no longer follow the
application's, and would hold back a delete of a parent row). The foreign
keys re-made NOT VALID are validated after the commit
(``Carried.after_commit``), which blocks no write.

``revert``: the same the other way (the old table, kept exact by the
reverse capture, becomes T again, with everything carried back), refused
when the reverse capture had to stop (``reverse``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import text
from sqlalchemy.engine import Connection

from backfill.rewrite import carry, names, reverse, uncarried, views
from backfill.rewrite.capture import Capture
from backfill.rewrite.shadow import Plan
from backfill.schema.sql import run
from framework import faults
from framework.errors import RetryableError, one_line
from framework.keys import quote

if TYPE_CHECKING:
    from backfill.rewrite.spark_rows import SparkSet

# Long enough to get in between application transactions, short enough
# that the statements queued behind the swap's lock wait no longer.
SWAP_LOCK_TIMEOUT = "2s"
_LOCK_NOT_AVAILABLE = "55P03"


class SwapBlocked(RetryableError):
    """The swap waited out its lock_timeout: nothing changed; try again later."""


class SwapRefused(RuntimeError):
    """Something the swap (or revert) cannot do safely: nothing changed."""


@dataclass(frozen=True)
class Swap:
    plan: Plan
    work_schema: str
    user_role: str | None = None  # who the last replay's copy of a row runs as (``Capture``)
    spark: SparkSet | None = None  # --engine spark's column (``Capture``)

    @property
    def old(self) -> str:
        """T's name once swapped away (qualified, quoted)."""
        p = self.plan
        return f"{quote(p.schema)}.{quote(names.old_table(p.job_id, p.table_name))}"

    @property
    def capture(self) -> Capture:
        return Capture(self.plan, self.work_schema, self.user_role, self.spark)


def rollback_statements(s: Swap) -> list[str]:
    """Before the swap: what the job made goes (triggers, shadow, log); T,
    never written by the job, stays as it was."""
    p = s.plan
    return [*s.capture.remove(), f"DROP TABLE IF EXISTS {p.shadow}", s.capture.drop_log()]


def cleanup_statements(s: Swap) -> list[str]:
    """After the swap (and --keep-old), or after a revert: the table swapped
    out (the old one, or the new one a revert put under the shadow's name),
    the reverse capture, the log and the job's records go."""
    p, work = s.plan, s.work_schema
    return [*reverse.remove(p, work, p.table), f"DROP TABLE IF EXISTS {s.old}",
            f"DROP TABLE IF EXISTS {p.shadow}", s.capture.drop_log(),
            *s.capture.remove(p.table),
            f"DROP TABLE IF EXISTS {names.renamed_table(work, p.job_id)}",
            f"DROP TABLE IF EXISTS {names.reverse_broken_table(work, p.job_id)}"]


def swap(conn: Connection, s: Swap, *, keep_old: bool,
         lock_timeout: str = SWAP_LOCK_TIMEOUT) -> carry.Carry:
    """In the caller's transaction; commit it, then run ``after_commit``."""
    p = s.plan
    tables, views_on = _related(conn, p.table)

    def replay_on_spark() -> None:
        # --engine spark: the last log rows' values are Spark's, whose reads of
        # T an ACCESS EXCLUSIVE lock would keep out: first a lock that keeps
        # out only writes, the replay, then the swap's own locks.
        from backfill.rewrite import spark_rows

        spark_rows.allow_idle(conn)  # from here: the owner's transaction waits for Spark
        run(conn, f"LOCK TABLE {p.shadow} IN ACCESS EXCLUSIVE MODE")
        run(conn, f"LOCK TABLE {p.table} IN EXCLUSIVE MODE")
        faults.hit("rewrite.swap_spark_locked")
        try:
            s.capture.replay_all(conn, lock_timeout=lock_timeout)
        except RetryableError as exc:  # Spark's (PostgreSQL's own lock waits: _bounded's)
            raise SwapBlocked(f"the swap's last replay on Spark failed, nothing changed; "
                              f"retrying: {exc}") from None

    # The shadow before T: see _bounded.
    return _bounded(conn, [p.shadow, p.table, *tables], p.table, views_on, lock_timeout,
                    "swap", lambda: _swap(conn, s, keep_old),
                    first=replay_on_spark if s.spark is not None else None)


def _swap(conn: Connection, s: Swap, keep_old: bool) -> carry.Carry:
    p = s.plan
    changed = _shape_changed(conn, p)
    if changed:
        raise SwapRefused(f"table {p.table} changed since the job began ({changed}); the new "
                          "table would not have it: cancel the job and submit it again")
    s.capture.replay_all(conn)
    finals = p.index_names()
    missing = [b.final for b in p.builds if not _has(conn, p, b.temp, b.kind)]
    if missing:
        raise SwapRefused(f"the shadow of {p.table} lacks {missing[0]} (the build step did not "
                          "make it); build it, then swap")
    kept = {c for c, _ in p.shape}
    refused = uncarried.refusals(conn, p.table, kept, finals)
    if refused:
        raise SwapRefused(refused[0])
    carried = carry.read(conn, p.table, p.shadow, source_after=s.old, target_after=p.table,
                         target_names={b.final for b in p.builds})
    for statement in s.capture.remove():
        run(conn, statement)
    run(conn, f"CREATE TABLE {names.renamed_table(s.work_schema, p.job_id)} "
              "(retired name PRIMARY KEY, original name NOT NULL)")
    _retire_indexes(conn, s, p.table)
    run(conn, f"ALTER TABLE {p.table} RENAME TO {quote(names.old_table(p.job_id, p.table_name))}")
    run(conn, f"ALTER TABLE {p.shadow} RENAME TO {quote(p.table_name)}")
    for build in p.builds:
        if build.temp != build.final:
            run(conn, f"ALTER INDEX {quote(p.schema)}.{quote(build.temp)} "
                      f"RENAME TO {quote(build.final)}")
    _apply(conn, carried)
    if keep_old:
        for statement in reverse.install(p, s.work_schema, s.old, _has_always_identity(conn, s.old)):
            run(conn, statement)
    else:
        for name in conn.execute(text("SELECT conname FROM pg_constraint WHERE contype = 'f' "
                                      "AND conrelid = to_regclass(:o)"), {"o": s.old}).scalars():
            run(conn, f"ALTER TABLE {s.old} DROP CONSTRAINT {quote(name)}")
    return carried


def revert(conn: Connection, s: Swap, *, lock_timeout: str = SWAP_LOCK_TIMEOUT) -> carry.Carry:
    """Swap back after a swap with --keep-old: the old table is T again,
    with every write made since (the reverse capture put it there)."""
    p = s.plan
    tables, views_on = _related(conn, p.table)
    # T before the old table, which the applications' writes on T write too
    # (the reverse capture): locked first, it would deadlock with them.
    return _bounded(conn, [p.table, s.old, *tables], p.table, views_on, lock_timeout,
                    "revert", lambda: _revert(conn, s))


def _revert(conn: Connection, s: Swap) -> carry.Carry:
    p = s.plan
    broken = names.reverse_broken_table(s.work_schema, p.job_id)
    if conn.execute(text("SELECT to_regclass(:b) IS NULL"), {"b": broken}).scalar():
        raise SwapRefused(f"job {p.job_id} kept no old table of {p.table} in step (no "
                          "--keep-old, or it was cleaned up); nothing to revert to")
    stopped = run(conn, f"SELECT key, error, at FROM {broken}")
    if stopped:
        key, error, at = stopped[0]
        raise SwapRefused(f"the old table of {p.table} is out of step since {at}: the write "
                          f"of key {key} could not be put back ({error}); a revert would lose "
                          "writes, so it refuses")
    renamed: dict[str, str] = dict(conn.execute(text(
        f"SELECT retired, original FROM {names.renamed_table(s.work_schema, p.job_id)}")).all())
    kept = set(conn.execute(text("SELECT attname FROM pg_attribute WHERE attrelid = "
                                 "to_regclass(:o) AND attnum > 0 AND NOT attisdropped"),
                            {"o": s.old}).scalars())
    refused = uncarried.refusals(conn, p.table, kept, set(renamed.values()))
    if refused:
        raise SwapRefused(refused[0])
    constraints = set(conn.execute(text("SELECT conname FROM pg_constraint WHERE conrelid = "
                                        "to_regclass(:o)"), {"o": s.old}).scalars())
    carried = carry.read(conn, p.table, s.old, source_after=p.shadow, target_after=p.table,
                         target_names=set(renamed.values()) | constraints)
    for statement in reverse.remove(p, s.work_schema, p.table):
        run(conn, statement)
    for index in _indexes(conn, p.table):
        run(conn, f"ALTER INDEX {quote(p.schema)}.{quote(index)} "
                  f"RENAME TO {quote(names.build_name(p.job_id, index))}")
    run(conn, f"ALTER TABLE {p.table} RENAME TO {quote(p.shadow_name)}")
    run(conn, f"ALTER TABLE {s.old} RENAME TO {quote(p.table_name)}")
    for index in _indexes(conn, p.table):
        if index in renamed:
            run(conn, f"ALTER INDEX {quote(p.schema)}.{quote(index)} "
                      f"RENAME TO {quote(renamed[index])}")
    _apply(conn, carried)
    run(conn, f"DROP TABLE {broken}")
    return carried


def _apply(conn: Connection, carried: carry.Carry) -> None:
    try:
        carry.apply(conn, carried)
    except views.CannotCarry as exc:
        raise SwapRefused(str(exc)) from None


def _bounded(conn: Connection, tables: list[str], table: str, views_on: list[str],
             lock_timeout: str, what: str, body: Callable[[], carry.Carry],
             first: Callable[[], None] | None = None) -> carry.Carry:
    """``body`` under ACCESS EXCLUSIVE locks on ``tables``, in that order,
    every lock wait in it bounded by ``lock_timeout``; a wait that runs out
    (there, or on a view the carry replaces) raises SwapBlocked naming who
    holds what the swap needs (``table``, T, first), the savepoint rolled
    back: nothing changed. The swap locks the shadow before T, as no
    application writes the shadow: while it waits there, nobody queues
    behind it. Autovacuum takes a freshly filled shadow, and a lock waiting
    for autovacuum waits until ``deadlock_timeout`` (1 s) cancels it: with
    T locked first, every application statement on T waited that second
    too (1.18 s, issue 24). (A TRUNCATE of T, which truncates the shadow,
    meeting the swap is a deadlock PostgreSQL ends; the swap is retried.)
    ``first`` runs before those locks, under the same bounds."""
    run(conn, f"SET LOCAL lock_timeout = '{lock_timeout}'")
    try:
        with conn.begin_nested():
            if first is not None:
                first()
            for locked in tables:
                run(conn, f"LOCK TABLE {locked} IN ACCESS EXCLUSIVE MODE")
            return body()
    except Exception as exc:
        if getattr(getattr(exc, "orig", None), "sqlstate", None) != _LOCK_NOT_AVAILABLE:
            raise
        named = [table, *(t for t in tables if t != table), *views_on]
        raise SwapBlocked(blocked(conn, named, lock_timeout, what)) from None


def _related(conn: Connection, table: str) -> tuple[list[str], list[str]]:
    """What the swap alters besides the two tables: the tables whose foreign
    keys reference T (locked up front with them), and the views on T (a
    LOCK of a view would lock T again as the view's owner)."""
    tables = conn.execute(text("""
        SELECT DISTINCT c.conrelid::regclass::text FROM pg_constraint c
        WHERE c.contype = 'f' AND c.confrelid = to_regclass(:t) AND c.conrelid <> c.confrelid
        ORDER BY 1"""), {"t": table}).scalars()
    views_on = conn.execute(text("""
        SELECT DISTINCT r.ev_class::regclass::text FROM pg_depend d
        JOIN pg_rewrite r ON r.oid = d.objid JOIN pg_class v ON v.oid = r.ev_class
        WHERE d.classid = 'pg_rewrite'::regclass AND d.refobjid = to_regclass(:t)
          AND v.relkind = 'v'
        ORDER BY 1"""), {"t": table}).scalars()
    return list(tables), list(views_on)


def _shape_changed(conn: Connection, p: Plan) -> str | None:
    """What of T's columns differs from when the job was planned, if anything."""
    now: dict[str, str] = dict(conn.execute(text("""
        SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
        WHERE attrelid = to_regclass(:t) AND attnum > 0 AND NOT attisdropped
          AND attgenerated = ''"""), {"t": p.table}).all())
    planned = dict(p.source)
    for column in sorted(set(now) | set(planned)):
        if column not in planned:
            return f"column {column} was added"
        if column not in now:
            return f"column {column} was dropped"
        if now[column] != planned[column]:
            return f"column {column} is now {now[column]}"
    return None


def blocked(conn: Connection, relations: list[str], lock_timeout: str, what: str) -> str:
    """The one line of a swap that gave up waiting for its locks."""
    table = relations[0]
    holders = conn.execute(text("""
        SELECT a.pid, a.usename, a.application_name, a.state,
               string_agg(DISTINCT l.relation::regclass::text, ', ') AS rel,
               floor(extract(epoch FROM clock_timestamp() - a.xact_start))::bigint AS open_s,
               floor(extract(epoch FROM clock_timestamp() - a.query_start))::bigint AS query_s,
               left(regexp_replace(a.query, '\\s+', ' ', 'g'), 80) AS query
        FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
        WHERE l.relation = ANY(CAST(:r AS regclass[])) AND l.granted
          AND l.pid <> pg_backend_pid()
        GROUP BY a.pid, a.usename, a.application_name, a.state, a.xact_start, a.query_start,
                 a.query
        ORDER BY a.xact_start NULLS LAST LIMIT 3"""), {"r": relations}).mappings().all()
    head = (f"the {what} of {table} waited {lock_timeout} (lock_timeout) for its lock and gave "
            "up; nothing changed")
    if not holders:
        return f"{head}; no session holds it now: it will be tried again"
    sessions = "; ".join(
        f"pid {h['pid']} (on {h['rel']}, user {h['usename']}, "
        f"application {h['application_name'] or '-'}, "
        f"{h['state'] or 'state hidden'}, transaction open {h['open_s']} s, query started "
        f"{h['query_s']} s ago: {h['query']})" for h in holders)
    return (f"{head}. Holding what it locks, oldest transaction first: {sessions}. It is tried again; "
            f"end that transaction (or SELECT pg_terminate_backend({holders[0]['pid']}))")


def _has(conn: Connection, p: Plan, name: str, kind: str) -> bool:
    if kind == "index":
        return bool(conn.execute(text("SELECT to_regclass(:i) IS NOT NULL"),
                                 {"i": f"{quote(p.schema)}.{quote(name)}"}).scalar())
    return bool(conn.execute(text("SELECT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid "
                                  "= to_regclass(:s) AND conname = :n)"),
                             {"s": p.shadow, "n": name}).scalar())


def _indexes(conn: Connection, table: str) -> list[str]:
    return list(conn.execute(text("SELECT ic.relname FROM pg_index i JOIN pg_class ic ON "
                                  "ic.oid = i.indexrelid WHERE i.indrelid = to_regclass(:t) "
                                  "ORDER BY 1"), {"t": table}).scalars())


def _retire_indexes(conn: Connection, s: Swap, table: str) -> None:
    """T's indexes renamed away (index names are unique per schema), recorded."""
    p = s.plan
    record = names.renamed_table(s.work_schema, p.job_id)
    for index in _indexes(conn, table):
        retired = names.retired_name(p.job_id, index)
        run(conn, f"ALTER INDEX {quote(p.schema)}.{quote(index)} RENAME TO {quote(retired)}")
        conn.execute(text(f"INSERT INTO {record} VALUES (:r, :o)"), {"r": retired, "o": index})


def _has_always_identity(conn: Connection, table: str) -> bool:
    return bool(conn.execute(text("SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = "
                                  "to_regclass(:t) AND attidentity = 'a')"), {"t": table}).scalar())


__all__ = ["SwapBlocked", "SwapRefused", "Swap", "one_line", "revert", "swap"]
