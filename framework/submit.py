"""Submitting a job: validate, optionally plan only (dry run), insert, and
wait for the owner's verdict on the input.

Validation and the dry-run plan run in a transaction that is always rolled
back, so a rejected or dry-run submit changes no table (DESIGN 11).

A job type whose checks are too costly for every ``reorg submit`` (analysing
a Spark expression needs a JVM: seconds to start) leaves them to the owner
(``JobType.analyse``), whose process keeps what they need warm::

    submit: validate ─► insert (queued) ─► wait for the verdict ─┬─► accepted: print the id
    owner:                       analyse ─► accept | reject ─────┴─► rejected: discard the
                                 (before split and prepare)          job, one error line, exit 2

A rejected job is deleted with its events by the submit that waited for it,
so a rejected submit leaves every table as it was; only a submit killed
while it waits leaves its rejected job behind (state reverted, its error
saying why: the trace of a submit that did not report). With no live owner,
and for a dry run (which writes nothing), submit runs the analysis itself
(it then takes as long as the JVM's start). If the verdict takes longer than
``verdict_seconds`` (an owner starting Spark for the first time on a loaded
host), submit prints the id anyway and says the job awaits its checks;
``reorg wait`` then reports a rejection as a failed job.

A Ctrl-C (KeyboardInterrupt) never leaves a job its submitter does not know
of: one during the insert's commit is held until the commit returns, and one
from then on comes out as ``SubmitInterrupted`` naming the job (which goes
on: a job awaiting its verdict, rejected later, stays reverted with its
error, as one of a killed submit). Any other KeyboardInterrupt out of
``submit`` means that nothing was submitted.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from framework import faults, jobtype, privileges
from framework.control import local_actor
from framework.db import Database
from framework.errors import InvalidParams
from framework.jobtype import JobType
from framework.keyset_split import plan_split
from framework.records import DEFAULT_BATCH_ROWS, Job, Target
from framework.splitting import SplitPlan
from framework.states import JobState
from framework.store import jobs, owner_lease

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

# A submit waits for the owner's verdict on a notification (the owner's accept
# or reject sends one at commit, ``jobs.notify_verdict``) and looks again at
# least this often without one: a job cancelled or changed meanwhile, or an
# owner of an older version that sends none (workers upgraded one by one).
VERDICT_RECHECK_SECONDS = 0.1

ON_FAILURE_CHOICES = ("rollback", "pause")


@dataclass(frozen=True)
class SubmitRequest:
    type: str
    params: dict[str, Any] = field(default_factory=dict)
    job_key: str | None = None
    priority: int = 0
    concurrency: int = 16
    batch_rows: int | None = None  # None: the job type's default_batch_rows
    max_rows_per_sec: int | None = None
    # Health throttles (framework.throttle): hold batches while any standby
    # lags more than this many seconds / more sessions than this are active.
    max_replica_lag: float | None = None
    max_active_sessions: int | None = None
    # What a subtask failing for good does: "rollback" the job, or "pause" it
    # with every finished range kept (then `reorg retry`).
    on_failure: str = "rollback"
    rows_per_subtask: int | None = None
    dry_run: bool = False
    # Who submits, for the job event (default: this process's user@host).
    actor: str | None = None
    # How long to wait for the owner's verdict on the input (JobType.analyse).
    verdict_seconds: float = 60.0

    def check_limits(self) -> None:
        for name, value in (("--concurrency", self.concurrency), ("--batch-rows", self.batch_rows)):
            if value is not None and value < 1:
                raise InvalidParams(f"{name} must be at least 1, got {value}")
        if self.max_rows_per_sec is not None and self.max_rows_per_sec < 1:
            raise InvalidParams(
                f"--max-rows-per-sec must be at least 1, got {self.max_rows_per_sec}; "
                "omit it for no limit"
            )
        if self.max_replica_lag is not None and not self.max_replica_lag > 0:
            raise InvalidParams(f"--max-replica-lag must be more than 0 seconds, got "
                                f"{self.max_replica_lag:g}; omit it for no limit")
        if self.max_active_sessions is not None and self.max_active_sessions < 1:
            raise InvalidParams(f"--max-active-sessions must be at least 1, got "
                                f"{self.max_active_sessions}; omit it for no limit")
        if self.on_failure not in ON_FAILURE_CHOICES:
            raise InvalidParams(f"--on-failure must be one of {', '.join(ON_FAILURE_CHOICES)}, "
                                f"got {self.on_failure!r}")
        if self.rows_per_subtask is not None and self.rows_per_subtask < 1:
            raise InvalidParams(f"--rows-per-subtask must be at least 1, got {self.rows_per_subtask}")


@dataclass(frozen=True)
class SubmitResult:
    job_id: int | None
    created: bool
    target_table: str
    # A dry run's split of the table into key ranges; None when no step of
    # the job's type ranges over its key (add-index), or not a dry run.
    plan: SplitPlan | None = None
    dry_run: bool = False
    # The owner had not given its verdict on the input within verdict_seconds.
    awaiting_verdict: bool = False
    # A dry run's description of the job beside its ranges (JobType.describe).
    notes: tuple[str, ...] = ()


def submit(db: Database, request: SubmitRequest) -> SubmitResult:
    request.check_limits()
    kind = jobtype.get(request.type)
    handed = kind.handed_over(dict(request.params))
    if handed is not None:
        request = replace(request, type=handed[0], params=handed[1])
        kind = jobtype.get(request.type)
    with db.connect(isolation_level="REPEATABLE READ") as conn, conn.begin() as tx:
        target = kind.validate(conn, dict(request.params))
        _check_key_kind(kind, request.type, target)
        # The job's SQL runs as whoever submits it, never as more
        # (framework.privileges); refused now if the workers cannot.
        submitter = privileges.current_role(conn)
        privileges.check_workers_can_run_as(conn, submitter)
        # An explicit range size wins over the job type's default.
        params = privileges.recorded({**target.params, "work_schema": db.schema}, submitter)
        if request.rows_per_subtask:
            params["rows_per_subtask"] = request.rows_per_subtask
        if request.batch_rows is None:
            params[DEFAULT_BATCH_ROWS] = kind.default_batch_rows
        ranged = any(step.ranges for step in kind.steps)
        plan = (plan_split(conn, target.table, target.key or target.key_column,
                           params.get("rows_per_subtask"))
                if request.dry_run and ranged else None)
        notes = tuple(kind.describe(conn, _draft(request, target, params))
                      ) if request.dry_run else ()
        tx.rollback()
    owner_checks = kind.analyses_on_owner()
    if owner_checks and (request.dry_run or not _owner_live(db)):
        params = _analyse_here(db, kind, request, target, params)
        owner_checks = False
    if request.dry_run:
        return SubmitResult(None, False, target.table, plan, dry_run=True, notes=notes)
    faults.hit("submit.before_insert")
    job_id, created = None, False
    try:
        with db.connect() as conn:
            # The job and its id, both or neither: a Ctrl-C during the
            # insert's commit (whose outcome it would leave unknown) is
            # taken once the commit has returned.
            with _interrupts_deferred(), conn.begin():
                if owner_checks:
                    # In the insert's transaction: listening from its commit on,
                    # before the owner can see the job, so no verdict is missed.
                    conn.execute(db.sql(f'LISTEN "{jobs.verdict_channel(db)}"'))
                job_id, created = jobs.insert(
                    db, conn, type=request.type, params=params, target_table=target.table,
                    key_column=target.key_column, job_key=request.job_key,
                    priority=request.priority, concurrency=request.concurrency,
                    batch_rows=_batch_rows(request, kind),
                    max_rows_per_sec=request.max_rows_per_sec, max_replica_lag=request.max_replica_lag,
                    max_active_sessions=request.max_active_sessions,
                    on_failure=request.on_failure, actor=request.actor or local_actor(),
                    key=target.key,
                )
                faults.hit("submit.in_insert")
            faults.hit("submit.after_insert")
            if owner_checks:
                try:
                    if created:
                        return _await_verdict(db, conn, job_id, target.table,
                                              request.verdict_seconds)
                except KeyboardInterrupt:
                    conn.invalidate()  # closed, not pooled: no statement after a Ctrl-C
                    raise
                finally:  # the connection goes back to the pool listening to nothing
                    if not conn.invalidated:
                        with conn.begin():
                            conn.execute(db.sql("UNLISTEN *"))
        return SubmitResult(job_id, created, target.table)
    except KeyboardInterrupt as interrupt:
        if job_id is None:
            raise  # nothing was submitted
        raise SubmitInterrupted(SubmitResult(
            job_id, created, target.table, awaiting_verdict=owner_checks and created)) from interrupt


class SubmitInterrupted(KeyboardInterrupt):
    """A Ctrl-C once the job exists: it goes on, and this names it
    (``result``). Any other KeyboardInterrupt out of ``submit`` means that
    nothing was submitted."""

    def __init__(self, result: SubmitResult) -> None:
        super().__init__(f"interrupted; job {result.job_id} was submitted")
        self.result = result


@contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Hold a SIGINT that comes in the block until its end, then act on it
    as it would have (KeyboardInterrupt). Only the main thread receives
    signals: elsewhere (the dashboard's) a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    before = signal.signal(signal.SIGINT, lambda signum, _frame: pending.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
    if pending and callable(before):
        before(signal.SIGINT, None)


def _batch_rows(request: SubmitRequest, kind: JobType) -> int:
    """The request's --batch-rows, else its job type's default, and then no
    more than one second of --max-rows-per-sec. The pacing books a batch as a
    whole: at the default of 10,000 rows a job of 4,500 rows at 30 rows/s was
    one batch, written in its first second. A --batch-rows given is kept.
    ``reorg alter`` applies the same rule to a new limit (``jobs.alter``)."""
    if request.batch_rows is not None:
        return request.batch_rows
    if request.max_rows_per_sec:
        return min(kind.default_batch_rows, request.max_rows_per_sec)
    return kind.default_batch_rows


def _owner_live(db: Database) -> bool:
    with db.begin() as conn:
        return bool(owner_lease.current(db, conn)["live"])


def _check_key_kind(kind: JobType, name: str, target: Target) -> None:
    """A job type runs on keys of any type only when it says so."""
    if target.key is None or target.key.arithmetic or kind.keys_of_any_type:
        return
    table = target.table.replace('"', "")
    raise InvalidParams(
        f"{name} runs only on tables keyed by one integer column (smallint, integer or "
        f"bigint); {table} is keyed by {target.key.described()}; "
        "use a job type that takes keys of any type (e.g. sql-update)")


def _analyse_here(db: Database, kind: JobType, request: SubmitRequest, target: Target,
                  params: dict[str, Any]) -> dict[str, Any]:
    """The owner's checks, run by this process (no owner to ask, or a dry run)."""
    job = _draft(request, target, params)
    with db.connect(isolation_level="REPEATABLE READ") as conn, conn.begin() as tx:
        analysed = kind.analyse(conn, job)
        tx.rollback()
    return {**analysed, jobs.VERDICT: jobs.ACCEPTED}


def _draft(request: SubmitRequest, target: Target, params: dict[str, Any]) -> Job:
    """The job a request would be, before it has an id (0)."""
    key = target.key
    return Job(id=0, type=request.type, state=str(JobState.QUEUED), step=0, params=params,
               target_table=target.table, key_column=target.key_column,
               batch_rows=_batch_rows(request, jobtype.get(request.type)),
               max_rows_per_sec=request.max_rows_per_sec,
               row_estimate=None, concurrency=request.concurrency,
               key_columns=list(key.columns) if key else None,
               key_types=list(key.types) if key else None)


def _await_verdict(db: Database, conn: Connection, job_id: int, table: str,
                   seconds: float) -> SubmitResult:
    """Wait for the owner to accept or reject the job's input, on ``conn``
    (which listens to the verdict channel); a rejected job is discarded and
    its error raised (DESIGN 11)."""
    deadline = time.monotonic() + seconds
    while True:
        with conn.begin():
            seen = jobs.verdict(db, conn, job_id)
        if seen is None:  # deleted meanwhile (another submit's discard cannot: it is ours)
            raise InvalidParams(f"job {job_id} disappeared before its input was checked")
        state, verdict, error = seen
        if verdict == jobs.REJECTED:
            with conn.begin():
                jobs.discard_rejected(db, conn, job_id)
            raise InvalidParams(error or "the owner rejected the job's input")
        if verdict == jobs.ACCEPTED or state is not JobState.QUEUED:
            return SubmitResult(job_id, True, table)
        left = deadline - time.monotonic()
        if left <= 0:
            return SubmitResult(job_id, True, table, awaiting_verdict=True)
        # Between transactions, where PostgreSQL delivers notifications; any
        # one (another job's verdict too) is a reason to look again.
        listening = conn.connection.driver_connection
        assert listening is not None  # a checked-out connection has its driver's
        for _ in listening.notifies(timeout=min(left, VERDICT_RECHECK_SECONDS),
                                    stop_after=1):
            pass
