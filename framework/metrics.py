"""A node's Prometheus metrics: the metric objects, and the few calls the
worker pool, the owner's reports and the node make to update them.

Updating a metric is an in-memory increment, so the hot path (one call per
batch) costs next to nothing; nothing is served unless the node's status
server runs (``reorg worker --metrics-port``, ``framework.status_server``).
Without ``prometheus_client`` installed the metrics are no-ops and serving
refuses with one line.

Series per node (a scrape reads one node; sum over nodes in the query):

    reorg_build_info{version,python}                 1: what this node runs
    reorg_rows_processed_total{job_id,job_type}      rows of batches this node committed
    reorg_batches_total{job_id,job_type,outcome}     committed | rolled_back | refused
    reorg_batch_duration_seconds{job_type}           histogram: a batch's own transaction
    reorg_subtasks_total{job_type,outcome}           succeeded | released | waiting | lost | retry | failed
    reorg_subtasks_running                           subtasks this node runs now
    reorg_leases_lost_total{reason}                  renewal_refused | untrusted | checkpoint_refused
    reorg_replica_lag_seconds{standby}               a standby's lag, while a job with
                                                     --max-replica-lag runs here
    reorg_is_owner                                   1 on the owner node

and on the owner, per job (``OWNER_JOB_GAUGES``), the figures ``reorg
status`` shows (``store.progress``):

    reorg_job_state{job_id,state}                    1 (the job's state now)
    reorg_job_failed{job_id}                         1 once the job failed (paused on it too)
    reorg_job_progress_ratio{job_id}                 percent / 100 (1 when succeeded)
    reorg_job_rows_done{job_id}                      rows done of its current range step
    reorg_job_rows_per_second{job_id}                recent rows/s
    reorg_job_eta_seconds{job_id}                    while it has one
    reorg_job_progress_timestamp_seconds{job_id}     when its figures last moved (Unix time)
    reorg_job_throttled{job_id,reason}               1 while a health limit holds it
    reorg_job_backlog{job_id}                        its type's backlog, where it has one

A job's series go ``KEEP_ENDED_SECONDS`` after it ended (a scrape meanwhile
sees its last figures), on the owner and on every worker that ran it; a
long-lived worker keeps none of old jobs.
"""

from __future__ import annotations

import contextlib
import platform
import threading
import time
from typing import Any

try:
    import prometheus_client as prom
except ImportError:  # pragma: no cover - the package depends on it; a stripped install may not
    prom = None  # type: ignore[assignment]


class _Noop:
    def labels(self, *args: Any, **kwargs: Any) -> _Noop:
        return self

    def inc(self, amount: float = 1) -> None: ...
    def dec(self, amount: float = 1) -> None: ...
    def set(self, value: float) -> None: ...
    def observe(self, value: float) -> None: ...
    def remove(self, *labels: Any) -> None: ...


def _make(kind: str, name: str, doc: str, labels: tuple[str, ...] = (), **kw: Any) -> Any:
    if prom is None:
        return _Noop()
    return getattr(prom, kind)(name, doc, labels, **kw)


# A job's series stay this long after it ended: long enough for a scrape
# (15-60 s apart) to see its final figures, then they go.
KEEP_ENDED_SECONDS = 120.0

BUILD_INFO = _make("Gauge", "reorg_build_info", "1; the reorg version this node runs.",
                   ("version", "python"))
ROWS = _make("Counter", "reorg_rows_processed", "Rows of batches this node committed.",
             ("job_id", "job_type"))
BATCHES = _make("Counter", "reorg_batches", "Batches this node ran, by outcome "
                "(committed; rolled_back: an error; refused: the lease was lost).",
                ("job_id", "job_type", "outcome"))
BATCH_SECONDS = _make(
    "Histogram", "reorg_batch_duration_seconds",
    "Seconds of a committed batch's own transaction, its write and fenced checkpoint "
    "(no pacing or throttle wait).",
    ("job_type",), buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
SUBTASKS = _make("Counter", "reorg_subtasks", "Subtasks this node ran, by outcome.",
                 ("job_type", "outcome"))
RUNNING = _make("Gauge", "reorg_subtasks_running", "Subtasks this node is running now.")
LEASES_LOST = _make("Counter", "reorg_leases_lost",
                    "Subtask leases this node lost (its work on them was abandoned).",
                    ("reason",))
# Every reason from the start, at 0: an alert on rate(reorg_leases_lost_total)
# needs the series to exist before the first loss.
for _reason in ("renewal_refused", "untrusted", "checkpoint_refused"):
    LEASES_LOST.labels(_reason)
REPLICA_LAG = _make("Gauge", "reorg_replica_lag_seconds",
                    "A standby's replay lag as the replica-lag throttle measures it; read only "
                    "while a job with --max-replica-lag runs on this node.", ("standby",))
IS_OWNER = _make("Gauge", "reorg_is_owner", "1 while this node is the elected owner.")

JOB_STATE = _make("Gauge", "reorg_job_state", "Owner only: 1 for the job's state now.",
                  ("job_id", "state"))
JOB_FAILED = _make("Gauge", "reorg_job_failed",
                   "Owner only: 1 once the job failed (rolling back, rolled back, or paused "
                   "on a failure with --on-failure pause).", ("job_id",))
JOB_PROGRESS = _make("Gauge", "reorg_job_progress_ratio",
                     "Owner only: a job's progress as reorg status shows it, 0 to 1 "
                     "(1 when succeeded).", ("job_id",))
JOB_ROWS = _make("Gauge", "reorg_job_rows_done",
                 "Owner only: a job's rows done as reorg status shows them.", ("job_id",))
JOB_RATE = _make("Gauge", "reorg_job_rows_per_second",
                 "Owner only: a job's recent rows/s as reorg status shows it.", ("job_id",))
JOB_ETA = _make("Gauge", "reorg_job_eta_seconds",
                "Owner only: seconds a running job has left at its recent rate (absent "
                "without one).", ("job_id",))
JOB_MOVED_AT = _make("Gauge", "reorg_job_progress_timestamp_seconds",
                     "Owner only: Unix time the job's figures (rows, percent, step or state) "
                     "last moved, as this owner saw them.", ("job_id",))
JOB_THROTTLED = _make("Gauge", "reorg_job_throttled",
                      "Owner only: 1 while a health limit holds the job's batches, by reason "
                      "(replica_lag, replica_lag_unknown, active_sessions, health_check_failed).",
                      ("job_id", "reason"))
JOB_BACKLOG = _make("Gauge", "reorg_job_backlog",
                    "Owner only: work a job has beyond its ranges, where its type has some "
                    "(rewrite: keys in its change log still to replay).", ("job_id",))
OWNER_JOB_GAUGES = (JOB_STATE, JOB_FAILED, JOB_PROGRESS, JOB_ROWS, JOB_RATE, JOB_ETA,
                    JOB_MOVED_AT, JOB_THROTTLED, JOB_BACKLOG)

ALL = (BUILD_INFO, ROWS, BATCHES, BATCH_SECONDS, SUBTASKS, RUNNING, LEASES_LOST, REPLICA_LAG,
       IS_OWNER, *OWNER_JOB_GAUGES)


def sample_names() -> set[str]:
    """Every sample name the metrics above export (``reorg_batches_total``,
    ``reorg_batch_duration_seconds_bucket``, ...): what an alert or a
    dashboard may name."""
    if prom is None:
        return set()
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count",
                                                                 "_created"), "gauge": ("",)}
    return {family.name + suffix for metric in ALL for family in metric.describe()
            for suffix in suffixes[family.type]}


def build_info(version: str) -> None:
    BUILD_INFO.labels(version, platform.python_version()).set(1)


# --- the workers' side ---------------------------------------------------------

# job id -> job type: the jobs this node has worker series of.
_worker_jobs: dict[str, str] = {}


def batch(job_id: int, job_type: str, outcome: str, rows: int = 0,
          seconds: float | None = None) -> None:
    job = str(job_id)
    _worker_jobs[job] = job_type  # one dict store: atomic, no lock on the hot path
    BATCHES.labels(job, job_type, outcome).inc()
    if outcome == "committed":
        ROWS.labels(job, job_type).inc(rows)
        if seconds is not None:
            BATCH_SECONDS.labels(job_type).observe(seconds)


def subtask(job_type: str, outcome: str) -> None:
    SUBTASKS.labels(job_type, outcome).inc()


def lease_lost(reason: str) -> None:
    LEASES_LOST.labels(reason).inc()


def worker_jobs() -> list[int]:
    """Jobs this node has per-job worker series of (the node drops those of
    ended jobs, ``forget_worker_jobs``)."""
    return [int(j) for j in list(_worker_jobs)]


def forget_worker_jobs(job_ids: list[int]) -> None:
    for job_id in job_ids:
        job = str(job_id)
        job_type = _worker_jobs.pop(job, None)
        if job_type is None:
            continue
        with contextlib.suppress(KeyError):
            ROWS.remove(job, job_type)
        for outcome in ("committed", "rolled_back", "refused"):
            with contextlib.suppress(KeyError):
                BATCHES.remove(job, job_type, outcome)


_lag_lock = threading.Lock()  # the health readings of several slots
_lag_standbys: set[str] = set()
_lag_at = 0.0  # monotonic time of the last reading shown


def replica_lag(lags: dict[str, float]) -> None:
    """The standbys' lag of the node's latest health reading; those gone
    from it lose their series."""
    global _lag_at
    with _lag_lock:
        _lag_at = time.monotonic()
        for name in _lag_standbys - lags.keys():
            with contextlib.suppress(KeyError):
                REPLICA_LAG.remove(name)
        for name, lag in lags.items():
            REPLICA_LAG.labels(name).set(lag)
        _lag_standbys.clear()
        _lag_standbys.update(lags)


def drop_stale_replica_lag(max_age: float) -> None:
    """No job read the lag for ``max_age`` seconds: its last figures are
    not news, they go (the node's heartbeat calls this)."""
    if _lag_standbys and time.monotonic() - _lag_at > max_age:
        replica_lag({})


# --- the owner's side ----------------------------------------------------------


class OwnerJobSeries:
    """The owner's per-job gauges: set from each report of the jobs'
    figures, removed ``KEEP_ENDED_SECONDS`` after a job ended, all of them
    when the node stops being the owner."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self.clock = clock
        self._ended_at: dict[str, float | None] = {}  # job id -> when seen ended (None: live)
        self._labels: dict[str, dict[Any, tuple[str, ...]]] = {}  # job id -> gauge -> labels
        self._moved: dict[str, tuple[Any, float]] = {}  # job id -> (figures, wall time)

    def live(self) -> list[int]:
        """Jobs shown as live: the owner reads them once more when they end."""
        return [int(j) for j, ended in self._ended_at.items() if ended is None]

    def show(self, jobs: list[dict[str, Any]], *, ended: frozenset[str],
             backlog: dict[int, int]) -> None:
        """Set the gauges of ``jobs`` (rows of ``store.progress.live_jobs_progress``
        with ``throttle_kind`` and ``failed_job`` added); forget the jobs that
        ended long enough ago."""
        IS_OWNER.set(1)
        now = self.clock()
        # A job shown as live and not read again is gone (a rejected job is
        # deleted): nothing more will end its series.
        read = {str(job["id"]) for job in jobs}
        for job_id in [j for j, ended in self._ended_at.items() if ended is None]:
            if job_id not in read:
                self._forget(job_id)
        for job in jobs:
            job_id = str(job["id"])
            self._set(job_id, job, backlog.get(job["id"]))
            if job["state"] in ended:
                self._ended_at[job_id] = self._ended_at.get(job_id) or now
            else:
                self._ended_at[job_id] = None
        for job_id, ended_at in list(self._ended_at.items()):
            if ended_at is not None and now - ended_at >= KEEP_ENDED_SECONDS:
                self._forget(job_id)

    def clear(self) -> None:
        """Not the owner (any more): no job series at all."""
        IS_OWNER.set(0)
        for job_id in list(self._ended_at):
            self._forget(job_id)

    def _set(self, job_id: str, job: dict[str, Any], backlog: int | None) -> None:
        figures = (job["state"], job["step"], job["rows_processed"], job["percent"],
                   job.get("step_percent"), job.get("revert_done"))
        last = self._moved.get(job_id)
        if last is None or last[0] != figures:
            self._moved[job_id] = (figures, time.time())
        values: list[tuple[Any, tuple[str, ...], float | None]] = [
            (JOB_STATE, (job_id, job["state"]), 1),
            (JOB_FAILED, (job_id,), 1 if job["failed_job"] else 0),
            (JOB_PROGRESS, (job_id,), job["percent"] / 100.0),
            (JOB_ROWS, (job_id,), job["rows_done"]),
            (JOB_RATE, (job_id,), job["rows_per_sec"]),
            (JOB_ETA, (job_id,), job["eta_seconds"]),
            (JOB_MOVED_AT, (job_id,), self._moved[job_id][1]),
            (JOB_THROTTLED, (job_id, job["throttle_kind"] or ""),
             1 if job["throttle_kind"] else None),
            (JOB_BACKLOG, (job_id,), backlog),
        ]
        shown = self._labels.setdefault(job_id, {})
        for gauge, labels, value in values:
            if shown.get(gauge) not in (None, labels) or value is None:
                self._remove(gauge, shown.pop(gauge, None))
            if value is not None:
                gauge.labels(*labels).set(value)
                shown[gauge] = labels

    def _forget(self, job_id: str) -> None:
        for gauge, labels in self._labels.pop(job_id, {}).items():
            self._remove(gauge, labels)
        self._ended_at.pop(job_id, None)
        self._moved.pop(job_id, None)

    @staticmethod
    def _remove(gauge: Any, labels: tuple[str, ...] | None) -> None:
        if labels is not None:
            with contextlib.suppress(KeyError):
                gauge.remove(*labels)
