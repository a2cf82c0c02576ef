"""A held subtask as its job type sees it (``SubtaskContext``), and the one
place a batch is committed.

A job type writes one batch at a time: given a connection in a transaction,
it writes the batch that starts at ``ctx.curr_key`` and returns a ``Batch``
(where the subtask resumes after it, the rows it scanned). Everything else
is here, the same for every job type:

- the commit (``SubtaskContext.commit``): the batch's write and its fenced
  checkpoint in one transaction (DESIGN 3). The checkpoint is a conditional
  UPDATE of the subtask on ``(id, exec_id, epoch)`` with the lease unexpired
  (DESIGN 2, ``SubtaskContext.fence``); when it hits no row the lease is
  lost: it raises LeaseLost inside the transaction, so the batch's write
  rolls back with it and the subtask stops. A zombie (paused, partitioned)
  can never commit. ``curr_key`` moves only once the commit returned, and
  never backward (DESIGN 6: the statement refuses it);
- the loop (``run_batches``) and one step of it (``run_batch``): stop
  between batches (pause, drain: a soft stop lets the open batch commit),
  cancel the open batch's statement at once on a hard stop (lease lost,
  cancel), pace by the job's rows/s limit and its health throttles;
- first batches of several quick subtasks in one transaction
  (``commit_first_batches``), checkpointed by one statement fenced row by row.

::

    run_batches ─► [stop? ─► health ─► BEGIN ─► write(conn) ─► checkpoint
                    (fenced) ─► COMMIT ─► count ─► pace] until end_key
                                   │ 0 rows: lease lost ─► ROLLBACK, stop
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NoReturn

from framework import faults, metrics
from framework.errors import LeaseLost, Stopped
from framework.records import Job

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

    from framework.store.subtasks import Checkpointed

log = logging.getLogger("reorg.worker")

LEASE_LOST = "lease lost"


@dataclass(frozen=True)
class Batch:
    """What a job type's batch did: the subtask resumes at ``next_key`` (the
    batch covered ``[curr_key, next_key)``; a fixed step's units), having
    scanned ``rows`` rows; ``meta`` replaces the subtask's meta (None: kept)."""

    next_key: Any
    rows: int
    meta: dict[str, Any] | None = None


# Writes one batch from ``ctx.curr_key`` on the connection, in the caller's
# transaction, without committing it; returns what it did.
WriteBatch = Callable[["Connection"], Batch]
# The fenced checkpoint of a batch, in the batch's transaction: the subtask's
# state after it, or None when the lease is lost (the worker's is
# ``framework.store.subtasks.checkpoint``).
Fence = Callable[["Connection", "SubtaskContext", Batch], "Checkpointed | None"]


@dataclass
class SubtaskContext:
    """What a worker hands a job type to run one subtask."""

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
    # Where batches run: the worker's pooled connections to the database.
    engine: Engine
    fence: Fence
    stop_event: threading.Event = field(default_factory=threading.Event)
    # Reason the subtask must stop ('lease lost', 'job pausing', ...); set with stop_event.
    stop_reason: list[str] = field(default_factory=list)
    # The job type's own notes between the batches of this run (e.g. how
    # dense the last batch's keys were); never stored, gone with the claim.
    batch_state: dict[str, Any] = field(default_factory=dict)
    # Set by the checkpoint that reached end_key: it finished the subtask too.
    finished: bool = False
    # What this run committed: its batches and their rows.
    rows: int = 0
    batches: int = 0
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
    _on_stop: list[Callable[[], None]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _hard: bool = False
    # Rows booked on the schedule before the first batch ran
    # (``book_first_batch``), not booked again after it.
    _prebooked: int = 0
    # Set by a stop and by a change of the job's rate limit (``retune``): a
    # slot waiting its turn on the rate schedule (``_pace``) looks again.
    _pacing_woken: threading.Event = field(default_factory=threading.Event)

    # --- batches -----------------------------------------------------------

    def run_batches(self, write: WriteBatch) -> None:
        """Run ``write`` batch after batch until the range is done."""
        while self.curr_key != self.end_key:
            self.run_batch(write)

    def run_batch(self, write: WriteBatch) -> Batch:
        """One batch of the loop: stop if asked to, commit it, then pace the
        next one by the job's limits."""
        self.raise_if_stopped()
        started = time.monotonic()
        batch = self.commit(write)
        self.throttle(batch.rows, time.monotonic() - started)
        return batch

    def commit(self, write: WriteBatch, *, on: Connection | None = None) -> Batch:
        """``write`` and its fenced checkpoint in one transaction (DESIGN 3),
        on a pooled connection or ``on`` (a session of the caller's, e.g. a
        long statement's); a hard stop cancels its statement. Raises
        LeaseLost, the transaction rolled back, when the checkpoint is
        refused. Also the way a fixed step's subtask records progress or
        its end: a write of nothing, ``Batch(units, 0)``."""
        # Timed from the connection's checkout to the commit: the batch's own
        # work, never the pacing and throttle waits between batches (``throttle``).
        started, refused = time.monotonic(), False
        try:
            with self._transaction(on) as conn, self.cancel_on_stop(conn):
                batch = write(conn)
                faults.hit("worker.before_checkpoint")
                done = self.fence(conn, self, batch)
                if done is None:
                    refused = True
                    self._refused()
                faults.hit("worker.after_checkpoint")
        except Exception:
            if not refused:  # else counted as refused
                metrics.batch(self.job.id, self.job.type, "rolled_back")
            raise
        faults.hit("worker.after_commit")
        self._committed(batch, done, time.monotonic() - started)
        return batch

    @contextlib.contextmanager
    def _transaction(self, on: Connection | None) -> Iterator[Connection]:
        if on is None:
            with self.engine.begin() as conn:
                yield conn
        else:
            with on.begin():
                yield on

    def _refused(self) -> NoReturn:
        """The checkpoint hit no row: the lease is lost; the batch rolls back."""
        metrics.batch(self.job.id, self.job.type, "refused")
        self.lose("checkpoint_refused")
        raise LeaseLost(f"subtask {self.subtask_id} epoch {self.epoch}: checkpoint refused")

    def _committed(self, batch: Batch, done: Checkpointed, seconds: float) -> None:
        """The batch committed in ``seconds`` (its transaction, no pacing wait)."""
        metrics.batch(self.job.id, self.job.type, "committed", batch.rows, seconds)
        self.rows += batch.rows
        self.batches += 1
        self.curr_key = batch.next_key
        if batch.meta is not None:
            self.meta = batch.meta
        self.finished = done.state == "succeeded"
        if done.running is not None:
            # The job's rate budget is split among the subtasks running it:
            # fresh with every batch, so a budget shared with other nodes holds.
            self.job = replace(self.job, running=done.running)

    # --- pacing --------------------------------------------------------------

    def throttle(self, rows: int, took_seconds: float) -> None:
        """Pace batches so the job delivers ``max_rows_per_sec`` in all
        (``rate_gate``); then wait while the job's health limits hold it.
        Wakes early when the subtask must stop. The ``worker.after_batch``
        fault point."""
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

    # --- stopping ------------------------------------------------------------

    def should_stop(self) -> bool:
        return self.stop_event.is_set()

    def raise_if_stopped(self) -> None:
        if self.stop_event.is_set():
            reason = self.stop_reason[0] if self.stop_reason else "stopped"
            raise LeaseLost(reason) if reason == LEASE_LOST else Stopped(reason)

    def lose(self, reason: str) -> None:
        """The lease is lost (``reason``: how it was found): stop hard.
        Counted once per subtask."""
        if LEASE_LOST not in self.stop_reason:
            metrics.lease_lost(reason)
        self.stop(LEASE_LOST, hard=True)

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


# The fenced checkpoint of several subtasks' batches in one statement: the
# state of each one checkpointed, by subtask id; one missing has lost its
# lease (the worker's is ``framework.store.subtasks.checkpoint``).
FenceMany = Callable[["Connection", list[tuple["SubtaskContext", Batch]]],
                     "dict[int, Checkpointed]"]


@dataclass
class FirstBatches:
    """What ``commit_first_batches`` did with each subtask of its group."""

    lost: list[SubtaskContext] = field(default_factory=list)  # fenced out: never committed
    finished: list[SubtaskContext] = field(default_factory=list)  # done by their first batch
    left: list[SubtaskContext] = field(default_factory=list)  # to run on their own


class _GroupFenced(Exception):
    """Some subtasks of a grouped transaction were fenced out: roll it back."""


def commit_first_batches(group: list[SubtaskContext],
                         write: Callable[[SubtaskContext, Connection], Batch],
                         fence_many: FenceMany) -> FirstBatches:
    """The first batch of each subtask of ``group`` (one job's quick subtasks,
    claimed together) in one transaction, checkpointed by one statement
    fenced row by row: one commit where each would take its own. A subtask
    found fenced out rolls the whole transaction back (its write must not
    commit, DESIGN 3): it is dropped as lost, and the others' batches run
    again without it. Subtasks asked to stop, those a batch did not finish,
    and all of them if a batch failed (each failure is then told apart on
    its own) are ``left``."""
    outcome = FirstBatches()
    todo = list(group)
    while todo:
        # Each subtask's stop flag read once a pass: one raised between two
        # reads would leave it in neither list.
        stopping = [ctx.should_stop() for ctx in todo]
        outcome.left += [ctx for ctx, stop in zip(todo, stopping, strict=True) if stop]
        todo = [ctx for ctx, stop in zip(todo, stopping, strict=True) if not stop]
        if not todo:
            break
        started, running = time.monotonic(), len(todo)
        metrics.RUNNING.inc(running)
        try:
            with todo[0].engine.begin() as conn:
                batches = []
                for ctx in todo:
                    faults.hit("worker.after_claim")
                    with ctx.cancel_on_stop(conn):
                        batches.append((ctx, write(ctx, conn)))
                    faults.hit("worker.before_checkpoint")
                states = fence_many(conn, batches)
                lost = [ctx for ctx in todo if ctx.subtask_id not in states]
                if lost:
                    raise _GroupFenced()  # rolls back every batch of the group
        except _GroupFenced:
            for ctx in lost:
                metrics.batch(ctx.job.id, ctx.job.type, "refused")
                ctx.lose("checkpoint_refused")
            outcome.lost += lost
            todo = [ctx for ctx in todo if ctx not in lost]
            continue
        except Exception as exc:
            log.debug("grouped batches rolled back, running them alone: %s", exc)
            outcome.left += todo
            return outcome
        finally:
            metrics.RUNNING.dec(running)
        took = (time.monotonic() - started) / len(todo)  # each batch's share of the transaction
        for ctx, batch in batches:
            ctx._committed(batch, states[ctx.subtask_id], took)
            faults.hit("worker.after_checkpoint")
            ctx.throttle(batch.rows, took)
            (outcome.finished if ctx.finished else outcome.left).append(ctx)
        return outcome
    return outcome
