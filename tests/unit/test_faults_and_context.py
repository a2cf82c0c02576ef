"""Fault points and the subtask context's stop semantics (pure logic)."""

import threading

import pytest
from helpers import wait_until

from framework import faults
from framework.jobtype import LEASE_LOST, Job, LeaseLost, Stopped, SubtaskContext


@pytest.fixture(autouse=True)
def _clean_faults():
    faults.disarm_all()
    yield
    faults.disarm_all()


def test_unarmed_fault_is_a_no_op_and_armed_one_fires_on_the_nth_hit():
    faults.hit("nowhere")
    faults.arm("p", "raise@2")
    faults.hit("p")
    with pytest.raises(RuntimeError, match="fault p"):
        faults.hit("p")
    faults.hit("p")


def _ctx() -> SubtaskContext:
    job = Job(1, "t", "running", 1, {}, "t", "id", 100, None, None)
    return SubtaskContext(job, 1, 0, 10, 0, 1, {}, lambda *a: None, threading.Event())


def test_soft_stop_keeps_the_batch_and_hard_stop_runs_cancellers_once():
    ctx, calls = _ctx(), []
    ctx.on_stop(lambda: calls.append("cancel"))
    ctx.stop("job pausing", hard=False)
    assert calls == [] and ctx.should_stop()
    with pytest.raises(Stopped):
        ctx.raise_if_stopped()
    ctx.stop("job cancelling", hard=True)
    ctx.stop("job cancelling", hard=True)
    wait_until(lambda: calls, 5, "canceller to run")
    assert calls == ["cancel"]


def test_lost_lease_raises_lease_lost_and_late_cancellers_run_at_once():
    ctx, calls = _ctx(), []
    ctx.stop(LEASE_LOST, hard=True)
    with pytest.raises(LeaseLost):
        ctx.raise_if_stopped()
    ctx.on_stop(lambda: calls.append("late"))
    assert calls == ["late"]


def test_throttle_paces_to_the_jobs_share_of_the_limit():
    ctx = _ctx()
    ctx.job = Job(1, "t", "running", 1, {}, "t", "id", 100, 1000, None, concurrency=2)
    waited = []
    ctx.stop_event.wait = lambda s: waited.append(s)  # type: ignore[method-assign]
    ctx.throttle(rows=100, took_seconds=0.05)
    assert waited == [pytest.approx(0.15)]  # 100 rows * 2 slots / 1000 rows/s - 0.05 s
