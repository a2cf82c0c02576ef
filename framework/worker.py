"""The worker pool: N slots that claim subtasks, run them, and keep their
leases renewed on a connection of their own.

A slot's life for one subtask::

    claim (epoch+1) ─► run_subtask: [batch write + fenced checkpoint] * n ─► finish
         │                 │ lease lost / cancel ─► hard stop: abandon batch
         │                 │ pause / drain       ─► soft stop: batch commits, release
         │                 │ NotReady            ─► waiting: back to pending, claimable after its wait
         │                 │ retryable error     ─► back to pending after backoff
         └─────────────────┴ other error         ─► subtask failed ─► job rolls back
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from sqlalchemy.engine import Connection

from framework import faults, jobtype, leases, metrics
from framework.db import Database
from framework.errors import LeaseLost, NotReady, Stopped, is_retryable, is_stale_plan, one_line
from framework.records import STEP_REVERT
from framework.states import JobState
from framework.store import jobs, subtasks
from framework.store.subtasks import Claim
from framework.subtask import LEASE_LOST, Batch, SubtaskContext, commit_first_batches
from framework.throttle import HealthMonitor, has_health_limits

log = logging.getLogger("reorg.worker")

_HARD_STOP_STATES = {JobState.CANCELLING, JobState.FAILED, JobState.REVERTING}
_SOFT_STOP_STATES = {JobState.PAUSING, JobState.PAUSED}


@dataclass
class _Held:
    claim: Claim
    ctx: SubtaskContext
    renewed_at: float  # monotonic time the last successful renewal was sent
    started: float  # monotonic time its run started


@dataclass
class SlotResult:
    """What one slot did with one subtask; tests read it."""

    subtask_id: int
    outcome: str  # succeeded | released | waiting | lost | retry | failed
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
        self.health = HealthMonitor(self.db, clock=self.clock, on_lags=metrics.replica_lag)

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
            with self.db.connect(isolation_level="AUTOCOMMIT") as conn:
                alive = subtasks.renew(self.db, conn, [h.claim for h in held])
                # A subtask a commit finished while the renewal waited on its
                # row is not renewed, and its slot may not know yet (the
                # commit has not returned): not a lost lease.
                unrenewed = [h.claim for h in held
                             if h.claim.id not in alive and not h.ctx.finished]
                finished = subtasks.finished_of(self.db, conn, unrenewed)
        except Exception as exc:
            log.warning("lease renewal failed: %s", one_line(exc))
            self.expire_untrusted()
            return
        for h in held:
            info = alive.get(h.claim.id)
            if info is None and (h.ctx.finished or h.claim.id in finished):
                continue  # its last batch (or its finish) finished it just now
            if info is None:
                log.warning("lost lease on subtask %s", h.claim.id,
                            extra={"job_id": h.claim.job_id, "subtask_id": h.claim.id})
                h.ctx.lose("renewal_refused")
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
                h.ctx.lose("untrusted")

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
        type that writes batches (``JobType.write_batch``), the first batches of a claim's subtasks run
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
                and jobtype.get(ctx.job.type).batch_writer(ctx.job.step) is not None)

    def _run_alone(self, h: _Held, size: ClaimSize) -> None:
        h.started = self.clock()
        metrics.RUNNING.inc()
        try:
            result = self._run(h.claim, h.ctx)
        finally:
            metrics.RUNNING.dec()
        self._record(h, result, self.clock() - h.started, size)

    def _run_grouped(self, group: list[_Held], size: ClaimSize) -> list[_Held]:
        """The first batches of ``group`` (one job's subtasks, claimed
        together) in one transaction (``subtask.commit_first_batches``).
        Returns the subtasks left to run alone: those a batch did not
        finish, those asked to stop (handed back at once by ``_run``, not
        left under a lease nobody renews), all of them if a batch failed."""
        write = jobtype.get(group[0].claim.job.type).batch_writer(group[0].claim.job.step)
        assert write is not None
        by_ctx = {id(h.ctx): h for h in group}
        started = self.clock()
        for h in group:
            h.started = started
        outcome = commit_first_batches([h.ctx for h in group], write, self._fence_many)
        took = (self.clock() - started) / len(group)
        for ctx in outcome.lost:
            self._record(by_ctx[id(ctx)], SlotResult(ctx.subtask_id, "lost", "checkpoint refused"),
                         took, size)
        for ctx in outcome.finished:
            self._record(by_ctx[id(ctx)], SlotResult(ctx.subtask_id, "succeeded"), took, size)
        return [by_ctx[id(ctx)] for ctx in outcome.left]

    def _record(self, h: _Held, result: SlotResult, took: float, size: ClaimSize) -> None:
        """The subtask is done with on this worker: count it and log one line."""
        claim = h.claim
        with self._lock:
            self._held.pop(claim.id, None)
        if result.outcome != "waiting":  # a look that it cannot start: no run's length
            size.observe(claim.job_id, took)
        result = replace(result, rows=h.ctx.rows, batches=h.ctx.batches, seconds=took)
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
        ctx = SubtaskContext(
            job=claim.job, subtask_id=claim.id, start_key=claim.start_key,
            end_key=claim.end_key, curr_key=claim.curr_key, epoch=claim.epoch,
            meta=dict(claim.meta), engine=self.db.engine,
            fence=lambda conn, ctx, batch: self._fence(claim, conn, ctx, batch),
            health_gate=self.health.hold,
            rate_gate=lambda rows, took: self._reserve_rate(claim.job_id, rows, took),
        )
        held = _Held(claim, ctx, renewed_at, started=renewed_at)
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
                jobtype.get(ctx.job.type).run_step(ctx)
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
            elif isinstance(exc, NotReady):
                # Not a failure: what it needs is still being made by another
                # subtask (``NotReady``). Back at once, claimable after a wait.
                outcome, held = "waiting", subtasks.release_until_if_held(
                    self.db, conn, claim, error, exc.seconds)
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

    def _fence(self, claim: Claim, conn: Connection, ctx: SubtaskContext,
               batch: Batch) -> subtasks.Checkpointed | None:
        """The subtask's fenced checkpoint (``SubtaskContext.fence``). Counting
        the job's running subtasks costs an index walk a batch: only a job
        with a rate limit needs it."""
        done = subtasks.checkpoint_one(self.db, conn, claim, batch.next_key, batch.rows,
                                       batch.meta, count_running=bool(ctx.job.max_rows_per_sec))
        if done is not None and done.state == "succeeded":
            self._wake_owner_at_the_end(conn, claim)
        return done

    def _fence_many(self, conn: Connection,
                    batches: list[tuple[SubtaskContext, Batch]]) -> dict[int, subtasks.Checkpointed]:
        """The fenced checkpoint of a group's first batches (``subtask.FenceMany``)."""
        with self._lock:
            claims = {ctx.subtask_id: self._held[ctx.subtask_id].claim for ctx, _ in batches}
        states = subtasks.checkpoint(self.db, conn, [
            subtasks.BatchDone(claims[ctx.subtask_id], batch.next_key, batch.rows, batch.meta)
            for ctx, batch in batches])
        finished = [claims[i] for i, done in states.items() if done.state == "succeeded"]
        if finished:
            self._wake_owner_at_the_end(conn, finished[0])
        return states

    def _wake_owner_at_the_end(self, conn: Connection, claim: Claim) -> None:
        """A subtask finished: if it was one of its job's last, wake the owner
        (at commit) to advance the job now rather than at its next tick, up
        to a second later."""
        if subtasks.none_pending(self.db, conn, claim):
            jobs.notify(self.db, conn)


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
