"""``JobType.run_step``, what a worker slot calls for every claimed subtask:
a forward subtask warms its type up first (Spark starts there), a revert
subtask restores without it (DESIGN 13: restores are PostgreSQL alone, so a
worker that only reverts never starts a JVM). The short form of
tests/fault/test_revert_faults.py::test_kill_9_mid_restore_of_a_spark_backfill_resumes_without_spark
(matrix)."""

from __future__ import annotations

import pytest

from framework.jobtype import JobType
from framework.records import STEP_REVERT, Job
from framework.subtask import SubtaskContext


class RecordingType(JobType):
    """A job type whose warm-up, like Spark's, is what a revert must skip."""

    name = "recording"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def warm_up(self, job: Job | None) -> None:
        self.calls.append("warm_up")

    def run_subtask(self, ctx: SubtaskContext) -> None:
        self.calls.append("run_subtask")

    def revert_subtask(self, ctx: SubtaskContext) -> None:
        self.calls.append("revert_subtask")

    validate = prepare = advance = plan_revert = revert = None  # type: ignore[assignment]


def _ctx(step: int) -> SubtaskContext:
    job = Job(id=1, type="recording", state="reverting" if step == STEP_REVERT else "running",
              step=step, params={}, target_table="public.items", key_column='"id"',
              batch_rows=100, max_rows_per_sec=None, row_estimate=None)
    return SubtaskContext(job=job, subtask_id=1, start_key=1, end_key=10, curr_key=1, epoch=1,
                          meta={}, engine=None, fence=lambda *a: None)  # type: ignore[arg-type]


@pytest.mark.parametrize(("step", "calls"), [
    (1, ["warm_up", "run_subtask"]),
    (2, ["warm_up", "run_subtask"]),
    (STEP_REVERT, ["revert_subtask"]),
])
def test_only_forward_subtasks_warm_their_type_up(step: int, calls: list[str]) -> None:
    kind = RecordingType()
    kind.run_step(_ctx(step))
    assert kind.calls == calls
