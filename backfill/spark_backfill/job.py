"""``backfill``: set a column from a Spark SQL expression, range by range, on Spark.

    reorg submit backfill --table T --set COL=EXPR [--where PRED]
                          [--add-column COL:TYPE] [--udf module:function]

EXPR is a Spark SQL expression over the row's columns; with ``--udf`` it may
call that Python function by its name (``--udf mylib:clean --set c=clean(b)``).
PRED is a PostgreSQL predicate applied to the read.

Each subtask runs on the process's SparkSession (``backfill.spark_backfill.batches``):
read a batch with row versions, transform, land, merge where unchanged, and
checkpoint in the merge transaction (DESIGN 3, 9).

Rollback (DESIGN 8): a column the job added is dropped; an overwritten column
gets its old values back wherever the row still holds what the job wrote
(``backfill.spark_backfill.merge``). Importing this module does not start Spark.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

from backfill import assignment
from backfill.expressions import optional_expression
from backfill.restore import index_before_restoring, restore_in_batches
from backfill.spark.sizing import ROWS_PER_SUBTASK
from backfill.spark.validation import DRY_RUN_ROWS, check_on_sample, start_spark_first
from backfill.spark.warmup import start_worker_spark
from backfill.spark_backfill.merge import MergeSql
from backfill.tables import (
    TableInfo,
    check_where,
    inspect_table,
    quote,
    relation_exists,
    set_ddl_lock_timeout,
)
from framework import jobtype
from framework.errors import InvalidParams
from framework.jobtype import JobType
from framework.privileges import as_role, run_as
from framework.records import Job, Target
from framework.subtask import SubtaskContext


def merge_sql(job: Job) -> MergeSql:
    p = job.params
    return MergeSql(job.id, job.target_table, job.key, p["column"], p["column_type"],
                    p.get("work_schema", "reorg"), bool(p["overwrite"]))


def spec_of(job: Job) -> Any:
    from backfill.spark.transform import Transform
    from backfill.spark_backfill.batches import BackfillSpec

    p = job.params
    return BackfillSpec(
        job_id=job.id, table=job.target_table, key=job.key_column, key_name=p["key"],
        transform=Transform(p["column"], p["expr"], p.get("udf")),
        column_type=p["column_type"], where=p.get("where"), merge=merge_sql(job),
        target_seconds=float(p.get("target_batch_seconds", 1.0)),
    )


class BackfillJobType(JobType):
    name = "backfill"
    # Batches of any key (framework.keys): read in keyset predicates, merged on
    # every key column (backfill.spark.keyset_read, merge.MergeSql).
    keys_of_any_type = True
    submit_options = "backfill.spark_backfill.options:backfill"

    # --- submit -------------------------------------------------------------

    def validate(self, conn: Connection, params: dict[str, Any]) -> Target:
        """The checks PostgreSQL answers; Spark's analysis of EXPR is ``analyse``'s."""
        # The job may do no more than its submitter (framework.privileges): its
        # reads run as the submitter, and its merge is the UPDATE checked here.
        table, column, expr, column_type, adding = assignment.check(conn, params)
        udf = (params.get("udf") or "").strip() or None
        where = optional_expression(params.get("where"), "--where")
        if where:
            check_where(conn, table, where)
        if udf:
            from backfill.spark.transform import UdfError, load_udf

            try:
                load_udf(udf)
            except UdfError as exc:
                raise InvalidParams(str(exc)) from None
        normalised = {k: v for k, v in params.items() if v is not None}
        normalised |= {"column": column, "expr": expr, "where": where, "udf": udf,
                       "column_type": column_type, "overwrite": not adding,
                       "key": table.key}
        normalised.setdefault("rows_per_subtask", ROWS_PER_SUBTASK)
        return Target(table.qualified, table.key_sql, normalised, key=table.key_spec)

    def analyse(self, conn: Connection, job: Job) -> dict[str, Any]:
        """EXPR on Spark against the table's schema, then dry-run on sample
        rows (owner, or ``reorg submit`` where no owner runs)."""
        p = job.params
        start_spark_first(conn, job.target_table)
        table = inspect_table(conn, job.target_table, any_key=True)
        from backfill.spark.quiet import quiet_analysis_errors

        # PySpark would log each rejected expression (a JSON record) and the
        # JVM a failed dry-run task (a stack trace); the one line is ours.
        with quiet_analysis_errors():
            self._check_with_spark(conn, table, p["column"], p["expr"], p["column_type"],
                                   p.get("where"), p.get("udf"), adding=not p["overwrite"],
                                   role=run_as(job))
        return p

    def warm_up(self, job: Job | None) -> None:
        start_worker_spark()

    @staticmethod
    def _check_with_spark(conn: Connection, table: TableInfo, column: str, expr: str,
                          column_type: str, where: str | None, udf: str | None,
                          *, adding: bool, role: str | None) -> None:
        """Analyse EXPR on the table's schema (no rows read for it), check its
        type against the column, then dry-run it on a few rows and land them in
        a temporary table inside a savepoint that is rolled back."""
        from backfill.spark import compat
        from backfill.spark.jdbc import jdbc_target, read_query, schema_probe
        from backfill.spark.keyset_read import text_columns
        from backfill.spark.session import get_validation_spark
        from backfill.spark.transform import Transform

        spark = get_validation_spark()
        jdbc = jdbc_target(conn.engine.url, role)  # the sample is read as the submitter
        keys = table.key_spec
        sample = spark.read.jdbc(jdbc.url, read_query(table.qualified, where, limit=DRY_RUN_ROWS,
                                                      columns=text_columns(keys)),
                                 properties=jdbc.read_props())
        # The expression is analysed on the sample's schema (the table's
        # columns as the subtasks read them): no JDBC schema query of its own
        # (a connection and a catalogue round trip a submit waits for).
        if adding:
            from pyspark.sql import functions as F

            # The subtasks will see the added column (all NULL); so does the check.
            target = schema_probe(spark, jdbc, f"SELECT CAST(NULL AS {column_type}) AS v"
                                  ).schema["v"].dataType
            sample = sample.withColumn(column, F.lit(None).cast(target))
        else:
            target = sample.schema[column].dataType
        if not compat.landable(target):
            raise InvalidParams(
                f"column {column} is {column_type}, which backfill cannot write yet; "
                "use sql-update for array, binary and composite columns")
        check_on_sample(conn, sample, Transform(column, expr, udf), target, column_type, keys,
                        table.display, where)

    # --- owner steps --------------------------------------------------------

    def prepare(self, conn: Connection, job: Job) -> None:
        p = job.params
        set_ddl_lock_timeout(conn)
        if p["overwrite"]:
            for stmt in merge_sql(job).create_images():
                conn.execute(text(stmt))
        else:
            self._add_column(conn, job)

    @staticmethod
    def _add_column(conn: Connection, job: Job) -> None:
        """Add the column, or fail the job if it exists: someone added it since
        submit, so its values are not the job's to overwrite without
        before-images, nor its column to drop on rollback. Plain ADD COLUMN
        (no IF NOT EXISTS) is the guard; it runs in the owner's transaction
        with the subtask insert, so a retried prepare finds nothing of its own.
        The lock first (ADD COLUMN takes it anyway) so the check below holds
        until then and the error can say how to go on."""
        column = job.params["column"]
        conn.execute(text(f"LOCK TABLE {job.target_table} IN ACCESS EXCLUSIVE MODE"))
        exists = conn.execute(text(
            "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(:t) "
            "AND attname = :c AND attnum > 0 AND NOT attisdropped)"),
            {"t": job.target_table, "c": column}).scalar()
        if exists:
            raise InvalidParams(
                f"column {column} already exists in {job.target_table}: it was added after "
                "the job was submitted, so the job neither writes nor drops it; submit again "
                "without --add-column to overwrite it (its old values are kept for rollback)")
        with as_role(conn, run_as(job)):  # DDL with the submitter's privileges
            conn.execute(text(f"ALTER TABLE {job.target_table} ADD COLUMN {quote(column)} "
                              f"{job.params['column_type']}"))

    def run_subtask(self, ctx: SubtaskContext) -> None:
        from backfill.spark_backfill.batches import run_subtask

        run_subtask(ctx, ctx.engine, spec_of(ctx.job))

    def advance(self, conn: Connection, job: Job) -> None:
        for stmt in merge_sql(job).drop_images():
            conn.execute(text(stmt))

    # --- revert step (DESIGN 8, 13): in PostgreSQL, never through Spark ------

    def plan_revert(self, conn: Connection, job: Job) -> bool:
        # The images' indexes are the revert subtasks' to build, not this
        # fenced transaction's (backfill.before_images).
        return bool(job.params["overwrite"] and relation_exists(conn, merge_sql(job).batches))

    def revert_subtask(self, ctx: SubtaskContext) -> None:
        m = merge_sql(ctx.job)
        index_before_restoring(ctx, table=m.kept.images,
                               built=m.kept.indexed_for_restore(),
                               statements=m.kept.index_for_restore())
        restore_in_batches(ctx, paced_by=(ctx.job.target_table, ctx.job.key),
                           statements=lambda bounded: m.restore_range(bounded))

    def revert(self, conn: Connection, job: Job) -> None:
        assignment.revert(conn, job, lambda: merge_sql(job).kept)


def register() -> None:
    jobtype.register(BackfillJobType())
