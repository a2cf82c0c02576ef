"""The ``rewrite`` job type: T copied into a shadow table of the new shape
by range subtasks, kept in step by a change log, verified range by range
and swapped in one short transaction (DESIGN "Table rewrite (shadow table)
jobs"; the engine is the rest of this package).

::

    prepare ─► copy ─► build ─► catch-up ─► verify ─► swap ─► swapped ─► cleanup
    (owner)   (ranges) (fixed)  (fixed)     (ranges)  (owner)  (fixed)    (owner)
       │          │        │        │           │       ▲ SwapBlocked: retried with backoff
       └──────────┴────────┴────────┴───────────┘       │ (the job's note names the blocker)
           cancel / failure: rollback, T never written  │
                                        after the swap: ┘ cancel = `reorg revert`: swap back
                                                          (--keep-old), else nothing to undo

Stored steps (never renumber): 1 copy, 2 build, 3 catch-up, 4 verify,
5 swapped. The swap is the DDL entering step 5 (``enter_step``, in the
owner's fenced transaction that moves the step); cleanup is the
``advance`` after it (in the transaction that marks the job succeeded),
so a cancel never races a cleanup: the job either still has its old
table, or has succeeded."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

from backfill.rewrite import names, planning, spark_rows, stored, swap, work
from backfill.rewrite.builds import Build
from backfill.rewrite.shadow import Plan
from backfill.rewrite.verify import verify_batch
from backfill.schema.sql import run
from backfill.tables import set_ddl_lock_timeout
from framework import faults, jobtype, privileges
from framework.errors import InvalidParams
from framework.jobtype import JobType
from framework.records import Job, Step, Target
from framework.subtask import Batch, SubtaskContext

log = logging.getLogger("reorg.rewrite")

NAME = "rewrite"
COPY, BUILD, CATCH_UP, VERIFY, SWAPPED = 1, 2, 3, 4, 5  # stored step numbers: never renumber
# Replay rounds at once in the catch-up step (each takes other log rows).
CATCH_UP_SUBTASKS = 4
# The change log's keys are counted up to this many for the job's backlog.
BACKLOG_CAP = 1_000_000
_PLAN = "rewrite.plan"  # ctx.batch_state: the job's plan, read once a subtask


class Rewrite(JobType):
    name = NAME
    keys_of_any_type = True
    submit_options = "backfill.rewrite.options:rewrite"
    # A batch reads T and writes only the shadow (no lock on T's rows): one
    # batch a range of the split's default 50,000 rows. Batches of 10,000
    # made the copy of 1,000,000 rows ~20 % slower (a commit, a checkpoint
    # and a statement's start each), and the verify likewise.
    default_batch_rows = 50_000
    steps = (Step("copy", restore=False, schema_state="write-reorg"),
             Step("build", ranges=False, restore=False, schema_state="write-reorg"),
             Step("catch-up", ranges=False, restore=False, schema_state="write-reorg"),
             Step("verify", restore=False, schema_state="write-reorg"),
             Step("swapped", ranges=False, restore=False, schema_state="public"))
    done_schema_state = "public"
    # The capture trigger, installed by prepare, logs every row inserted from
    # then on: rows past the copy's last range reach the shadow by replay.
    trigger_covers_inserts = True

    def __init__(self) -> None:
        # job id -> the swap's VALIDATE statements, from enter_step to
        # fixed_subtasks (the same transaction of the owner's).
        self._to_validate: dict[int, list[str]] = {}

    # --- planner -------------------------------------------------------------

    def validate(self, conn: Connection, params: dict[str, Any]) -> Target:
        p = planning.normalised(params)
        if p["engine"] == "spark":
            spark_rows.start_first(conn, p["table"])  # before the checks' transaction opens
        plan = planning.checked_plan(conn, p["table"], 0, p)
        planning.check_submitter(conn, plan)
        spark_set = spark_rows.spark_set_of(p, plan)
        if spark_set is not None:
            spark_rows.check(conn, plan, spark_set)
        p["table"] = f"{plan.schema}.{plan.table_name}"
        return Target(plan.table, plan.copy_key.expr(), p, key=plan.copy_key)

    def describe(self, conn: Connection, job: Job) -> list[str]:
        plan = planning.checked_plan(conn, job.params["table"], job.id, job.params)
        return planning.describe(conn, job, plan)

    def prepare(self, conn: Connection, job: Job) -> None:
        """The shadow, the capture and the plan, in the owner's fenced
        transaction. Planned again with the job's id (names), and so checked
        again: T may have changed since the submit (a refusal fails the job,
        nothing applied)."""
        set_ddl_lock_timeout(conn)  # the capture trigger's lock on T
        plan = planning.checked_plan(conn, job.target_table, job.id, job.params)
        if plan.copy_key != job.key:
            raise InvalidParams(f"the key of {plan.table} changed since the submit (now "
                                f"{plan.copy_key.described()}); submit the job again")
        for statement in planning.prepare_statements(job, plan):
            run(conn, statement)
        privileges.grant_to_submitter(conn, job, planning.SHADOW_GRANT, plan.shadow)
        stored.save(conn, job.params["work_schema"], plan)

    def fixed_subtasks(self, conn: Connection, job: Job, step: int) -> list[dict[str, Any]]:
        plan = _plan_on(conn, job)
        if step == BUILD:
            return [{"build": b.to_param()} for b in plan.builds]
        if step == CATCH_UP:
            # (The shadow's ANALYZE: in the verify step, ``work.analyze_once``.)
            return [{"round": n} for n in range(min(job.concurrency, CATCH_UP_SUBTASKS))]
        if step == SWAPPED:
            return [work.swapped_meta(conn, job.params.get("keep_old_seconds") or 0,
                                      self._to_validate.pop(job.id, []))]
        raise ValueError(f"{NAME} has no fixed step {step}")

    def enter_step(self, conn: Connection, job: Job, step: int) -> None:
        if step == SWAPPED:
            self._swap(conn, job)

    def _swap(self, conn: Connection, job: Job) -> None:
        """T becomes the new table (``swap.swap``). Blocked (SwapBlocked,
        retryable): the owner tries again after a backoff, its note on the
        job naming who holds T; with --kill-blockers, that session is ended
        and the swap tried once more first."""
        faults.hit("rewrite.before_swap")
        plan = _plan_on(conn, job)
        s = planning.swap_of(job, plan)
        keep = bool(job.params.get("keep_old_seconds"))
        try:
            carried = swap.swap(conn, s, keep_old=keep)
        except swap.SwapBlocked:
            if not job.params.get("kill_blockers") or not _end_blockers(conn, s):
                raise
            carried = swap.swap(conn, s, keep_old=keep)
        faults.hit("rewrite.in_swap")
        self._to_validate[job.id] = list(carried.after_commit)

    def advance(self, conn: Connection, job: Job) -> None:
        """Cleanup, once --keep-old ran out: the old table, the log, the plan."""
        plan = _plan_on(conn, job)
        set_ddl_lock_timeout(conn)  # the reverse trigger's drop locks T
        for statement in swap.cleanup_statements(planning.swap_of(job, plan)):
            run(conn, statement)
        run(conn, stored.drop(job.params["work_schema"], job.id))

    def plan_revert(self, conn: Connection, job: Job) -> bool:
        return False  # T is never written before the swap; after it, the revert swaps back

    def revert(self, conn: Connection, job: Job) -> None:
        """Before the swap: what the job made goes, T as it was. After it,
        with --keep-old: swap back (the old table holds every write made
        since), then the new table goes. After a swap without --keep-old
        there is no way back: the job's leftovers go, T keeps its new shape."""
        work_schema = job.params["work_schema"]
        plan = stored.load(conn, work_schema, job.id)
        if plan is None:
            return  # prepare never committed: nothing was made
        set_ddl_lock_timeout(conn)
        s = planning.swap_of(job, plan)
        if _swapped(conn, s):
            if job.params.get("keep_old_seconds"):
                swap.revert(conn, s)
            else:
                log.warning("job %s was cancelled after its swap without --keep-old: %s "
                            "keeps its new shape", job.id, plan.table)
            statements = swap.cleanup_statements(s)
        else:
            statements = swap.rollback_statements(s)
        for statement in statements:
            run(conn, statement)
        run(conn, stored.drop(work_schema, job.id))

    def backlog(self, conn: Connection, job: Job) -> int | None:
        """Keys in the change log still to replay into the shadow, until the
        swap (counted up to ``BACKLOG_CAP``: a count of a big log is a scan)."""
        if not COPY <= job.step < SWAPPED:
            return None
        log_table = names.log_table(job.params["work_schema"], job.id)
        if not conn.execute(text("SELECT to_regclass(:t) IS NOT NULL"), {"t": log_table}).scalar():
            return None
        return int(conn.execute(text(f"SELECT count(*) FROM (SELECT 1 FROM {log_table} "
                                     "LIMIT :cap) x"), {"cap": BACKLOG_CAP}).scalar_one())

    def warm_before_step(self, job: Job, step: int) -> bool:
        """--engine spark: the swap's last replay runs on the owner's Spark."""
        return step == SWAPPED and job.params.get("engine") == "spark"

    def warm_up(self, job: Job | None) -> None:
        """Spark for a job on --engine spark (not at a worker's start: most
        rewrites need none)."""
        if job is not None and job.params.get("engine") == "spark":
            spark_rows.warm_up()

    # --- executor ------------------------------------------------------------

    def write_batch(self, ctx: SubtaskContext, conn: Connection) -> Batch:
        # batch_steps: the copy's
        return work.copy_batch(ctx, conn, planning.capture_of(ctx.job, _plan_of(ctx, conn)))

    def run_subtask(self, ctx: SubtaskContext) -> None:
        step = ctx.job.step
        if step == COPY:
            ctx.run_batches(lambda conn: self.write_batch(ctx, conn))
        elif "analyze" in ctx.meta:  # a job's from before it moved to the verify step
            work.analyze(ctx, _plan_of(ctx))
        elif step == BUILD:
            work.build(ctx, _plan_of(ctx), Build.from_param(ctx.meta["build"]))
        elif step == CATCH_UP:
            work.catch_up(ctx, planning.capture_of(ctx.job, _plan_of(ctx)))
        elif step == VERIFY:
            work.analyze_once(ctx, _plan_of(ctx))  # by one subtask, the others go on
            capture = planning.capture_of(ctx.job, _plan_of(ctx))
            ctx.run_batches(lambda conn: verify_batch(ctx, conn, capture.plan, capture))
        elif step == SWAPPED:
            work.swapped(ctx)
        else:
            raise ValueError(f"{NAME} has no step {step}")


def _plan_on(conn: Connection, job: Job) -> Plan:
    plan = stored.load(conn, job.params["work_schema"], job.id)
    if plan is None:
        raise RuntimeError(f"job {job.id}'s plan is gone (table rewrite_{job.id}_plan of "
                           "the work schema): it was dropped by hand; the job cannot go on")
    return plan


def _plan_of(ctx: SubtaskContext, conn: Connection | None = None) -> Plan:
    """The job's plan, read once per subtask run."""
    plan = ctx.batch_state.get(_PLAN)
    if plan is None:
        if conn is not None:
            plan = _plan_on(conn, ctx.job)
        else:
            with ctx.engine.connect() as own:
                plan = _plan_on(own, ctx.job)
        ctx.batch_state[_PLAN] = plan
    return plan  # type: ignore[no-any-return]


def _swapped(conn: Connection, s: swap.Swap) -> bool:
    """Whether the swap committed: it made the record of T's renamed indexes."""
    return bool(conn.execute(text("SELECT to_regclass(:r) IS NOT NULL"), {
        "r": names.renamed_table(s.work_schema, s.plan.job_id)}).scalar())


def _end_blockers(conn: Connection, s: swap.Swap) -> bool:
    """End the sessions holding a lock on T, the shadow or the tables the
    swap locks with them (--kill-blockers). Whether it ended any."""
    tables, views_on = swap._related(conn, s.plan.table)
    relations = [s.plan.table, s.plan.shadow, *tables, *views_on]
    ended = conn.execute(text("""
        SELECT a.pid, pg_terminate_backend(a.pid, 5000) FROM pg_stat_activity a
        WHERE a.pid <> pg_backend_pid() AND a.pid IN (
            SELECT l.pid FROM pg_locks l
            WHERE l.relation = ANY(CAST(:r AS regclass[])) AND l.granted)"""),
        {"r": relations}).all()
    for pid, _ in ended:
        log.warning("job %s: ended session %s, which kept the swap of %s waiting "
                    "(--kill-blockers)", s.plan.job_id, pid, s.plan.table)
    return any(done for _, done in ended)


def register() -> None:
    jobtype.register(Rewrite())
