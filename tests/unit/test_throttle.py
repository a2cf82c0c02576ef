"""The health throttles' decisions (framework.throttle), without a server:
how a standby's lag is worked out from the primary's WAL samples, and what
holds a job."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from framework.records import Job
from framework.store.health import Reading, Standby
from framework.subtask import SubtaskContext
from framework.throttle import WalSamples, hold_reason, standby_lag


def job(**limits: object) -> Job:
    knobs: dict[str, object] = {"max_rows_per_sec": None, "row_estimate": None, **limits}
    return Job(1, "t", "running", 1, {}, "t", "id", 100, **knobs)  # type: ignore[arg-type]


def samples(*points: tuple[int, float]) -> WalSamples:
    s = WalSamples()
    for pos, at in points:
        s.add(pos, at)
    return s


def test_a_stuck_standby_lags_since_the_first_wal_it_has_not_replayed_was_seen():
    wal = samples((100, 10.0), (200, 11.0), (300, 12.0), (400, 13.0))
    reading = Reading(at=20.0, wal_pos=400, active_sessions=0, standbys=())
    # Replayed up to 150: WAL past it existed by t=11; its last reply came at t=19.
    stuck = Standby("s1", replay_pos=150, reply_at=19.0, replay_lag=0.5)
    assert standby_lag(stuck, reading, wal) == 8.0
    # PostgreSQL's own replay_lag wins when it says more.
    assert standby_lag(Standby("s1", 150, 19.0, 30.0), reading, wal) == 30.0
    # Caught up with the primary's position: no lag, whatever replay_lag (stale) says.
    assert standby_lag(Standby("s1", 400, 19.0, 30.0), reading, wal) == 0.0
    # Position not visible (no pg_monitor): unknown.
    assert standby_lag(Standby("s1", None, None, None), reading, wal) is None


def test_a_new_primary_forgets_the_old_ones_wal_samples():
    wal = samples((1_000, 1.0), (2_000, 2.0))
    wal.add(50, 3.0)  # behind the last sample: a failover
    assert wal.first_past(10) == 3.0
    assert wal.first_past(50) is None


def test_what_holds_a_job():
    wal = samples((100, 10.0), (200, 11.0))
    lagging = Reading(20.0, 200, 3, (Standby("a", 200, 19.0, None),
                                     Standby("b", 150, 19.0, None)))
    assert hold_reason(job(), lagging, wal) is None
    assert hold_reason(job(max_replica_lag=5.0), lagging, wal) == "replica lag 8.0s > 5s (b)"
    assert hold_reason(job(max_replica_lag=10.0), lagging, wal) is None
    assert hold_reason(job(max_active_sessions=3), lagging, wal) is None
    assert hold_reason(job(max_active_sessions=2), lagging, wal) == "active sessions 3 > 2"
    blind = Reading(20.0, 200, 0, (Standby("c", None, None, None),))
    assert "grant pg_monitor" in (hold_reason(job(max_replica_lag=5.0), blind, wal) or "")
    # No standby at all: nothing lags.
    assert hold_reason(job(max_replica_lag=1.0), Reading(20.0, 200, 0, ()), wal) is None


def test_throttle_books_batches_on_the_jobs_shared_schedule():
    """A worker's context waits what the job's schedule says (``rate_gate``);
    without a gate it paces by its share; if booking fails it paces alone."""
    import threading

    booked: list[tuple[int, float]] = []
    waited: list[float] = []

    def context(gate):  # type: ignore[no-untyped-def]
        ctx = SubtaskContext(job=job(max_rows_per_sec=1_000, concurrency=2), subtask_id=1,
                             start_key=0, end_key=10, curr_key=0, epoch=1, meta={},
                             engine=None, fence=lambda *a: None, stop_event=threading.Event(),
                             rate_gate=gate)
        # What the slot waits for its turn (none when it need not wait).
        ctx._pace = lambda s: s > 0 and waited.append(s)  # type: ignore[method-assign]
        return ctx

    context(lambda rows, took: booked.append((rows, took)) or 0.7).throttle(100, 0.05)
    assert (booked, waited) == ([(100, 0.05)], [0.7])

    waited.clear()
    context(lambda rows, took: None).throttle(100, 0.05)  # the limit was lifted meanwhile
    assert waited == []

    def away(rows: int, took: float) -> float:
        raise OSError("connection refused")

    context(away).throttle(100, 0.05)
    assert waited == [pytest.approx(0.15)]  # 100 rows / (1000 rows/s / 2 subtasks) - 0.05 s


@pytest.mark.parametrize("new_limit", [1_000_000, None], ids=["raised", "lifted"])
def test_a_slot_waiting_its_turn_at_the_old_limit_goes_on_once_it_is_raised_or_lifted(
        new_limit):
    """``reorg alter`` reaches the waiting slot through the lease renewal
    (``retune``): what is left of its wait is re-timed at the new limit, not
    slept out at the old one."""
    ctx = SubtaskContext(job=job(max_rows_per_sec=10), subtask_id=1, start_key=0, end_key=10,
                         curr_key=0, epoch=1, meta={}, engine=None, fence=lambda *a: None,
                         stop_event=threading.Event())
    slot = threading.Thread(target=ctx._pace, args=(30.0,))  # 300 rows booked at 10 rows/s
    slot.start()
    time.sleep(0.1)
    ctx.retune(replace(ctx.job, batch_rows=500))  # another knob: the wait goes on
    slot.join(0.3)
    assert slot.is_alive()
    started = time.monotonic()
    ctx.retune(replace(ctx.job, max_rows_per_sec=new_limit))
    slot.join(5)
    assert not slot.is_alive() and time.monotonic() - started < 5


def test_a_lowered_limit_lengthens_the_wait_and_a_stop_ends_it():
    ctx = SubtaskContext(job=job(max_rows_per_sec=1_000), subtask_id=1, start_key=0,
                         end_key=10, curr_key=0, epoch=1, meta={}, engine=None, fence=lambda *a: None,
                         stop_event=threading.Event())
    slot = threading.Thread(target=ctx._pace, args=(0.5,))
    slot.start()
    ctx.retune(replace(ctx.job, max_rows_per_sec=10))  # what is left: 100 times as long
    slot.join(2)
    assert slot.is_alive()
    ctx.stop("job pausing", hard=False)
    slot.join(5)
    assert not slot.is_alive()


def test_the_kind_of_a_reason_is_the_label_of_reorg_job_throttled():
    from framework.throttle import reason_kind

    assert reason_kind("replica lag 8.0s > 5s (b)") == "replica_lag"
    assert reason_kind("replica lag unknown (s1: replay position not visible; grant "
                       "pg_monitor to reorg's role)") == "replica_lag_unknown"
    assert reason_kind("active sessions 3 > 2") == "active_sessions"
    assert reason_kind("health check failed: connection refused") == "health_check_failed"
    assert reason_kind("something new") == "other"


def test_a_replica_lag_reading_is_exported_per_standby_and_goes_when_no_job_reads_it(
        monkeypatch):
    from contextlib import contextmanager

    from prometheus_client import REGISTRY

    from framework import metrics
    from framework.store import health
    from framework.throttle import HealthMonitor

    class Db:
        @contextmanager
        def begin(self):
            yield None

    def lag(standby: str) -> float | None:
        return REGISTRY.get_sample_value("reorg_replica_lag_seconds", {"standby": standby})

    reading = Reading(20.0, 200, 0, (Standby("a", 200, 19.0, None), Standby("b", 150, 19.0, None),
                                     Standby("hidden", None, None, None)))
    monkeypatch.setattr(health, "read", lambda conn: reading)
    monitor = HealthMonitor(Db(), on_lags=metrics.replica_lag)  # type: ignore[arg-type]
    monitor.samples.add(100, 10.0)
    monitor.samples.add(160, 11.0)
    assert monitor.reason(job(max_active_sessions=5)) is None
    assert lag("b") is None  # a job without a replica-lag limit reads no lag
    assert monitor.reason(job(max_replica_lag=60.0)).startswith("replica lag unknown (hidden")
    assert (lag("a"), lag("b"), lag("hidden")) == (0.0, 8.0, None)  # the visible ones
    metrics.drop_stale_replica_lag(60.0)
    assert lag("b") == 8.0  # read just now: kept
    metrics.drop_stale_replica_lag(0.0)
    assert (lag("a"), lag("b")) == (None, None)


def test_status_takes_a_throttled_note_as_stale_after_ten_refresh_intervals():
    """control writes the figure out so as not to import this module; it
    must follow the interval a held slot refreshes its note at."""
    from framework import control, throttle

    assert control.THROTTLED_NOTE_FRESH_SECONDS == 10 * throttle.HEALTH_INTERVAL_SECONDS
