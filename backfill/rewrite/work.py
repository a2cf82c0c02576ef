"""The workers' side of ``rewrite``: a batch of the copy, the build step's
subtasks, the catch-up's replay rounds and the swapped step's wait.

Every one of them ends its work through ``framework.subtask``: a batch (or
a fixed step's progress) commits with its fenced checkpoint in one
transaction (DESIGN 3), so a worker killed anywhere resumes from what was
committed, on any host.

- copy: one ``INSERT INTO shadow SELECT ... FROM T WHERE key in [lo, hi)``
  a batch, as the submitter (it carries their ``--set``; with ``--engine
  spark`` the Spark column comes from a stage, ``spark_rows``). T's triggers do
  not fire; the shadow has no index yet. On a single integer key the batch
  is ``[curr, curr + n)`` with no key scan while the keys are dense, as
  ``backfill.update_batch`` does;
- build: one index or constraint of the shadow, on a long statement's
  session (``framework.long_statements``): made and checkpointed in one
  transaction, so a retry after a kill finds it made, or not at all; a
  CHECK or FOREIGN KEY is added NOT VALID in a short transaction of its
  own, then validated with the checkpoint (the NOT VALID add locks the
  referenced table only for a moment). A build whose prerequisite
  (``builds.needed_by``: a foreign key of T to T needs the shadow's key)
  is not built yet hands its subtask back (``NotReady``) to be claimed
  again after ``PREREQUISITE_WAIT_SECONDS``;
- catch-up: replay rounds (``capture.Capture.replay``) until less than a
  batch is left in the log (at most CATCH_UP_LEFT rows): what the swap
  replays under its lock is then small. Several subtasks replay at once;
- verify (``verify``): one of its subtasks ANALYZEs the shadow first
  (``analyze_once``), beside the others' ranges;
- swapped: validate the foreign keys the swap re-made NOT VALID on other
  tables, then wait out ``--keep-old`` by the database's clock, showing the
  share of it gone as the subtask's progress; the owner's ``advance`` then
  cleans up."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

from backfill.batch_bounds import next_bound
from backfill.rewrite import builds, names, stored
from backfill.rewrite.builds import Build
from backfill.rewrite.capture import Capture
from backfill.rewrite.shadow import Plan
from backfill.schema.sql import run
from backfill.tables import set_ddl_lock_timeout
from framework import faults, long_statements
from framework.errors import NotReady
from framework.keys import END, Key, quote
from framework.privileges import as_role, run_as
from framework.records import FIXED_SUBTASK_UNITS
from framework.subtask import Batch, SubtaskContext

# Below this share of key values holding a row, a copy batch of ``n`` key
# values would copy too few rows: the next batch scans for its ``n`` keys.
DENSE_SHARE = 0.5
_SPARSE = "rewrite.sparse"
# Catch-up ends once the log holds at most this many rows (and less than a
# batch): the swap replays them under its lock, in well under a second.
CATCH_UP_LEFT = 1_000
# A replay round that found every log row taken by another subtask waits
# this long before it looks again.
IDLE_SECONDS = 0.05
# A build subtask whose prerequisite is not built yet is claimed again after
# this long: that index takes seconds to minutes to build, and a claim and a
# look at the catalogue a second cost nothing.
PREREQUISITE_WAIT_SECONDS = 1.0
# How often the swapped step's wait checkpoints its progress.
WAIT_CHECKPOINT_SECONDS = 5.0


# --- every batch ------------------------------------------------------------------


def batch_settings(conn: Connection) -> None:
    """Settings of a copy, verify or replay batch's transaction. The commit
    does not wait for its WAL to reach disk: the batch writes only the
    shadow and the log, and commits with its checkpoint, so a server crash
    can lose only whole batches with their checkpoints, which are redone;
    a durable commit after it (the owner's step change, the swap) flushes
    it too, WAL being written in order. A copy of 10,000 rows writes ~1.5
    MB of WAL: each waiting for its flush cost the copy ~10 % (and the
    application's commits queued behind those flushes). No JIT: a batch's
    statement runs for tens of milliseconds, a compile takes about as long.
    No parallel workers: the job runs its batches in parallel already, and
    a verify batch of 50,000 rows planned two for each table it reads (four
    more processes a batch, on top of the other slots' batches)."""
    conn.execute(text("SELECT set_config('synchronous_commit', 'off', true), "
                      "set_config('jit', 'off', true), "
                      "set_config('max_parallel_workers_per_gather', '0', true)"))


# --- copy ------------------------------------------------------------------------


def copy_batch(ctx: SubtaskContext, conn: Connection, capture: Capture) -> Batch:
    """Copy the batch from ``ctx.curr_key`` into the shadow."""
    batch_settings(conn)
    plan = capture.plan
    key, curr, end, n = plan.copy_key, ctx.curr_key, ctx.end_key, ctx.job.batch_rows
    if key.arithmetic and end is not END and not ctx.batch_state.get(_SPARSE):
        upper = min(curr + n, end)
        rows = _copy(ctx, conn, capture, curr, upper)
        ctx.batch_state[_SPARSE] = rows < DENSE_SHARE * (upper - curr)
        return Batch(upper, rows)
    upper, rows = next_bound(conn, plan.table, key, curr, end, n)
    _copy(ctx, conn, capture, curr, upper)
    if key.arithmetic and upper is not END:
        ctx.batch_state[_SPARSE] = rows < DENSE_SHARE * (upper - curr)
    return Batch(upper, rows)


def copy_rows(capture: Capture, lo: Key, hi: Key) -> tuple[str, str]:
    """The copy of ``[lo, hi)``: T's rows (SQL) and their order. Ranged over
    --order-by columns, which an application may change, a row can move from
    a range copied already into one not copied yet; an update logs its key,
    so the copy leaves out the keys in the log (the catch-up replays them):
    each key is copied once."""
    plan = capture.plan
    if not plan.order_by:
        return plan.copy_key.between(lo, hi), ""
    return (f"{plan.copy_key.between(lo, hi)} AND NOT {logged(capture, plan.table)}",
            f" ORDER BY {plan.copy_key.order_by()}")


def logged(capture: Capture, row: str) -> str:
    """SQL: the key of ``row`` (T's or the shadow's, or an alias) is in the log."""
    match = " AND ".join(f"l.{k} = {row}.{quote(c)}" for k, c in
                         zip(capture.log_key.names(), capture.plan.key.columns, strict=True))
    return f"EXISTS (SELECT 1 FROM {capture.log} l WHERE {match})"


def _copy(ctx: SubtaskContext, conn: Connection, capture: Capture, lo: Key, hi: Key) -> int:
    """The batch's rows, as the submitter (the user's --set); the rows written."""
    where, order_by = copy_rows(capture, lo, hi)
    with as_role(conn, run_as(ctx.job)):
        return capture.insert_rows(conn, where, order_by)


# --- build -----------------------------------------------------------------------


def build(ctx: SubtaskContext, plan: Plan, made: Build) -> None:
    """One index or constraint of the shadow, exactly once (see the module)."""
    faults.hit("rewrite.before_build")
    _after(ctx, plan, made.final, builds.needed_by(made, plan.builds))
    with long_statements.session(ctx, autocommit=False) as conn:
        if made.validate is None:
            ctx.commit(lambda c: _make(c, plan, made), on=conn)
            return
        with conn.begin():
            _make(conn, plan, made)

        def validate(c: Connection) -> Batch:
            assert made.validate is not None
            run(c, made.validate)
            return Batch(ctx.end_key, 0)

        ctx.commit(validate, on=conn)
    # (a retry of a validated constraint validates again: a no-op)


def _make(conn: Connection, plan: Plan, made: Build) -> Batch:
    if not _built(conn, plan, made):
        # A FOREIGN KEY locks its referenced table: a bounded wait, retried.
        set_ddl_lock_timeout(conn)
        for statement in made.statements:
            run(conn, statement)
    return Batch(FIXED_SUBTASK_UNITS, 0)


def _after(ctx: SubtaskContext, plan: Plan, what: str, needed: list[Build]) -> None:
    """Raise NotReady unless every build in ``needed`` was made (committed:
    a build commits what it made with its checkpoint)."""
    if not needed:
        return
    with ctx.engine.connect() as conn:
        missing = [b.final for b in needed if not _built(conn, plan, b)]
    if missing:
        raise NotReady(f"{what} waits for {missing[0]} of the shadow, which another build "
                       "subtask makes", PREREQUISITE_WAIT_SECONDS)


def _built(conn: Connection, plan: Plan, made: Build) -> bool:
    if made.kind == "index":
        return bool(conn.execute(text("SELECT to_regclass(:i) IS NOT NULL"),
                                 {"i": f"{quote(plan.schema)}.{quote(made.temp)}"}).scalar())
    return bool(conn.execute(text(
        "SELECT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = to_regclass(:s) "
        "AND conname = :n)"), {"s": plan.shadow, "n": made.temp}).scalar())


def analyze(ctx: SubtaskContext, plan: Plan) -> None:
    """The ANALYZE subtask of a job from before the statistics moved to the
    verify step (``analyze_once``): of its catch-up step, or of its build
    step, where it waits for the indexes first."""
    _after(ctx, plan, "ANALYZE", [b for b in plan.builds if b.makes_index])
    analyze_once(ctx, plan)
    ctx.commit(lambda conn: Batch(ctx.end_key, 0))


def analyze_once(ctx: SubtaskContext, plan: Plan) -> None:
    """The shadow's statistics, so the new table is planned well from its
    first statement after the swap (its statistics go with it); taken by
    one verify subtask before its range while the others verify theirs:
    ANALYZE's lock conflicts with neither their reads nor a range's copy
    again, where it would with the build step's CREATE INDEX, and every
    index exists by then (an index on an expression gets its statistics
    from its table's ANALYZE). It took ~0.5 s of the catch-up step on
    2,000,000 rows, alone on the step's critical path. The ANALYZE and the
    mark that it was done commit together, so a subtask killed in it leaves
    it to its own retry; a subtask finding another one at it goes on with
    its range: the verify step cannot end before that one ends."""
    work_schema = ctx.job.params["work_schema"]
    with ctx.engine.connect() as conn:
        if stored.analyzed(conn, work_schema, plan.job_id):
            return
    with long_statements.session(ctx, autocommit=False) as conn, conn.begin():
        taken = conn.execute(text("SELECT pg_try_advisory_xact_lock(:k)"),
                             {"k": names.analyze_lock(plan.job_id)}).scalar()
        if not taken or stored.analyzed(conn, work_schema, plan.job_id):
            return
        run(conn, f"ANALYZE {plan.shadow}")
        run(conn, stored.mark_analyzed(work_schema, plan.job_id))
        faults.hit("rewrite.in_analyze")


# --- catch-up --------------------------------------------------------------------


def catch_up(ctx: SubtaskContext, capture: Capture) -> None:
    """Replay rounds until the log is small (see the module)."""
    # On Spark a round costs a Spark job whatever its rows (~0.3-1 s), so
    # does the swap's last replay: the log need not shrink below CATCH_UP_LEFT.
    left_at_most = CATCH_UP_LEFT if capture.spark else min(ctx.job.batch_rows, CATCH_UP_LEFT)
    while True:
        ctx.raise_if_stopped()
        faults.hit("rewrite.before_replay")
        batch = ctx.run_batch(lambda conn: _replay_round(ctx, conn, capture, left_at_most))
        if batch.next_key == ctx.end_key:
            return
        if not batch.rows:  # every log row was another subtask's
            ctx.stop_event.wait(IDLE_SECONDS)


def _replay_round(ctx: SubtaskContext, conn: Connection, capture: Capture,
                  left_at_most: int) -> Batch:
    """One replay of up to a batch of log rows; done once at most
    ``left_at_most`` are left, else progress is the share of the backlog at
    the subtask's start replayed since."""
    batch_settings(conn)
    taken = capture.replay(conn, ctx.job.batch_rows)
    backlog = log_rows(conn, capture, cap=1_000_000)
    meta = dict(ctx.meta)
    start = meta.setdefault("backlog_at_start", max(backlog + taken, 1))
    meta["backlog"] = backlog
    if backlog <= left_at_most:
        return Batch(ctx.end_key, taken, meta)
    share = int(FIXED_SUBTASK_UNITS * (1 - backlog / start))
    return Batch(min(max(ctx.curr_key, share), FIXED_SUBTASK_UNITS - 1), taken, meta)


def log_rows(conn: Connection, capture: Capture, cap: int) -> int:
    """The log's rows, counted up to ``cap`` (a count of a big log is a scan)."""
    return int(conn.execute(text(f"SELECT count(*) FROM (SELECT 1 FROM {capture.log} "
                                 "LIMIT :cap) x"), {"cap": cap}).scalar_one())


# --- swapped ---------------------------------------------------------------------


def swapped(ctx: SubtaskContext) -> None:
    """Validate what the swap re-made NOT VALID, then wait out --keep-old."""
    validate: list[str] = ctx.meta.get("validate", [])
    if validate:
        with long_statements.session(ctx) as conn:
            for statement in validate:  # validating again after a retry: a no-op
                run(conn, statement)
    until = float(ctx.meta.get("until", 0))
    window = max(float(ctx.meta.get("keep_old_seconds", 0)), 1.0)
    last = 0.0
    while True:
        ctx.raise_if_stopped()
        with ctx.engine.connect() as conn:
            now = float(conn.execute(text("SELECT extract(epoch FROM clock_timestamp())"))
                        .scalar_one())
        left = until - now
        if left <= 0:
            break
        if time.monotonic() - last >= WAIT_CHECKPOINT_SECONDS:
            gone = int(FIXED_SUBTASK_UNITS * (1 - left / window))
            units = min(max(ctx.curr_key, gone), FIXED_SUBTASK_UNITS - 1)
            ctx.commit(_progress(units))
            last = time.monotonic()
        ctx.stop_event.wait(min(left, WAIT_CHECKPOINT_SECONDS))
    ctx.commit(lambda conn: Batch(ctx.end_key, 0))


def _progress(units: int) -> Callable[[Connection], Batch]:
    return lambda conn: Batch(units, 0)


def swapped_meta(conn: Connection, keep_old_seconds: int, validate: list[str]) -> dict[str, Any]:
    """The swapped step's subtask: what to validate, and until when (the
    database's clock) the old table is kept."""
    now = float(conn.execute(text("SELECT extract(epoch FROM clock_timestamp())")).scalar_one())
    return {"validate": validate, "keep_old_seconds": keep_old_seconds,
            "until": now + keep_old_seconds}

