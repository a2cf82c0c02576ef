"""Submitting a job: validate, optionally plan only (dry run), insert.

Validation and the dry-run plan run in a transaction that is always rolled
back, so a rejected or dry-run submit changes no table (DESIGN 11).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from framework import jobtype
from framework.control import local_actor
from framework.db import Database
from framework.jobtype import InvalidParams
from framework.splitting import SplitPlan, plan_split
from framework.store import jobs


@dataclass(frozen=True)
class SubmitRequest:
    type: str
    params: dict[str, Any] = field(default_factory=dict)
    job_key: str | None = None
    priority: int = 0
    concurrency: int = 16
    batch_rows: int = 10_000
    max_rows_per_sec: int | None = None
    rows_per_subtask: int | None = None
    dry_run: bool = False
    # Who submits, for the job event (default: this process's user@host).
    actor: str | None = None

    def check_limits(self) -> None:
        for name, value in (("--concurrency", self.concurrency), ("--batch-rows", self.batch_rows)):
            if value < 1:
                raise InvalidParams(f"{name} must be at least 1, got {value}")
        if self.max_rows_per_sec is not None and self.max_rows_per_sec < 1:
            raise InvalidParams(
                f"--max-rows-per-sec must be at least 1, got {self.max_rows_per_sec}; "
                "omit it for no limit"
            )
        if self.rows_per_subtask is not None and self.rows_per_subtask < 1:
            raise InvalidParams(f"--rows-per-subtask must be at least 1, got {self.rows_per_subtask}")


@dataclass(frozen=True)
class SubmitResult:
    job_id: int | None
    created: bool
    target_table: str
    plan: SplitPlan | None = None


def submit(db: Database, request: SubmitRequest) -> SubmitResult:
    request.check_limits()
    kind = jobtype.get(request.type)
    with db.connect(isolation_level="REPEATABLE READ") as conn, conn.begin() as tx:
        target = kind.validate(conn, dict(request.params))
        # An explicit range size wins over the job type's default.
        params = {**target.params, "work_schema": db.schema}
        if request.rows_per_subtask:
            params["rows_per_subtask"] = request.rows_per_subtask
        plan = (plan_split(conn, target.table, target.key_column, params.get("rows_per_subtask"))
                if request.dry_run else None)
        tx.rollback()
    if plan is not None:
        return SubmitResult(None, False, target.table, plan)
    with db.begin() as conn:
        job_id, created = jobs.insert(
            db, conn, type=request.type, params=params, target_table=target.table,
            key_column=target.key_column, job_key=request.job_key, priority=request.priority,
            concurrency=request.concurrency, batch_rows=request.batch_rows,
            max_rows_per_sec=request.max_rows_per_sec,
            actor=request.actor or local_actor(),
        )
    return SubmitResult(job_id, created, target.table)
