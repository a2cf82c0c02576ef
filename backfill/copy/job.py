"""``copy``: copy rows into another table through Spark SQL select expressions.

    reorg submit copy --table SRC --target DST --select EXPR [--select EXPR ...]
                      [--create-target] [--where PRED]

Each EXPR is a Spark SQL expression over SRC's columns naming one target
column (``id``, ``CAST(a AS bigint) AS a``, ``upper(b) AS b_up``). SRC's key
columns (one integer, or any key: ``framework.keys``) must be copied
unchanged under their own names (``--select id``): the copy runs range by
range over SRC's key, and a range's rows keep their keys, so each range is
idempotent. PRED is a PostgreSQL predicate on SRC.

``--create-target``: the prepare step creates DST with one column per select
(a verbatim source column keeps its PostgreSQL type; a computed one gets the
type Spark gives it, mapped to PostgreSQL) and the key as primary key.
Without it DST must exist, have the key as its primary key (for a key of
any type: the same columns of the same types), have every
selected column with a type the result can land in, and hold none of the
keys the copy would write (checked at submit, so rows that were in DST
before the job keep their values; rows that appear there during the job
stop it instead of being overwritten).

Each batch lands its rows in one transaction with its fenced checkpoint
(``backfill.copy.batches``). Rollback (DESIGN 8, 13): a created DST is dropped
(only if it still carries this job's marker comment); otherwise revert
subtasks delete exactly the keys the job wrote, range by range. Advance drops the job's key list.

Its cost against one ``INSERT INTO ... SELECT *``: docs/benchmarks.md, "Measured apart".

The copy reads SRC batch by batch: it is a snapshot per range, not a
replication stream. Writes to SRC after their range was copied are not
carried over; run ``checksum`` afterwards, or copy while SRC is quiet.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

from backfill.copy import submit
from backfill.copy.batches import CopySpec, OutputColumn
from backfill.restore import restore_in_batches
from backfill.spark.warmup import start_worker_spark
from backfill.tables import relation_exists, set_ddl_lock_timeout
from framework import jobtype
from framework.errors import InvalidParams
from framework.jobtype import JobType
from framework.records import Job, Target
from framework.subtask import SubtaskContext


def spec_of(job: Job) -> CopySpec:
    p = job.params
    return CopySpec(
        job_id=job.id, source=job.target_table, key=job.key_column, key_name=p["key"],
        target=p["target_table"],
        columns=tuple(OutputColumn.from_param(c) for c in p["columns"]),
        where=p.get("where"), created=bool(p["create_target"]),
        work_schema=p.get("work_schema", "reorg"),
        target_seconds=float(p.get("target_batch_seconds", 1.0)),
        source_key=job.key,
    )


class CopyJobType(JobType):
    name = "copy"
    # Ranges of any key (framework.keys): read in keyset predicates, upserted
    # and recorded on every key column.
    keys_of_any_type = True
    submit_options = "backfill.copy.options:copy"

    def validate(self, conn: Connection, params: dict[str, Any]) -> Target:
        return submit.validate(conn, params)  # what PostgreSQL answers: backfill.copy.submit

    def analyse(self, conn: Connection, job: Job) -> dict[str, Any]:
        return submit.analyse(conn, job)  # the selects on Spark

    def warm_up(self, job: Job | None) -> None:
        start_worker_spark()

    # --- owner steps --------------------------------------------------------

    def prepare(self, conn: Connection, job: Job) -> None:
        spec = spec_of(job)
        set_ddl_lock_timeout(conn)
        # Plain CREATE TABLE: a table that appeared since submit fails the job
        # before anything is copied (and is never ours to drop). The check
        # first only gives that failure a message saying how to go on.
        if spec.created and relation_exists(conn, spec.target):
            raise InvalidParams(
                f"target table {job.params['target']} already exists: it was created after the "
                "job was submitted, so the job neither writes nor drops it; submit again "
                "without --create-target to copy into it, or name a new table")
        for stmt in spec.create_target() if spec.created else [spec.create_keys()]:
            conn.execute(text(stmt))

    def run_subtask(self, ctx: SubtaskContext) -> None:
        from backfill.copy.batches import run_copy

        run_copy(ctx, ctx.engine, spec_of(ctx.job))

    def advance(self, conn: Connection, job: Job) -> None:
        spec = spec_of(job)
        if spec.created:
            if _carries_marker(conn, spec):
                conn.execute(text(f"COMMENT ON TABLE {spec.target} IS NULL"))
        else:
            conn.execute(text(spec.drop_keys()))

    # --- revert step (DESIGN 8, 13) -------------------------------------------

    def plan_revert(self, conn: Connection, job: Job) -> bool:
        """A created target is dropped whole (``revert``); in an existing one the
        copied keys are deleted range by range."""
        spec = spec_of(job)
        return not spec.created and relation_exists(conn, spec.keys)

    def restores_into(self, job: Job) -> str:
        """The revert deletes copied rows from the target, never touches the
        source: a dropped source still leaves them to delete."""
        return spec_of(job).target

    def revert_subtask(self, ctx: SubtaskContext) -> None:
        spec = spec_of(ctx.job)
        restore_in_batches(ctx, paced_by=(spec.keys, spec.copied_key),
                           statements=lambda bounded: [spec.delete_copied_range(bounded)])

    def revert(self, conn: Connection, job: Job) -> None:
        spec = spec_of(job)
        set_ddl_lock_timeout(conn)
        if spec.created:
            # Only the table this job created: its marker comment says so.
            if _carries_marker(conn, spec):
                conn.execute(text(f"DROP TABLE {spec.target}"))
            return
        conn.execute(text(spec.drop_keys()))


def _carries_marker(conn: Connection, spec: CopySpec) -> bool:
    return bool(conn.execute(
        text("SELECT obj_description(to_regclass(:t), 'pg_class') = :m"),
        {"t": spec.target, "m": spec.marker()}).scalar())



def register() -> None:
    jobtype.register(CopyJobType())
