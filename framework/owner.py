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
from dataclasses import dataclass, field, replace

import sqlalchemy as sa

from framework import catch_up, faults, jobtype, keyset_split, leases, long_statements, privileges
from framework.db import Database
from framework.errors import InvalidParams, is_retryable, one_line
from framework.keyset_split import plan_split
from framework.records import STEP_PREPARED, STEP_REVERT, Job, Step
from framework.splitting import DEFAULT_ROWS_PER_RANGE, SplitPlan
from framework.states import JobState
from framework.store import history, jobs, nodes, owner_lease, progress, steps
from framework.store.owner_lease import OwnerTerm
from framework.warming import Warming

log = logging.getLogger("reorg.owner")
J = JobState


# A job the owner cannot drive (a transient error) is looked at again after
# this backoff, doubling per failure; other jobs go on meanwhile.
JOB_BACKOFF_SECONDS = 1.0
# How long one tick may spend moving finished subtasks to history; of that,
# how long for the succeeded subtasks of running jobs, which move once more
# than LIVE_SUCCEEDED_KEPT of them wait in the live table (status reads those).
HISTORY_SECONDS_PER_TICK = 0.3
HISTORY_SECONDS_WHILE_RUNNING = 0.1
LIVE_SUCCEEDED_KEPT = 5_000
JOB_BACKOFF_CAP_SECONDS = 60.0
# History retention and dead-node marking run at most this often, not every
# tick: their horizons are days and a minute, and a tick's every round trip
# waits its turn among busy slots of the same process.
HOUSEKEEPING_SECONDS = 5.0
# Ranges inserted per tick: a big split goes in a chunk a tick
# (``steps.insert_split_chunk``) while workers already claim the first ones,
# and the owner ticks again at once while a chunk remains (``TickResult.again``),
# so no tick grows with the job (docs/benchmarks.md, "Framework at scale"). The
# revert step's ranges likewise.
SPLIT_CHUNK = 2_000
# Rows a revert range restores at most: neighbouring forward ranges that made
# progress are merged up to this many rows.
REVERT_ROWS_PER_RANGE = DEFAULT_ROWS_PER_RANGE


class TermLost(RuntimeError):
    """A fenced owner write found the term over: roll back and stand down."""


@dataclass
class TickResult:
    is_owner: bool = False
    revision: int | None = None
    actions: list[str] = field(default_factory=list)
    # Work is left that the next tick should do at once rather than after the
    # interval: ranges of a split still to insert. Each tick stays short.
    again: bool = False


class Owner:
    def __init__(
        self, db: Database, node_id: str, clock: Callable[[], float] = time.monotonic,
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        """``wake``: start the next tick now (the node's wake-up), e.g. once a
        job type's warm-up a job waits for is done."""
        self.db = db
        self.node_id = node_id
        self.clock = clock
        self.term: OwnerTerm | None = None
        self._renewed_at = 0.0
        # job id -> (consecutive failures, monotonic time to look again)
        self._backoff: dict[int, tuple[int, float]] = {}
        self._history_budget_ends = 0.0
        self._warming = Warming(on_done=wake)
        self._again = False  # this tick left ranges to insert (TickResult.again)
        self._retention_due = 0.0  # monotonic time of the next retention run
        # job id -> monotonic time its claim mark is next probed from the
        # step's start (between, from the mark itself: ``_mark_from_mark``).
        self._full_mark_due: dict[int, float] = {}

    # --- election -------------------------------------------------------

    def _hold_term(self) -> OwnerTerm | None:
        sent = self.clock()
        ttl = self.db.settings.owner_lease_seconds
        if self.term is not None and sent - self._renewed_at < leases.renew_interval(ttl):
            # Renewed a moment ago (a tick or ``keep_term``): the term is good
            # for most of its lease still, and a renewal is a durable commit,
            # which with 16 slots committing took up to 220 ms of a tick;
            # ticks come back to back while a split goes in. A deposed
            # owner's writes are fenced anyway (DESIGN 4).
            return self.term
        with self.db.begin() as conn:
            if self.term is not None and not owner_lease.renew(self.db, conn, self.term):
                log.warning("owner term %s is over", self.term.revision)
                self.term = None
            if self.term is None:
                self.term = owner_lease.campaign(self.db, conn, self.node_id)
                if self.term:
                    log.info("elected owner, revision %s", self.term.revision)
                    self._backoff.clear()
        if self.term is not None:
            self._renewed_at = sent
        return self.term

    def keep_term(self) -> None:
        """Renew the term on a schedule of its own (every third of the lease),
        so that a long step of a tick (a split, a rollback, DDL waiting for a
        lock) does not outlast it. Never campaigns: that is the tick's job."""
        term = self.term
        if term is None:
            return
        sent = self.clock()
        try:
            with self.db.begin() as conn:
                renewed = owner_lease.renew(self.db, conn, term)
        except Exception as exc:
            log.warning("owner lease renewal failed: %s", one_line(exc))
            return
        if renewed and self.term == term:
            self._renewed_at = max(self._renewed_at, sent)

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
        self._history_budget_ends = self.clock() + HISTORY_SECONDS_PER_TICK
        result = TickResult(is_owner=term is not None, revision=term.revision if term else None)
        if term is None:
            return result
        self._again = False
        try:
            live = self._live_jobs()
            self._full_mark_due = {j["id"]: self._full_mark_due[j["id"]] for j in live
                                   if j["id"] in self._full_mark_due}
            for job in live:
                if not self.trusted():
                    break
                if self._backing_off(job["id"]):
                    continue
                action = self._drive_one(term, job)
                if action:
                    result.actions.append(f"job {job['id']}: {action}")
            result.actions += self._housekeeping(term)
        except TermLost:
            log.warning("owner write rejected: term %s is over", term.revision)
            self.term = None
            result.is_owner = False
        result.again = self._again and result.is_owner
        return result

    def _drive_one(self, term: OwnerTerm, row: dict) -> str | None:
        """Drive one job; whatever goes wrong with it stays with it: one poison
        job (its table dropped, its type not installed here) must not stop the
        owner from driving every other job and its housekeeping."""
        try:
            action = self._drive(term, row)
        except _Raced:
            return "raced with another change; will look again"
        except TermLost:
            raise
        except Exception as exc:
            return self._job_error(term, row, exc)
        self._backoff.pop(row["id"], None)
        return action

    def _job_error(self, term: OwnerTerm, row: dict, exc: Exception) -> str:
        error = one_line(exc)
        state = JobState(row["state"])
        if not is_retryable(exc) and state in (J.QUEUED, J.RUNNING):
            log.error("job %s cannot be driven, failing it: %s", row["id"], error, exc_info=exc)
            with self._fenced(term) as conn:
                jobs.fail(self.db, conn, term, row["id"], actor=self._actor(term),
                          error=f"owner: {error}", detail="the owner cannot drive the job")
            return f"failed: {error}"
        wait = self._back_off(row["id"])
        step = "rollback" if state is J.REVERTING else f"{state} job"
        log.warning("job %s: %s failed, looking again in %.0fs: %s", row["id"], step, wait,
                    error, exc_info=exc)
        with self._fenced(term) as conn:
            # Kept beside the job's own error (why it failed), not over it.
            jobs.note_error(self.db, conn, term, row["id"], f"{step} retrying: {error}")
        return f"{step} failed, will retry in {wait:.0f}s: {error}"

    def _back_off(self, job_id: int) -> float:
        failures = self._backoff.get(job_id, (0, 0.0))[0] + 1
        wait = leases.retry_backoff(failures, JOB_BACKOFF_SECONDS, JOB_BACKOFF_CAP_SECONDS)
        self._backoff[job_id] = (failures, self.clock() + wait)
        return wait

    def _backing_off(self, job_id: int) -> bool:
        entry = self._backoff.get(job_id)
        return entry is not None and self.clock() < entry[1]

    def _live_jobs(self) -> list[dict]:
        with self._reading() as conn:
            return jobs.live(self.db, conn)

    def _drive(self, term: OwnerTerm, row: dict) -> str | None:
        state = JobState(row["state"])
        job = _job(row)
        if state is J.QUEUED:
            return self._start(term, job)
        if state is J.RUNNING:
            return self._check_running(term, row, job)
        if state is J.PAUSING:
            return self._pause_when_quiet(term, job)
        if state is J.RESUMING:
            with self._fenced(term) as conn:
                moved = jobs.resumed(self.db, conn, term, job.id, actor=self._actor(term),
                                     owner_node=self.node_id)
            return "running" if moved else None
        if state in (J.CANCELLING, J.FAILED):
            return self._wind_down(term, job)
        if state is J.REVERTING:
            target = JobState(row["revert_target"] or J.REVERTED)
            if job.step == STEP_REVERT:
                return self._check_reverting(term, row, job, target)
            return self._start_revert(term, job, target)
        return None

    def _start(self, term: OwnerTerm, job: Job) -> str | None:
        try:
            kind = jobtype.get(job.type)
            if not self._may_run_as_submitter(term, job):
                return "input rejected"
            if kind.analyses_on_owner() and job.params.get(jobs.VERDICT) != jobs.ACCEPTED:
                if not self._warming.ready(kind, job):
                    return None  # e.g. Spark starting: other jobs go on, this one next tick
                analysed = self._analyse(term, kind, job)
                if analysed is None:
                    return "input rejected"
                job = analysed
            declared = kind.steps
            first = declared[0]
            plan = self._split(job) if first.ranges else None
            local = (plan is not None
                     and len(plan.ranges) < self.db.settings.local_job_max_subtasks)
            with self._fenced(term) as conn:
                kind.prepare(conn, job)
                faults.hit("owner.after_prepare")
                started = replace(job, step=STEP_PREPARED)
                count, detail = self._insert_step(conn, term, kind, started, plan)
                self._must(jobs.start(
                    self.db, conn, term, job.id, actor=self._actor(term), step=STEP_PREPARED,
                    row_estimate=plan.row_count if plan else 0,
                    run_on_node=self.node_id if local else None,
                    detail=_step_detail(declared, STEP_PREPARED, detail)
                           + (", local to the owner's node" if local else ""),
                    step_names=[st.name for st in declared], step_ranges=first.ranges,
                    step_subtasks=count, schema_state=first.schema_state,
                ))
        except (TermLost, _Raced):
            raise
        except Exception as exc:
            if is_retryable(exc):  # e.g. the DDL's lock timeout on a busy table
                raise
            # The schema step failed for good: nothing was applied.
            with self._fenced(term) as conn:
                jobs.fail(self.db, conn, term, job.id, actor=self._actor(term),
                          error=one_line(exc), detail="prepare failed")
            return f"prepare failed: {one_line(exc)}"
        return f"started with {count} subtasks"

    def _split(self, job: Job) -> SplitPlan:
        """The key space of the job's table in ranges. The split reads the key
        column (a sample of it on a big table); it runs before, and outside,
        the transaction that takes DDL locks, so the table is never locked for
        it (``keep_term`` keeps the term alive meanwhile)."""
        with self.db.begin(isolation_level="REPEATABLE READ") as conn:
            faults.hit("owner.before_split")
            plan = plan_split(conn, job.target_table, job.key,
                              job.params.get("rows_per_subtask"))
            faults.hit("owner.after_split")
            return plan

    def _insert_step(self, conn: sa.Connection, term: OwnerTerm, kind: jobtype.JobType,
                     job: Job, plan: SplitPlan | None) -> tuple[int, str]:
        """Insert the subtasks of the job's step ``job.step``: the ranges of
        ``plan`` for a range step, the planner's fixed subtasks otherwise.
        Returns how many, and a few words on them for the job's event."""
        if plan is not None:
            # Rows committed since the split's snapshot with keys below its
            # first range would lie in no range (DESIGN 5), whatever the key
            # (an integer key's catch-up looks only past the last range): the
            # first range reaches back to the smallest key now. After
            # prepare's DDL in this transaction, later writers wait for its
            # commit and then meet what it made (a trigger).
            plan = keyset_split.reach_back(conn, job.target_table, job.key, plan)
            # A big split goes in a chunk a tick (``_check_running``).
            steps.begin_split(self.db, conn, term, job.id, job.step, plan.ranges, SPLIT_CHUNK)
            count = len(plan.ranges)
            # The next chunk at once; never unset: another job's may be due too.
            self._again = self._again or count > SPLIT_CHUNK
            return count, f"{count} subtasks of ~{plan.rows_per_range} rows"
        metas = [dict(m) for m in kind.fixed_subtasks(conn, job, job.step)]
        count = steps.insert_fixed(self.db, conn, term, job.id, job.step, metas) if metas else 0
        return count, f"{count} subtask{'' if count == 1 else 's'}"

    def _may_run_as_submitter(self, term: OwnerTerm, job: Job) -> bool:
        """A job's SQL runs as its submitter (framework.privileges): if this
        node's role may not act as that role, the job is rejected before
        anything touches its table (queued -> failed, as a rejected input)."""
        try:
            with self.db.begin() as conn:
                privileges.check_can_run(conn, job)
        except InvalidParams as exc:
            with self._fenced(term) as conn:
                self._must(jobs.reject(self.db, conn, term, job.id, actor=self._actor(term),
                                       error=one_line(exc)))
            return False
        return True

    def _analyse(self, term: OwnerTerm, kind: jobtype.JobType, job: Job) -> Job | None:
        """The type's checks too costly for ``reorg submit`` (DESIGN 11): in a
        transaction of their own that is rolled back, before the split and
        prepare touch the table, so the fenced transaction never waits on
        them. Returns the job with its accepted params, or None: rejected
        (queued -> failed, nothing done; the waiting submit reports it)."""
        try:
            with self.db.connect() as conn, conn.begin() as tx:
                # The analysis leaves this read-only transaction idle while
                # Spark plans (seconds on a busy host); it holds no lease row,
                # so the owner's short idle limit (a third of its lease) would
                # only cut a good analysis off. A submit's own limit applies.
                conn.execute(sa.text("SET LOCAL idle_in_transaction_session_timeout = '60s'"))
                params = dict(kind.analyse(conn, job))
                tx.rollback()
        except InvalidParams as exc:
            with self._fenced(term) as conn:
                self._must(jobs.reject(self.db, conn, term, job.id, actor=self._actor(term),
                                       error=one_line(exc)))
            return None
        with self._fenced(term) as conn:
            if not jobs.accept(self.db, conn, term, job.id, params):
                raise _Raced()
        faults.hit("owner.after_analyse")
        return replace(job, params={**params, jobs.VERDICT: jobs.ACCEPTED})

    def _check_running(self, term: OwnerTerm, row: dict, job: Job) -> str | None:
        # Exhausted subtasks failed here fail the job only in a durable
        # transaction below, which flushes this one first.
        with self._fenced(term, durable=False) as conn:
            if row["run_on_node"] and row["run_on_node"] != self.node_id:
                # Small jobs follow the owner: a new owner takes over its
                # predecessor's local jobs.
                jobs.bind_to_node(self.db, conn, term, job.id, self.node_id)
            steps.fail_exhausted(self.db, conn, term, job.id, self.db.settings.max_attempts)
            # A big split goes on a chunk a tick (workers claim from the start).
            to_go = steps.insert_split_chunk(self.db, conn, term, job.id, SPLIT_CHUNK)
            steps.mark_claim_from(self.db, conn, term, job.id, job.step,
                                  from_mark=self._mark_from_mark(job.id))
        if to_go:
            faults.hit("owner.after_split_chunk")
        with self._reading() as conn:
            # From the claim mark: _advance re-reads the whole step (DESIGN 7).
            snap = steps.step_snapshot(self.db, conn, job.id, job.step, from_mark=True)
            error = steps.first_error(self.db, conn, job.id) if (
                snap.failed or snap.cancelled) else None
            # On the same connection: whether succeeded ones pile up.
            many = (error is None and not to_go and not snap.all_succeeded and snap.succeeded
                    and steps.succeeded_beyond(self.db, conn, job.id, LIVE_SUCCEEDED_KEPT))
        if error is not None:
            with self._fenced(term) as conn:
                if job.on_failure == "pause":  # keep every finished range; `reorg retry`
                    moved = jobs.pause_on_failure(
                        self.db, conn, term, job.id, actor=self._actor(term), error=error,
                        detail=f"a subtask failed; pausing (--on-failure pause): fix the "
                               f"cause, then `reorg retry {job.id}`")
                    return "pausing on failure" if moved else None
                moved = jobs.fail(self.db, conn, term, job.id, actor=self._actor(term),
                                  error=error, detail="a subtask failed")
            return "failed" if moved else None
        if to_go:
            self._again = True
            return f"split: {to_go} ranges still to insert"
        if snap.all_succeeded:
            return self._advance(term, job)
        if many:  # keep what status reads of a running job small
            self._move_to_history(term, job.id, job_finished=False,
                                  seconds=HISTORY_SECONDS_WHILE_RUNNING)
        return None

    def _advance(self, term: OwnerTerm, job: Job) -> str | None:
        """Every subtask of the job's step succeeded: move it to its next
        forward step, or, after the last one, make the final schema step (the
        cut-over) and mark it succeeded. Either way in one fenced transaction
        that re-reads the step first (DESIGN 7). A retryable failure here (the
        cut-over's DDL hitting the owner's bounded ``lock_timeout`` on a busy
        table) rolls it all back and is tried again after a backoff; the job
        stays running (``_job_error``)."""
        kind = jobtype.get(job.type)
        declared = kind.steps
        current = kind.step_named(job.step)
        last = job.step == len(declared)
        following = None if last else declared[job.step]
        # The next range step's split, outside the fenced transaction (``_split``).
        plan = self._split(job) if following is not None and following.ranges else None
        if (following is not None and kind.warm_before_step(job, job.step + 1)
                and not self._warming.ready(kind, job)):
            return None  # e.g. Spark starting: other jobs go on, this one next tick
        with self._fenced(term) as conn:
            # Re-read in this transaction: the decision and the advance must
            # rest on the same committed state (DESIGN 7).
            snap = steps.step_snapshot(self.db, conn, job.id, job.step)
            if not snap.all_succeeded or steps.split_pending(self.db, conn, job.id):
                return None
            if current.ranges:
                tail = catch_up.cover_tail(self.db, conn, term, job)
                if tail.added:
                    return tail.detail
                tail_detail = tail.detail
            else:
                tail_detail = ""
            if following is not None:
                return self._enter_next_step(conn, term, kind, job, plan, tail_detail)
            faults.hit("owner.before_cutover")
            long_statements.end_sessions(conn, job.id)  # orphans: their locks would hold the DDL
            kind.advance(conn, job)
            faults.hit("owner.after_advance_step")
            count = steps.count_in_step(self.db, conn, job.id, job.step)
            rows = progress.rows_of_step_now(self.db, conn, job.id)
            self._must(jobs.succeed(self.db, conn, term, job.id, actor=self._actor(term),
                                    step=kind.done_step(),
                                    schema_state=getattr(kind, "done_schema_state", None),
                                    detail=f"{count} subtasks succeeded{tail_detail}; "
                                           f"{rows:,} rows done"))
        return "succeeded"

    def _enter_next_step(self, conn: sa.Connection, term: OwnerTerm, kind: jobtype.JobType,
                         job: Job, plan: SplitPlan | None, tail_detail: str) -> str:
        """Within ``_advance``'s fenced transaction: the type's DDL between
        steps, the next step's subtasks, and the job's step moved, together."""
        declared = kind.steps
        number = job.step + 1
        following = declared[number - 1]
        entered = replace(job, step=number)
        long_statements.end_sessions(conn, job.id)  # orphans: their locks would hold the DDL
        kind.enter_step(conn, entered, number)
        count, detail = self._insert_step(conn, term, kind, entered, plan)
        faults.hit("owner.after_next_step")
        if not jobs.advance_step(
                self.db, conn, term, job.id, from_step=job.step, to_step=number,
                step_ranges=following.ranges, step_subtasks=count,
                row_estimate=plan.row_count if plan else None,
                schema_state=following.schema_state, actor=self._actor(term),
                step_names=(declared[job.step - 1].name, following.name),
                detail=f"step {declared[job.step - 1].name} done{tail_detail}; "
                       + _step_detail(declared, number, detail)):
            raise _Raced()
        return f"step {number} ({following.name}): {count} subtasks"

    def _pause_when_quiet(self, term: OwnerTerm, job: Job) -> str | None:
        with self.db.begin() as conn:
            snap = steps.step_snapshot(self.db, conn, job.id, job.step)
        if snap.live_leases:
            return None
        with self._fenced(term) as conn:
            moved = jobs.paused(self.db, conn, term, job.id, actor=self._actor(term))
        return "paused" if moved else None

    def _wind_down(self, term: OwnerTerm, job: Job) -> str | None:
        """Cancel or failure: wait until no worker holds a live lease, mark the
        rest cancelled, then revert."""
        with self._fenced(term) as conn:
            steps.drop_pending_split(self.db, conn, term, job.id)
            steps.cancel_unleased(self.db, conn, term, job.id)
            snap = steps.step_snapshot(self.db, conn, job.id, job.step)
            if snap.live_leases or snap.unfinished:
                return None
            self._must(jobs.begin_revert(self.db, conn, term, job.id, actor=self._actor(term)))
        return "reverting"

    def _start_revert(self, term: OwnerTerm, job: Job, target: JobState) -> str:
        """Begin the revert step (DESIGN 13) in one short fenced transaction:
        the job type plans it; the ranges that made progress become revert
        subtasks, which workers claim like any others. With nothing to restore
        range by range, the final revert DDL runs at once instead. A failure
        is retried with backoff (``_job_error``); the job stays reverting."""
        kind = jobtype.get(job.type) if job.step >= STEP_PREPARED else None
        with self._fenced(term) as conn:
            if kind is None:
                detail = "nothing was applied"
            elif not table_exists(conn, gone := kind.restores_into(job)):
                self._revert_ddl(conn, kind, job)  # work tables, what it made elsewhere
                detail = _table_gone(gone)
            else:
                faults.hit("owner.before_revert_plan")
                restore = kind.steps_to_restore(job, kind.plan_revert(conn, job))
                # Ranges by the rows to restore, not the forward step's
                # granularity (a job of 100,000 tiny subtasks restores in a few).
                progressed = steps.revert_ranges(
                    steps.progressed_ranges(self.db, conn, job.id, restore),
                    REVERT_ROWS_PER_RANGE)
                count = len(progressed)
                # A chunk now, the rest a chunk a tick (``_check_reverting``),
                # as a big split goes in.
                steps.begin_split(self.db, conn, term, job.id, STEP_REVERT,
                                  [(lo, hi) for _, lo, hi in progressed], SPLIT_CHUNK,
                                  metas=[{"revert_of_step": st} for st, _, _ in progressed],
                                  counter="revert_total")
                self._again = self._again or count > SPLIT_CHUNK
                if count:
                    faults.hit("owner.after_revert_plan")
                    if not jobs.start_revert_step(
                            self.db, conn, term, job.id, from_step=job.step,
                            from_name=_step_name(kind, job.step), actor=self._actor(term),
                            detail=f"revert step: {count} ranges to restore"):
                        raise _Raced()
                    return f"reverting {count} ranges"
                self._revert_ddl(conn, kind, job)
                detail = "table restored"
            self._must(jobs.finish_revert(self.db, conn, term, job.id, target,
                                          actor=self._actor(term), detail=detail))
        return str(target)

    def _check_reverting(self, term: OwnerTerm, row: dict, job: Job,
                         target: JobState) -> str | None:
        """The revert step: once every revert subtask succeeded (one snapshot,
        DESIGN 7), run the final revert DDL and end the job. Meanwhile give
        exhausted revert subtasks another round and show why they are retried."""
        settings = self.db.settings
        with self._fenced(term) as conn:
            if row["run_on_node"] and row["run_on_node"] != self.node_id:
                jobs.bind_to_node(self.db, conn, term, job.id, self.node_id)
            # A revert subtask that used its last attempt gets a new round after
            # the backoff of one attempt more (never failed: a rollback must not
            # stop with the table half restored).
            steps.retry_exhausted_reverts(
                self.db, conn, term, job.id, settings.max_attempts,
                leases.retry_backoff(settings.max_attempts + 1, settings.retry_backoff_seconds,
                                     jitter=0.0))
            kind = jobtype.get(job.type)
            if not table_exists(conn, gone := kind.restores_into(job)):
                return self._end_revert_of_a_gone_table(conn, term, job, kind, gone, target)
            to_go = steps.insert_split_chunk(self.db, conn, term, job.id, SPLIT_CHUNK)
            steps.mark_claim_from(self.db, conn, term, job.id, STEP_REVERT,
                                  from_mark=self._mark_from_mark(job.id))
        with self._reading() as conn:
            # From the claim mark: the end of the job re-reads the whole step.
            snap = steps.step_snapshot(self.db, conn, job.id, STEP_REVERT, from_mark=True)
            error = steps.revert_error(self.db, conn, job.id)
        if to_go:
            self._again = True
            return f"revert: {to_go} ranges still to insert"
        if not snap.all_succeeded:
            if error:
                with self._fenced(term) as conn:
                    jobs.note_error(self.db, conn, term, job.id, f"revert retrying: {error}")
            if snap.succeeded:
                with self.db.begin() as conn:
                    many = steps.succeeded_beyond(self.db, conn, job.id, LIVE_SUCCEEDED_KEPT)
                if many:
                    self._move_to_history(term, job.id, job_finished=False,
                                          seconds=HISTORY_SECONDS_WHILE_RUNNING)
            return None
        with self._fenced(term) as conn:
            # Re-read in this transaction: the decision and the end of the job
            # rest on the same committed state (DESIGN 7).
            if (not steps.step_snapshot(self.db, conn, job.id, STEP_REVERT).all_succeeded
                    or steps.split_pending(self.db, conn, job.id)):
                return None
            self._revert_ddl(conn, kind, job)
            count = steps.count_in_step(self.db, conn, job.id, STEP_REVERT)
            self._must(jobs.finish_revert(self.db, conn, term, job.id, target,
                                          actor=self._actor(term),
                                          detail=f"table restored: {count} ranges"))
        return str(target)

    def _end_revert_of_a_gone_table(self, conn: sa.Connection, term: OwnerTerm, job: Job,
                                    kind: jobtype.JobType, gone: str,
                                    target: JobState) -> str | None:
        """Nothing left to restore: stop the revert subtasks, end the job once
        no worker holds one."""
        steps.drop_pending_split(self.db, conn, term, job.id)
        steps.cancel_unleased(self.db, conn, term, job.id)
        if steps.step_snapshot(self.db, conn, job.id, STEP_REVERT).live_leases:
            return None
        self._revert_ddl(conn, kind, job)  # work tables, what it made elsewhere
        self._must(jobs.finish_revert(self.db, conn, term, job.id, target,
                                      actor=self._actor(term), detail=_table_gone(gone)))
        return str(target)

    @staticmethod
    def _revert_ddl(conn: sa.Connection, kind: jobtype.JobType, job: Job) -> None:
        faults.hit("owner.before_rollback")
        # A long statement a dead or frozen worker left running (an index
        # build) holds its lock on the table: the DDL, and the application's
        # writes behind it, would queue behind it on every try.
        long_statements.end_sessions(conn, job.id)
        kind.revert(conn, job)
        faults.hit("owner.after_rollback")

    def _housekeeping(self, term: OwnerTerm) -> list[str]:
        actions = []
        settings = self.db.settings
        with self._reading() as conn:
            finished = history.jobs_awaiting_history(self.db, conn, limit=10)
        for job_id in finished:
            moved = self._move_to_history(term, job_id, job_finished=True)
            if moved:
                actions.append(f"job {job_id}: moved {moved} subtasks to history")
        if self.clock() < self._retention_due:
            return actions
        with self._fenced(term, durable=False) as conn:
            deleted = history.delete_older_than(
                self.db, conn, term, settings.history_retention_days, settings.history_batch)
        # Durable: it writes job events (a dead node's, on the jobs it held).
        with self._fenced(term) as conn:
            dead = nodes.mark_dead(self.db, conn, settings.node_dead_after_seconds,
                                   actor=self._actor(term))
        # A full batch deleted: more may be past retention, go on next tick.
        if deleted < settings.history_batch:
            self._retention_due = self.clock() + HOUSEKEEPING_SECONDS
        if deleted:
            actions.append(f"deleted {deleted} history rows past retention")
        actions += [f"node {n} marked dead" for n in dead]
        return actions

    def _move_to_history(self, term: OwnerTerm, job_id: int, *, job_finished: bool,
                         seconds: float | None = None) -> int:
        """Move a job's finished subtasks (of a running job: its succeeded ones)
        batch after batch, each its own short transaction, within the tick's
        time budget (and ``seconds``): 100,000 subtasks move in seconds and a
        tick still ends."""
        batch, total = self.db.settings.history_batch, 0
        ends = self._history_budget_ends
        if seconds is not None:
            ends = min(ends, self.clock() + seconds)
        while self.clock() < ends:
            with self._fenced(term, durable=False) as conn:  # atomic either way (DESIGN 10)
                moved = history.move_finished(self.db, conn, term, job_id, batch,
                                              only_succeeded=not job_finished)
                if job_finished and moved < batch:
                    history.mark_done(self.db, conn, term, job_id)
            faults.hit("owner.after_history_batch")
            total += moved
            if moved < batch:
                break
        return total

    # --- helpers --------------------------------------------------------

    def _mark_from_mark(self, job_id: int) -> bool:
        """Whether this tick's claim mark may start at the current mark: yes,
        but for one tick every HOUSEKEEPING_SECONDS, which probes from the
        step's start (a wrong mark is put right; it walks the dead entries
        of every subtask finished since the last vacuum, and ticks come back
        to back while a split goes in)."""
        now = self.clock()
        if now < self._full_mark_due.get(job_id, 0.0):
            return True
        self._full_mark_due[job_id] = now + HOUSEKEEPING_SECONDS
        return False

    @contextmanager
    def _reading(self) -> Iterator[sa.Connection]:
        """A connection for the tick's reads, each one statement (one
        snapshot, as under READ COMMITTED in a transaction) in autocommit:
        one round trip instead of three (BEGIN, the read, COMMIT), each of
        which waits its turn among the busy slots of the owner's process."""
        with self.db.connect(isolation_level="AUTOCOMMIT") as conn:
            yield conn

    @contextmanager
    def _fenced(self, term: OwnerTerm, *, durable: bool = True) -> Iterator[sa.Connection]:
        """A transaction that starts by holding the owner term (see
        ``owner_lease.hold``), so every statement in it is fenced.

        ``durable=False`` for bookkeeping a later tick redoes if a server
        crash loses it (claim marks, split chunks, history moves, retention):
        its commit does not wait for the disk, which with 16 slots committing
        was most of a running tick (each fenced transaction writes: the
        lease row's lock). Job transitions stay durable."""
        with self.db.begin() as conn:
            if not owner_lease.hold(self.db, conn, term, durable=durable):
                raise TermLost()
            yield conn

    @staticmethod
    def _must(moved: JobState | None) -> None:
        if moved is None:
            raise _Raced()

    def _actor(self, term: OwnerTerm) -> str:
        return f"owner {self.node_id} rev {term.revision}"


class _Raced(RuntimeError):
    """A compare-and-set found the job moved by someone else (e.g. a cancel
    raced an advance): the transaction rolls back and the job is looked at
    again next tick."""


def _step_name(kind: jobtype.JobType, number: int) -> str:
    """Forward step ``number``'s name, for the event of a step change."""
    declared = kind.steps
    return declared[number - 1].name if 1 <= number <= len(declared) else str(number)


def _step_detail(declared: tuple[Step, ...], number: int, subtasks: str) -> str:
    """How a job's event names the step it enters (a type of one step: as before)."""
    if len(declared) == 1:
        return subtasks
    return f"step {number}/{len(declared)} {declared[number - 1].name}: {subtasks}"


def _table_gone(table: str) -> str:
    return f"table {table} no longer exists (dropped or renamed): nothing to restore"


def table_exists(conn: sa.Connection, table: str) -> bool:
    return conn.execute(sa.text("SELECT to_regclass(:t) IS NOT NULL"), {"t": table}).scalar() is True


def _job(row: dict) -> Job:
    return Job(**{k: row[k] for k in Job.__dataclass_fields__ if k in row})
