"""Live subtask rows, the owner's side: a job step's ranges inserted, read in
one snapshot, failed when exhausted, cancelled when unleased (a worker's
side of one subtask is ``framework.store.subtasks``).

Every write is fenced on the owner term; every read is a probe of an index,
so a tick costs the same for 40 subtasks or 100,000.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from framework.db import Database, SqlConnection, SqlDatabase
from framework.keys import Key, decode, encode
from framework.records import FIXED_SUBTASK_UNITS, STEP_REVERT
from framework.states import SubtaskState
from framework.store.owner_lease import FENCE, OwnerTerm
from framework.store.subtasks import CLAIM_MARK, LEASE_LIVE, NO_MARK, guard_into

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

S = SubtaskState


def insert_ranges(
    db: Database, conn: Connection, term: OwnerTerm, job_id: int, step: int,
    ranges: Sequence[tuple[Key, Key]], *, first_ordinal: int = 0,
    meta: dict[str, Any] | None = None, counted: bool = False,
    metas: list[dict[str, Any]] | None = None,
) -> int:
    """Insert the ranges as pending subtasks, and count them into the job's
    ``subtasks_total`` in the same statement (``reorg status`` reads it)
    unless ``counted`` (a chunk of a step counted when it began; such a
    chunk may carry a meta per range, ``metas``)."""
    assert counted or metas is None, "a meta per range only for a counted chunk"
    rows = """
        SELECT :job_id, :step, :first + r.ordinal - 1, 'pending', r.lo, r.hi, r.lo,
               coalesce(r.meta, CAST(:meta AS jsonb))
        FROM unnest(CAST(:los AS jsonb[]), CAST(:his AS jsonb[]), CAST(:metas AS jsonb[]))
             WITH ORDINALITY AS r(lo, hi, meta, ordinal)"""
    return _insert(db, conn, term, rows, {
        "job_id": job_id, "step": step, "los": [encode(lo) for lo, _ in ranges],
        "his": [encode(hi) for _, hi in ranges], "first": first_ordinal,
        "metas": [json.dumps(m) for m in metas] if metas is not None else [],
        "meta": json.dumps(meta or {})}, count=not counted)


def insert_fixed(
    db: Database, conn: Connection, term: OwnerTerm, job_id: int, step: int,
    metas: list[dict[str, Any]],
) -> int:
    """Insert the subtasks of a fixed step, one per meta dict, each covering
    ``[0, FIXED_SUBTASK_UNITS)``: units of its own progress, not keys. Counted
    into ``subtasks_total`` like ranges."""
    rows = f"""
        SELECT :job_id, :step, f.ordinal - 1, 'pending', to_jsonb(0),
               to_jsonb({FIXED_SUBTASK_UNITS}), to_jsonb(0), f.meta
        FROM unnest(CAST(:metas AS jsonb[])) WITH ORDINALITY AS f(meta, ordinal)"""
    return _insert(db, conn, term, rows, {
        "job_id": job_id, "step": step, "metas": [json.dumps(m) for m in metas]}, count=True)


def _insert(db: Database, conn: Connection, term: OwnerTerm, rows: str,
            params: dict[str, Any], *, count: bool) -> int:
    """Insert the subtasks ``rows`` selects, fenced on the owner term; with
    ``count``, count them into the job's ``subtasks_total`` in the same
    statement. Returns how many were inserted (0: the term was lost)."""
    insert = f"""
        INSERT INTO {{s}}.background_subtask
            (job_id, step, ordinal, state, start_key, end_key, curr_key, meta)
        {rows}
        WHERE {FENCE}"""
    params = {**params, **term.params()}
    if not count:
        return int(conn.execute(db.sql(insert), params).rowcount)
    return int(conn.execute(db.sql(f"""
        WITH inserted AS ({insert}
            RETURNING 1),
        counted AS (
            UPDATE {{s}}.jobs SET subtasks_total = subtasks_total
                                                  + (SELECT count(*) FROM inserted)
            WHERE id = :job_id AND EXISTS (SELECT 1 FROM inserted))
        SELECT count(*) FROM inserted"""), params).scalar_one())


# The job counter a step's subtasks are counted into (``reorg status`` reads
# them): forward steps and the revert step apart (migration 0003).
COUNTERS = {"subtasks_total", "revert_total"}


def begin_split(
    db: Database, conn: Connection, term: OwnerTerm, job_id: int, step: int,
    ranges: Sequence[tuple[Key, Key]], chunk: int, *, meta: dict[str, Any] | None = None,
    metas: list[dict[str, Any]] | None = None, counter: str = "subtasks_total",
) -> int:
    """Insert the first ``chunk`` ranges of a step and keep the rest in
    ``job_split_pending`` for ``insert_split_chunk``; all of them are counted
    into the job's ``counter`` now, so status shows the step's size from its
    start. Every range gets ``meta``, or its own of ``metas``. Returns how
    many were inserted (0 when fenced out)."""
    assert counter in COUNTERS
    first = insert_ranges(db, conn, term, job_id, step, ranges[:chunk], meta=meta, counted=True,
                          metas=metas[:chunk] if metas is not None else None)
    if first != len(ranges[:chunk]):
        return first
    rest = ranges[chunk:]
    conn.execute(
        db.sql(f"""
            WITH kept AS (
                INSERT INTO {{s}}.job_split_pending
                    (job_id, step, los, his, inserted, meta, metas)
                SELECT :job_id, :step, {_elements("los")}, {_elements("his")}, :inserted,
                       CAST(:meta AS jsonb), {_elements("metas")}
                WHERE :keep AND {FENCE})
            UPDATE {{s}}.jobs SET {counter} = {counter} + :total
            WHERE id = :job_id AND {FENCE}"""),
        {"job_id": job_id, "step": step, "inserted": first, "total": len(ranges),
         "keep": bool(rest), "meta": json.dumps(meta or {}),
         "metas": json.dumps(metas) if metas is not None else None,
         # The whole plan, so ordinals and ranges come from one list (DESIGN 5).
         "los": _json_array(encode(lo) for lo, _ in ranges),
         "his": _json_array(encode(hi) for _, hi in ranges), **term.params()},
    )
    return first


def _json_array(texts: Iterable[str]) -> str:
    """One JSON array of jsonb texts: a 100,000-range plan goes as one
    parameter PostgreSQL parses in one go (0.16 s), where a list of 200,000
    strings took psycopg and the server 0.4-0.65 s, most of the start tick
    of a 100,000-subtask job (``bench.framework_scale``)."""
    return "[" + ",".join(texts) + "]"


def _elements(param: str) -> str:
    """SQL: the JSON array bound to ``param`` as a jsonb[] in its order (NULL
    stays NULL: no rows to aggregate)."""
    return (f"(SELECT array_agg(e ORDER BY i) FROM jsonb_array_elements(CAST(:{param} AS jsonb)) "
            f"WITH ORDINALITY AS a(e, i))")


def insert_split_chunk(
    db: Database, conn: Connection, term: OwnerTerm, job_id: int, chunk: int,
) -> int | None:
    """Insert the next ``chunk`` ranges of the job's pending split, and move
    its cursor (or drop the row, once all are in) in the same statement.
    Returns how many ranges are still to insert, or None when the job has no
    pending split. The row is locked: two owners never insert one chunk twice
    (and a deposed one's insert is fenced anyway). The slices are taken in
    SQL and go straight into the live table: a chunk reads its part of the
    plan, and its keys never pass through Python (decoded and encoded again,
    they were most of a chunk's time in an owner sharing its process with
    busy slots)."""
    row = conn.execute(
        db.sql(f"""
            WITH plan AS (
                SELECT job_id, step, inserted, cardinality(los) AS total, meta,
                       los[inserted + 1 : inserted + :chunk] AS los,
                       his[inserted + 1 : inserted + :chunk] AS his,
                       metas[inserted + 1 : inserted + :chunk] AS metas
                FROM {{s}}.job_split_pending WHERE job_id = :job_id FOR UPDATE),
            fenced AS (SELECT * FROM plan WHERE {FENCE}),
            added AS (
                INSERT INTO {{s}}.background_subtask
                    (job_id, step, ordinal, state, start_key, end_key, curr_key, meta)
                SELECT f.job_id, f.step, f.inserted + r.ordinal - 1, 'pending', r.lo, r.hi,
                       r.lo, coalesce(r.meta, f.meta)
                -- metas is NULL where every range has the plan's meta: then
                -- unnest pads it with NULLs.
                FROM fenced f, unnest(f.los, f.his, f.metas)
                     WITH ORDINALITY AS r(lo, hi, meta, ordinal)
                RETURNING 1),
            counted AS (SELECT count(*) AS n FROM added),
            advanced AS (
                UPDATE {{s}}.job_split_pending p SET inserted = f.inserted + counted.n
                FROM fenced f, counted
                WHERE p.job_id = f.job_id AND f.inserted + counted.n < f.total),
            finished AS (
                DELETE FROM {{s}}.job_split_pending p USING fenced f, counted
                WHERE p.job_id = f.job_id AND f.inserted + counted.n >= f.total)
            SELECT plan.total - plan.inserted AS left_before, counted.n AS added,
                   EXISTS (SELECT 1 FROM fenced) AS held
            FROM plan, counted"""),
        {"job_id": job_id, "chunk": chunk, **term.params()},
    ).mappings().one_or_none()
    if row is None:
        return None
    if not row["held"]:
        return int(row["left_before"])  # fenced out: the caller's term check says why
    return int(row["left_before"]) - int(row["added"])


def split_pending(db: Database, conn: Connection, job_id: int) -> bool:
    """Whether ranges of the job's split still wait to be inserted: then the
    job must not succeed, whatever its inserted subtasks say (DESIGN 7)."""
    return conn.execute(
        db.sql("SELECT EXISTS (SELECT 1 FROM {s}.job_split_pending WHERE job_id = :job_id)"),
        {"job_id": job_id},
    ).scalar() is True


def drop_pending_split(db: Database, conn: Connection, term: OwnerTerm, job_id: int) -> None:
    """A job winding down inserts no more ranges: the ones never inserted had
    no work done on them, so its revert has nothing of theirs to restore."""
    conn.execute(
        db.sql(f"DELETE FROM {{s}}.job_split_pending WHERE job_id = :job_id AND {FENCE}"),
        {"job_id": job_id, **term.params()},
    )


def progressed_ranges(db: Database, conn: Connection, job_id: int,
                      from_steps: list[int]) -> list[Progressed]:
    """Every range of the forward steps ``from_steps`` that made progress
    (succeeded, or ``curr_key`` past ``start_key``), live or moved to
    history, in step and key order: ``[start_key, curr_key)`` holds exactly
    the keys the forward steps may have written, what the revert step
    restores (DESIGN 13). Ranges never touched need no work.

    Read once the forward steps are quiet (no live lease: DESIGN 2 keeps a
    zombie from checkpointing a cancelled subtask), so ``curr_key`` is final."""
    if not from_steps:
        return []
    rows = conn.execute(
        db.sql("""
            SELECT step, start_key::text, curr_key::text, end_key::text, row_count,
                   start_key AS lo
            FROM {s}.background_subtask
            WHERE job_id = :job_id AND step = ANY(:from_steps) AND curr_key > start_key
            UNION ALL
            SELECT step, start_key::text, curr_key::text, end_key::text, row_count, start_key
            FROM {s}.background_subtask_history
            WHERE job_id = :job_id AND step = ANY(:from_steps) AND curr_key > start_key
            ORDER BY step, lo"""),
        {"job_id": job_id, "from_steps": from_steps},
    ).all()
    return [Progressed(int(step), decode(lo), decode(curr), decode(end), int(n))
            for step, lo, curr, end, n, _ in rows]


@dataclass(frozen=True)
class Progressed:
    """A forward range that made progress: it wrote ``[lo, curr)`` of ``[lo, end)``."""

    step: int
    lo: Key
    curr: Key
    end: Key
    rows: int


def revert_ranges(progressed: Sequence[Progressed],
                  rows_per_range: int) -> list[tuple[int, Key, Key]]:
    """The revert step's ranges, ``(forward step, lo, hi)``: the progressed
    ranges of a step that touch (one done to its end, the next starting
    there) are restored as one range, up to about ``rows_per_range`` rows
    each, so a job cancelled after 100,000 quick subtasks restores in a few
    hundred subtasks, not 100,000. They cover exactly the keys the forward
    ranges wrote: never a key of a range's untouched tail."""
    merged: list[tuple[int, Key, Key]] = []
    rows = 0
    for i, r in enumerate(progressed):
        before = progressed[i - 1] if i else None
        if (before is not None and before.step == r.step and before.curr == before.end
                and before.end == r.lo and rows + r.rows <= rows_per_range):
            merged[-1] = (r.step, merged[-1][1], r.curr)
            rows += r.rows
        else:
            merged.append((r.step, r.lo, r.curr))
            rows = r.rows
    return merged


def revert_error(db: Database, conn: Connection, job_id: int) -> str | None:
    """The error of a revert subtask that is being retried, if any. Only rows
    claimed at least once are read (the ``subtask_exhausted`` index from
    attempts > 0): the running ones and those waiting to retry."""
    return conn.execute(
        db.sql(f"""
            SELECT 'revert subtask ' || ordinal || ' [' || start_key::text || ', '
                   || end_key::text || '): ' || error
            FROM {{s}}.background_subtask
            WHERE job_id = :job_id AND attempts > 0 AND state IN ('pending', 'running')
              AND step = {STEP_REVERT} AND error IS NOT NULL
            ORDER BY attempts DESC LIMIT 1"""),
        {"job_id": job_id},
    ).scalar()


def retry_exhausted_reverts(
    db: Database, conn: Connection, term: OwnerTerm, job_id: int, max_attempts: int,
    backoff_seconds: float,
) -> int:
    """Give revert subtasks that used their last attempt a new round after
    ``backoff_seconds`` instead of failing them: a revert never gives up with
    the table half restored (its error stays on the subtask, shown by status).
    Like ``fail_exhausted`` it leaves subtasks a worker holds alone."""
    return conn.execute(
        db.sql(f"""
            UPDATE {{s}}.background_subtask SET
                state = 'pending', exec_id = NULL, exec_expired = NULL, attempts = 0,
                not_before = clock_timestamp() + make_interval(secs => :backoff),
                error = coalesce(error, CASE WHEN state = 'running' THEN 'lease expired'
                                             ELSE 'holder restarted' END),
                updated_at = clock_timestamp()
            WHERE job_id = :job_id AND attempts >= :max_attempts
              -- subtask_exhausted's predicate (max_attempts is at least 1)
              AND state IN ('pending', 'running') AND attempts > 0
              AND step = {STEP_REVERT}
              -- A pending one stays pending (only its attempts reset); a running
              -- one whose lease expired moves back to pending.
              AND (state = 'pending'
                   OR {guard_into(S.PENDING)} AND exec_expired <= clock_timestamp())
              AND {FENCE}"""),
        {"job_id": job_id, "max_attempts": max_attempts, "backoff": backoff_seconds,
         **term.params()},
    ).rowcount


@dataclass(frozen=True)
class LastRange:
    """The highest range of a job step: where its coverage ends."""

    ordinal: int
    end_key: Key
    catch_up_round: int  # 0 for the split's own ranges


def last_range(db: Database, conn: Connection, job_id: int, step: int) -> LastRange | None:
    """One probe of the (job_id, step, ordinal) index, live and history rows
    alike (ordinals grow with keys, so the last ordinal ends the coverage)."""
    row = conn.execute(
        db.sql("""
            SELECT ordinal, end_key::text AS end_key,
                   coalesce((meta->>'catch_up')::int, 0) AS catch_up_round
            FROM (
                (SELECT ordinal, end_key, meta FROM {s}.background_subtask
                 WHERE job_id = :job_id AND step = :step ORDER BY ordinal DESC LIMIT 1)
                UNION ALL
                (SELECT ordinal, end_key, meta FROM {s}.background_subtask_history
                 WHERE job_id = :job_id AND step = :step ORDER BY ordinal DESC LIMIT 1)
            ) last ORDER BY ordinal DESC LIMIT 1"""),
        {"job_id": job_id, "step": step},
    ).mappings().first()
    return LastRange(**{**row, "end_key": decode(row["end_key"])}) if row else None


def first_error(db: Database, conn: Connection, job_id: int) -> str:
    """The error to show for a failed job: its first failed subtask's."""
    return conn.execute(
        db.sql("""
            SELECT 'subtask ' || ordinal || ': ' || coalesce(error, state)
            FROM {s}.background_subtask
            WHERE job_id = :id AND state IN ('failed', 'cancelled')
            ORDER BY (state = 'failed') DESC, ordinal LIMIT 1"""),
        {"id": job_id},
    ).scalar() or "a subtask failed"


@dataclass(frozen=True)
class StepSnapshot:
    """Which states one job step's subtasks are in, read in one statement (one
    snapshot). Each field is one probe of an index, not a count, so the owner's
    tick costs the same for 40 subtasks or 100,000."""

    pending: bool = False
    running: bool = False
    live_leases: bool = False
    succeeded: bool = False
    failed: bool = False
    cancelled: bool = False

    @property
    def unfinished(self) -> bool:
        return self.pending or self.running

    @property
    def all_succeeded(self) -> bool:
        """Every subtask succeeded, or there are none (an empty table)."""
        return not (self.unfinished or self.failed or self.cancelled)


def step_snapshot(db: Database, conn: Connection, job_id: int, step: int, *,
                  from_mark: bool = False) -> StepSnapshot:
    """``from_mark``: the pending and running probes start at the owner's
    claim mark (``mark_claim_from``), past the dead index entries every
    finished subtask leaves until vacuum (tens of thousands, walked on every
    tick of a churning job). Only for a quick look: a decision to advance
    re-reads without it (DESIGN 7), so a wrong mark could only delay one."""

    def probe(cond: str, in_order: bool = False) -> str:
        # Pending rows can be nearly all of a job's: in ordinal order the probe
        # takes the claimable index to its first one, where the planner would
        # otherwise bet on a sequential scan finding one early.
        # (A scalar subquery: EXISTS would drop the ORDER BY.)
        order = " ORDER BY ordinal" if in_order else ""
        return (f"(SELECT ordinal FROM {{s}}.background_subtask WHERE job_id = :job_id "
                f"AND step = :step AND {cond}{order} LIMIT 1) IS NOT NULL")

    start = f"ordinal >= {CLAIM_MARK} AND " if from_mark else ""
    row = conn.execute(
        db.sql(f"""
            SELECT {probe(start + "state = 'pending'", in_order=True)} AS pending,
                   {probe(start + "state = 'running'", in_order=True)} AS running,
                   {probe(f"state = 'running' AND {LEASE_LIVE}")} AS live_leases,
                   {probe("state = 'succeeded'")} AS succeeded,
                   {probe("state = 'failed'")} AS failed,
                   {probe("state = 'cancelled'")} AS cancelled"""),
        {"job_id": job_id, "step": step},
    ).mappings().one()
    return StepSnapshot(**row)


def mark_claim_from(db: Database, conn: Connection, term: OwnerTerm, job_id: int,
                    step: int, *, from_mark: bool = False) -> None:
    """Mark where the step's claimable subtasks begin: claims scan the
    claimable index from there, past the dead entries finished subtasks leave
    in it until vacuum (migration ``0015_throughput``). One index probe from
    the step's start, once a tick, instead of one per claim.

    Nothing claimable is ever below the mark: subtasks only leave the
    claimable set (running ones handed back keep their ordinal), ranges added
    later get higher ordinals, and ``requeue_failed`` clears the mark. With
    nothing claimable left, a mark of the same step stays where it was.

    ``from_mark``: the probe starts at the current mark, not at the step's
    first ordinal (every subtask finished since the last vacuum leaves dead
    entries between, walked on each tick). Without it, a wrong mark would be
    put right: the owner probes from the start every few seconds."""
    conn.execute(
        db.sql(f"""
            UPDATE {{s}}.jobs j SET claim_from_step = :step,
                claim_from = coalesce(first.ordinal, CASE WHEN j.claim_from_step = :step
                                                         THEN j.claim_from END)
            FROM (SELECT (SELECT ordinal FROM {{s}}.background_subtask
                          WHERE job_id = :job_id AND step = :step
                            AND ordinal >= {CLAIM_MARK if from_mark else NO_MARK}
                            AND state IN ('pending', 'running')  -- subtask_claimable's
                          ORDER BY ordinal LIMIT 1) AS ordinal) first
            WHERE j.id = :job_id AND {FENCE}
              -- Rechecked on the row a concurrent `reorg retry` (of a paused
              -- job) wrote: its cleared mark must not be overwritten.
              AND j.state IN ('running', 'reverting')
              -- the jobs row is written only when the mark moves
              AND (j.claim_from_step IS DISTINCT FROM :step
                   OR first.ordinal IS NOT NULL
                      AND j.claim_from IS DISTINCT FROM first.ordinal)"""),
        {"job_id": job_id, "step": step, **term.params()},
    )


def succeeded_beyond(db: Database, conn: Connection, job_id: int, kept: int) -> bool:
    """More than ``kept`` succeeded subtasks of the job in the live table (an
    index walk of at most ``kept`` entries, not a count of them all)."""
    return conn.execute(
        db.sql("""
            SELECT (SELECT 1 FROM {s}.background_subtask
                    WHERE job_id = :job_id AND state = 'succeeded'
                    OFFSET :kept LIMIT 1) IS NOT NULL"""),
        {"job_id": job_id, "kept": kept},
    ).scalar() is True


def count_in_step(db: Database, conn: Connection, job_id: int, step: int) -> int:
    """How many subtasks a step has (live and moved): for the job's final event."""
    return int(conn.execute(
        db.sql("""
            SELECT (SELECT count(*) FROM {s}.background_subtask
                    WHERE job_id = :job_id AND step = :step)
                 + (SELECT count(*) FROM {s}.background_subtask_history
                    WHERE job_id = :job_id AND step = :step)"""),
        {"job_id": job_id, "step": step},
    ).scalar_one())


def fail_exhausted(
    db: Database, conn: Connection, term: OwnerTerm, job_id: int, max_attempts: int
) -> int:
    """Fail subtasks that used their last allowed attempt and are not being
    worked on: a running one whose lease expired, or a pending one (handed back
    after its holder crashed; claims skip it, so nothing else would end it)."""
    return conn.execute(
        db.sql(f"""
            UPDATE {{s}}.background_subtask SET
                state = 'failed', finished_at = clock_timestamp(), updated_at = clock_timestamp(),
                error = coalesce(error || '; ', '')
                        || CASE WHEN state = 'running' THEN 'lease expired'
                                ELSE 'holder restarted' END
                        || ' on attempt ' || attempts || ' of ' || :max_attempts
            WHERE job_id = :job_id AND attempts >= :max_attempts
              -- subtask_exhausted's predicate (max_attempts is at least 1)
              AND state IN ('pending', 'running') AND attempts > 0
              AND {guard_into(S.FAILED)}
              AND (state = 'pending' OR exec_expired <= clock_timestamp())
              AND {FENCE}"""),
        {"job_id": job_id, "max_attempts": max_attempts, **term.params()},
    ).rowcount


def cancel_unleased(db: Database, conn: Connection, term: OwnerTerm, job_id: int) -> int:
    """Cancel every unfinished subtask no worker holds a live lease on."""
    return conn.execute(
        db.sql(f"""
            UPDATE {{s}}.background_subtask SET
                state = 'cancelled', finished_at = clock_timestamp(),
                updated_at = clock_timestamp()
            WHERE job_id = :job_id AND {guard_into(S.CANCELLED)}
              AND (state = 'pending' OR exec_expired IS NULL
                   OR exec_expired <= clock_timestamp())
              AND {FENCE}"""),
        {"job_id": job_id, **term.params()},
    ).rowcount


def has_failed(db: SqlDatabase, conn: SqlConnection, job_id: int) -> bool:
    """Whether the job has a failed subtask in the live table (one index probe)."""
    return conn.execute(
        db.sql("""SELECT (SELECT 1 FROM {s}.background_subtask
                          WHERE job_id = :job_id AND state = 'failed' LIMIT 1) IS NOT NULL"""),
        {"job_id": job_id},
    ).scalar() is True


def requeue_failed(db: SqlDatabase, conn: SqlConnection, job_id: int) -> int:
    """``reorg retry``: the job's failed subtasks back to pending with their
    attempts reset; each resumes from its ``curr_key`` (its committed batches
    stay). The failed -> pending edge is a user's (``SUBTASK_USER_EDGES``).
    They may lie below the claim mark (``mark_claim_from``): it is cleared."""
    conn.execute(db.sql("UPDATE {s}.jobs SET claim_from_step = NULL WHERE id = :job_id"),
                 {"job_id": job_id})
    return conn.execute(
        db.sql(f"""
            UPDATE {{s}}.background_subtask SET
                state = 'pending', attempts = 0, error = NULL, exec_id = NULL,
                exec_expired = NULL, not_before = NULL, finished_at = NULL,
                updated_at = clock_timestamp()
            WHERE job_id = :job_id AND {guard_into(S.PENDING, user=True)}"""),
        {"job_id": job_id},
    ).rowcount
