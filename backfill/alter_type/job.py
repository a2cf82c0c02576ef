"""The ``alter-type`` job type: its planner (owner side) and executor (the
workers' side), in the steps the package docstring draws."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

from backfill.alter_type import batches, checks, names, plan
from backfill.alter_type.cutover import cut_over
from backfill.rewrite import handover
from backfill.schema import catalog, trigger, user_triggers
from backfill.schema.sql import literal, run
from backfill.tables import quote, set_ddl_lock_timeout
from framework import faults, jobtype
from framework.jobtype import JobType
from framework.records import Job, Step, Target
from framework.subtask import Batch, SubtaskContext

NAME = "alter-type"
BACKFILL, VERIFY, BUILD_INDEXES = 1, 2, 3  # stored step numbers: never renumber


class AlterType(JobType):
    name = NAME
    # Its batches are keyset pages of any key (framework.keys); a key column
    # itself may be altered (``checks``: why that is safe).
    keys_of_any_type = True
    submit_options = "backfill.alter_type.options:alter_type"
    steps = (Step("backfill", restore=False, schema_state="write-reorg"),
             Step("verify", restore=False, schema_state="write-reorg"),
             Step("build-indexes", ranges=False, restore=False, schema_state="write-reorg"))
    done_schema_state = "public"
    batch_steps = (BACKFILL,)  # quick backfill subtasks share a transaction (batch_writer)
    # Its trigger gives every row inserted after prepare its value.
    trigger_covers_inserts = True

    # --- planner -------------------------------------------------------------

    def handed_over(self, params: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
        return handover.alter_type(params)  # --method rewrite: a rewrite job

    def validate(self, conn: Connection, params: dict[str, Any]) -> Target:
        return checks.check(conn, params)

    def describe(self, conn: Connection, job: Job) -> list[str]:
        return plan.describe(conn, job)

    def prepare(self, conn: Connection, job: Job) -> None:
        """Write-only, in one short transaction: the shadow column, its NOT
        VALID checks and the trigger. Checked again first: the table may have
        changed since the submit (a refusal fails the job, nothing applied)."""
        checks.check(conn, {k: job.params.get(k) for k in (
            "table", "column", "type", "using", user_triggers.ALLOW) if k in job.params})
        set_ddl_lock_timeout(conn)
        facts = catalog.column_facts(conn, job.target_table, job.params["column"])
        assert facts is not None  # checked just now
        for statement in plan.prepare_statements(
                job, facts.not_null, plan.constraint_clones(conn, job, facts.attnum)):
            run(conn, statement)
        run(conn, f"COMMENT ON COLUMN {job.target_table}.{quote(job.params['shadow'])} "
                  f"IS {literal(names.shadow_mark(job))}")
        trigger.install(conn, table=job.target_table,
                        table_name=job.target_table.split(".", 1)[1],
                        function=names.function(job), trigger=names.trigger(job),
                        shadow=quote(job.params["shadow"]), expression=plan.expression(job.params),
                        # Without USING the value is CAST(column AS type): on NEW directly.
                        column=None if job.params.get("using") else quote(job.params["column"]))

    def fixed_subtasks(self, conn: Connection, job: Job, step: int) -> list[dict[str, Any]]:
        """Build-indexes: one subtask per index covering the column, and one
        that validates the shadow column's constraints and analyses it."""
        facts = catalog.column_facts(conn, job.target_table, job.params["column"])
        assert facts is not None
        builds = [{"build": b.name, "statement": b.statement, "replaces": b.original}
                  for b in plan.index_builds(conn, job, facts.attnum)]
        validate = ([names.not_null_check(job)] if facts.not_null else []) + [
            c.name for c in plan.constraint_clones(conn, job, facts.attnum) if c.validate]
        return [*builds, {"validate": validate}]

    def advance(self, conn: Connection, job: Job) -> None:
        cut_over(conn, job)

    def plan_revert(self, conn: Connection, job: Job) -> bool:
        return False  # the old column was never written: nothing to restore by range

    def revert(self, conn: Connection, job: Job) -> None:
        """Drop what the job added; the shadow column's indexes and
        constraints go with it. The table is then as before the job."""
        set_ddl_lock_timeout(conn)
        trigger.remove(conn, table=job.target_table, function=names.function(job),
                       triggers=names.triggers(job))
        mark = conn.execute(text(
            "SELECT col_description(attrelid, attnum) FROM pg_attribute "
            "WHERE attrelid = to_regclass(:t) AND attname = :c AND NOT attisdropped"),
            {"t": job.target_table, "c": job.params["shadow"]}).scalar()
        if mark == names.shadow_mark(job):  # ours: never a user's column of that name
            run(conn, f"ALTER TABLE {job.target_table} DROP COLUMN {quote(job.params['shadow'])}")

    # --- executor ------------------------------------------------------------

    def run_subtask(self, ctx: SubtaskContext) -> None:
        step = ctx.job.step
        if step == BUILD_INDEXES:
            if "build" in ctx.meta:
                batches.build_index(ctx)
            else:
                batches.validate_constraints(ctx)
        elif step == BACKFILL:
            ctx.run_batches(lambda conn: batches.backfill_batch(ctx, conn))
        elif step == VERIFY:
            if ctx.curr_key == ctx.start_key:
                faults.hit("alter_type.before_verify")
            ctx.run_batches(lambda conn: batches.verify_batch(ctx, conn))
        else:
            raise ValueError(f"{NAME} has no step {step}")

    def write_batch(self, ctx: SubtaskContext, conn: Connection) -> Batch:
        return batches.backfill_batch(ctx, conn)  # batch_steps: the backfill's alone


def register() -> None:
    jobtype.register(AlterType())
