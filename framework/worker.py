"""The worker pool: N slots that claim subtasks, run them, and keep their
leases renewed on a connection of their own.

A slot's life for one subtask::

    claim (epoch+1) ─► run_subtask: [batch write + fenced checkpoint] * n ─► finish
         │                 │ lease lost / cancel ─► hard stop: abandon batch
         │                 │ pause / drain       ─► soft stop: batch commits, release
         │                 │ retryable error     ─► back to pending after backoff
         └─────────────────┴ other error         ─► subtask failed ─► job rolls back
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import NoReturn

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from framework import faults, jobtype, leases, metrics
from framework.db import Database
from framework.errors import is_retryable, is_stale_plan, one_line
from framework.jobtype import (
    LEASE_LOST,
    STEP_REVERT,
    FencedBatch,
    InlineCheckpoint,
    LeaseLost,
    Stopped,
    SubtaskContext,
)
from framework.keys import Key, encode
from framework.states import JobState
from framework.store import jobs, subtasks
from framework.store.subtasks import Claim
from framework.throttle import HealthMonitor, has_health_limits

log = logging.getLogger("reorg.worker")

_HARD_STOP_STATES = {JobState.CANCELLING, JobState.FAILED, JobState.REVERTING}
_SOFT_STOP_STATES = {JobState.PAUSING, JobState.PAUSED}


@dataclass
class _Tally:
    """What one subtask did on this worker, counted as its batches commit."""

    started: float  # monotonic
    mark: float  # monotonic time of the start or the last committed batch
    rows: int = 0
    batches: int = 0


@dataclass
class _Held:
    claim: Claim
    ctx: SubtaskContext
    renewed_at: float  # monotonic time the last successful renewal was sent
    tally: _Tally
    # Set while the subtask's batch runs in a transaction shared with other
    # subtasks of its claim: its checkpoint is then kept here and written for
    # all of them by one fenced statement before the commit.
    grouped: bool = False
    deferred: subtasks.BatchDone | None = None


class _GroupFenced(Exception):
    """Some subtasks of a grouped transaction were fenced out: roll it back."""

    def __init__(self, lost: list[_Held]) -> None:
        super().__init__(f"{len(lost)} subtasks fenced out")
        self.lost = lost


@dataclass
class SlotResult:
    """What one slot did with one subtask; tests read it."""

    subtask_id: int
    outcome: str  # succeeded | released | lost | retry | failed
    error: str | None = None
    # Batches this run committed, their rows, and the run's seconds (set by run_claimed).
    rows: int = 0
    batches: int = 0
    seconds: float = 0.0


@dataclass
class WorkerPool:
    db: Database
    node_id: str
    slots: int
    clock: Callable[[], float] = time.monotonic
    # The latest outcomes, for tests; bounded so a long-lived worker does not grow.
    results: deque[SlotResult] = field(default_factory=lambda: deque(maxlen=10_000))

    def __post_init__(self) -> None:
        self._wake = threading.Event()
        self._draining = threading.Event()
        self._held: dict[int, _Held] = {}
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        # One health reading per interval for the whole node (throttle.py).
        self.health = HealthMonitor(self.db, clock=self.clock)

    # --- lifecycle ------------------------------------------------------

    def start(self) -> None:
        for i in range(self.slots):
            t = threading.Thread(target=self._slot_loop, name=f"slot-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def wake(self) -> None:
        self._wake.set()

    def drain(self, timeout: float) -> None:
        """Stop claiming; let each slot finish its batch and release its subtask."""
        self._draining.set()
        self._wake.set()
        with self._lock:
            held = list(self._held.values())
        for h in held:
            h.ctx.stop("node draining", hard=False)
        deadline = self.clock() + timeout
        for t in self._threads:
            t.join(max(deadline - self.clock(), 0.1))

    def busy(self) -> int:
        with self._lock:
            return len(self._held)

    # --- lease renewal (its own connection, every ttl/3) ------------------

    def renew_leases(self) -> None:
        with self._lock:
            held = list(self._held.values())
        if not held:
            return
        sent = self.clock()
        try:
            with self.db.connect(isolation_level="AUTOCOMMIT") as conn:  # one statement
                alive = subtasks.renew(self.db, conn, [h.claim for h in held])
        except Exception as exc:
            log.warning("lease renewal failed: %s", one_line(exc))
            self.expire_untrusted()
            return
        for h in held:
            info = alive.get(h.claim.id)
            if info is None and h.ctx.finished:
                continue  # its last batch finished it just now
            if info is None:
                log.warning("lost lease on subtask %s", h.claim.id,
                            extra={"job_id": h.claim.job_id, "subtask_id": h.claim.id})
                self._lose(h.ctx, "renewal_refused")
                continue
            h.renewed_at = sent
            # Knob changes (`reorg alter`) reach the running subtask here
            # (at once: the alter's NOTIFY makes the node renew now).
            h.ctx.retune(replace(h.ctx.job, batch_rows=info["batch_rows"],
                                 max_rows_per_sec=info["max_rows_per_sec"],
                                 concurrency=info["concurrency"], running=info["running"],
                                 max_replica_lag=info["max_replica_lag"],
                                 max_active_sessions=info["max_active_sessions"]))
            state = JobState(info["job_state"])
            if state is JobState.REVERTING and h.claim.job.step == STEP_REVERT:
                continue  # a revert subtask: reverting is its job's running state
            if state in _HARD_STOP_STATES:
                h.ctx.stop(f"job {state}", hard=True)
            elif state in _SOFT_STOP_STATES:
                h.ctx.stop(f"job {state}", hard=False)

    def expire_untrusted(self) -> None:
        """Watchdog, run often and never touching the database: a renewal can
        hang (partition), so the pool must notice on its own clock that a lease
        is no longer trusted and abandon the work before others may claim it."""
        ttl = self.db.settings.lease_seconds
        with self._lock:
            held = list(self._held.values())
        for h in held:
            if not leases.still_trusted(h.renewed_at, self.clock(), ttl):
                self._lose(h.ctx, "untrusted")

    @staticmethod
    def _lose(ctx: SubtaskContext, reason: str) -> None:
        """Stop a subtask whose lease is lost; counted once per subtask."""
        if LEASE_LOST not in ctx.stop_reason:
            metrics.lease_lost(reason)
        ctx.stop(LEASE_LOST, hard=True)

    # --- slots ----------------------------------------------------------

    def _slot_loop(self) -> None:
        size = ClaimSize()
        while not self._draining.is_set():
            try:
                ran = self.run_claimed(size)
            except Exception as exc:  # the database may be briefly away; keep the slot alive
                log.warning("claim failed: %s", one_line(exc))
                ran = False
            if not ran:
                self._wake.wait(self.db.settings.poll_seconds)
                self._wake.clear()

    def run_one(self) -> bool:
        """Claim and run one subtask; False when there was nothing to claim."""
        return self.run_claimed(ClaimSize(limit=1))

    def run_claimed(self, size: ClaimSize) -> bool:
        """Claim as many subtasks as ``size`` says and run them one after
        another; False when there was nothing to claim. Quick subtasks are
        claimed several at a time (one claim statement for many); the claimed
        ones wait under live leases, renewed with the running one. Of a job
        type with ``run_batch``, the first batches of a claim's subtasks run
        in one transaction (``_run_grouped``)."""
        if self._draining.is_set():
            return False
        sent = self.clock()
        # The claim is one statement, a transaction by itself: in autocommit it
        # is one round trip instead of three (BEGIN, claim, COMMIT).
        with self.db.connect(isolation_level="AUTOCOMMIT") as conn:
            limit, sized_job = size.next()
            claims = subtasks.claim(self.db, conn, self.node_id, limit, sized_job)
        if not claims:
            return False
        held = [self._hold(claim, sent) for claim in claims]
        try:
            for _, same_job in itertools.groupby(held, key=lambda h: h.claim.job_id):
                group = list(same_job)
                if len(group) > 1 and self._groupable(group[0].ctx):
                    group = self._run_grouped(group, size)
                for h in group:
                    self._run_alone(h, size)
        finally:
            with self._lock:
                for claim in claims:
                    self._held.pop(claim.id, None)
        return True

    @staticmethod
    def _groupable(ctx: SubtaskContext) -> bool:
        # A rate-limited job paces every batch on its own (ctx.throttle), a
        # health-limited one checks the database before its first batch; a
        # revert subtask restores (revert_subtask), it never runs forward.
        return (ctx.job.step != STEP_REVERT and not ctx.job.max_rows_per_sec
                and not has_health_limits(ctx.job)
                and jobtype.batch_runner(jobtype.get(ctx.job.type), ctx.job.step) is not None)

    def _run_alone(self, h: _Held, size: ClaimSize) -> None:
        h.tally.started = h.tally.mark = self.clock()
        metrics.RUNNING.inc()
        try:
            result = self._run(h.claim, h.ctx)
        finally:
            metrics.RUNNING.dec()
        self._record(h, result, self.clock() - h.tally.started, size)

    def _run_grouped(self, group: list[_Held], size: ClaimSize) -> list[_Held]:
        """Run the first batch of each subtask of ``group`` (one job, claimed
        together) in one transaction, checkpointed by one fenced statement.
        A subtask found fenced out rolls the transaction back (its write must
        not commit, DESIGN 3): it is dropped as lost and the others' batches
        run again. Returns the subtasks left to run alone: those a batch did
        not finish, those asked to stop, and all of them if a batch failed
        (alone, each failure is told apart and handled)."""
        run_batch = jobtype.batch_runner(jobtype.get(group[0].claim.job.type),
                                         group[0].claim.job.step)
        assert run_batch is not None
        # Subtasks asked to stop, from every pass: each goes on to run alone,
        # where it is handed back at once (``_run``), not left under a lease
        # nobody renews. Each is looked at once per pass: a stop arriving
        # between two looks must not leave it in neither list.
        stopped: list[_Held] = []
        todo = list(group)
        while todo:
            going_on = [h for h in todo if not h.ctx.should_stop()]
            stopped += [h for h in todo if h not in going_on]
            todo = going_on
            if not todo:
                return stopped
            started = self.clock()
            metrics.RUNNING.inc(len(todo))
            try:
                with self.db.begin() as conn:
                    for h in todo:
                        h.grouped, h.deferred = True, None
                        faults.hit("worker.after_claim")
                        run_batch(h.ctx, conn)
                    done = [h.deferred for h in todo if h.deferred is not None]
                    states = subtasks.checkpoint_many(self.db, conn, done)
                    lost = [h for h in todo if h.deferred and h.claim.id not in states]
                    if lost:
                        raise _GroupFenced(lost)  # rolls back every batch of the group
            except _GroupFenced:
                pass
            except Exception as exc:
                log.debug("grouped batches rolled back, running them alone: %s", one_line(exc))
                return stopped + todo
            finally:
                metrics.RUNNING.dec(len(todo))
                for h in todo:
                    h.grouped = False
            if lost:
                for h in lost:
                    metrics.batch(h.claim.job_id, h.claim.job.type, "refused")
                    self._lose(h.ctx, "checkpoint_refused")
                    self._record(h, SlotResult(h.claim.id, "lost", "checkpoint refused"),
                                 self.clock() - started, size)
                todo = [h for h in todo if h not in lost]
                continue
            took = self.clock() - started
            share = took / len(todo)
            left = stopped
            for h in todo:
                if h.deferred is not None:
                    h.ctx.curr_key = h.deferred.curr_key
                    h.ctx.finished = states[h.claim.id] == "succeeded"
                    h.tally.rows, h.tally.batches = h.deferred.rows, 1
                    metrics.batch(h.claim.job_id, h.claim.job.type, "committed",
                                  h.deferred.rows, share)
                    faults.hit("worker.after_checkpoint")
                    # What a job type does after each committed batch of its own.
                    h.ctx.throttle(h.deferred.rows, share)
                if h.ctx.finished:
                    self._record(h, SlotResult(h.claim.id, "succeeded"), share, size)
                else:
                    left.append(h)
            return left
        return stopped

    def _record(self, h: _Held, result: SlotResult, took: float, size: ClaimSize) -> None:
        """The subtask is done with on this worker: count it and log one line."""
        claim = h.claim
        with self._lock:
            self._held.pop(claim.id, None)
        size.observe(claim.job_id, took)
        result = replace(result, rows=h.tally.rows, batches=h.tally.batches, seconds=took)
        self.results.append(result)
        metrics.subtask(claim.job.type, result.outcome)
        log.info("subtask %s (job %s): %s, %d rows in %d batches, %.2fs%s",
                 claim.id, claim.job_id, result.outcome, result.rows, result.batches,
                 took, f" ({result.error})" if result.error else "",
                 extra={"job_id": claim.job_id, "subtask_id": claim.id,
                        "job_type": claim.job.type, "outcome": result.outcome,
                        "rows": result.rows, "batches": result.batches,
                        "seconds": round(took, 3)})

    def _hold(self, claim: Claim, renewed_at: float) -> _Held:
        tally = _Tally(started=renewed_at, mark=renewed_at)
        # The context's callbacks reach the _Held through a weak reference:
        # a strong one would make each subtask a reference cycle (held ->
        # ctx -> callback -> held), freed only by the garbage collector,
        # whose sweeps were a fifth of a busy worker's CPU. The claim's
        # caller keeps the _Held alive while the subtask runs.
        ctx = SubtaskContext(
            job=claim.job, subtask_id=claim.id, start_key=claim.start_key,
            end_key=claim.end_key, curr_key=claim.curr_key, epoch=claim.epoch,
            meta=dict(claim.meta),
            checkpoint=lambda conn, key, rows, meta=None: self._on_checkpoint(
                _alive(held_ref), conn, key, rows, meta),
            stop_event=threading.Event(), health_gate=self.health.hold,
            rate_gate=lambda rows, took: self._reserve_rate(claim.job_id, rows, took),
            inline_checkpoint=lambda key_sql, rows_sql: self._inline_checkpoint(
                _alive(held_ref), key_sql, rows_sql),
            fenced_batch=lambda: self._fenced_batch(_alive(held_ref)),
        )
        held = _Held(claim, ctx, renewed_at, tally)
        held_ref = weakref.ref(held)
        with self._lock:
            self._held[claim.id] = held
        return held

    def _run(self, claim: Claim, ctx: SubtaskContext) -> SlotResult:
        try:
            # A claimed subtask may have waited behind others of its claim: a
            # pause, cancel or drain meanwhile hands it back before it starts.
            ctx.raise_if_stopped()
            faults.hit("worker.after_claim")
            ctx.wait_for_health()
            ctx.book_first_batch()
            try:
                ctx.raise_if_stopped()
                jobtype.run_step(jobtype.get(ctx.job.type), ctx, self.db.engine)
            finally:
                ctx.return_unused_booking()
            if ctx.finished:  # the last checkpoint finished it, in the batch's transaction
                return SlotResult(claim.id, "succeeded")
            ctx.raise_if_stopped()
            with self.db.begin() as conn:
                if subtasks.finish_if_held(self.db, conn, claim):
                    return SlotResult(claim.id, "succeeded")
            return SlotResult(claim.id, "lost", "finish refused: lease lost or range not done")
        except Exception as exc:
            return self._after_error(claim, ctx, exc)

    def _after_error(self, claim: Claim, ctx: SubtaskContext, exc: Exception) -> SlotResult:
        # A stop may surface as any error (a cancelled query, a cancelled Spark
        # job): the stop reason, not the error, says what happened.
        reason = ctx.stop_reason[0] if ctx.stop_reason else None
        if isinstance(exc, LeaseLost) or reason == LEASE_LOST:
            return SlotResult(claim.id, "lost", one_line(exc))
        error = one_line(exc)
        with self.db.begin() as conn:
            if isinstance(exc, Stopped) or reason is not None:
                outcome, held = "released", subtasks.release_if_held(self.db, conn, claim)
                error = reason or error
            elif is_stale_plan(exc):
                # The table's shape changed under a statement prepared before
                # (framework.db replaces the connections): nothing is wrong
                # with the subtask, so it goes back at once, its attempt
                # given back, and runs again on fresh connections.
                log.info("subtask %s: %s; running it again on fresh connections",
                         claim.id, error, extra={"job_id": claim.job_id, "subtask_id": claim.id})
                outcome, held = "retry", subtasks.release_if_held(self.db, conn, claim)
            elif (is_retryable(exc) and claim.attempts < self.db.settings.max_attempts
                  # A revert never fails: it is retried (past its last attempt,
                  # after the owner's longer backoff) until the table is restored.
                  or claim.job.step == STEP_REVERT):
                backoff = leases.retry_backoff(
                    claim.attempts, self.db.settings.retry_backoff_seconds)
                outcome, held = "retry", subtasks.retry_later_if_held(self.db, conn, claim, error, backoff)
            else:
                log.error("subtask %s failed: %s", claim.id, error, exc_info=exc,
                          extra={"job_id": claim.job_id, "subtask_id": claim.id})
                outcome = "failed"
                held = subtasks.fail_if_held(self.db, conn, claim, f"attempt {claim.attempts}: {error}")
        # Every one of those writes is fenced: 0 rows means another worker has
        # the subtask now, and whatever this one was doing is void.
        return SlotResult(claim.id, outcome if held else "lost", error)

    def _reserve_rate(self, job_id: int, rows: int, took: float) -> float | None:
        """Seconds this slot waits so that the job keeps its rows/s limit
        (``jobs.reserve_rate``); the statement is one transaction by itself."""
        with self.db.connect(isolation_level="AUTOCOMMIT") as conn:
            return jobs.reserve_rate(self.db, conn, job_id, rows, took)

    def _on_checkpoint(self, h: _Held, conn: Connection, key: Key, rows: int,
                       meta: dict | None) -> None:
        if h.grouped:  # written with the group's, before its commit (_run_grouped)
            faults.hit("worker.before_checkpoint")
            h.deferred = subtasks.BatchDone(h.claim, key, rows, meta)
            return
        self._checkpoint(h.ctx, h.claim, h.tally, conn, key, rows, meta)

    def _checkpoint(self, ctx: SubtaskContext, claim: Claim, tally: _Tally, conn: Connection,
                    key: Key, rows: int, meta: dict | None) -> None:
        faults.hit("worker.before_checkpoint")
        # Counting the job's running subtasks costs an index walk per batch:
        # only a job with a rate limit needs it.
        done = subtasks.checkpoint(self.db, conn, claim, key, rows, meta,
                                   count_running=bool(ctx.job.max_rows_per_sec))
        self._checkpointed(ctx, claim, tally, conn, key, rows, done)

    @staticmethod
    def _checkpoint_in_statement(h: _Held) -> bool:
        """Whether the batch's own statement may write its checkpoint: not a
        batch whose checkpoint is the group's, nor a rate-limited job's (its
        checkpoint counts the running subtasks). Where it may, the statement
        that writes both is next (the ``worker.before_checkpoint`` point)."""
        if h.grouped or h.ctx.job.max_rows_per_sec:
            return False
        faults.hit("worker.before_checkpoint")
        return True

    def _inline_checkpoint(self, h: _Held, key_sql: str, rows_sql: str) -> InlineCheckpoint | None:
        """The checkpoint for the batch's own statement (``SubtaskContext.
        inline_checkpoint``); None for a batch whose checkpoint is the
        group's, or a rate-limited job's (its checkpoint counts the running
        subtasks)."""
        if not self._checkpoint_in_statement(h):
            return None
        sql, params = subtasks.checkpoint_in_statement(self.db, h.claim, key_sql, rows_sql)

        def done(conn: Connection, key: Key, rows: int, state: str | None) -> None:
            self._checkpointed(h.ctx, h.claim, h.tally, conn, key, rows,
                               None if state is None else subtasks.Checkpointed(state, None))

        return InlineCheckpoint(sql, params, done)

    def _fenced_batch(self, h: _Held) -> FencedBatch | None:
        """The batch and its checkpoint as one statement (``SubtaskContext.
        fenced_batch``); None where ``_inline_checkpoint`` would be."""
        if not self._checkpoint_in_statement(h):
            return None
        call, params = subtasks.fenced_batch(self.db, h.claim)

        def run(conn: Connection, batch: str, lo: Key, hi: Key) -> int:
            try:
                written, state = conn.execute(self.db.sql(call), {
                    **params, "batch": batch, "lo": lo, "hi": hi, "new_key": encode(hi)}).one()
            except sa.exc.DBAPIError as exc:
                if getattr(exc.orig, "sqlstate", None) == subtasks.LEASE_LOST_SQLSTATE:
                    self._refused(h.ctx, h.claim, exc)
                raise
            self._checkpointed(h.ctx, h.claim, h.tally, conn, hi, int(written),
                               subtasks.Checkpointed(state, None), committed=True)
            return int(written)

        return FencedBatch(run)

    def _refused(self, ctx: SubtaskContext, claim: Claim,
                 error: Exception | None = None) -> NoReturn:
        """The batch's checkpoint was refused: the lease is lost, and the
        batch rolls back (or has, with the statement that raised ``error``)."""
        metrics.batch(claim.job_id, claim.job.type, "refused")
        self._lose(ctx, "checkpoint_refused")
        raise LeaseLost(f"subtask {claim.id} epoch {claim.epoch}: checkpoint refused") from error

    def _checkpointed(self, ctx: SubtaskContext, claim: Claim, tally: _Tally, conn: Connection,
                      key: Key, rows: int, done: subtasks.Checkpointed | None, *,
                      committed: bool = False) -> None:
        """After the fenced checkpoint statement (``done``: what it returned;
        None: 0 rows, the lease is lost and the batch must roll back).
        ``committed``: the statement was a transaction by itself, and has
        committed."""
        if done is None:
            self._refused(ctx, claim)
        if committed:
            self._count(claim, tally, rows)
        else:
            self._count_when_done(conn, claim, tally, rows)
        ctx.curr_key = key
        # Done once the batch's transaction commits; until then a failure
        # rolls the finish back with the batch.
        ctx.finished = done.state == "succeeded"
        if ctx.finished and subtasks.none_pending(self.db, conn, claim):
            # One of the job's last subtasks: wake the owner (at commit) to
            # advance it now rather than at its next tick, up to a second later.
            jobs.notify(self.db, conn)
        if done.running is not None:
            # The job's rate budget is split among the subtasks running it: fresh
            # with every batch, so a budget shared with other nodes holds.
            ctx.job = replace(ctx.job, running=done.running)
        faults.hit("worker.after_checkpoint")

    def _count_when_done(self, conn: Connection, claim: Claim, tally: _Tally,
                         rows: int) -> None:
        """Count the batch when its transaction ends: its rows once it commits
        (the commit event fires as the commit is sent), a roll-back as such.
        Each batch has a connection of its own, so the listeners go with it."""

        def committed(_conn: Connection) -> None:
            self._count(claim, tally, rows)

        def rolled_back(_conn: Connection) -> None:
            metrics.batch(claim.job_id, claim.job.type, "rolled_back")

        sa.event.listen(conn, "commit", committed, once=True)
        sa.event.listen(conn, "rollback", rolled_back, once=True)

    def _count(self, claim: Claim, tally: _Tally, rows: int) -> None:
        """A committed batch of ``rows``: in the metrics and the subtask's tally."""
        now = self.clock()
        metrics.batch(claim.job_id, claim.job.type, "committed", rows, now - tally.mark)
        tally.mark, tally.rows, tally.batches = now, tally.rows + rows, tally.batches + 1


def _alive(ref: weakref.ref[_Held]) -> _Held:
    """The subtask's _Held, while its slot runs it; a callback called after
    the slot let go of it (a job type's straggling thread) finds the lease
    given up."""
    held = ref()
    if held is None:
        raise LeaseLost("the subtask is no longer held by this slot")
    return held


class ClaimSize:
    """How many subtasks a slot claims at once: about ``CLAIM_SECONDS`` of
    work by the recent run times of one job's subtasks (one subtask when they
    take that long or longer, so the other slots and workers are not kept
    waiting at the job's end while this slot works through a pile of held
    ones; up to ``limit`` of quick ones, whose run is as short as a claim's
    round trip). The size is that job's alone: another job gives
    one subtask a claim until one of its own has been timed (a worker that
    had just run a job of quick subtasks took a pile of the next job's long
    ones at once)."""

    CLAIM_SECONDS = 0.1

    def __init__(self, limit: int = 32) -> None:
        self.limit = limit
        self.job_id: int | None = None  # the job whose subtasks were timed
        self.seconds: float | None = None  # moving average of their run times

    def next(self) -> tuple[int, int | None]:
        """How many subtasks to claim of the job ``job_id`` (one of any other)."""
        if self.seconds is None:
            return 1, None
        return (max(1, min(self.limit, int(self.CLAIM_SECONDS / max(self.seconds, 1e-3)))),
                self.job_id)

    def observe(self, job_id: int, seconds: float) -> None:
        if job_id != self.job_id or self.seconds is None:
            self.job_id = job_id
            self.seconds = seconds
            return
        self.seconds = 0.8 * self.seconds + 0.2 * seconds
