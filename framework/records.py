"""The records every part of reorg passes around: a job as the workers and
the owner read it (``Job``), what a job type's ``validate`` found
(``Target``), a step a job type declares (``Step``) and the stored step
numbers. Plain data: this module imports nothing of reorg but its keys, so
``store/`` and the extension point (``framework.jobtype``) both build on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from framework.keys import KeySpec

# Job and subtask steps. Once shipped, never renumber: they are stored.
STEP_QUEUED = 0  # nothing done to the table yet
STEP_PREPARED = 1  # schema step done; the first forward step's subtasks inserted
# Forward step n (1-based) of a job type's ``steps`` is stored as n; a job
# that succeeded is at ``done_step`` = its last forward step + 1, which for a
# type of one step is STEP_DONE.
STEP_DONE = 2  # final schema step done (a job type of one step)
STEP_REVERT = -1  # rolling back: the revert subtasks restore ranges, then revert DDL

# In a job's params when it was submitted without --batch-rows: the job type's
# default batch, which its batch size then follows under a rate limit (at most
# one second of the limit, framework.submit; again at `reorg alter`).
DEFAULT_BATCH_ROWS = "default_batch_rows"

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
