"""The owner: one node, elected through the owner lease, drives every job.

Each ``tick`` first renews (or campaigns for) the lease, then, while the term
is trusted, runs the duties once and returns what it did. Every write is
fenced on the term (``store.owner_lease.FENCE``); multi-statement steps (schema
step + subtask insert + transition) run in one transaction that holds the
lease row share-locked from its first statement.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import sqlalchemy as sa

from framework import faults, jobtype, leases
from framework.db import Database
from framework.errors import one_line
from framework.jobtype import Job
from framework.splitting import plan_split
from framework.states import JobState
from framework.store import history, jobs, nodes, owner_lease, subtasks
from framework.store.owner_lease import OwnerTerm

log = logging.getLogger("reorg.owner")
J = JobState

# Job steps. Once shipped, never renumber: they are stored in job rows.
STEP_QUEUED = 0  # nothing done to the table yet
STEP_PREPARED = 1  # schema step done, subtasks inserted for this step
STEP_DONE = 2  # final schema step done


class TermLost(RuntimeError):
    """A fenced owner write found the term over: roll back and stand down."""


@dataclass
class TickResult:
    is_owner: bool = False
    revision: int | None = None
    actions: list[str] = field(default_factory=list)


class Owner:
    def __init__(
        self, db: Database, node_id: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.db = db
        self.node_id = node_id
        self.clock = clock
        self.term: OwnerTerm | None = None
        self._renewed_at = 0.0

    # --- election -------------------------------------------------------

    def _hold_term(self) -> OwnerTerm | None:
        sent = self.clock()
        with self.db.begin() as conn:
            if self.term is not None and not owner_lease.renew(self.db, conn, self.term):
                log.warning("owner term %s is over", self.term.revision)
                self.term = None
            if self.term is None:
                self.term = owner_lease.campaign(self.db, conn, self.node_id)
                if self.term:
                    log.info("elected owner, revision %s", self.term.revision)
        if self.term is not None:
            self._renewed_at = sent
        return self.term

    def trusted(self) -> bool:
        return self.term is not None and leases.still_trusted(
            self._renewed_at, self.clock(), self.db.settings.owner_lease_seconds
        )

    def resign(self) -> None:
        if self.term is not None:
            with self.db.begin() as conn:
                owner_lease.resign(self.db, conn, self.term)
            self.term = None

    # --- duties ---------------------------------------------------------

    def tick(self) -> TickResult:
        term = self._hold_term()
        result = TickResult(is_owner=term is not None, revision=term.revision if term else None)
        if term is None:
            return result
        try:
            for job in self._live_jobs():
                if not self.trusted():
                    break
                try:
                    action = self._drive(term, job)
                except _Raced:
                    action = "raced with another change; will look again"
                if action:
                    result.actions.append(f"job {job['id']}: {action}")
            result.actions += self._housekeeping(term)
        except TermLost:
            log.warning("owner write rejected: term %s is over", term.revision)
            self.term = None
            result.is_owner = False
        return result

    def _live_jobs(self) -> list[dict]:
        with self.db.begin() as conn:
            return jobs.live(self.db, conn)

    def _drive(self, term: OwnerTerm, row: dict) -> str | None:
        state = JobState(row["state"])
        job = _job(row)
        if state is J.QUEUED:
            return self._start(term, job)
        if state is J.RUNNING:
            return self._check_running(term, row, job)
        if state is J.PAUSING:
            return self._when_quiet(term, job, J.PAUSING, J.PAUSED)
        if state is J.RESUMING:
            return self._transition(term, job.id, J.RESUMING, J.RUNNING,
                                    run_on_node=row["run_on_node"] and self.node_id)
        if state in (J.CANCELLING, J.FAILED):
            return self._wind_down(term, job, state)
        if state is J.REVERTING:
            return self._revert(term, job, JobState(row["revert_target"] or J.REVERTED))
        return None

    def _start(self, term: OwnerTerm, job: Job) -> str:
        kind = jobtype.get(job.type)
        # The split reads the whole key column; it runs before, and outside, the
        # transaction that takes DDL locks, so the table is never locked for it.
        with self.db.begin(isolation_level="REPEATABLE READ") as conn:
            plan = plan_split(conn, job.target_table, job.key_column,
                              job.params.get("rows_per_subtask"))
        local = len(plan.ranges) < self.db.settings.local_job_max_subtasks
        try:
            with self._fenced(term) as conn:
                kind.prepare(conn, job)
                faults.hit("owner.after_prepare")
                subtasks.insert_ranges(self.db, conn, term, job.id, STEP_PREPARED, plan.ranges)
                self._must(jobs.transition(
                    self.db, conn, job.id, J.QUEUED, J.RUNNING, actor=self._actor(term),
                    term=term, step=STEP_PREPARED, row_estimate=plan.row_count,
                    run_on_node=self.node_id if local else None,
                    detail=f"{len(plan.ranges)} subtasks of ~{plan.rows_per_range} rows"
                           + (", local to the owner's node" if local else ""),
                ))
        except TermLost:
            raise
        except Exception as exc:  # the schema step failed: nothing was applied
            with self._fenced(term) as conn:
                jobs.transition(self.db, conn, job.id, J.QUEUED, J.FAILED,
                                actor=self._actor(term), term=term, error=one_line(exc),
                                detail="prepare failed")
            return f"prepare failed: {one_line(exc)}"
        return f"started with {len(plan.ranges)} subtasks"

    def _check_running(self, term: OwnerTerm, row: dict, job: Job) -> str | None:
        with self._fenced(term) as conn:
            if row["run_on_node"] and row["run_on_node"] != self.node_id:
                # Small jobs follow the owner: a new owner takes over its
                # predecessor's local jobs.
                jobs.bind_to_node(self.db, conn, term, job.id, self.node_id)
            subtasks.fail_exhausted(self.db, conn, term, job.id, self.db.settings.max_attempts)
        with self.db.begin() as conn:
            snap = subtasks.step_snapshot(self.db, conn, job.id, job.step)
        if snap.failed or snap.cancelled:
            error = self._first_subtask_error(job.id)
            return self._transition(term, job.id, J.RUNNING, J.FAILED, error=error,
                                    detail=f"{snap.failed} subtask(s) failed")
        if snap.all_succeeded or snap.total == 0:
            return self._advance(term, job)
        return None

    def _advance(self, term: OwnerTerm, job: Job) -> str | None:
        kind = jobtype.get(job.type)
        with self._fenced(term) as conn:
            # Re-read in this transaction: the decision and the advance must
            # rest on the same committed state (DESIGN 7).
            snap = subtasks.step_snapshot(self.db, conn, job.id, job.step)
            if not (snap.all_succeeded or snap.total == 0):
                return None
            kind.advance(conn, job)
            faults.hit("owner.after_advance_step")
            self._must(jobs.transition(self.db, conn, job.id, J.RUNNING, J.SUCCEEDED,
                                       actor=self._actor(term), term=term, step=STEP_DONE,
                                       detail=f"{snap.succeeded} subtasks succeeded"))
        return "succeeded"

    def _when_quiet(self, term: OwnerTerm, job: Job, src: JobState, dst: JobState) -> str | None:
        with self.db.begin() as conn:
            snap = subtasks.step_snapshot(self.db, conn, job.id, job.step)
        if snap.live_leases:
            return None
        return self._transition(term, job.id, src, dst)

    def _wind_down(self, term: OwnerTerm, job: Job, state: JobState) -> str | None:
        """Cancel or failure: wait until no worker holds a live lease, mark the
        rest cancelled, then revert."""
        with self._fenced(term) as conn:
            subtasks.cancel_unleased(self.db, conn, term, job.id)
            snap = subtasks.step_snapshot(self.db, conn, job.id, job.step)
            if snap.live_leases or snap.pending or snap.running:
                return None
            target = J.CANCELLED if state is J.CANCELLING else J.REVERTED
            self._must(jobs.transition(self.db, conn, job.id, state, J.REVERTING,
                                       actor=self._actor(term), term=term,
                                       revert_target=target))
        return "reverting"

    def _revert(self, term: OwnerTerm, job: Job, target: JobState) -> str:
        kind = jobtype.get(job.type)
        try:
            with self._fenced(term) as conn:
                if job.step >= STEP_PREPARED:
                    kind.rollback(conn, job)
                faults.hit("owner.after_rollback")
                self._must(jobs.transition(self.db, conn, job.id, J.REVERTING, target,
                                           actor=self._actor(term), term=term,
                                           detail="table restored"))
        except TermLost:
            raise
        except Exception as exc:  # retried on the next tick; the job stays reverting
            log.exception("rollback of job %s failed", job.id)
            return f"rollback failed, will retry: {one_line(exc)}"
        return str(target)

    def _housekeeping(self, term: OwnerTerm) -> list[str]:
        actions = []
        settings = self.db.settings
        with self.db.begin() as conn:
            finished = history.finished_jobs_with_live_rows(self.db, conn, limit=10)
        for job_id in finished:
            with self._fenced(term) as conn:
                moved = history.move_finished(self.db, conn, term, job_id, settings.history_batch)
            faults.hit("owner.after_history_batch")
            if moved:
                actions.append(f"job {job_id}: moved {moved} subtasks to history")
        with self._fenced(term) as conn:
            deleted = history.delete_older_than(
                self.db, conn, term, settings.history_retention_days, settings.history_batch)
            dead = nodes.mark_dead(self.db, conn, settings.node_dead_after_seconds)
        if deleted:
            actions.append(f"deleted {deleted} history rows past retention")
        actions += [f"node {n} marked dead" for n in dead]
        return actions

    # --- helpers --------------------------------------------------------

    def _transition(self, term: OwnerTerm, job_id: int, src: JobState, dst: JobState,
                    **kwargs) -> str | None:
        with self._fenced(term) as conn:
            moved = jobs.transition(self.db, conn, job_id, src, dst, actor=self._actor(term),
                                    term=term, **kwargs)
        return str(dst) if moved else None

    @contextmanager
    def _fenced(self, term: OwnerTerm) -> Iterator[sa.Connection]:
        """A transaction that starts by holding the owner term (see
        ``owner_lease.hold``), so every statement in it is fenced."""
        with self.db.begin() as conn:
            if not owner_lease.hold(self.db, conn, term):
                raise TermLost()
            yield conn

    @staticmethod
    def _must(moved: JobState | None) -> None:
        if moved is None:
            raise _Raced()

    def _actor(self, term: OwnerTerm) -> str:
        return f"owner {self.node_id} rev {term.revision}"

    def _first_subtask_error(self, job_id: int) -> str:
        with self.db.begin() as conn:
            return conn.execute(
                self.db.sql("""
                    SELECT 'subtask ' || ordinal || ': ' || coalesce(error, state)
                    FROM {s}.background_subtask
                    WHERE job_id = :id AND state IN ('failed', 'cancelled')
                    ORDER BY (state = 'failed') DESC, ordinal LIMIT 1"""),
                {"id": job_id},
            ).scalar() or "a subtask failed"


class _Raced(RuntimeError):
    """A compare-and-set found the job moved by someone else (e.g. a cancel
    raced an advance): the transaction rolls back and the job is looked at
    again next tick."""


def _job(row: dict) -> Job:
    return Job(**{k: row[k] for k in Job.__dataclass_fields__})
