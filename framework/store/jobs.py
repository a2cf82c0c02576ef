"""Job rows: submit, one compare-and-set per transition, reads.

A transition and its audit event are one statement, so the job events table
never disagrees with the jobs table. User transitions (cancel, pause, resume)
are plain compare-and-set; owner transitions are also fenced on the owner term.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from framework.db import Database, SqlConnection, SqlDatabase
from framework.keys import KeySpec
from framework.records import DEFAULT_BATCH_ROWS, STEP_REVERT, Job
from framework.states import (
    JOB_TERMINAL,
    JOB_TRANSITIONS,
    JobState,
    check_job_transition,
)
from framework.store.owner_lease import FENCE, OwnerTerm
from framework.store.progress import ROWS_OF_STEP_NOW

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

JOB_COLUMNS = (
    "id, type, state, step, params, target_table, key_column, batch_rows, "
    "max_rows_per_sec, row_estimate, concurrency, max_replica_lag, max_active_sessions, "
    "on_failure, key_columns, key_types"
)
_TERMINAL_SQL = ", ".join(f"'{s}'" for s in sorted(JOB_TERMINAL))
J = JobState


class ActiveJobExists(RuntimeError):
    def __init__(self, table: str, job_id: int) -> None:
        readable = table.replace('"', "")
        super().__init__(
            f"table {readable} already has active job {job_id}; wait for it, "
            f"or cancel it with `reorg cancel {job_id}`"
        )
        self.job_id = job_id


def insert(
    db: Database,
    conn: Connection,
    *,
    type: str,
    params: dict[str, Any],
    target_table: str,
    key_column: str,
    job_key: str | None,
    priority: int,
    concurrency: int,
    batch_rows: int,
    max_rows_per_sec: int | None,
    actor: str,
    max_replica_lag: float | None = None,
    max_active_sessions: int | None = None,
    on_failure: str = "rollback",
    key: KeySpec | None = None,
) -> tuple[int, bool]:
    """Insert a queued job; returns (job id, created). A repeated ``job_key``
    returns the job it already named instead of creating another."""
    existing = _named_by(db, conn, job_key)
    if existing is not None:
        return existing, False
    active = active_on_table(db, conn, target_table)
    if active is not None:
        raise ActiveJobExists(target_table, active)
    from sqlalchemy.exc import IntegrityError

    try:
        with conn.begin_nested():
            job_id = conn.execute(
                db.sql("""
                    WITH job AS (
                        INSERT INTO {s}.jobs (job_key, type, params, target_table, key_column,
                                              priority, concurrency, batch_rows, max_rows_per_sec,
                                              max_replica_lag, max_active_sessions, on_failure,
                                              key_columns, key_types)
                        VALUES (:job_key, :type, CAST(:params AS jsonb), :target_table,
                                :key_column, :priority, :concurrency, :batch_rows, :max_rps,
                                :max_lag, :max_sessions, :on_failure,
                                CAST(:key_columns AS text[]), CAST(:key_types AS text[]))
                        RETURNING id),
                    event AS (
                        INSERT INTO {s}.job_events (job_id, actor, from_state, to_state, detail)
                        SELECT id, :actor, NULL, 'queued', 'submitted' FROM job)
                    SELECT id FROM job"""),
                {
                    "job_key": job_key, "type": type, "params": json.dumps(params),
                    "target_table": target_table, "key_column": key_column,
                    "priority": priority, "concurrency": concurrency,
                    "batch_rows": batch_rows, "max_rps": max_rows_per_sec, "actor": actor,
                    "max_lag": max_replica_lag, "max_sessions": max_active_sessions,
                    "on_failure": on_failure,
                    "key_columns": list(key.columns) if key else None,
                    "key_types": list(key.types) if key else None,
                },
            ).scalar_one()
    except IntegrityError:
        # Lost a race with another submit: report whichever job won.
        won = _named_by(db, conn, job_key)
        if won is not None:
            return won, False
        active = active_on_table(db, conn, target_table)
        raise ActiveJobExists(target_table, active or 0) from None
    notify(db, conn)
    return job_id, True


def _named_by(db: Database, conn: Connection, job_key: str | None) -> int | None:
    """The job a ``job_key`` already names, if any (none without a key)."""
    if job_key is None:
        return None
    found = conn.execute(
        db.sql("SELECT id FROM {s}.jobs WHERE job_key = :k"), {"k": job_key}).scalar()
    return None if found is None else int(found)


def active_on_table(db: Database, conn: Connection, table: str) -> int | None:
    return conn.execute(
        db.sql(f"""SELECT id FROM {{s}}.jobs
                   WHERE target_table = :t AND state NOT IN ({_TERMINAL_SQL})"""),
        {"t": table},
    ).scalar()


def _move(
    db: SqlDatabase, conn: SqlConnection, job_id: int, sources: Iterable[JobState], dst: JobState,
    *, actor: str, term: OwnerTerm | None, detail: str | None = None,
    sets: str = "", at_step: int | None = None, event: tuple[str, str] | None = None,
    **params: object,
) -> JobState | None:
    """The one compare-and-set every named transition below goes through:
    move the job from one of ``sources`` to ``dst`` (each edge checked against
    ``JOB_TRANSITIONS``), apply ``sets`` (extra ``col = expr`` assignments,
    ``old.state`` names the state left), and write the audit event, all in one
    statement. ``at_step``: only a job at that step moves. ``event``: what
    the event names as from and to instead of the states, for a move of the
    step in which the state stays (``dst`` is the one source). Returns the
    state it left, or None when the job was in none of ``sources`` (or, for
    an owner, the term is over)."""
    sources = frozenset(sources)
    if event is not None:
        assert sources == {dst}, "a move of the step alone keeps the state"
    else:
        for src in sources:
            check_job_transition(src, dst)
    fence = FENCE if term is not None else "TRUE"
    finished = ", finished_at = clock_timestamp()" if dst in JOB_TERMINAL else ""
    left = conn.execute(
        db.sql(f"""
            WITH old AS (
                SELECT id, state FROM {{s}}.jobs
                WHERE id = :job_id AND state = ANY(:sources)
                  {"AND step = :at_step" if at_step is not None else ""} FOR UPDATE),
            moved AS (
                UPDATE {{s}}.jobs j SET state = :dst, updated_at = clock_timestamp()
                    {finished} {", " + sets if sets else ""}
                FROM old WHERE j.id = old.id AND {fence}
                RETURNING j.id, old.state AS from_state),
            event AS (
                INSERT INTO {{s}}.job_events (job_id, actor, from_state, to_state, detail)
                SELECT id, :actor, coalesce(:from_event, from_state), coalesce(:to_event, :dst),
                       :detail FROM moved)
            SELECT from_state FROM moved"""),
        {"job_id": job_id, "sources": sorted(str(s) for s in sources), "dst": str(dst),
         "actor": actor, "detail": detail, "at_step": at_step,
         "from_event": event[0] if event else None, "to_event": event[1] if event else None,
         **params, **(term.params() if term else {})},
    ).scalar()
    if left is None:
        return None
    notify(db, conn)
    return JobState(left)


def _into(dst: JobState) -> frozenset[JobState]:
    """Every state the transition map lets reach ``dst``: the guard of a
    transition that is allowed from all of them."""
    return frozenset(s for s, nxt in JOB_TRANSITIONS.items() if dst in nxt)


# --- owner transitions (fenced on the term) ------------------------------------

# Leaving a step (to a fixed step, or once the job ends): its rows stay the
# job's rows (store.progress). A range step left complete knows its rows
# exactly, so they become its estimate too; a fixed step keeps what it had.
_KEEP_STEP_ROWS = (f"step_moved_rows = {ROWS_OF_STEP_NOW}, row_estimate = CASE "
                   f"WHEN j.step_ranges THEN {ROWS_OF_STEP_NOW} ELSE j.row_estimate END")

def start(
    db: Database, conn: Connection, term: OwnerTerm, job_id: int, *, actor: str, step: int,
    row_estimate: int, run_on_node: str | None, detail: str,
    step_names: list[str] | None = None, step_ranges: bool = True, step_subtasks: int = 0,
    schema_state: str | None = None,
) -> JobState | None:
    """queued -> running, once prepared and split; ``run_on_node`` binds a small
    job to the owner's node. ``step_names`` (the type's declared steps) and the
    first step's figures are kept for ``reorg status``."""
    return _move(db, conn, job_id, {J.QUEUED}, J.RUNNING, actor=actor, term=term, detail=detail,
                 sets="step = :step, row_estimate = :row_estimate, run_on_node = :node, "
                      "started_at = coalesce(j.started_at, clock_timestamp()), error = NULL, "
                      "step_names = CAST(:step_names AS text[]), step_ranges = :step_ranges, "
                      "step_subtasks_total = :step_subtasks, step_moved_succeeded = 0, "
                      "step_moved_rows = 0, schema_state = :schema_state",
                 step=step, row_estimate=row_estimate, node=run_on_node,
                 step_names=step_names, step_ranges=step_ranges, step_subtasks=step_subtasks,
                 schema_state=schema_state)


def advance_step(
    db: Database, conn: Connection, term: OwnerTerm, job_id: int, *, from_step: int,
    to_step: int, step_ranges: bool, step_subtasks: int, row_estimate: int | None,
    schema_state: str | None, actor: str, detail: str, step_names: tuple[str, str],
) -> bool:
    """A running job moves from forward step ``from_step`` to ``to_step`` once
    every subtask of ``from_step`` succeeded and the next step's subtasks are
    inserted (in the same transaction, DESIGN 7). The state stays ``running``:
    a compare-and-set of the step, its audit event in the same statement,
    from and to the steps' names (``step_names``), which is what changed. The
    step's progress counters start again; ``row_estimate`` is the new step's
    split; entering a fixed step, the job's rows stay those of the step it
    left (``_KEEP_STEP_ROWS``)."""
    rows = ("step_moved_rows = 0, row_estimate = CAST(:row_estimate AS bigint)"
            if step_ranges else _KEEP_STEP_ROWS)
    # Idle workers claim the new step's subtasks at once (the move's NOTIFY).
    return _move(db, conn, job_id, {J.RUNNING}, J.RUNNING, actor=actor, term=term,
                 detail=detail, at_step=from_step,
                 event=(step_event(step_names[0]), step_event(step_names[1])),
                 sets=f"step = :to_step, step_ranges = :step_ranges, "
                      f"step_subtasks_total = :step_subtasks, step_moved_succeeded = 0, "
                      f"{rows}, schema_state = :schema_state",
                 to_step=to_step, step_ranges=step_ranges, step_subtasks=step_subtasks,
                 row_estimate=row_estimate, schema_state=schema_state) is not None


# A step change keeps the job's state; its event names the steps instead,
# e.g. "step fill" -> "step verify", "step run" -> "step revert".
REVERT_STEP_NAME = "revert"


def step_event(name: str) -> str:
    """How a job event's from / to names a step (a job state never starts so)."""
    return f"step {name}"


def fail(
    db: Database, conn: Connection, term: OwnerTerm, job_id: int, *, actor: str, error: str,
    detail: str,
) -> JobState | None:
    """queued (prepare failed) or running (a subtask failed for good) -> failed."""
    return _move(db, conn, job_id, _into(J.FAILED), J.FAILED, actor=actor, term=term,
                 detail=detail, sets="error = :error", error=error)


# The owner's verdict on a job's input (``JobType.analyse``), kept in its params:
# absent while it waits for one, "accepted" (also when ``reorg submit`` checked
# it itself), or "rejected" (the job failed before anything was done).
VERDICT = "verdict"
ACCEPTED, REJECTED = "accepted", "rejected"


def accept(
    db: Database, conn: Connection, term: OwnerTerm, job_id: int, params: dict[str, Any],
) -> bool:
    """Record a queued job's accepted input: its params, as the analysis
    completed them, with the verdict. Not a transition: the job stays queued
    until prepared and split."""
    accepted = conn.execute(
        db.sql(f"""UPDATE {{s}}.jobs SET params = CAST(:params AS jsonb),
                       updated_at = clock_timestamp()
                   WHERE id = :job_id AND state = 'queued' AND {FENCE}"""),
        {"job_id": job_id, "params": json.dumps({**params, VERDICT: ACCEPTED}),
         **term.params()},
    ).rowcount == 1
    if accepted:
        notify_verdict(db, conn, job_id)
    return accepted


def reject(
    db: Database, conn: Connection, term: OwnerTerm, job_id: int, *, actor: str, error: str,
) -> JobState | None:
    """queued -> failed: the analysis rejected the job's input, before
    anything was done to any table. Its submit, if still waiting, reports
    ``error`` and discards the job (``discard_rejected``)."""
    left = _move(db, conn, job_id, {J.QUEUED}, J.FAILED, actor=actor, term=term,
                 detail="input rejected",
                 sets="error = :error, params = j.params || CAST(:verdict AS jsonb)",
                 error=error, verdict=json.dumps({VERDICT: REJECTED}))
    if left is not None:
        notify_verdict(db, conn, job_id)
    return left


def verdict(db: Database, conn: Connection, job_id: int) -> tuple[JobState, str | None,
                                                                    str | None] | None:
    """(state, verdict, error) of a job; None when there is no such job."""
    row = conn.execute(
        db.sql("SELECT state, params ->> :key AS verdict, error FROM {s}.jobs WHERE id = :id"),
        {"id": job_id, "key": VERDICT},
    ).first()
    return (JobState(row.state), row.verdict, row.error) if row else None


def discard_rejected(db: Database, conn: Connection, job_id: int) -> bool:
    """Delete a job whose input was rejected, with its events: its submit
    failed, so it leaves no trace (DESIGN 11). Only such a job (never
    prepared: step 0, no subtasks); the owner may be reverting it meanwhile,
    which then finds it gone.

    The job's row is locked first, in a statement of its own: an event the
    owner adds (its move to reverting) commits before the lock is granted,
    so the delete's own snapshot, taken after, sees it and deletes it too;
    one added later waits for the lock (its key check), then finds the job
    gone. In one statement, the events taken were those of its snapshot,
    and an event committed meanwhile failed the job's delete on the foreign
    key (the submit's "database error", once in a CI rehearsal)."""
    conn.execute(db.sql("SELECT 1 FROM {s}.jobs WHERE id = :id FOR UPDATE"), {"id": job_id})
    return conn.execute(
        db.sql("""
            WITH gone AS (
                DELETE FROM {s}.jobs
                WHERE id = :id AND step = 0 AND params ->> :key = :rejected
                  AND state IN ('failed', 'reverting', 'reverted')
                RETURNING id),
            events AS (DELETE FROM {s}.job_events WHERE job_id IN (SELECT id FROM gone))
            SELECT count(*) FROM gone"""),
        {"id": job_id, "key": VERDICT, "rejected": REJECTED},
    ).scalar_one() == 1


def succeed(
    db: Database, conn: Connection, term: OwnerTerm, job_id: int, *, actor: str, step: int,
    detail: str, schema_state: str | None = None,
) -> JobState | None:
    """running -> succeeded at ``step`` (the type's done step); a type that
    reports schema states names the final one (e.g. "public"). The job's
    rows stay those of its last step (``_KEEP_STEP_ROWS``)."""
    return _move(db, conn, job_id, _into(J.SUCCEEDED), J.SUCCEEDED, actor=actor, term=term,
                 detail=detail, step=step, schema_state=schema_state, sep=NOW_SEP,
                 # A note of why the cut-over was retried (``note_error``) goes.
                 sets=f"step = :step, schema_state = :schema_state, error = {_WITHOUT_NOTE}, "
                      f"{_KEEP_STEP_ROWS}")


def pause_on_failure(
    db: Database, conn: Connection, term: OwnerTerm, job_id: int, *, actor: str, error: str,
    detail: str,
) -> JobState | None:
    """running -> pausing for a job submitted with ``--on-failure pause``: a
    subtask failed for good; finished ranges stay, the error shows until
    ``reorg retry``."""
    return _move(db, conn, job_id, {J.RUNNING}, J.PAUSING, actor=actor, term=term,
                 detail=detail, sets="error = :error", error=error)


def begin_revert(
    db: Database, conn: Connection, term: OwnerTerm, job_id: int, *, actor: str,
) -> JobState | None:
    """cancelling or failed -> reverting; the state left says where the revert
    ends (cancelled after a cancel, reverted after a failure)."""
    return _move(db, conn, job_id, _into(J.REVERTING), J.REVERTING, actor=actor, term=term,
                 sets="revert_target = CASE old.state WHEN 'cancelling' THEN 'cancelled' "
                      "ELSE 'reverted' END")


def finish_revert(
    db: Database, conn: Connection, term: OwnerTerm, job_id: int, target: JobState, *,
    actor: str, detail: str,
) -> JobState | None:
    """reverting -> cancelled | reverted (the job's ``revert_target``). A note
    of why the revert was being retried (``note_error``) goes: it is over. The
    job's own error (why it failed) stays."""
    return _move(db, conn, job_id, {J.REVERTING}, target, actor=actor, term=term,
                 detail=detail, sep=NOW_SEP,
                 # Nothing of a schema change stays after its rollback.
                 sets=f"error = {_WITHOUT_NOTE}, schema_state = NULL")


def start_revert_step(
    db: Database, conn: Connection, term: OwnerTerm, job_id: int, *, from_step: int,
    from_name: str, actor: str, detail: str,
) -> bool:
    """A reverting job at forward step ``from_step`` (named ``from_name``)
    moves to STEP_REVERT once its revert subtasks are inserted (workers claim
    them from then on). The state stays ``reverting``, so this is a
    compare-and-set of the step, not a transition; its audit event, from that
    step to the revert step, is written in the same statement. The job's rows
    stay as they were when it stopped, against the step's estimate."""
    # Idle workers claim the revert subtasks at once (the move's NOTIFY).
    return _move(db, conn, job_id, {J.REVERTING}, J.REVERTING, actor=actor, term=term,
                 detail=detail, at_step=from_step,
                 event=(step_event(from_name), step_event(REVERT_STEP_NAME)),
                 sets=f"step = {STEP_REVERT}, step_moved_rows = {ROWS_OF_STEP_NOW}") is not None


def paused(db: Database, conn: Connection, term: OwnerTerm, job_id: int, *,
           actor: str) -> JobState | None:
    """pausing -> paused, once no worker holds a live lease on the job."""
    return _move(db, conn, job_id, {J.PAUSING}, J.PAUSED, actor=actor, term=term)


def resumed(db: Database, conn: Connection, term: OwnerTerm, job_id: int, *, actor: str,
            owner_node: str) -> JobState | None:
    """resuming -> running; a small job bound to a node follows the owner."""
    return _move(db, conn, job_id, {J.RESUMING}, J.RUNNING, actor=actor, term=term,
                 sets="run_on_node = CASE WHEN j.run_on_node IS NULL THEN NULL "
                      "ELSE :owner_node END", owner_node=owner_node)


# --- user transitions (plain compare-and-set) -----------------------------------

def request_cancel(db: SqlDatabase, conn: SqlConnection, job_id: int, *, actor: str) -> JobState | None:
    return _move(db, conn, job_id, _into(J.CANCELLING), J.CANCELLING, actor=actor, term=None,
                 detail="cancel requested")


def request_pause(db: SqlDatabase, conn: SqlConnection, job_id: int, *, actor: str) -> JobState | None:
    return _move(db, conn, job_id, _into(J.PAUSING), J.PAUSING, actor=actor, term=None,
                 detail="pause requested")


def request_resume(db: SqlDatabase, conn: SqlConnection, job_id: int, *, actor: str) -> JobState | None:
    return _move(db, conn, job_id, _into(J.RESUMING), J.RESUMING, actor=actor, term=None,
                 detail="resume requested")


def request_retry(db: SqlDatabase, conn: SqlConnection, job_id: int, *, actor: str,
                  detail: str) -> JobState | None:
    """paused -> resuming, clearing the error: ``reorg retry`` (its failed
    subtasks re-queued in the same transaction)."""
    return _move(db, conn, job_id, {J.PAUSED}, J.RESUMING, actor=actor, term=None,
                 detail=detail, sets="error = NULL")


def resume_while_pausing(
    db: SqlDatabase, conn: SqlConnection, job_id: int, *, actor: str
) -> JobState | None:
    """pausing -> running: a resume that arrives before the pause completed.
    The job keeps its node binding (a small job stays on its node)."""
    return _move(db, conn, job_id, {J.PAUSING}, J.RUNNING, actor=actor, term=None,
                 detail="resume requested while pausing")


# --- owner writes that are not transitions ---------------------------------------

NOW_SEP = " | now: "
# The job's error without a note ``note_error`` left (the inverse of its CASE).
_WITHOUT_NOTE = ("CASE WHEN j.error LIKE '%retrying: %' AND position(:sep IN j.error) = 0 "
                 "THEN NULL ELSE split_part(j.error, :sep, 1) END")


def note_error(db: Database, conn: Connection, term: OwnerTerm, job_id: int, error: str) -> bool:
    """Show why the owner cannot move a job on yet (e.g. a lock timeout in
    prepare, a rollback failing) without changing its state. The job's own
    error (why it failed) stays; the note after it is replaced each time."""
    return conn.execute(
        db.sql(f"""UPDATE {{s}}.jobs SET updated_at = clock_timestamp(),
                       error = CASE WHEN error IS NULL OR error LIKE '%retrying: %'
                                         AND position(:sep IN error) = 0
                                    THEN :error
                                    ELSE split_part(error, :sep, 1) || :sep || :error END
                   WHERE id = :job_id AND {FENCE}"""),
        {"job_id": job_id, "error": error, "sep": NOW_SEP, **term.params()},
    ).rowcount == 1


def add_to_estimate(db: Database, conn: Connection, term: OwnerTerm, job_id: int,
                    rows: int) -> bool:
    """Rows of a range added after the split count toward the job's total."""
    return conn.execute(
        db.sql(f"""UPDATE {{s}}.jobs SET row_estimate = coalesce(row_estimate, 0) + :rows
                   WHERE id = :job_id AND {FENCE}"""),
        {"job_id": job_id, "rows": rows, **term.params()},
    ).rowcount == 1


def bind_to_node(
    db: Database, conn: Connection, term: OwnerTerm, job_id: int, node_id: str
) -> bool:
    """Move a local-mode job onto the current owner's node (a new owner takes
    over the small jobs its predecessor was running)."""
    return conn.execute(
        db.sql(f"""
            UPDATE {{s}}.jobs SET run_on_node = :node_id, updated_at = clock_timestamp()
            WHERE id = :job_id AND run_on_node IS DISTINCT FROM :node_id
              AND run_on_node IS NOT NULL AND {FENCE}"""),
        {"job_id": job_id, "node_id": node_id, **term.params()},
    ).rowcount == 1


def alter(
    db: SqlDatabase, conn: SqlConnection, job_id: int, *, batch_rows: int | None,
    max_rows_per_sec: int | None, concurrency: int | None, actor: str,
    max_replica_lag: float | None = None, max_active_sessions: int | None = None,
) -> str | None:
    """Change a live job's knobs; workers read them at their next batch (rate
    and health limits at their next lease renewal). A limit of 0 removes it.
    A new rate limit re-times the job's schedule (``reserve_rate``): what was
    booked and is not yet due is due as if booked at the new limit, and the
    batch of a job whose batch size was never given (``DEFAULT_BATCH_ROWS``
    in its params) becomes its type's default capped at one second of the
    new limit, as a submit makes it; a ``batch_rows`` given from then on is
    kept. The change and its audit event (the state stays, the detail names
    the new values, a batch resized that way too) are one statement. Returns
    that detail, None when the job had ended (nothing changed)."""
    changed = {"batch_rows": batch_rows, "max_rows_per_sec": max_rows_per_sec,
               "concurrency": concurrency, "max_replica_lag": max_replica_lag,
               "max_active_sessions": max_active_sessions}
    detail = "altered: " + ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                                     for k, v in changed.items() if v is not None)
    return conn.execute(
        db.sql(f"""
            WITH knobs AS (
                SELECT CAST(:batch_rows AS bigint) AS batch_rows,
                       CAST(:max_rps AS bigint) AS max_rps,
                       CAST(:concurrency AS bigint) AS concurrency,
                       CAST(:max_lag AS double precision) AS max_lag,
                       CAST(:max_sessions AS integer) AS max_sessions),
            before AS (SELECT batch_rows FROM {{s}}.jobs WHERE id = :job_id),
            altered AS (
                UPDATE {{s}}.jobs j SET
                    batch_rows = CASE
                        WHEN k.batch_rows IS NOT NULL THEN k.batch_rows
                        WHEN k.max_rps IS NULL OR j.params -> :default_key IS NULL
                            THEN j.batch_rows
                        WHEN k.max_rps = 0 THEN CAST(j.params ->> :default_key AS bigint)
                        ELSE least(CAST(j.params ->> :default_key AS bigint), k.max_rps) END,
                    params = CASE WHEN k.batch_rows IS NULL THEN j.params
                                  ELSE j.params - CAST(:default_key AS text) END,
                    max_rows_per_sec = CASE WHEN k.max_rps IS NULL THEN j.max_rows_per_sec
                                            WHEN k.max_rps = 0 THEN NULL ELSE k.max_rps END,
                    concurrency = coalesce(k.concurrency, j.concurrency),
                    max_replica_lag = CASE WHEN k.max_lag IS NULL THEN j.max_replica_lag
                                           WHEN k.max_lag = 0 THEN NULL ELSE k.max_lag END,
                    max_active_sessions = CASE
                        WHEN k.max_sessions IS NULL THEN j.max_active_sessions
                        WHEN k.max_sessions = 0 THEN NULL ELSE k.max_sessions END,
                    -- Rows booked at the old limit and not yet due are
                    -- re-timed at the new one (none left when lifted): else
                    -- a raised limit would wait out the old schedule.
                    rate_due_at = CASE
                        WHEN k.max_rps IS NULL OR j.rate_due_at IS NULL THEN j.rate_due_at
                        WHEN k.max_rps = 0 OR j.max_rows_per_sec IS NULL
                             OR j.rate_due_at <= clock_timestamp() THEN NULL
                        ELSE clock_timestamp() + (j.rate_due_at - clock_timestamp())
                             * (CAST(j.max_rows_per_sec AS float8) / k.max_rps) END,
                    updated_at = clock_timestamp()
                FROM knobs k
                WHERE j.id = :job_id AND j.state NOT IN ({_TERMINAL_SQL})
                RETURNING j.id, j.state, j.batch_rows),
            event AS (
                INSERT INTO {{s}}.job_events (job_id, actor, from_state, to_state, detail)
                SELECT a.id, CAST(:actor AS text), a.state, a.state,
                       CAST(:detail AS text) || CASE
                           WHEN a.batch_rows <> b.batch_rows AND :batch_rows IS NULL
                           THEN ', batch_rows=' || a.batch_rows ELSE '' END
                FROM altered a, before b
                RETURNING detail)
            SELECT detail FROM event"""),
        {"job_id": job_id, "batch_rows": batch_rows, "max_rps": max_rows_per_sec,
         "concurrency": concurrency, "max_lag": max_replica_lag,
         "max_sessions": max_active_sessions, "actor": actor, "detail": detail,
         "default_key": DEFAULT_BATCH_ROWS},
    ).scalar()


def reserve_rate(db: Database, conn: Connection, job_id: int, rows: int,
                 took_seconds: float) -> float | None:
    """Book a committed batch's ``rows`` on the job's rate schedule and
    return how many seconds its slot waits before the next batch; None when
    the job has no ``max_rows_per_sec`` (any more).

    The schedule is one timestamp on the job row, ``rate_due_at``: when the
    rows booked so far are due at the job's limit (a virtual-scheduling
    token bucket, by the database clock). A batch is booked from when it
    started (``took_seconds`` ago) or from the schedule, whichever is later,
    and its slot waits until the new due time. Every slot of every node books
    on the same row, so n slots take turns and the job as a whole delivers
    its limit; a job slower than its limit finds the schedule in the past
    and waits not at all (no credit saved up for a burst). Negative ``rows``
    give back a booking not used, never moving the schedule before now. One
    short statement per batch, only for a job with a limit."""
    return conn.execute(
        db.sql("""
            UPDATE {s}.jobs SET rate_due_at = greatest(
                greatest(rate_due_at, clock_timestamp() - make_interval(secs => :took))
                + make_interval(secs => CAST(:rows AS float8) / max_rows_per_sec),
                clock_timestamp() - make_interval(secs => :took))
            WHERE id = :job_id AND max_rows_per_sec > 0
            RETURNING extract(epoch FROM rate_due_at - clock_timestamp())::float8"""),
        {"job_id": job_id, "rows": rows, "took": max(took_seconds, 0.0)},
    ).scalar()


def note_throttled(db: Database, conn: Connection, job_id: int, reason: str | None) -> None:
    """Record what holds the job's batches now (None: nothing), for ``reorg
    status``; written by a waiting worker at most once per health interval."""
    conn.execute(
        db.sql("""UPDATE {s}.jobs SET throttled = CAST(:reason AS text),
                      throttled_at = CASE WHEN CAST(:reason AS text) IS NULL THEN NULL
                                          ELSE clock_timestamp() END
                  WHERE id = :job_id AND (CAST(:reason AS text) IS NOT NULL
                                          OR throttled IS NOT NULL)"""),
        {"job_id": job_id, "reason": reason},
    )


def ended_before(db: Database, conn: Connection, job_ids: list[int],
                 seconds: float) -> list[int]:
    """Of ``job_ids``, those that ended more than ``seconds`` ago, or are gone."""
    return list(conn.execute(
        db.sql(f"""
            SELECT i.id FROM unnest(CAST(:ids AS bigint[])) AS i(id)
            LEFT JOIN {{s}}.jobs j ON j.id = i.id
            WHERE j.id IS NULL
               OR j.state IN ({_TERMINAL_SQL})
                  AND j.finished_at < clock_timestamp() - make_interval(secs => :secs)"""),
        {"ids": job_ids, "secs": seconds},
    ).scalars())


def get(db: SqlDatabase, conn: SqlConnection, job_id: int) -> Job | None:
    row = conn.execute(
        db.sql(f"SELECT {JOB_COLUMNS} FROM {{s}}.jobs WHERE id = :id"), {"id": job_id}
    ).mappings().first()
    return Job(**row) if row else None


def state(db: SqlDatabase, conn: SqlConnection, job_id: int) -> JobState | None:
    value = conn.execute(
        db.sql("SELECT state FROM {s}.jobs WHERE id = :id"), {"id": job_id}
    ).scalar()
    return JobState(value) if value else None


def live(db: Database, conn: Connection) -> list[dict[str, Any]]:
    """Jobs the owner still has work on, oldest first within each priority."""
    rows = conn.execute(
        db.sql(f"""
            SELECT {JOB_COLUMNS}, run_on_node, revert_target FROM {{s}}.jobs
            WHERE state NOT IN ({_TERMINAL_SQL}) ORDER BY priority DESC, id""")
    ).mappings()
    return [dict(r) for r in rows]


def events(db: SqlDatabase, conn: SqlConnection, job_id: int) -> list[dict[str, Any]]:
    rows = conn.execute(
        db.sql("""
            SELECT at, actor, from_state, to_state, detail FROM {s}.job_events
            WHERE job_id = :id ORDER BY id"""),
        {"id": job_id},
    ).mappings()
    return [dict(r) for r in rows]


def notify(db: SqlDatabase, conn: SqlConnection) -> None:
    """Wake idle workers and the owner; delivered when the transaction commits."""
    conn.execute(db.sql("SELECT pg_notify(:channel, '')"), {"channel": channel(db)})


def channel(db: SqlDatabase) -> str:
    """Every job move and every wake-up of the owner and idle workers is
    NOTIFYed here (``reorg wait`` listens too)."""
    return f"reorg_{db.schema}"


def notify_verdict(db: Database, conn: Connection, job_id: int) -> None:
    """Wake a submit waiting for the verdict on ``job_id``'s input (at commit).
    A channel of its own: workers and the owner have nothing to do for it."""
    conn.execute(db.sql("SELECT pg_notify(:channel, :job)"),
                 {"channel": verdict_channel(db), "job": str(job_id)})


def verdict_channel(db: Database) -> str:
    return f"reorg_{db.schema}_verdict"


