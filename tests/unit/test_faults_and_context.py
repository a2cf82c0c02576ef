"""Fault points and the subtask context's stop semantics (pure logic)."""

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support import wait_until

from framework import faults
from framework.errors import LeaseLost, Stopped
from framework.records import Job
from framework.subtask import LEASE_LOST, SubtaskContext


def test_unarmed_fault_is_a_no_op_and_armed_one_fires_on_the_nth_hit():
    faults.hit("worker.after_claim")
    faults.arm("worker.after_claim", "raise@2")
    faults.hit("worker.after_claim")
    with pytest.raises(RuntimeError, match="fault worker.after_claim"):
        faults.hit("worker.after_claim")
    faults.hit("worker.after_claim")


def test_the_known_points_are_exactly_the_points_the_code_hits():
    root = Path(__file__).parents[2]
    used = {m for package in ("framework", "backfill", "cli")
            for path in (root / package).rglob("*.py")
            for m in re.findall(r"faults\.hit\(\"([^\"]+)\"\)", path.read_text())}
    assert used == set(faults.POINTS)
    assert len(faults.POINTS) == len(set(faults.POINTS))
    with pytest.raises(ValueError, match="unknown fault point 'worker.after_merge'"):
        faults.arm("worker.after_merge", "exit")


def test_signals_are_off_until_enabled_and_each_wait_takes_one_hit():
    faults.hit("worker.after_batch")
    with pytest.raises(RuntimeError, match="enable_signals"):
        faults.wait("worker.after_batch", 0.1)
    faults.enable_signals()
    with pytest.raises(AssertionError, match="worker.after_batch"):
        faults.wait("worker.after_batch", 0.05)  # the hit before enabling does not count
    threading.Timer(0.1, faults.hit, ["worker.after_batch"]).start()
    faults.hit("worker.after_batch")
    faults.wait("worker.after_batch", 5)
    faults.wait("worker.after_batch", 5)  # the timer's hit
    with pytest.raises(AssertionError):
        faults.wait("worker.after_batch", 0.05)


def test_block_holds_the_thread_until_released_and_the_point_stays_open():
    faults.arm("worker.after_batch", "block")
    passed = []

    def batch():
        faults.hit("worker.after_batch")
        passed.append(1)

    threads = [threading.Thread(target=batch) for _ in range(2)]
    for t in threads:
        t.start()
    faults.wait_blocked("worker.after_batch", 5, count=2)
    assert passed == [] and faults.blocked("worker.after_batch") == 2
    faults.release("worker.after_batch")
    for t in threads:
        t.join(5)
    assert passed == [1, 1] and faults.blocked("worker.after_batch") == 0
    faults.hit("worker.after_batch")  # released: later hits pass


def test_disarm_all_lets_blocked_threads_go():
    faults.arm("worker.after_claim", "block@2")
    faults.hit("worker.after_claim")  # only the 2nd hit blocks
    t = threading.Thread(target=faults.hit, args=["worker.after_claim"])
    t.start()
    faults.wait_blocked("worker.after_claim", 5)
    faults.disarm_all()
    t.join(5)
    assert not t.is_alive()


def test_block_across_processes_through_gates(tmp_path):
    gates = faults.Gates(tmp_path)
    code = ("from framework import faults; faults.hit('worker.after_batch'); "
            "print('passed', flush=True)")
    env = {**os.environ, **gates.env(), "REORG_FAULTS": "worker.after_batch=block"}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            text=True, cwd=Path(__file__).parents[2])
    try:
        assert gates.wait_blocked("worker.after_batch", 30) == [proc.pid]
        assert proc.poll() is None
        gates.release("worker.after_batch")
        out, _ = proc.communicate(timeout=30)
        assert out == "passed\n" and proc.returncode == 0
        assert gates.blocked("worker.after_batch") == []
    finally:
        proc.kill()


def _ctx() -> SubtaskContext:
    job = Job(1, "t", "running", 1, {}, "t", "id", 100, None, None)
    return SubtaskContext(job, 1, 0, 10, 0, 1, {}, engine=None, fence=lambda *a: None)  # type: ignore[arg-type]


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
    ctx._pace = lambda s: waited.append(s)  # type: ignore[method-assign]
    ctx.throttle(rows=100, took_seconds=0.05)
    assert waited == [pytest.approx(0.15)]  # 100 rows * 2 slots / 1000 rows/s - 0.05 s


def test_the_rate_budget_is_split_among_the_subtasks_running_the_job():
    """--max-rows-per-sec is the job's: 4 running subtasks get a quarter each
    whatever the concurrency setting (16 by default), and one alone gets it all."""
    from dataclasses import replace

    job = Job(1, "t", "running", 1, {}, "t", "id", 100, 2_000, None, concurrency=16)
    assert job.rate_share() == 2_000 / 16  # nothing seen yet: the most it could be split
    assert replace(job, running=4).rate_share() == 500
    assert replace(job, running=1).rate_share() == 2_000
    assert replace(job, max_rows_per_sec=None, running=4).rate_share() is None
