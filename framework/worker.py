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

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from sqlalchemy.engine import Connection

from framework import faults, jobtype, leases
from framework.db import Database
from framework.errors import is_retryable, one_line
from framework.jobtype import LEASE_LOST, LeaseLost, Stopped, SubtaskContext
from framework.states import JobState
from framework.store import jobs, subtasks
from framework.store.subtasks import Claim

log = logging.getLogger("reorg.worker")

_HARD_STOP_STATES = {JobState.CANCELLING, JobState.FAILED, JobState.REVERTING}
_SOFT_STOP_STATES = {JobState.PAUSING, JobState.PAUSED}


@dataclass
class _Held:
    claim: Claim
    ctx: SubtaskContext
    renewed_at: float  # monotonic time the last successful renewal was sent


@dataclass
class SlotResult:
    """What one slot did with one subtask; tests read it."""

    subtask_id: int
    outcome: str  # succeeded | released | lost | retry | failed
    error: str | None = None


@dataclass
class WorkerPool:
    db: Database
    node_id: str
    slots: int
    clock: Callable[[], float] = time.monotonic
    results: list[SlotResult] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._wake = threading.Event()
        self._draining = threading.Event()
        self._held: dict[int, _Held] = {}
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

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
            with self.db.begin() as conn:
                alive = subtasks.renew(self.db, conn, [h.claim for h in held])
        except Exception as exc:
            log.warning("lease renewal failed: %s", one_line(exc))
            self.expire_untrusted()
            return
        for h in held:
            info = alive.get(h.claim.id)
            if info is None:
                log.warning("lost lease on subtask %s", h.claim.id)
                h.ctx.stop(LEASE_LOST, hard=True)
                continue
            h.renewed_at = sent
            # Knob changes (`reorg alter`) reach the running subtask here.
            h.ctx.job = replace(h.ctx.job, batch_rows=info["batch_rows"],
                                max_rows_per_sec=info["max_rows_per_sec"],
                                concurrency=info["concurrency"])
            state = JobState(info["job_state"])
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
                h.ctx.stop(LEASE_LOST, hard=True)

    # --- slots ----------------------------------------------------------

    def _slot_loop(self) -> None:
        while not self._draining.is_set():
            try:
                ran = self.run_one()
            except Exception as exc:  # the database may be briefly away; keep the slot alive
                log.warning("claim failed: %s", one_line(exc))
                ran = False
            if not ran:
                self._wake.wait(self.db.settings.poll_seconds)
                self._wake.clear()

    def run_one(self) -> bool:
        """Claim and run one subtask; False when there was nothing to claim."""
        if self._draining.is_set():
            return False
        sent = self.clock()
        with self.db.begin() as conn:
            claim = subtasks.claim(self.db, conn, self.node_id)
            job = jobs.get(self.db, conn, claim.job_id) if claim else None
        if claim is None or job is None:
            return False
        ctx = SubtaskContext(
            job=job, subtask_id=claim.id, start_key=claim.start_key, end_key=claim.end_key,
            curr_key=claim.curr_key, epoch=claim.epoch, meta=dict(claim.meta),
            checkpoint=lambda conn, key, rows, meta=None: self._checkpoint(
                ctx, claim, conn, key, rows, meta),
            stop_event=threading.Event(),
        )
        with self._lock:
            self._held[claim.id] = _Held(claim, ctx, sent)
        try:
            result = self._run(claim, ctx)
        finally:
            with self._lock:
                self._held.pop(claim.id, None)
        self.results.append(result)
        log.info("subtask %s (job %s): %s%s", claim.id, claim.job_id, result.outcome,
                 f" ({result.error})" if result.error else "")
        return True

    def _run(self, claim: Claim, ctx: SubtaskContext) -> SlotResult:
        faults.hit("worker.after_claim")
        try:
            jobtype.get(ctx.job.type).run_subtask(ctx, self.db.engine)
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
            elif is_retryable(exc) and claim.attempts < self.db.settings.max_attempts:
                backoff = leases.retry_backoff(
                    claim.attempts, self.db.settings.retry_backoff_seconds)
                outcome, held = "retry", subtasks.retry_later_if_held(self.db, conn, claim, error, backoff)
            else:
                log.error("subtask %s failed: %s", claim.id, error, exc_info=exc)
                outcome = "failed"
                held = subtasks.fail_if_held(self.db, conn, claim, f"attempt {claim.attempts}: {error}")
        # Every one of those writes is fenced: 0 rows means another worker has
        # the subtask now, and whatever this one was doing is void.
        return SlotResult(claim.id, outcome if held else "lost", error)

    def _checkpoint(self, ctx: SubtaskContext, claim: Claim, conn: Connection, key: int,
                    rows: int, meta: dict | None) -> None:
        faults.hit("worker.before_checkpoint")
        if not subtasks.checkpoint(self.db, conn, claim, key, rows, meta):
            ctx.stop(LEASE_LOST, hard=True)
            raise LeaseLost(f"subtask {claim.id} epoch {claim.epoch}: checkpoint refused")
        ctx.curr_key = key
        faults.hit("worker.after_checkpoint")
