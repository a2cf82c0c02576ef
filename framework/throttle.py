"""Health throttles: hold a job's batches while the database is unhealthy.

Two signals, each a knob of the job (``reorg submit``/``reorg alter``):

``max_replica_lag`` (seconds)
    Batches wait while any standby connected to the primary is further behind
    than this. A standby's lag is *how long ago the oldest WAL it has not
    replayed was written*, not PostgreSQL's ``replay_lag`` alone, because:

    - ``replay_lag`` is NULL once the standby has caught up and the primary is
      idle, and it is *stale*, not growing, while replay is stuck (paused,
      blocked by a query conflict): it is only measured when replay advances;
    - a distance in bytes says nothing about time.

    So each node samples the primary's WAL position with every health reading
    (``HealthMonitor``). For a standby whose replay position is behind the
    primary's, the first sample past that position says when WAL it has not
    replayed already existed; the lag is the standby's last reply time minus
    that sample's time (a lower bound, exact to one health interval), or
    ``replay_lag`` if that is larger. A standby that has replayed everything
    the primary had written at the reading lags 0, whatever ``replay_lag``
    says. A standby whose position is not visible (the role lacks
    ``pg_monitor``) counts as over the limit; a standby that is disconnected
    is not in ``pg_stat_replication`` and is not seen at all. Standbys report
    their replay position with each reply: ``wal_receiver_status_interval``
    (10 s by default) bounds how late a stuck or resumed replay is noticed.

``max_active_sessions``
    Batches wait while more client sessions of the job's database than this
    are active (``pg_stat_activity.state = 'active'``). reorg's own
    connections (application name ``reorg-*``) do not count, so a job's own
    batches never hold it; Spark's JDBC reads do.

Cheap by construction: a node reads the database's health with one
statement at most once per ``HEALTH_INTERVAL_SECONDS``, shared by all its
slots and jobs, and only while a job with a health limit runs there.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from framework import faults
from framework.db import Database
from framework.errors import one_line
from framework.records import Job
from framework.store import health, jobs

if TYPE_CHECKING:  # the worker's; `reorg status` reads this module too
    from framework.subtask import SubtaskContext

log = logging.getLogger("reorg.throttle")

# How old a health reading may be before a slot reads it again; also how
# often a held slot looks again and refreshes its "throttled" note.
HEALTH_INTERVAL_SECONDS = 1.0
# WAL position samples kept for the lag arithmetic (an hour at one a second):
# a lag older than the oldest sample reads as at least that old.
MAX_SAMPLES = 3600


def has_health_limits(job: Job) -> bool:
    return bool(job.max_replica_lag or job.max_active_sessions)


class WalSamples:
    """(WAL position, time) of the primary, in time order, positions rising."""

    def __init__(self, limit: int = MAX_SAMPLES) -> None:
        self._samples: deque[tuple[int, float]] = deque(maxlen=limit)

    def add(self, pos: int, at: float) -> None:
        if self._samples and pos < self._samples[-1][0]:
            self._samples.clear()  # a new primary (failover): its history is not ours
        self._samples.append((pos, at))

    def first_past(self, pos: int) -> float | None:
        """Time of the first sample whose position is beyond ``pos``: WAL the
        standby had not replayed existed by then. None: no sample is."""
        positions = [p for p, _ in self._samples]
        i = bisect.bisect_right(positions, pos)
        return self._samples[i][1] if i < len(self._samples) else None


def standby_lag(standby: health.Standby, reading: health.Reading,
                samples: WalSamples) -> float | None:
    """Seconds the standby is behind (see the module docstring); None when its
    position is not visible."""
    if standby.replay_pos is None:
        return None
    if reading.wal_pos is not None and standby.replay_pos >= reading.wal_pos:
        return 0.0
    behind_since = samples.first_past(standby.replay_pos)
    by_samples = 0.0
    if behind_since is not None:
        by_samples = max((standby.reply_at or reading.at) - behind_since, 0.0)
    return max(by_samples, standby.replay_lag or 0.0)


def standby_lags(reading: health.Reading, samples: WalSamples) -> dict[str, float]:
    """Each standby's lag by its name; one whose position is not visible has none."""
    lags = {s.name: standby_lag(s, reading, samples) for s in reading.standbys}
    return {name: lag for name, lag in lags.items() if lag is not None}


def hold_reason(job: Job, reading: health.Reading, samples: WalSamples) -> str | None:
    """Why the job's batches must wait now, or None."""
    if job.max_replica_lag:
        worst: tuple[float, str] | None = None
        for standby in reading.standbys:
            lag = standby_lag(standby, reading, samples)
            if lag is None:
                return (f"replica lag unknown ({standby.name}: replay position not "
                        "visible; grant pg_monitor to reorg's role)")
            if worst is None or lag > worst[0]:
                worst = (lag, standby.name)
        if worst is not None and worst[0] > job.max_replica_lag:
            shown = f"{worst[0]:.1f}" if worst[0] < 10 else f"{worst[0]:.0f}"
            return f"replica lag {shown}s > {job.max_replica_lag:g}s ({worst[1]})"
    if job.max_active_sessions and reading.active_sessions > job.max_active_sessions:
        return f"active sessions {reading.active_sessions} > {job.max_active_sessions}"
    return None


# What kind of reason ``hold_reason`` (or ``HealthMonitor.reason``) gave, by
# how its text starts: the ``reason`` label of ``reorg_job_throttled``.
REASON_KINDS = (("replica lag unknown", "replica_lag_unknown"), ("replica lag", "replica_lag"),
                ("active sessions", "active_sessions"),
                ("health check failed", "health_check_failed"))


def reason_kind(reason: str) -> str:
    """The kind of a throttle reason, e.g. ``replica_lag`` for ``replica lag
    12s > 5s (standby1)``; ``other`` for a text none of them starts."""
    return next((kind for start, kind in REASON_KINDS if reason.startswith(start)), "other")


@dataclass
class _Note:
    reason: str | None
    written_at: float  # monotonic


class HealthMonitor:
    """One per node: the latest health reading, shared by every slot, and the
    gate slots pass before each batch of a job with a health limit."""

    def __init__(self, db: Database, clock: Callable[[], float] = time.monotonic,
                 interval: float = HEALTH_INTERVAL_SECONDS,
                 on_lags: Callable[[dict[str, float]], None] | None = None) -> None:
        """``on_lags``: told the standbys' lags each time a job with a
        replica-lag limit reads them (the node's metrics)."""
        self.db = db
        self.on_lags = on_lags
        self.clock = clock
        self.interval = interval
        self.samples = WalSamples()
        self._reading: health.Reading | None = None
        self._read_at = float("-inf")  # monotonic
        self._read_lock = threading.Lock()
        self._notes: dict[int, _Note] = {}
        self._notes_lock = threading.Lock()
        self.reads = 0  # statements run; tests and the bench read it

    def reading(self) -> health.Reading:
        """The latest reading, read again when older than the interval; while
        one slot reads, the others wait for its result instead of reading too."""
        with self._read_lock:
            if self._reading is None or self.clock() - self._read_at >= self.interval:
                with self.db.begin() as conn:
                    reading = health.read(conn)
                self.reads += 1
                if reading.wal_pos is not None:
                    self.samples.add(reading.wal_pos, reading.at)
                self._reading, self._read_at = reading, self.clock()
            return self._reading

    def reason(self, job: Job) -> str | None:
        try:
            reading = self.reading()
            if job.max_replica_lag and self.on_lags is not None:
                self.on_lags(standby_lags(reading, self.samples))
            return hold_reason(job, reading, self.samples)
        except Exception as exc:  # unhealthy enough: hold, and say why
            return f"health check failed: {one_line(exc)}"

    def hold(self, ctx: SubtaskContext) -> None:
        """Wait while the job must not run a batch; returns at once for a job
        without health limits, or when the subtask must stop (the caller's
        next step raises). Limits changed by ``reorg alter`` arrive in
        ``ctx.job`` with the lease renewals, so a held slot sees them too."""
        while not ctx.should_stop():
            job = ctx.job
            reason = self.reason(job) if has_health_limits(job) else None
            self._note(job.id, reason)
            if reason is None:
                return
            faults.hit("throttle.held")
            ctx.stop_event.wait(self.interval)

    def _note(self, job_id: int, reason: str | None) -> None:
        """Tell ``reorg status`` what holds the job: on a change, and while
        held once per interval (so a note no worker refreshes reads as stale)."""
        now = self.clock()
        with self._notes_lock:
            last = self._notes.get(job_id)
            if reason is None and (last is None or last.reason is None):
                return
            if last is not None and last.reason == reason and now - last.written_at < self.interval:
                return
            self._notes[job_id] = _Note(reason, now)
        if reason is not None and (last is None or last.reason is None):
            log.info("job %s throttled: %s", job_id, reason, extra={"job_id": job_id})
        elif reason is None:
            log.info("job %s no longer throttled", job_id, extra={"job_id": job_id})
        try:
            with self.db.begin() as conn:
                jobs.note_throttled(self.db, conn, job_id, reason)
        except Exception as exc:  # a note is not worth failing a batch for
            log.warning("could not note throttling of job %s: %s", job_id, one_line(exc))
