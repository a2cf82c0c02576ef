"""The job-type extension point, and the registry job types join from outside.

The protocol (planner and executor, steps, rollback, the optional duties, CLI
options and registration) is documented in one place: docs/design.md,
"Job-type protocol". This module holds its types: ``Planner`` (the owner's
side), ``Executor`` (every worker's side), ``Step`` (one forward step a
planner declares), ``SubtaskContext`` and the registry. tests/support/fill.py
is the worked example (``test-fill``, and ``test-fill-verify`` with steps).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import threading
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from importlib.metadata import EntryPoints, entry_points
from typing import TYPE_CHECKING, Any, Protocol

from framework import faults
from framework.keys import KeySpec

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

log = logging.getLogger("reorg.worker")

# Job and subtask steps. Once shipped, never renumber: they are stored.
STEP_QUEUED = 0  # nothing done to the table yet
STEP_PREPARED = 1  # schema step done; the first forward step's subtasks inserted
# Forward step n (1-based) of a job type's ``steps`` is stored as n; a job
# that succeeded is at ``done_step`` = its last forward step + 1, which for a
# type of one step is STEP_DONE.
STEP_DONE = 2  # final schema step done (a job type of one step)
STEP_REVERT = -1  # rolling back: the revert subtasks restore ranges, then revert DDL

# A subtask of a fixed step covers [0, FIXED_SUBTASK_UNITS): not keys of the
# table but its own progress, which it may checkpoint as it goes (percent).
FIXED_SUBTASK_UNITS = 100


@dataclass(frozen=True)
class Step:
    """One forward step of a job type, as its planner declares it.

    ``ranges``: split into key ranges of the table (a fresh split when the job
    enters the step); False: a small fixed set of subtasks the planner names
    (``fixed_subtasks``), e.g. one that runs CREATE INDEX CONCURRENTLY.
    ``restore``: on rollback, the ranges this step made progress on get revert
    subtasks (it wrote to the table); a fixed step never has ranges to restore.
    ``schema_state``: shown by ``reorg status`` while the job is in the step
    (TiDB's schema states: "write-only", "write-reorg", ...)."""

    name: str
    ranges: bool = True
    restore: bool = True
    schema_state: str | None = None

    def __post_init__(self) -> None:
        if not self.ranges and self.restore:
            raise ValueError(f"step {self.name!r}: a fixed step has no ranges to restore; "
                             "declare it with restore=False")


# What a job type declares when it declares no steps: one range step.
ONE_STEP = (Step("run"),)


class InvalidParams(ValueError):
    """Bad user input: the message is one line saying what is wrong and how to fix it."""


class RetryableError(RuntimeError):
    """A transient failure: the subtask is retried with backoff."""


class LeaseLost(RuntimeError):
    """The worker no longer holds the subtask: roll back and stop."""


class Stopped(RuntimeError):
    """The subtask was asked to stop (pause, cancel, drain): release it."""


@dataclass(frozen=True)
class Target:
    """What ``validate`` found: where the job writes and how its keys run."""

    table: str  # schema-qualified and quoted, e.g. "public"."items"
    key_column: str  # quoted, e.g. "id"; the key as one SQL value (``KeySpec.expr``)
    params: dict[str, Any]  # normalised parameters, stored on the job row
    # The key's columns and types; None: the single integer ``key_column``.
    key: KeySpec | None = None


@dataclass(frozen=True)
class Job:
    id: int
    type: str
    state: str
    step: int
    params: dict[str, Any]
    target_table: str
    key_column: str
    batch_rows: int
    max_rows_per_sec: int | None
    row_estimate: int | None
    concurrency: int = 1
    # Health throttles (framework.throttle): hold batches while any standby's
    # replay lag exceeds this many seconds / while more sessions than this are
    # active in the database; None: no such limit.
    max_replica_lag: float | None = None
    max_active_sessions: int | None = None
    # What a subtask failing for good does to the job: "rollback" or "pause".
    on_failure: str = "rollback"
    # Subtasks of the job holding a live lease, as last seen by this worker
    # (at the claim, then at each lease renewal); None: not known yet.
    running: int | None = None
    # The key's columns and types (framework.keys); None on a job whose key is
    # the single integer ``key_column`` (every job before migration 0010).
    key_columns: list[str] | None = None
    key_types: list[str] | None = None

    @property
    def key(self) -> KeySpec:
        if self.key_columns and self.key_types:
            return KeySpec.of(self.key_columns, self.key_types)
        return KeySpec.integer_column(self.key_column)

    def rate_share(self) -> float | None:
        """This subtask's share of ``max_rows_per_sec``: the job's budget split
        among the subtasks running it now, on every node. An estimate (the
        count is as last seen): Spark sizes its batches by it, and a context
        without a ``rate_gate`` paces by it; a worker paces by the job's
        shared schedule instead (``SubtaskContext.rate_gate``)."""
        if not self.max_rows_per_sec:
            return None
        return self.max_rows_per_sec / max(self.running or self.concurrency, 1)


LEASE_LOST = "lease lost"


@dataclass(frozen=True)
class InlineCheckpoint:
    """A batch's checkpoint written by the batch's own statement, as one of
    its CTEs (``SubtaskContext.inline_checkpoint``): ``sql`` is a fenced
    ``UPDATE ... RETURNING state`` binding ``params``. After the statement,
    ``done(conn, key, rows, state)`` with the state it returned does the rest
    of ``checkpoint`` (None, no row: the lease is lost; it raises LeaseLost
    and the batch must roll back)."""

    sql: str
    params: dict[str, Any]
    done: Callable[[Connection, Any, int, str | None], None]


@dataclass(frozen=True)
class FencedBatch:
    """A batch and its fenced checkpoint as one statement in autocommit, one
    transaction in one round trip (``SubtaskContext.fenced_batch``).
    ``run(conn, batch, lo, hi)`` runs ``batch`` (SQL binding ``$1`` and
    ``$2`` for the range ``[lo, hi)``) and the checkpoint to ``hi`` on
    ``conn`` and returns the rows it wrote, committed. When the lease is
    lost, the statement fails, its writes roll back, and ``run`` raises
    LeaseLost."""

    run: Callable[[Connection, str, Any, Any], int]


@dataclass
class SubtaskContext:
    """What a worker hands a job type to run one subtask.

    ``checkpoint(conn, new_curr_key, rows, meta=None)`` must be called inside
    the transaction that writes a batch, after the write: it advances
    ``curr_key`` (and stores ``meta``) fenced on the lease, and raises
    LeaseLost when the worker no longer holds it, so the batch rolls back.
    """

    job: Job
    subtask_id: int
    # framework.keys.Key: ints for a single integer key (what a job type
    # without ``keys_of_any_type`` always gets, so it may treat them as ints);
    # tuples, or END for a step's last range, for any other key. A fixed
    # step's are its units (ints).
    start_key: Any
    end_key: Any
    curr_key: Any
    epoch: int
    meta: dict[str, Any]
    checkpoint: Callable[..., None]
    stop_event: threading.Event
    # Reason the subtask must stop ('lease lost', 'job pausing', ...); set with stop_event.
    stop_reason: list[str] = field(default_factory=list)
    # The job type's own notes between the batches of this run (e.g. how
    # dense the last batch's keys were); never stored, gone with the claim.
    batch_state: dict[str, Any] = field(default_factory=dict)
    _on_stop: list[Callable[[], None]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _hard: bool = False
    # Set by the checkpoint that reached end_key: it finished the subtask too.
    finished: bool = False
    # The node's health gate (framework.throttle.HealthMonitor.hold): waits
    # while the job's health limits say no batch may run; None: no gate.
    health_gate: Callable[[SubtaskContext], None] | None = None
    # The job's shared rate schedule (a worker's: ``framework.store.jobs.
    # reserve_rate``): given a committed batch's rows and how long it took,
    # books them against the job's ``max_rows_per_sec`` and returns the seconds
    # to wait before the next batch (None: the job has no limit any more).
    # Every batch of the job, on every node, books on the same schedule, so
    # the job delivers its limit whatever the number of workers and slots.
    # None: pace by this subtask's share of the limit (``Job.rate_share``).
    rate_gate: Callable[[int, float], float | None] | None = None
    # ``checkpoint`` as SQL for the batch's own statement (one round trip
    # fewer), given SQL of the new key (its stored form, jsonb) and of the
    # rows; None (or a None result): call ``checkpoint`` after the write.
    # Only for a statement that runs as the worker's role: the checkpoint is
    # the worker's to write, never the submitter's.
    inline_checkpoint: Callable[[str, str], InlineCheckpoint | None] | None = None
    # ``checkpoint`` and a batch of one statement as one call (``FencedBatch``):
    # three round trips fewer than BEGIN, batch, checkpoint, COMMIT. None (or
    # a None result): not offered. Like ``inline_checkpoint``, only for a
    # statement that runs as the worker's role.
    fenced_batch: Callable[[], FencedBatch | None] | None = None
    # Rows booked on the schedule before the first batch ran
    # (``book_first_batch``), not booked again after it.
    _prebooked: int = 0
    # Set by a stop and by a change of the job's rate limit (``retune``): a
    # slot waiting its turn on the rate schedule (``_pace``) looks again.
    _pacing_woken: threading.Event = field(default_factory=threading.Event)

    def should_stop(self) -> bool:
        return self.stop_event.is_set()

    def raise_if_stopped(self) -> None:
        if self.stop_event.is_set():
            reason = self.stop_reason[0] if self.stop_reason else "stopped"
            raise LeaseLost(reason) if reason == LEASE_LOST else Stopped(reason)

    def run_batches(self, engine: Any, batch: Callable[[Connection], int],
                    alone: Callable[[Any], int | None] | None = None) -> None:
        """Run ``batch`` (one batch from ``curr_key`` on the connection,
        checkpointed; returns the rows it scanned) in a transaction of its
        own, again and again until the range is done, each paced by
        ``throttle``. ``alone(engine)``: the batch as one statement that is a
        transaction by itself (``fenced_batch``), run where it can be; None
        when this batch cannot, and ``batch`` runs instead."""
        while self.curr_key != self.end_key:
            self.raise_if_stopped()
            started = time.monotonic()
            rows = alone(engine) if alone is not None else None
            if rows is None:
                with engine.begin() as conn:
                    rows = batch(conn)
            self.throttle(rows, time.monotonic() - started)

    def throttle(self, rows: int, took_seconds: float) -> None:
        """Pace batches so the job delivers ``max_rows_per_sec`` in all
        (``rate_gate``); then wait while the job's health limits hold it.
        Wakes early when the subtask must stop.

        Job types call it after every committed batch, which makes it the
        ``worker.after_batch`` fault point too."""
        faults.hit("worker.after_batch")
        if self.job.max_rows_per_sec and rows:
            booked = min(rows, self._prebooked)
            self._prebooked -= booked
            self._pace(self._rate_wait(rows - booked, took_seconds))
        self.wait_for_health()

    def book_first_batch(self) -> None:
        """Before the subtask's first batch: book ``batch_rows`` on the job's
        shared schedule and wait for the booking's turn. Booked only after
        it ran, the first batch of every slot starting at once went unpaced:
        a burst of slots x ``batch_rows`` over the limit at the job's start
        (and one batch whenever a slot joined). Rows booked beyond what the
        first batch had are taken off the next bookings."""
        limit, rows = self.job.max_rows_per_sec, self.job.batch_rows
        if not limit or self.rate_gate is None:
            return
        try:
            due = self.rate_gate(rows, 0.0)
        except Exception as exc:  # the database is away: the batch will say so
            log.warning("could not book job %s's first batch, pacing after it: %s",
                        self.job.id, exc)
            return
        if due is None:
            return
        self._prebooked = rows
        self._pace(due - rows / limit)  # the booking's start: when the rows before it are due

    def return_unused_booking(self) -> None:
        """After the subtask: give back what ``book_first_batch`` booked and
        no batch used (a range smaller than a batch, a stop): else many small
        subtasks would hold the job far below its limit."""
        rows, self._prebooked = self._prebooked, 0
        if rows and self.rate_gate is not None:
            try:
                self.rate_gate(-rows, 0.0)
            except Exception as exc:  # costs pace only, never rows
                log.warning("could not return job %s's unused booking: %s", self.job.id, exc)

    def retune(self, job: Job) -> None:
        """The job's knobs as ``reorg alter`` left them (the lease renewal
        brings them). A new rate limit takes effect within the batch: a slot
        waiting its turn at the old limit looks again (``_pace``)."""
        changed = job.max_rows_per_sec != self.job.max_rows_per_sec
        self.job = job
        if changed:
            self._pacing_woken.set()

    def _pace(self, seconds: float) -> None:
        """Wait ``seconds``, this slot's turn on the job's rate schedule; a
        stop ends the wait. A limit changed meanwhile re-times what is left
        of it at the new limit (none when lifted), as ``reorg alter`` re-times
        the job's schedule (``framework.store.jobs.alter``): rows booked at
        40 rows/s are not waited out at 40 rows/s once the job may go faster."""
        limit = self.job.max_rows_per_sec
        due = time.monotonic() + seconds
        while not self.stop_event.is_set():
            left = due - time.monotonic()
            if left <= 0:
                return
            if not self._pacing_woken.wait(left):
                return
            self._pacing_woken.clear()  # before reading the job: no change is missed
            new = self.job.max_rows_per_sec
            if new != limit:
                left = max(due - time.monotonic(), 0.0)
                due = time.monotonic() + (left * limit / new if new and limit else 0.0)
                limit = new

    def _rate_wait(self, rows: int, took_seconds: float) -> float:
        if self.rate_gate is not None:
            try:
                return self.rate_gate(rows, took_seconds) or 0.0
            except Exception as exc:  # the database is away: the next batch will say so
                log.warning("could not book job %s's rate budget, pacing alone: %s",
                            self.job.id, exc)
        share = self.job.rate_share()
        return rows / share - took_seconds if share else 0.0

    def wait_for_health(self) -> None:
        """Before a batch: wait while the database is unhealthy by the job's
        limits (replica lag, active sessions; ``framework.throttle``)."""
        if self.health_gate is not None:
            self.health_gate(self)

    def on_stop(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Run ``callback`` (from another thread) the moment the subtask must stop
        hard, e.g. to cancel a running query or Spark job group. Returns an
        unregister function."""
        with self._lock:
            already = self._hard
            self._on_stop.append(callback)
        if already:
            _run_all([callback])

        def unregister() -> None:
            with self._lock:
                if callback in self._on_stop:
                    self._on_stop.remove(callback)

        return unregister

    @contextlib.contextmanager
    def cancel_on_stop(self, conn: Connection) -> Iterator[None]:
        """While the block runs, a hard stop cancels the statement running on
        ``conn`` (the batch rolls back now, not when the statement ends).

        The canceller runs on a thread of its own and may fire late. Once it
        has sent a cancel, the connection is never used again: it is
        invalidated instead of going back to the pool, where a late cancel
        would hit whatever statement its next user runs, and the stop is
        raised, so the batch is abandoned, never committed."""
        driver = conn.connection.driver_connection
        lock = threading.Lock()
        state = {"open": True, "sent": False}

        def cancel() -> None:
            with lock:
                if not state["open"]:
                    return
                state["sent"] = True
            cancel_safe = getattr(driver, "cancel_safe", None)  # psycopg >= 3.2: bounded
            cancel_safe(timeout=5.0) if cancel_safe else driver.cancel()  # type: ignore[union-attr]

        unregister = self.on_stop(cancel)
        try:
            yield
        finally:
            unregister()
            with lock:
                state["open"] = False
                sent = state["sent"]
            if sent:
                conn.invalidate()
                self.raise_if_stopped()

    def stop(self, reason: str, *, hard: bool) -> None:
        """Ask the subtask to stop. A soft stop (pause, drain) lets the current
        batch commit; a hard stop (lease lost, cancel, job failed) also runs the
        ``on_stop`` callbacks so the open batch is abandoned at once."""
        callbacks: list[Callable[[], None]] = []
        with self._lock:
            if not self.stop_event.is_set():
                self.stop_reason.append(reason)
                self.stop_event.set()
                self._pacing_woken.set()
            first_hard = hard and not self._hard
            if first_hard:
                self._hard = True
                callbacks = list(self._on_stop)
        faults.hit("subtask.stop")
        if not first_hard:
            return
        # Cancellers run on a thread of their own: cancelling a query needs the
        # network, which may be the very thing that is broken (a partition).
        threading.Thread(target=_run_all, args=(callbacks,), name="stop-subtask",
                         daemon=True).start()


def _run_all(callbacks: list[Callable[[], None]]) -> None:
    for callback in callbacks:
        # A failing canceller must not keep the others from running.
        with contextlib.suppress(Exception):
            callback()


class Planner(Protocol):
    """The owner's side of a job type (docs/design.md, "Job-type protocol").
    Optional: ``steps``, ``enter_step``, ``fixed_subtasks``, ``analyse``,
    ``done_schema_state``, ``submit_options``, ``keys_of_any_type``,
    ``trigger_covers_inserts``."""

    name: str

    def validate(self, conn: Connection, params: dict[str, Any]) -> Target: ...

    def prepare(self, conn: Connection, job: Job) -> None: ...

    def advance(self, conn: Connection, job: Job) -> None: ...

    def plan_revert(self, conn: Connection, job: Job) -> bool | Collection[int]: ...

    def revert(self, conn: Connection, job: Job) -> None: ...


class Executor(Protocol):
    """The workers' side of a job type: one subtask of a step, batch by batch."""

    name: str

    def run_subtask(self, ctx: SubtaskContext, engine: Any) -> None: ...

    def revert_subtask(self, ctx: SubtaskContext, engine: Any) -> None: ...


class JobType(Planner, Executor, Protocol):
    """Both sides in one object, as every built-in job type is registered."""


def run_step(job_type: Executor, ctx: SubtaskContext, engine: Any) -> None:
    """Run one claimed subtask: a revert subtask restores, any other runs forward."""
    if ctx.job.step == STEP_REVERT:
        job_type.revert_subtask(ctx, engine)  # restores run in PostgreSQL: no warm-up
    else:
        warm_up(job_type, ctx.job)  # e.g. Spark, started only where a type needing it runs
        job_type.run_subtask(ctx, engine)


class BatchExecutor(Executor, Protocol):
    """An executor whose forward subtasks can be quick (one batch, or a few)
    offers ``run_batch`` beside ``run_subtask``: write the one batch that starts at
    ``ctx.curr_key`` on ``conn`` and call ``ctx.checkpoint(conn, ...)`` after
    it, without committing. When a worker claims several subtasks at once
    (they were quick), it runs their first batches in one transaction and
    checkpoints them with one fenced statement; if any of them has lost its
    lease, the whole transaction rolls back and the others' batches run again
    without it (DESIGN 3). Subtasks not finished by that batch continue
    through ``run_subtask``."""

    def run_batch(self, ctx: SubtaskContext, conn: Connection) -> None: ...


def batch_runner(job_type: Executor,
                 step: int = STEP_PREPARED) -> Callable[[SubtaskContext, Connection], None] | None:
    """The executor's ``run_batch``, if it has one (``BatchExecutor``) for
    forward step ``step``: the steps in its ``batch_steps`` (by default the
    first, the only step of a type of one)."""
    if step not in getattr(job_type, "batch_steps", (STEP_PREPARED,)):
        return None
    return getattr(job_type, "run_batch", None)


def restores_into(kind: Planner, job: Job) -> str:
    """The table ``kind``'s revert writes (optional duty; default the job's)."""
    into = getattr(kind, "restores_into", None)
    return into(job) if callable(into) else job.target_table


def steps_of(kind: object) -> tuple[Step, ...]:
    """The forward steps a type declares (``steps``), or the one range step."""
    declared = getattr(kind, "steps", None)
    return tuple(declared) if declared else ONE_STEP


def done_step(kind: object) -> int:
    """The step a succeeded job of the type is at: past its last forward step."""
    return len(steps_of(kind)) + 1


def step_named(kind: object, number: int) -> Step:
    """Forward step ``number`` (1-based, as stored) of the type."""
    declared = steps_of(kind)
    if not 1 <= number <= len(declared):
        raise ValueError(f"job type {getattr(kind, 'name', kind)!r} has no forward step {number}")
    return declared[number - 1]


def enter_step(kind: object, conn: Connection, job: Job, number: int) -> None:
    """The type's owner-side DDL between steps (optional ``enter_step``), run
    in the fenced transaction that moves the job to step ``number`` (2 and on;
    step 1's is ``prepare``)."""
    hook = getattr(kind, "enter_step", None)
    if callable(hook):
        hook(conn, job, number)


def fixed_subtasks(kind: object, conn: Connection, job: Job, number: int) -> list[dict[str, Any]]:
    """The subtasks of a fixed step: one meta dict each (optional
    ``fixed_subtasks``; by default one subtask with empty meta). None at all
    is allowed: the step then ends at the owner's next look."""
    hook = getattr(kind, "fixed_subtasks", None)
    return [dict(m) for m in hook(conn, job, number)] if callable(hook) else [{}]


def steps_to_restore(kind: object, job: Job, planned: bool | Collection[int]) -> list[int]:
    """The forward steps whose progressed ranges the revert step restores, from
    what ``plan_revert`` returned: True, every step up to the job's that
    declares ``restore``; False, none; or the step numbers themselves."""
    if planned is True:
        return [n for n, step in enumerate(steps_of(kind), start=1)
                if n <= job.step and step.restore]
    if not planned:
        return []
    chosen = sorted(set(planned))  # type: ignore[arg-type]
    for number in chosen:
        if not step_named(kind, number).ranges:
            raise ValueError(f"plan_revert named step {number}, which has no ranges to restore")
    return chosen


def takes_any_key(kind: JobType) -> bool:
    """Whether the job type runs on tables keyed by anything but one integer
    column (``keys_of_any_type = True``): its SQL uses ``Job.key``, not
    integer arithmetic on keys."""
    return bool(getattr(kind, "keys_of_any_type", False))


def trigger_covers_inserts(kind: object) -> bool:
    """Whether the type's prepare installs a trigger that gives every row
    inserted from then on what the job would write to it
    (``trigger_covers_inserts = True``, e.g. add-column, alter-type). Rows
    past a range step's last catch-up range (``framework.catch_up``) are then
    not missed: they were inserted after the first round, so after prepare."""
    return bool(getattr(kind, "trigger_covers_inserts", False))


def analyses_on_owner(kind: JobType) -> bool:
    """Whether the type has checks that ``validate`` leaves to the owner."""
    return callable(getattr(kind, "analyse", None))


def analyse(kind: JobType, conn: Connection, job: Job) -> dict[str, Any]:
    """The type's ``analyse`` (optional duty); raises InvalidParams to reject."""
    return dict(kind.analyse(conn, job))  # type: ignore[attr-defined]


def describe(kind: object, conn: Connection, job: Job) -> list[str]:
    """What ``--dry-run`` prints beside the ranges (optional ``describe``),
    e.g. the DDL of each schema state; run in the rolled-back validation
    transaction, with ``job.id`` 0."""
    hook = getattr(kind, "describe", None)
    return [str(line) for line in hook(conn, job)] if callable(hook) else []


def warm_up(kind: object, job: Job | None) -> None:
    """The type's per-process start-up (optional duty), e.g. Spark's."""
    start = getattr(kind, "warm_up", None)
    if callable(start):
        start(job)


_registry: dict[str, JobType] = {}
_loaded: set[str] = set()  # entry points loaded, by name; "*": all of them
GROUP = "reorg.job_types"


def register(job_type: JobType) -> None:
    _registry[job_type.name] = job_type


def get(name: str) -> JobType:
    """The job type ``name``. Only its own entry point is imported (``reorg
    submit sql-update`` loads no Spark type), unless it registers under
    another name: then every one is."""
    if name not in _registry:
        _load_entry_points(name)
    if name not in _registry:
        _load_entry_points()
    try:
        return _registry[name]
    except KeyError:
        known = ", ".join(sorted(_registry)) or "none installed"
        raise InvalidParams(f"unknown job type {name!r}; choose one of: {known}") from None


def names() -> list[str]:
    _load_entry_points()
    return sorted(_registry)


@functools.cache
def _all_entry_points() -> Any:
    # EntryPoints, or on Python 3.11 SelectableGroups: both ``select`` alike.
    return entry_points()


def installed_entry_points(group: str) -> EntryPoints:
    """The installed entry points of ``group``. Every group is read in one scan
    of the installed distributions, once per process (tens of milliseconds
    each: most of a short command's start-up beside its imports)."""
    return _all_entry_points().select(group=group)  # type: ignore[no-any-return]


def _load_entry_points(name: str | None = None) -> None:
    """Import and call the ``reorg.job_types`` entry points (the one named
    ``name``, or all), and the ``REORG_JOB_TYPES`` specs (always all: they
    carry no names); each once per process."""
    if "*" in _loaded:
        return
    for ep in installed_entry_points(GROUP):
        if (name is None or ep.name == name) and ep.name not in _loaded:
            _loaded.add(ep.name)
            ep.load()()
    if "env" not in _loaded:
        _loaded.add("env")
        for spec in filter(None, os.environ.get("REORG_JOB_TYPES", "").split(",")):
            module, _, function = spec.strip().partition(":")
            getattr(importlib.import_module(module), function or "register")()
    if name is None:
        _loaded.add("*")
