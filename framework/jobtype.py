"""The job-type extension point: the duties a job type declares, and the
registry job types join from outside ``framework/``.

A job type is a subclass of ``JobType``. The owner calls its planner's side
(``validate`` at submit, ``prepare``, ``enter_step``, ``advance``, the
revert); every worker calls its executor's side: ``write_batch`` (one batch
on a connection in a transaction, ``framework.subtask`` commits it with its
fenced checkpoint) or ``run_subtask`` for work that is not range batches (an
index build). Every duty is declared here with its default, so a type
checker holds a job type to them; docs/design.md, "Job-type protocol", says
when each runs. tests/support/fill.py is the worked example (``test-fill``,
and ``test-fill-verify`` with steps).
"""

from __future__ import annotations

import importlib
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from framework.entry_points import installed_entry_points
from framework.errors import InvalidParams
from framework.records import ONE_STEP, STEP_PREPARED, STEP_REVERT, Job, Step, Target

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    # The workers' side: `reorg status` reads the registry without it.
    from framework.subtask import Batch, SubtaskContext


class JobType(ABC):
    """A kind of job. Abstract: ``validate``, ``prepare``, ``advance``,
    ``plan_revert`` and ``revert``; every other duty has a default."""

    name: str
    # The forward steps (``Step``); one range step unless declared.
    steps: tuple[Step, ...] = ONE_STEP
    # The schema state a succeeded job reports (TiDB's "public"); None: none.
    done_schema_state: str | None = None
    # Runs on tables keyed by anything but one integer column: its SQL uses
    # ``Job.key`` (``framework.keys``), never integer arithmetic on keys.
    keys_of_any_type: bool = False
    # Its prepare installs a trigger that gives every row inserted from then
    # on what the job writes (add-column, alter-type): rows past a range
    # step's last catch-up range are not missed (``framework.catch_up``).
    trigger_covers_inserts: bool = False
    # The forward steps whose quick subtasks' first batches the pool may run
    # together in one transaction (``write_batch``; ``subtask.commit_first_batches``).
    batch_steps: tuple[int, ...] = (STEP_PREPARED,)
    # ``reorg submit TYPE``'s own options: a function whose keyword parameters
    # are typer options, returning the params; or "module:function", imported
    # by ``reorg submit`` alone, so workers never import typer. None:
    # ``--table`` and ``--param KEY=VALUE``.
    submit_options: str | Callable[..., dict[str, Any]] | None = None
    # Rows per batch when the submit gives no --batch-rows.
    default_batch_rows: int = 10_000

    # --- planner: the owner's side, and submit's --------------------------

    @abstractmethod
    def validate(self, conn: Connection, params: dict[str, Any]) -> Target:
        """Submit: check and normalise ``params``, name the table and its key;
        raise InvalidParams (one line: what is wrong, how to fix it). Runs in
        a rolled-back transaction."""

    def handed_over(self, params: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
        """Submit, before ``validate``: the job type and params of another
        type that does this request (``alter-type --method rewrite`` is a
        ``rewrite`` job), or None to take it. Pure: no database; the type
        handed to validates the params it is given."""
        return None

    def analyse(self, conn: Connection, job: Job) -> dict[str, Any]:
        """Checks ``validate`` leaves to the owner (e.g. on a warm Spark
        session) before the split, in a rolled-back transaction: the job's
        params, or InvalidParams to reject the job. Only where a type
        overrides it (``analyses_on_owner``)."""
        return dict(job.params)

    def analyses_on_owner(self) -> bool:
        """Whether submit waits for the owner's ``analyse`` verdict."""
        return type(self).analyse is not JobType.analyse

    def describe(self, conn: Connection, job: Job) -> list[str]:
        """What ``--dry-run`` prints beside the ranges (e.g. each schema
        state's DDL); ``job.id`` is 0."""
        return []

    @abstractmethod
    def prepare(self, conn: Connection, job: Job) -> None:
        """Before step 1: the first schema step, in the fenced transaction
        that inserts step 1's subtasks and starts the job."""

    def enter_step(self, conn: Connection, job: Job, step: int) -> None:
        """The DDL between steps, entering forward step ``step`` (2, 3, ...),
        in the fenced transaction that moves the job's step."""
        return None

    def fixed_subtasks(self, conn: Connection, job: Job, step: int) -> list[dict[str, Any]]:
        """The subtasks of a fixed step (``Step(ranges=False)``), one meta
        dict each; none at all ends the step at the owner's next look."""
        return [{}]

    @abstractmethod
    def advance(self, conn: Connection, job: Job) -> None:
        """Every subtask of the last step succeeded: the final schema step
        (the cut-over), in the fenced transaction that marks the job
        succeeded, under the owner's bounded lock_timeout."""

    @abstractmethod
    def plan_revert(self, conn: Connection, job: Job) -> bool | Collection[int]:
        """After cancel or failure: True (restore the ranges of every step
        that declares ``restore``), False (nothing to restore by range), or
        the step numbers to restore. Nothing in it may grow with the job."""

    @abstractmethod
    def revert(self, conn: Connection, job: Job) -> None:
        """Every revert subtask succeeded (or none was needed): the final
        revert DDL, in the transaction that ends the job; also when the
        table is gone (so ``IF EXISTS``)."""

    def restores_into(self, job: Job) -> str:
        """The table the revert subtasks write."""
        return job.target_table

    def backlog(self, conn: Connection, job: Job) -> int | None:
        """Work the live job has beyond its ranges' rows, if its type keeps
        any (a change log still to replay), as one count; None: none now.
        The owner reads it every few seconds for the job's metrics and
        progress line, so it must stay cheap (a bounded count)."""
        return None

    def has_backlog(self) -> bool:
        return type(self).backlog is not JobType.backlog

    # --- executor: every worker's side ---------------------------------------

    def warm_before_step(self, job: Job, step: int) -> bool:
        """Whether the owner runs ``warm_up(job)`` in its own process before
        ``job`` enters ``step`` (whose ``enter_step`` needs it, e.g. Spark):
        off its tick (``framework.warming``), the step entered at a tick
        after the warm-up ended."""
        return False

    def warm_up(self, job: Job | None) -> None:
        """Per-process start-up (Spark's), before a process's first forward
        subtask of the type; idempotent. ``job`` None: at worker start."""
        return None

    def write_batch(self, ctx: SubtaskContext, conn: Connection) -> Batch:
        """Write the batch that starts at ``ctx.curr_key`` on ``conn`` (in a
        transaction the caller commits with the batch's fenced checkpoint)
        and say what it did. A type of range batches declares this; the
        default ``run_subtask`` runs it until the range is done."""
        raise NotImplementedError(f"job type {self.name!r} writes no batches of its own")

    def run_subtask(self, ctx: SubtaskContext) -> None:
        """One subtask of a forward step (``ctx.job.step`` says which)."""
        ctx.run_batches(lambda conn: self.write_batch(ctx, conn))

    def revert_subtask(self, ctx: SubtaskContext) -> None:
        """One revert subtask: restore ``[ctx.curr_key, ctx.end_key)`` of the
        forward step ``ctx.meta["revert_of_step"]``, batch by batch."""
        raise NotImplementedError(f"job type {self.name!r} plans no revert subtasks")

    # --- derived --------------------------------------------------------------

    def batch_writer(self, step: int) -> Callable[[SubtaskContext, Connection], Batch] | None:
        """``write_batch``, for a forward step whose quick subtasks' first
        batches may share a transaction; None otherwise."""
        if step not in self.batch_steps or type(self).write_batch is JobType.write_batch:
            return None
        return self.write_batch

    def run_step(self, ctx: SubtaskContext) -> None:
        """Run one claimed subtask: a revert subtask restores (PostgreSQL
        alone: no warm-up), any other warms the type up and runs forward."""
        if ctx.job.step == STEP_REVERT:
            self.revert_subtask(ctx)
        else:
            self.warm_up(ctx.job)
            self.run_subtask(ctx)

    def done_step(self) -> int:
        """The step a succeeded job of the type is at: past its last forward step."""
        return len(self.steps) + 1

    def step_named(self, number: int) -> Step:
        """Forward step ``number`` (1-based, as stored)."""
        if not 1 <= number <= len(self.steps):
            raise ValueError(f"job type {self.name!r} has no forward step {number}")
        return self.steps[number - 1]

    def steps_to_restore(self, job: Job, planned: bool | Collection[int]) -> list[int]:
        """The forward steps whose progressed ranges the revert step restores,
        from what ``plan_revert`` returned."""
        if planned is True:
            return [n for n, step in enumerate(self.steps, start=1)
                    if n <= job.step and step.restore]
        if not planned:
            return []
        chosen = sorted(set(planned))  # type: ignore[arg-type]
        for number in chosen:
            if not self.step_named(number).ranges:
                raise ValueError(
                    f"plan_revert named step {number}, which has no ranges to restore")
        return chosen


_registry: dict[str, JobType] = {}
_loaded: set[str] = set()  # entry points loaded, by name; "*": all of them
GROUP = "reorg.job_types"


def register(job_type: JobType) -> None:
    if not isinstance(job_type, JobType):
        raise TypeError(f"{job_type!r} is not a framework.jobtype.JobType")
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
