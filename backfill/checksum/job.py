"""``checksum``: compare two tables range by range; read-only.

    reorg submit checksum --table A --target B [--columns c1,c2,...]

Rows are matched by A's key (one integer column, or any key:
``framework.keys``; B must have the same key) and
compared on the listed columns (default: every column of A but the key;
each must exist in B, with a type comparable to A's). How a range is
compared: ``backfill.checksum.batches``.

The job succeeds when the comparison completes: mismatches are a finding,
not a failure. Each subtask keeps its findings in its meta, written with its
checkpoints (so they follow the subtask into ``background_subtask_history``
and its retention); ``backfill.checksum.report`` sums them up. Nothing else is
written, so prepare, advance and revert have nothing to do.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

from backfill.checksum.batches import ChecksumSpec, CompareColumn
from backfill.spark.sizing import ROWS_PER_SUBTASK
from backfill.tables import (
    TableInfo,
    check_identifier,
    explain_select_or_fail,
    inspect_table,
    relation_exists,
)
from framework import jobtype
from framework.errors import InvalidParams
from framework.jobtype import JobType
from framework.records import Job, Target
from framework.subtask import SubtaskContext

COMPARE_IN = ("postgres", "spark")


def spec_of(job: Job) -> ChecksumSpec:
    p = job.params
    return ChecksumSpec(
        source=job.target_table, target=p["target_table"], key=job.key_column, key_name=p["key"],
        columns=tuple(CompareColumn(c["name"], c.get("common")) for c in p["columns"]),
        keys=job.key, compare_in=p.get("compare_in", "postgres"),
        target_seconds=float(p.get("target_batch_seconds", 1.0)),
    )


class ChecksumJobType(JobType):
    name = "checksum"
    # Rows matched on every key column of any type (framework.keys).
    keys_of_any_type = True
    submit_options = "backfill.checksum.options:checksum"

    def validate(self, conn: Connection, params: dict[str, Any]) -> Target:
        a = inspect_table(conn, params.get("table", ""), any_key=True)
        b = self._target(conn, a, (params.get("target") or "").strip())
        names = _column_names(params.get("columns"))
        if names:
            for name in names:
                check_identifier(name, "--columns")
                if name not in a.columns:
                    raise InvalidParams(f"column {name} does not exist in {a.display}; check "
                                        "--columns")
            names = [n for n in dict.fromkeys(names) if n not in a.key_spec.columns]
        else:
            names = [n for n in a.columns if n not in a.key_spec.columns]
        missing = [n for n in names if n not in b.columns]
        if missing:
            raise InvalidParams(
                f"{b.display} has no column {', '.join(missing)}; pass --columns to compare "
                "only the columns both tables have")
        columns = [CompareColumn(n, _common_type(conn, a, b, n)) for n in names]
        compare_in = params.get("compare_in") or "postgres"
        if compare_in not in COMPARE_IN:
            raise InvalidParams(f"compare_in {compare_in!r} is not one of {', '.join(COMPARE_IN)}")
        if not conn.execute(text(f"SELECT EXISTS (SELECT 1 FROM {a.qualified})")).scalar():
            others = conn.execute(text(f"SELECT count(*) FROM {b.qualified}")).scalar()
            raise InvalidParams(
                f"table {a.display} is empty, so there are no key ranges to compare over"
                + (f"; every one of the {others} rows of {b.display} is missing from it"
                   if others else "; so is " + b.display))
        spec = ChecksumSpec(a.qualified, b.qualified, a.key_sql, a.key, tuple(columns),
                            a.key_spec)
        # Plans (and type-checks) the comparison on both tables without running it.
        explain_select_or_fail(conn, spec.compare_sql("TRUE"), "--columns",
                               f"{a.display} and {b.display}")
        normalised = {k: v for k, v in params.items() if v is not None}
        normalised |= {"key": a.key, "target": b.display, "target_table": b.qualified,
                       "columns": [{"name": c.name, "common": c.common} for c in columns],
                       "compare_in": compare_in}
        normalised.setdefault("rows_per_subtask", ROWS_PER_SUBTASK)
        return Target(a.qualified, a.key_sql, normalised, key=a.key_spec)

    @staticmethod
    def _target(conn: Connection, a: TableInfo, name: str) -> TableInfo:
        if not name:
            raise InvalidParams("no --target given; name the table to compare with, e.g. "
                                "--target public.items_copy")
        if not relation_exists(conn, name):
            raise InvalidParams(f"target table {name!r} does not exist; check the name")
        try:
            b = inspect_table(conn, name, any_key=True)
        except InvalidParams:
            raise InvalidParams(
                f"target {name} has no primary key ({a.key}); checksum matches rows by the key "
                f"of {a.display}, so {name} needs it as its primary key") from None
        if b.qualified == a.qualified:
            raise InvalidParams(f"--target {b.display} is the same table as --table; compare "
                                "two different tables")
        if not b.key_spec.matches(a.key_spec):
            raise InvalidParams(
                f"target {b.display} is keyed by {b.key_spec.described()} but {a.display} by "
                f"{a.key_spec.described()}; checksum matches rows on the key, so both need the "
                "same key columns of the same types")
        if b.key != a.key:
            raise InvalidParams(
                f"target {b.display} has primary key ({b.key}) but the key of {a.display} is "
                f"{a.key}; checksum matches rows by that key, so both need it")
        return b

    def warm_up(self, job: Job | None) -> None:
        # Only a comparison in Spark needs it; the default compares in PostgreSQL.
        if job is not None and job.params.get("compare_in") == "spark":
            from backfill.spark.warmup import start_worker_spark

            start_worker_spark()

    def prepare(self, conn: Connection, job: Job) -> None:
        return None  # read-only: nothing to set up

    def run_subtask(self, ctx: SubtaskContext) -> None:
        from backfill.checksum.batches import run_checksum

        run_checksum(ctx, ctx.engine, spec_of(ctx.job))

    def advance(self, conn: Connection, job: Job) -> None:
        return None  # findings live in the subtasks' meta, which history keeps

    def plan_revert(self, conn: Connection, job: Job) -> bool:
        return False  # read-only: no range to restore

    def revert(self, conn: Connection, job: Job) -> None:
        return None  # nothing was written outside the subtasks' meta


def _column_names(value: Any) -> list[str]:
    if not value:
        return []
    items = value.split(",") if isinstance(value, str) else value
    return [c.strip() for item in items for c in str(item).split(",") if c.strip()]


def _common_type(conn: Connection, a: TableInfo, b: TableInfo, name: str) -> str | None:
    """None when both columns have the same type; else the type both cast to
    (PostgreSQL's UNION resolution), or a one-line error when there is none."""
    ta, tb = a.columns[name], b.columns[name]
    if ta == tb:
        return None
    try:
        with conn.begin_nested():
            common = conn.execute(text(
                f"SELECT format_type(pg_typeof(x)::oid, NULL) FROM (SELECT CAST(NULL AS {ta}) AS x "
                f"UNION ALL SELECT CAST(NULL AS {tb})) q LIMIT 1")).scalar()
    except Exception:
        raise InvalidParams(
            f"column {name} is {ta} in {a.display} but {tb} in {b.display}, which cannot be "
            "compared; leave it out of --columns") from None
    return str(common)


def register() -> None:
    jobtype.register(ChecksumJobType())
