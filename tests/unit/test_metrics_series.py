"""The owner's per-job series (framework.metrics.OwnerJobSeries) without a
server: one state at a time, the throttle's reason as a label, the last
figures kept for KEEP_ENDED_SECONDS after the end, then none; a live job no
longer read (a rejected job is deleted) goes at once."""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY

from framework import metrics

JOB = 9_000_001  # far from the job ids other tests in this process use


def row(state: str, **figures: Any) -> dict[str, Any]:
    return {"id": JOB, "state": state, "step": 1, "rows_processed": 10, "percent": 1.0,
            "rows_done": 10, "rows_per_sec": 5.0, "eta_seconds": 20.0, "throttle_kind": None,
            "failed_job": False, **figures}


def value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"job_id": str(JOB), **labels})


def shown() -> list[str]:
    return sorted(s.name + str(sorted(s.labels.items())) for f in REGISTRY.collect()
                  for s in f.samples if s.labels.get("job_id") == str(JOB))


def test_a_job_shows_one_state_its_throttle_reason_and_goes_after_it_ended() -> None:
    now = [100.0]
    series = metrics.OwnerJobSeries(clock=lambda: now[0])
    ended = frozenset({"succeeded", "cancelled", "reverted"})
    series.show([row("running", throttle_kind="replica_lag")], ended=ended, backlog={JOB: 7})
    assert value("reorg_job_state", state="running") == 1
    assert value("reorg_job_throttled", reason="replica_lag") == 1
    assert value("reorg_job_backlog") == 7
    assert series.live() == [JOB]
    series.show([row("running", throttle_kind="active_sessions", eta_seconds=None)],
                ended=ended, backlog={})
    assert value("reorg_job_throttled", reason="replica_lag") is None  # one reason at a time
    assert value("reorg_job_throttled", reason="active_sessions") == 1
    assert value("reorg_job_eta_seconds") is None and value("reorg_job_backlog") is None
    series.show([row("succeeded", percent=100.0)], ended=ended, backlog={})
    assert value("reorg_job_state", state="running") is None
    assert value("reorg_job_state", state="succeeded") == 1
    assert value("reorg_job_throttled", reason="active_sessions") is None
    assert series.live() == []
    now[0] += metrics.KEEP_ENDED_SECONDS - 1
    series.show([], ended=ended, backlog={})
    assert value("reorg_job_progress_ratio") == 1.0  # a scrape still sees the end
    now[0] += 1
    series.show([], ended=ended, backlog={})
    assert shown() == []


def test_a_live_job_no_longer_read_goes_and_a_node_that_stops_owning_shows_none() -> None:
    series = metrics.OwnerJobSeries()
    series.show([row("queued")], ended=frozenset(), backlog={})
    assert value("reorg_job_state", state="queued") == 1
    series.show([], ended=frozenset(), backlog={})  # deleted (a rejected job)
    assert shown() == [] and series.live() == []
    series.show([row("running")], ended=frozenset(), backlog={})
    series.clear()
    assert shown() == [] and REGISTRY.get_sample_value("reorg_is_owner") == 0
